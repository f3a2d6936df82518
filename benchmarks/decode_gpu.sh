#!/usr/bin/env bash
# Issue 32's language goals on one H200, in stages that each fit a 10-minute command; logs and JSON go to OUT.
#   benchmarks/decode_gpu.sh OUT decode   # Qwen3-8B decode, graph and compiled steps side by side at batch 32, 128
#                                         # and 256 (prompt 256, 128 new tokens); --profile at 128: one decode
#                                         # step by kernel kind (OUT/profile_b128/KEY/step.json)
#   benchmarks/decode_gpu.sh OUT gspo     # choice_gspo on Qwen3-8B LoRA r32, two steps, generation.decoder static
#                                         # then compiled (generated tokens/s, the share of the step generating)
# TINY=1 checks the script on a CPU with the tiny twin.
set -uo pipefail
out=$1
shift
mkdir -p "$out"
if [ -n "${TINY:-}" ]; then size=(--tiny); batches=(4); len=(--prompt-len 8 --max-new-tokens 6); else
    size=(--model-size 8b); batches=(32 128 256); len=(--prompt-len 256 --max-new-tokens 128); fi
for stage in "$@"; do
    case $stage in
    decode)
        for b in "${batches[@]}"; do
            prof=()
            if [ "$b" = 128 ] || [ -n "${TINY:-}" ]; then prof=(--profile "$out/profile_b$b"); fi
            python3 -m omnialign bench decode "${size[@]}" --prompts "$b" "${len[@]}" --decoders graph compiled \
                "${prof[@]}" --out "$out/decode_b$b.json" >"$out/decode_b$b.log" 2>&1
            echo "batch $b rc=$?"; grep -E '^(\{"decoder|graph |compiled )' "$out/decode_b$b.log" | cut -c1-420
        done
        ;;
    gspo)
        opts=(--set model.lora.rank=32 model.lora.alpha=64)
        [ -n "${TINY:-}" ] && opts=(--prompt-len 32 --max-new-tokens 8 --set)
        for dec in static compiled; do
            python3 -m omnialign bench language --recipe choice_gspo "${size[@]}" --steps 2 "${opts[@]}" \
                "generation.decoder=$dec" --work "/tmp/bench_$dec" --out "$out/gspo_$dec.json" >"$out/gspo_$dec.log" 2>&1
            echo "gspo $dec rc=$?"; tail -4 "$out/gspo_$dec.log" | cut -c1-600
        done
        ;;
    *) echo "unknown stage $stage" && exit 2 ;;
    esac
done
