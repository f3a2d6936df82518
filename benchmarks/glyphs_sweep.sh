#!/bin/bash
# Glyphs runs given one per line on stdin as "NAME RECIPE [OVERRIDES...]", all at once, round-robin over the GPUs
# (several per GPU), for comparing recipe settings side by side:
#   printf 'cps_clip2 glyphs_cps algorithm.clip_range=2e-4\n' | benchmarks/glyphs_sweep.sh OUT [STEPS [VAL_EVERY]]
# writes OUT/runs/NAME/{metrics.jsonl,samples/} and OUT/NAME.log, then prints each run's validation curve
# (step, reward, gold accuracy, not a digit).
out=$1; steps=${2:-300}; every=${3:-10}
gpus=$(nvidia-smi -L | wc -l); i=${FIRST_GPU:-0}; names=""
mkdir -p $out/runs
while read -r name recipe overrides; do
  [ -z "$name" ] && continue
  CUDA_VISIBLE_DEVICES=$((i % gpus)) ${PYTHON:-python} -m omnialign train $recipe name=$name trainer.total_steps=$steps \
    trainer.val_every=$every trainer.save_every=$steps trainer.progress=false trainer.save_val_images=true \
    trainer.output_dir=$out/runs $overrides > $out/$name.log 2>&1 &
  i=$((i + 1)); names="$names $name"
done
wait
for n in $names; do
  echo "== $n"; tail -1 $out/$n.log
  ${PYTHON:-python} - $out/runs/$n/metrics.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "val/gold/accuracy" in r:
        print(r["step"], f'{r["val/reward/mean"]:.3f} {r["val/gold/accuracy"]:.3f} {r["val/gold/not_a_digit"]:.3f}', end=" | ")
print()
PY
done
