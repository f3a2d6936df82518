#!/bin/bash
# Issue 10: the published Qwen-Image recipes on several H200s (random full-size weights), and the
# scaling of FSDP2 at a fixed per-GPU batch. Needs N GPUs of one host (default 4):
#   benchmarks/multi_gpu.sh OUT [N]
# Writes OUT/*.json (rank 0's rows) and OUT/*.log; the tables go to BENCHMARKS.md.
# CPU rehearsal of the same launches (gloo, tiny random pipeline):
#   BENCH_ARGS=--tiny PYTHON=.venv/bin/python benchmarks/multi_gpu.sh OUT 2
out=$1
n=${2:-4}
run() {  # name, gpus, args...
  local name=$1 gpus=$2
  shift 2
  ${PYTHON:-python} -m torch.distributed.run --nproc-per-node "$gpus" -m omnialign bench recipe --work "/tmp/bench_$name" --out "$out/$name.json" "$@" $BENCH_ARGS \
    > "$out/$name.log" 2>&1
  grep '"step": 2' "$out/$name.log" | head -1
}
# the published global batch: 32 prompts x 16 images, micro-batch 16 (32 / N prompts per GPU)
run flowgrpo_lora_${n}gpu "$n" --recipe qwen_image_ocr_flowgrpo_lora --prompts $((32 / n)) --steps 2
run flowgrpo_full_${n}gpu "$n" --recipe qwen_image_ocr_flowgrpo_full --prompts $((32 / n)) --steps 2
# scaling at 4 prompts x 16 images per GPU
for g in 1 2 4; do
  [ "$g" -le "$n" ] && run flowgrpo_lora_scaling_${g}gpu "$g" --recipe qwen_image_ocr_flowgrpo_lora --prompts 4 --steps 2
done
