#!/bin/bash
# Every glyphs recipe x SEEDS seeds x STEPS steps on the GPUs of one machine, JOBS runs at a time (default: one per
# CPU core), for BENCHMARKS.md's seed-sweep table ("Learning on every seed"):
#   benchmarks/glyphs_seeds.sh OUT [STEPS [SEEDS [RECIPE ...]]]   # defaults: 300 steps, seeds 0-4, the recipes below
# writes OUT/runs/RECIPE_sSEED/{metrics.jsonl,samples/step_*.{png,pt}} and OUT/logs/, then summarises the runs into
# OUT/seeds.json and OUT/seeds.png with benchmarks/glyphs_seeds.py (`--into benchmarks/glyphs/seeds.json` there
# merges a sweep into the shipped table). Runs go round-robin over the GPUs. A variant of the recipes: SET="KEY=VALUE
# ..." adds config overrides to every run and TAG=_name a suffix to their names (RECIPE_name_sSEED; its own row).
# FIRST=K starts at seed K (seeds K to K+SEEDS-1), so that a sweep too long for one command runs in parts whose
# OUT/runs folders are gathered into one before the summary. Runs resume (`--resume auto`): SAVE_EVERY=N checkpoints
# every N steps (default: at the end only), so that a sweep cut off by a command's time limit goes on where it stopped
# when run again with the same OUT; a run with a summary.json is done and is skipped. MPS=1 starts CUDA MPS first (the
# tiny runs then share the card instead of time-slicing it: about three times the runs per second on one H200) and
# stops it at the end if this script started it; where it does not start, the sweep runs without it.
out=$1; steps=${2:-300}; seeds=${3:-5}; shift $(($# < 3 ? $# : 3))
recipes=${*:-glyphs glyphs_cps glyphs_dance glyphs_mixgrpo glyphs_grpo_guard glyphs_dppo glyphs_nft glyphs_awm glyphs_dgpo glyphs_gardo glyphs_tempflow glyphs_branch glyphs_online_dpo glyphs_distill
  glyphs_edit glyphs_edit_cps glyphs_edit_mixgrpo glyphs_edit_grpo_guard glyphs_edit_dppo glyphs_edit_nft glyphs_edit_online_dpo
  glyphs_video glyphs_video_cps glyphs_video_mixgrpo glyphs_video_grpo_guard glyphs_video_dppo glyphs_video_nft glyphs_video_online_dpo}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l); gpus=$((gpus > 0 ? gpus : 1)); jobs=${JOBS:-$(nproc)}  # before OMP_NUM_THREADS=1, which nproc obeys
mkdir -p $out/runs $out/logs
export out steps PYTHON=${PYTHON:-python} OMP_NUM_THREADS=1 SET TAG SAVE_EVERY
$PYTHON - > $out/meta.json <<'PY'
import datetime, json, os, subprocess, torch
device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
commit = os.environ.get("COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                    text=True).stdout.strip()
print(json.dumps({"date": str(datetime.date.today()), "device": device, "torch": torch.__version__, "commit": commit}))
PY
if [ "${MPS:-0}" = 1 ]; then
  started=0; nvidia-cuda-mps-control -d 2>/dev/null && started=1
  if $PYTHON -c "import torch; torch.zeros(1).cuda()" 2>/dev/null; then
    [ $started = 1 ] && trap 'echo quit | nvidia-cuda-mps-control' EXIT
  else
    echo "CUDA MPS did not start: the sweep runs without it" >&2
    [ $started = 1 ] && echo quit | nvidia-cuda-mps-control
  fi
fi
i=0
for r in $recipes; do
  for s in $(seq ${FIRST:-0} $((${FIRST:-0} + seeds - 1))); do echo "$((i % gpus)) $r $s"; i=$((i + 1)); done
done | xargs -P $jobs -L 1 bash -c '
  [ -f $out/runs/$1${TAG}_s$2/summary.json ] && { echo "already done $1$TAG seed $2"; exit 0; }
  CUDA_VISIBLE_DEVICES=$0 $PYTHON -m omnialign train $1 seed=$2 name=$1${TAG}_s$2 \
    trainer.total_steps=$steps trainer.val_every=10 trainer.save_every=${SAVE_EVERY:-$steps} trainer.progress=false \
    trainer.save_val_images=true trainer.output_dir=$out/runs $SET --resume auto >> $out/logs/$1${TAG}_s$2.log 2>&1 \
    && echo "done $1$TAG seed $2" || echo "FAILED $1$TAG seed $2: $out/logs/$1${TAG}_s$2.log"'
$PYTHON benchmarks/glyphs_seeds.py $out
