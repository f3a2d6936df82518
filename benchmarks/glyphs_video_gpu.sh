#!/bin/bash
# The glyphs video world on a GPU machine: pretrain the video model into the shipped assets (stages video_teacher,
# clean clips, and video, a share of the prompts replaced; GPU 0), then run the slow learning checks of every
# glyphs_video recipe on it, in parallel (GPU 0):
#   benchmarks/glyphs_video_gpu.sh OUT [VIDEO_STEPS [VIDEO_NOISY_STEPS]]
# writes OUT/pretrain_log.txt, OUT/video_assets.tar (video_teacher, video and pretrain.json), OUT/snapshots.tar (the
# video stage's model at each of its evaluations, to choose its steps), OUT/learning.txt and OUT/runs.tar (each
# run's metrics.jsonl, summary.json and grids). Environment: ASSETS=DIR pretrains into DIR instead (its gold and
# recognizer linked from the shipped ones), PATCH=2 the 1024-token model, LEARN=0 skips the learning checks (they
# read the shipped assets), TEACHER_LIMIT and LEARN_LIMIT (seconds) bounds on the teacher stage and the checks,
# TEACHER_ARGS more options for the teacher stage (e.g. "--video-init omnialign/worlds/glyphs/assets/video_teacher"
# to continue the shipped teacher), NOISY_ARGS for the video stage (e.g. "--video-stop-gold 0.45 --eval-every 10"),
# DEVICE=cpu a quick check of the script (with tiny step counts).
out=$(realpath -m $1); steps=${2:-8000}; noisy=${3:-400}
mkdir -p $out
shipped=omnialign/worlds/glyphs/assets
assets=${ASSETS:-$shipped}
if [ "$assets" != "$shipped" ]; then
  mkdir -p $assets && for part in gold recognizer; do ln -sfn $(realpath $shipped/$part) $assets/$part; done
fi
prepare="${PYTHON:-python} -m omnialign prepare glyphs --out $assets --device ${DEVICE:-cuda}"
# the teacher stops after TEACHER_LIMIT seconds if set; its last snapshot then stands in for it
timeout ${TEACHER_LIMIT:-0} $prepare --stages video_teacher --video-steps $steps --video-patch ${PATCH:-4} \
  --eval-every 500 --snapshots $out/snap $TEACHER_ARGS > $out/pretrain_log.txt 2>&1
status=$?
if [ $status = 124 ]; then
  last=$(ls -d $out/snap/video_teacher_* | tail -1)
  echo "video_teacher stopped at TEACHER_LIMIT=$TEACHER_LIMIT s; using $last" | tee -a $out/pretrain_log.txt
  rm -rf $assets/video_teacher && cp -r $last $assets/video_teacher
elif [ $status != 0 ]; then tail -30 $out/pretrain_log.txt; exit 1; fi
$prepare --stages video --video-noisy-steps $noisy --eval-every 50 --snapshots $out/snap $NOISY_ARGS \
  >> $out/pretrain_log.txt 2>&1 \
  || { tail -30 $out/pretrain_log.txt; exit 1; }
grep -o "video step.*" $out/pretrain_log.txt
tar -C $assets -cf $out/video_assets.tar video_teacher video pretrain.json
# the video stage's snapshots and the teacher's last four (each about 1.4 MB)
(cd $out/snap && tar -cf $out/snapshots.tar video_0* $(ls -d video_teacher_* | tail -4)) && rm -r $out/snap
[ "${LEARN:-1}" = 0 ] && exit 0
timeout ${LEARN_LIMIT:-0} ${PYTHON:-python} -m pytest --runslow -q -p no:cacheprovider tests/test_learning.py -k video -n 7 \
  --basetemp=/tmp/video_runs > $out/learning.txt 2>&1
grep -E "passed|failed|AssertionError|^FAILED" $out/learning.txt | tail -12
# one flat tar (the device returns no deep folders): each run's metrics.jsonl, summary.json and grids
cd /tmp/video_runs && find . \( -name metrics.jsonl -o -name summary.json -o -name "step_*.png" \) -print0 \
  | tar --null -T - -cf $out/runs.tar
