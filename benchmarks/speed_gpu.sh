#!/usr/bin/env bash
# Issue 32's diffusion and omni goals on one H200, in stages that each fit a 10-minute command; logs, JSON and
# profiles go to OUT. Run the stages of one goal in one call so that its rows are side by side.
#   benchmarks/speed_gpu.sh OUT qwen_ckpt        # qwen_image_ocr_flowgrpo_lora (4 prompts x 16, two steps) with
#                                                # engine.checkpoint_every 1 then 2 (EVERY="1 2" by default): goal 1
#   benchmarks/speed_gpu.sh OUT qwen_fp8         # qwen_image_ocr_flowgrpo_lora (4 prompts x 16, two steps) with
#                                                # engine.fp8 false then true (FP8="false true"): goals 1 and 2
#   benchmarks/speed_gpu.sh OUT qwen_goal1       # qwen_image_ocr_{flowgrpo,dppo,nft}_lora (4 prompts, two steps) in
#                                                # fp8 with the exact replay (ALGOS="flowgrpo dppo nft"; two fit
#                                                # one call): goal 1 as measured at e768b33
#   benchmarks/speed_gpu.sh OUT qwen_casts       # qwen_image_ocr_flowgrpo_lora (4 prompts x 16, two steps) compiled
#                                                # with inductor's emulate_precision_casts (as engine.compile sets
#                                                # it) and without: what the exact replay costs (goal 1)
#   benchmarks/speed_gpu.sh OUT one_rank         # RECIPE (flux_ocr_flowgrpo_lora, PROMPTS=2, two steps) with FSDP
#                                                # managing every parameter, as before b876edb, then with the frozen
#                                                # bf16 weights left to the modules (the default since)
#   benchmarks/speed_gpu.sh OUT profile_flux     # the warm step of flux_ocr_flowgrpo_lora under the profiler: goal 2
#   benchmarks/speed_gpu.sh OUT profile_kontext  # flux_kontext_edit_flowgrpo_lora, the same
#   benchmarks/speed_gpu.sh OUT profile_edit     # qwen_image_edit_ocr_flowgrpo_lora, the same
#   benchmarks/speed_gpu.sh OUT profile_wan      # wan21_t2v_1_3b_ocr_flowgrpo_lora, the same
#   benchmarks/speed_gpu.sh OUT fp8_flux         # flux_ocr_flowgrpo_lora with engine.fp8 false then true (FP8=...): goal 2;
#                                                # fp8_kontext, fp8_edit and fp8_wan do the same for the three above
#                                                # (Wan: 1 prompt x 2 videos, issue 20's row; 8 take 350 s a step);
#                                                # FP8=true SET="rollout.grad_graph=true engine.fp8_backward=true"
#                                                # runs them with the backward in FP8 too (engine.fp8_backward)
#   benchmarks/speed_gpu.sh OUT ck4_flux         # flux_ocr_flowgrpo_lora (2 prompts, two steps) in fp8 with the backward
#                                                # in fp8 and `rollout.grad_graph`: three blocks kept in four
#                                                # (engine.checkpoint_every=4) at micro-batch 8, then the recipe's 16
#                                                # with every block recomputed: goal 2 as met on an H100 (f911e1c)
#   benchmarks/speed_gpu.sh OUT ck4_kontext      # flux_kontext_edit_flowgrpo_lora, the same at micro-batch 4
#                                                # (MICRO=N sets the first run's micro-batch for either stage,
#                                                # STEPS=N the steps of both runs; 2 by default)
#   benchmarks/speed_gpu.sh OUT wan14b           # wan21_t2v_14b_ocr_flowgrpo_lora, one step of two videos: goal 4
#   benchmarks/speed_gpu.sh OUT omni             # qwen3_omni_dpo with the full towers on image, audio and video
#                                                # rows, then qwen3_omni_gspo with generation: goal 5
#   benchmarks/speed_gpu.sh OUT omni_gspo        # qwen3_omni_gspo alone, image rows through the full towers
#   benchmarks/speed_gpu.sh OUT omni_decoders    # qwen3_omni_gspo, 16 image prompts x 8 generated 128 together,
#                                                # through each of DECODERS="transformers compiled": goal 5
#                                                # (OMNI_MICRO_BATCH=64 for 64 at a time)
# STEPS=N also sets the steps of profile_flux and profile_kontext (the last one is profiled). TINY=1 checks a stage on
# a CPU with the tiny twins. SET="KEY=VALUE ..." adds overrides to the runs of qwen_fp8,
# qwen_goal1, the fp8 stages, profile_flux and profile_kontext: an H100 holds the Qwen-Image recipes' actor
# micro-batch of 16 in neither precision (SET=actor.micro_batch_size=8); a profile at the ck4 stages' settings.
set -uo pipefail
out=$1
shift
mkdir -p "$out"
tiny=(); [ -n "${TINY:-}" ] && tiny=(--tiny)
omnialign=(python3 -m omnialign)
# the same CLI with compile_forward's `emulate_precision_casts = True` landing on a namespace that inductor never reads
# (its reduction-config filter still set)
no_casts=(python3 -c "import sys, types, omnialign.engine.fsdp as f
f.inductor_config = types.SimpleNamespace(test_configs=f.inductor_config.test_configs)
from omnialign.cli import main; main(sys.argv[1:])")
# the same CLI with FSDP managing every parameter over one rank too, as before b876edb (frozen bf16 weights gathered,
# that is copied, before each forward and backward)
all_managed=(python3 -c "import sys, torch.distributed.fsdp as d, omnialign.engine.fsdp as f
f.fully_shard = lambda module, **kw: d.fully_shard(module, **{**kw, 'ignored_params': None})
from omnialign.cli import main; main(sys.argv[1:])")
bench() {  # bench KIND NAME RECIPE [bench args ...]: one `omnialign bench KIND` run, its log and JSON under OUT
    local kind=$1 name=$2 r=$3
    shift 3
    local smi=""  # the card's clocks, power and temperature each second beside the run (OUT/NAME.smi.csv)
    if [ -z "${TINY:-}" ]; then
        nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
            --format=csv,noheader -lms 1000 >"$out/$name.smi.csv" 2>&1 &
        smi=$!
    fi
    "${omnialign[@]}" bench "$kind" --recipe "$r" "${tiny[@]}" --work "/tmp/bench_$name" --out "$out/$name.json" \
        "$@" >"$out/$name.log" 2>&1
    echo "$name rc=$?"
    [ -n "$smi" ] && kill "$smi"
    tail -3 "$out/$name.log" | cut -c1-700
}
for stage in "$@"; do
    case $stage in
    qwen_ckpt)
        for every in ${EVERY:-1 2}; do
            bench recipe "qwen_image_flowgrpo_ckpt$every" qwen_image_ocr_flowgrpo_lora --prompts 4 --steps 2 \
                --set engine.checkpoint_every="$every"
        done
        ;;
    qwen_goal1)
        for algo in ${ALGOS:-flowgrpo dppo nft}; do
            bench recipe "qwen_$algo" "qwen_image_ocr_${algo}_lora" --prompts 4 --steps 2 \
                --set engine.fp8=true rollout.grad_graph=true ${SET:-}
        done
        ;;
    one_rank)  # RECIPE (flux_ocr_flowgrpo_lora) with every parameter FSDP's, then with the frozen ones its own
        r=${RECIPE:-flux_ocr_flowgrpo_lora}
        (omnialign=("${all_managed[@]}") && bench recipe "${r}_all_managed" "$r" --prompts ${PROMPTS:-2} --steps 2 ${SET:+--set $SET})
        bench recipe "${r}_frozen_own" "$r" --prompts ${PROMPTS:-2} --steps 2 ${SET:+--set $SET}
        ;;
    qwen_casts)
        bench recipe qwen_image_flowgrpo_casts qwen_image_ocr_flowgrpo_lora --prompts 4 --steps 2
        (omnialign=("${no_casts[@]}") && bench recipe qwen_image_flowgrpo_no_casts qwen_image_ocr_flowgrpo_lora \
            --prompts 4 --steps 2)
        ;;
    qwen_fp8 | fp8_flux | fp8_kontext | fp8_edit | fp8_wan)  # goal 1's and goal 2's recipes, bf16 then fp8
        x=
        case $stage in
        qwen_fp8) r=qwen_image_ocr_flowgrpo_lora p=4 ;;
        fp8_flux) r=flux_ocr_flowgrpo_lora p=2 ;;
        fp8_kontext) r=flux_kontext_edit_flowgrpo_lora p=2 ;;
        fp8_edit) r=qwen_image_edit_ocr_flowgrpo_lora p=1 ;;
        fp8_wan) r=wan21_t2v_1_3b_ocr_flowgrpo_lora p=1 x=rollout.n=2 ;;
        esac
        for fp8 in ${FP8:-false true}; do
            bench recipe "${stage}_$fp8" $r --prompts $p --steps 2 --set engine.fp8="$fp8" $x ${SET:-}
        done
        ;;
    ck4_flux | ck4_kontext)
        case $stage in
        ck4_flux) r=flux_ocr_flowgrpo_lora m=${MICRO:-8} ;;
        ck4_kontext) r=flux_kontext_edit_flowgrpo_lora m=${MICRO:-4} ;;
        esac
        fast="engine.fp8=true rollout.grad_graph=true engine.fp8_backward=true"
        bench recipe "${stage}_every4" $r --prompts 2 --steps ${STEPS:-2} --set $fast engine.checkpoint_every=4 \
            actor.micro_batch_size=$m rollout.micro_batch_size=$m
        bench recipe "${stage}_recipe" $r --prompts 2 --steps ${STEPS:-2} --set $fast
        ;;
    profile_flux)
        bench recipe flux_profile flux_ocr_flowgrpo_lora --prompts 2 --steps ${STEPS:-2} --profile "$out/flux_profile" ${SET:+--set $SET}
        ;;
    profile_kontext)
        bench recipe kontext_profile flux_kontext_edit_flowgrpo_lora --prompts 2 --steps ${STEPS:-2} --profile "$out/kontext_profile" \
            ${SET:+--set $SET}
        ;;
    profile_edit)
        bench recipe edit_profile qwen_image_edit_ocr_flowgrpo_lora --prompts 1 --steps 2 --profile "$out/edit_profile"
        ;;
    profile_wan)
        bench recipe wan_profile wan21_t2v_1_3b_ocr_flowgrpo_lora --prompts 1 --steps 2 --set rollout.n=2 \
            --profile "$out/wan_profile"
        ;;
    wan14b) bench recipe wan14b wan21_t2v_14b_ocr_flowgrpo_lora --prompts 1 --steps 1 --set rollout.n=2 ;;
    omni)
        for media in image audio video; do
            bench language "omni_dpo_$media" qwen3_omni_dpo --towers full --media "$media" --steps 2
        done
        ;&
    omni_gspo) bench language omni_gspo qwen3_omni_gspo --towers full --media image --steps 2 ;;
    omni_decoders)
        for decoder in ${DECODERS:-transformers compiled}; do
            bench language "omni_gspo_$decoder" qwen3_omni_gspo --towers full --media image --steps 2 --prompts 16 \
                --set generation.micro_batch_size=${OMNI_MICRO_BATCH:-128} generation.decoder="$decoder"
        done
        ;;
    *) echo "unknown stage $stage" && exit 2 ;;
    esac
done
