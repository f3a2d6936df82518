#!/usr/bin/env bash
# Issue 32's language goals on one H200, in stages that each fit a 10-minute command; logs and JSON go to OUT.
#   benchmarks/decode_gpu.sh OUT decode   # Qwen3-8B decode, graph and compiled steps side by side at batch 32, 128
#                                         # and 256 (prompt 256, 128 new tokens); --profile at 128: one decode
#                                         # step by kernel kind (OUT/profile_b128/KEY/step.json)
#   benchmarks/decode_gpu.sh OUT gspo     # choice_gspo on Qwen3-8B LoRA r32 (8 prompts x 8, two steps), the static
#                                         # decoder with the adapters through peft (generation.merge_lora=false), then
#                                         # merged (the default): generated tokens/s, the share of the step generating
#   benchmarks/decode_gpu.sh OUT gspo_scale  # the compiled decoder, merged, at 8 prompts x 8 then 32 x 8 generated
#                                            # together (generation.micro_batch_size=256)
#   benchmarks/decode_gpu.sh OUT autotune    # the compiled decoder at batch 128 as it is, with inductor's GEMM
#                                            # autotuning (TORCHINDUCTOR_MAX_AUTOTUNE=1), and with coordinate-descent
#                                            # tuning of its fused kernels besides (three processes, one after another)
#   benchmarks/decode_gpu.sh OUT triton      # benchmarks/decode_splitkv.py: the decode attention alone (SDPA and every
#                                            # Triton tile config), then the compiled decoder through SDPA and through
#                                            # the kernels with the best tiles at 128 x 384, at batch 128 and at the
#                                            # batches TRITON_BATCHES names (about 3.5 minutes for batch 128; a GPU)
#   benchmarks/decode_gpu.sh OUT draw        # the eager and the fused draw alone (decode_splitkv.py draw), then the
#                                            # compiled decoder at batch 128 and at the batches TRITON_BATCHES names,
#                                            # in one process each: SDPA and the eager draw, the kernels of BASELINE
#                                            # (a flash_decode.py of another commit, if set) and the fused draw, the
#                                            # code; about a minute each on an H100
#   benchmarks/decode_gpu.sh OUT products    # benchmarks/decode_products.py: the step's five products alone at batch 128
#                                            # (cuBLAS as the decoder calls it, preferring cuBLASLt, the width split in
#                                            # two), each weight read from beyond the L2 cache (about a minute)
# TINY=1 checks the script on a CPU with the tiny twin.
set -uo pipefail
out=$1
shift
mkdir -p "$out"
if [ -n "${TINY:-}" ]; then size=(--tiny); batches=(4); len=(--prompt-len 8 --max-new-tokens 6); else
    size=(--model-size 8b); batches=(32 128 256); len=(--prompt-len 256 --max-new-tokens 128); fi
gspo() {  # gspo NAME PROMPTS SETTING...: two choice_gspo steps on LoRA r32, their log and JSON under OUT
    local name=$1 prompts=$2
    shift 2
    local opts=(--set model.lora.rank=32 model.lora.alpha=64)
    [ -n "${TINY:-}" ] && opts=(--prompt-len 32 --max-new-tokens 8 --set model.lora.rank=4 model.lora.alpha=8)
    python3 -m omnialign bench language --recipe choice_gspo "${size[@]}" --steps 2 --prompts "$prompts" "${opts[@]}" \
        "$@" --work "/tmp/bench_$name" --out "$out/gspo_$name.json" >"$out/gspo_$name.log" 2>&1
    echo "gspo $name rc=$?"; tail -3 "$out/gspo_$name.log" | cut -c1-700
}
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
        gspo static_unmerged 8 generation.decoder=static generation.merge_lora=false
        gspo static 8 generation.decoder=static
        ;;
    gspo_scale)
        gspo compiled 8 generation.decoder=compiled
        gspo compiled_p32 32 generation.decoder=compiled generation.micro_batch_size=256
        ;;
    autotune)
        b=${batches[1]:-${batches[0]}}
        for tuning in plain max_autotune coordinate; do
            flags=()
            [ "$tuning" != plain ] && flags+=(TORCHINDUCTOR_MAX_AUTOTUNE=1)
            [ "$tuning" = coordinate ] && flags+=(TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1)
            env "${flags[@]}" python3 -m omnialign bench decode "${size[@]}" --prompts "$b" "${len[@]}" \
                --decoders compiled --out "$out/autotune_$tuning.json" >"$out/autotune_$tuning.log" 2>&1
            echo "autotune $tuning rc=$?"; grep -E '^(\{"decoder|compiled )' "$out/autotune_$tuning.log" | cut -c1-420
        done
        ;;
    triton)
        python3 benchmarks/decode_splitkv.py micro "$out/triton_micro.json" >"$out/triton_micro.log" 2>&1
        echo "triton micro rc=$?"; cut -c1-300 "$out/triton_micro.log"
        tiles=$(python3 -c "import json, sys; r = [r for r in json.load(open(sys.argv[1])) if (r['batch'], r['L']) == (128, 384)]
print(*(r[0]['best'][k] for k in ('block', 'warps', 'stages')))" "$out/triton_micro.json")
        for b in 128 ${TRITON_BATCHES:-}; do  # then the batches TRITON_BATCHES names (TRITON_BATCHES="32 256")
            python3 benchmarks/decode_splitkv.py decode "$out/triton_decode.jsonl" $b $tiles >"$out/triton_decode_b$b.log" 2>&1
            echo "triton decode batch $b ($tiles) rc=$?"; grep "^==" "$out/triton_decode_b$b.log"
        done
        ;;
    draw)
        python3 benchmarks/decode_splitkv.py draw "$out/draw_micro.json" >"$out/draw_micro.log" 2>&1
        echo "draw micro rc=$?"; cut -c1-300 "$out/draw_micro.log"
        for b in 128 ${TRITON_BATCHES:-}; do
            python3 benchmarks/decode_splitkv.py decode "$out/draw_decode.jsonl" $b ${BASELINE:-} >"$out/draw_decode_b$b.log" 2>&1
            echo "draw decode batch $b rc=$?"; grep "^==" "$out/draw_decode_b$b.log"
        done
        ;;
    products)
        python3 benchmarks/decode_products.py "$out/products.json" >"$out/products.log" 2>&1
        echo "products rc=$?"; cut -c1-400 "$out/products.log"
        ;;
    *) echo "unknown stage $stage" && exit 2 ;;
    esac
done
