#!/bin/bash
# Issue 34's runs on one machine with two GPUs (nvidia-h200-x2), random full-size weights:
#   benchmarks/two_gpu.sh OUT [PART ...]      # parts: qwen_full scaling wan_sp exact (default: all four)
# writes OUT/NAME.json (rank 0's bench rows) and OUT/NAME.log for each run, and prints the lines the tables need.
#   qwen_full  qwen_image_ocr_flowgrpo_full split over 2 GPUs (FSDP2, fp32 master weights), the published 8 prompts
#              x 16 images per GPU (32 x 16 on 4 GPUs)
#   scaling    qwen_image_ocr_flowgrpo_lora at 4 prompts x 16 images per GPU on 1 and on 2 GPUs
#   wan_sp     wan21_t2v_14b_ocr_flowgrpo_lora, one prompt x 2 videos, on 1 GPU and with engine.sequence_parallel=2,
#              at each size of SIZES ("HEIGHTxWIDTHxFRAMES ...") until both fail; OOM is recorded, not fatal
#   exact      a 2-process glyphs run with trainer.deterministic=true, twice: metrics.jsonl equal without timings
# CPU rehearsal (gloo, tiny random pipelines; wan_sp's sizes then small):
#   TINY=1 PYTHON=.venv/bin/python benchmarks/two_gpu.sh /tmp/two
out=$(realpath -m $1); shift
parts=${*:-qwen_full scaling wan_sp exact}
py=${PYTHON:-python}
mkdir -p $out
tiny=${TINY:+--tiny}
if [ -n "$TINY" ]; then sizes=${SIZES:-"64x64x5 64x64x9"}; else sizes=${SIZES:-"480x832x81 480x832x121 720x1280x81 720x1280x121 720x1280x161"}; fi

bench() {  # NAME GPUS ARGS...: one bench recipe run; prints its last row's figures or why it failed
  local name=$1 gpus=$2; shift 2
  $py -m torch.distributed.run --standalone --nproc-per-node $gpus -m omnialign bench recipe --work /tmp/two_$name \
    --out $out/$name.json $tiny "$@" > $out/$name.log 2>&1
  if grep -q OutOfMemoryError $out/$name.log; then echo "$name: out of memory"; return 1; fi
  [ -s $out/$name.json ] || { echo "$name: FAILED (tail of $out/$name.log)"; tail -5 $out/$name.log; return 1; }
  $py -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][-1]
print(sys.argv[2] + ':', {k: v for k, v in r.items() if k in ('gpus', 'step_s', 'mfu', 'peak_alloc_gb') or 'per_gpu_s' in k})" \
    $out/$name.json $name
}

for part in $parts; do
  case $part in
    qwen_full) bench qwen_full_2gpu 2 --recipe qwen_image_ocr_flowgrpo_full --prompts 8 --steps 2 ;;
    scaling)
      bench lora_1gpu 1 --recipe qwen_image_ocr_flowgrpo_lora --prompts 4 --steps 2
      bench lora_2gpu 2 --recipe qwen_image_ocr_flowgrpo_lora --prompts 4 --steps 2 ;;
    wan_sp)
      for size in $sizes; do
        IFS=x read h w f <<< $size
        set_=(--set rollout.n=2 rollout.height=$h rollout.width=$w model.frames=$f)
        one=0; two=0
        bench wan14b_${size}_1gpu 1 --recipe wan21_t2v_14b_ocr_flowgrpo_lora --prompts 1 --steps 2 "${set_[@]}" && one=1
        bench wan14b_${size}_sp2 2 --recipe wan21_t2v_14b_ocr_flowgrpo_lora --prompts 1 --steps 2 "${set_[@]}" \
          engine.sequence_parallel=2 && two=1  # the last --set entry
        [ $one$two = 00 ] && break
      done ;;
    exact)
      steps=${EXACT_STEPS:-20}
      for k in a b; do
        $py -m torch.distributed.run --standalone --nproc-per-node 2 -m omnialign train glyphs name=exact_$k \
          trainer.deterministic=true trainer.total_steps=$steps trainer.val_every=10 trainer.save_every=$steps \
          trainer.progress=false trainer.output_dir=$out/exact > $out/exact_$k.log 2>&1 || { echo "exact $k: FAILED"; tail -5 $out/exact_$k.log; }
      done
      $py -c "
import sys; from omnialign.metrics import read_metrics, without_timing
a, b = (without_timing(read_metrics(f'$out/exact/exact_{k}/metrics.jsonl')) for k in 'ab')
print('exact: %d records, identical without timings: %s' % (len(a), a == b))" ;;
    *) echo "unknown part $part: choose from qwen_full scaling wan_sp exact"; exit 2 ;;
  esac
done
