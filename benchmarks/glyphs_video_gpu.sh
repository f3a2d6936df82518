#!/bin/bash
# The glyphs video world on a GPU machine: pretrain the video model into the shipped assets (stages video_teacher,
# clean clips, and video, a share of the prompts replaced; GPU 0), then run the slow learning checks of every
# glyphs_video recipe on it, in parallel (GPU 0):
#   benchmarks/glyphs_video_gpu.sh OUT [VIDEO_STEPS [VIDEO_NOISY_STEPS]]
# writes OUT/pretrain_log.txt, OUT/video_assets.tar (assets/video_teacher, assets/video and pretrain.json),
# OUT/snapshots.tar (the video stage's model at each of its evaluations, to choose its steps), OUT/learning.txt and
# OUT/runs.tar (each run's metrics.jsonl, summary.json and grids).
out=$(realpath -m $1); steps=${2:-8000}; noisy=${3:-400}
mkdir -p $out
assets=omnialign/worlds/glyphs/assets
prepare="${PYTHON:-python} -m omnialign prepare glyphs --out $assets --device cuda"
{ CUDA_VISIBLE_DEVICES=0 $prepare --stages video_teacher --video-steps $steps --eval-every 500 &&
  CUDA_VISIBLE_DEVICES=0 $prepare --stages video --video-noisy-steps $noisy --eval-every 50 --snapshots /tmp/snap
} > $out/pretrain_log.txt 2>&1 || { tail -30 $out/pretrain_log.txt; exit 1; }
grep "video step" $out/pretrain_log.txt
tar -C $assets -cf $out/video_assets.tar video_teacher video pretrain.json
tar -C /tmp/snap -cf $out/snapshots.tar .
CUDA_VISIBLE_DEVICES=0 ${PYTHON:-python} -m pytest --runslow -q -p no:cacheprovider tests/test_learning.py -k video \
  -n 7 --basetemp=/tmp/video_runs > $out/learning.txt 2>&1
grep -E "passed|failed|AssertionError|^FAILED" $out/learning.txt | tail -12
# one flat tar (the device returns no deep folders): each run's metrics.jsonl, summary.json and grids
cd /tmp/video_runs && find . \( -name metrics.jsonl -o -name summary.json -o -name "step_*.png" \) -print0 \
  | tar --null -T - -cf $out/runs.tar
