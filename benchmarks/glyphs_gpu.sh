#!/bin/bash
# Every glyphs recipe for STEPS steps (default 300) on the GPUs of one machine, several runs per GPU at once,
# for BENCHMARKS.md's learning table (gold judge and reward before/after):
#   benchmarks/glyphs_gpu.sh OUT [STEPS]
# writes OUT/runs/RECIPE/{metrics.jsonl,samples/step_*.png,.pt} and OUT/RECIPE.log, then prints each run's last
# line. Runs go round-robin over the GPUs, starting at GPU $FIRST_GPU (default 0).
out=$1; steps=${2:-300}
recipes="glyphs glyphs_cps glyphs_dance glyphs_mixgrpo glyphs_grpo_guard glyphs_dppo glyphs_nft glyphs_online_dpo glyphs_distill"
gpus=$(nvidia-smi -L | wc -l); i=${FIRST_GPU:-0}
mkdir -p $out/runs
for r in $recipes; do
  CUDA_VISIBLE_DEVICES=$((i % gpus)) ${PYTHON:-python} -m omnialign train $r trainer.total_steps=$steps \
    trainer.val_every=$((steps / 3)) trainer.save_every=$steps trainer.progress=false trainer.save_val_images=true \
    trainer.output_dir=$out/runs > $out/$r.log 2>&1 &
  i=$((i + 1))
done
wait
for r in $recipes; do echo "== $r"; tail -1 $out/$r.log; done
