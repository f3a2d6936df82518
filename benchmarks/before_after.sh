#!/usr/bin/env bash
# One `omnialign bench recipe` before and after a change of the library, on one card: a process each, in the order
# before, after, after, before (ABBA), so that the card's drift over the call (clocks at its power cap, a cold
# compile cache on a fresh machine) shows rather than biases the comparison. nvidia-smi logs the SM clock, power and
# utilization each second beside each run. Issue 32's rollout without host syncs was measured this way.
#   benchmarks/before_after.sh OUT BEFORE BENCH_ARGS...
#   e.g. benchmarks/before_after.sh OUT .dev/before --recipe flux_kontext_edit_flowgrpo_lora --prompts 2 --steps 3 \
#        --set engine.fp8=true rollout.grad_graph=true engine.fp8_backward=true engine.checkpoint_every=4 \
#        actor.micro_batch_size=4 rollout.micro_batch_size=4
# BEFORE holds the package's changed files as they were (omnialign/...), laid over a copy of the working tree's
# package; make it on the development machine from a revision REV (files added since REV stay as they are):
#   git diff --name-only REV -- omnialign | while read f; do mkdir -p BEFORE/$(dirname $f); git show REV:$f > BEFORE/$f; done
# ORDER="before after" runs each once. Writes OUT/{before,after}{1,2}.{json,log,smi.csv}; prints each warm step and
# each run's mean SM clock, power and utilization over its last 48 busy seconds (power over 300 W).
set -uo pipefail
out=$1 before=$2
shift 2
mkdir -p "$out"
rm -rf /tmp/before_tree && mkdir -p /tmp/before_tree && cp -r omnialign /tmp/before_tree/ && cp -r "$before"/. /tmp/before_tree/
declare -A seen=()
for code in ${ORDER:-before after after before}; do
    seen[$code]=$((${seen[$code]:-0} + 1))
    name=$code${seen[$code]}
    tree=$PWD
    [ "$code" = before ] && tree=/tmp/before_tree
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu,clocks_event_reasons.active --format=csv,noheader \
        -lms 1000 >"$out/$name.smi.csv" 2>&1 &
    smi=$!
    (cd "$tree" && PYTHONPATH=$tree:${PYTHONPATH:-} python3 -m omnialign bench recipe "$@" --work "/tmp/bench_$name" \
        --out "$out/$name.json" >"$out/$name.log" 2>&1)
    echo "$name rc=$?"
    kill $smi 2>/dev/null
done
python3 - "$out" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
print("run | step | step_s | rollout_s | update_s | mfu | clock MHz | W | util %")
for log in sorted(out.glob("*.log")):
    smi = [line.split(", ") for line in (out / f"{log.stem}.smi.csv").read_text().splitlines() if line.count(",") >= 4]
    busy = [[float(r[i].split()[0]) for i in (1, 2, 3)] for r in smi if float(r[2].split()[0]) > 300][-48:]
    card = " | ".join(str(round(statistics.mean(c[i] for c in busy), 1)) for i in range(3)) if busy else "- | - | -"
    for line in log.read_text().splitlines():
        if line.startswith("{") and json.loads(line)["step"] > 1:
            r = json.loads(line)
            print(f"{log.stem} | {r['step']} | {r['step_s']} | {r['rollout_s']} | {r['update_s']} | {r['mfu']} | {card}")
PY
