#!/usr/bin/env bash
# The GPU runs behind "exact and repeatable" (docs/engine.md, BENCHMARKS.md), on one H200, in stages that each fit
# a 10-minute command; everything worth keeping is packed into OUT/results-STAGE.tar (flat: logs, JSON, metrics,
# last grids).
#   benchmarks/exact_gpu.sh OUT cost     # trainer.deterministic's cost: glyphs and choice runs in same-seed pairs
#                                        # (benchmarks/same_seed.py), the full-size Qwen-Image FlowGRPO LoRA step
#   benchmarks/exact_gpu.sh OUT phase1   # make test-gpu-1 beside two 300-step deterministic glyphs_online_dpo runs
#                                        # started together; then compares their metrics.jsonl
#   benchmarks/exact_gpu.sh OUT phase2   # make test-gpu-2
#   benchmarks/exact_gpu.sh OUT decode   # the decoders' log-probs against training at realistic logits (Qwen3-4B)
set -uo pipefail
out=$1
shift
work=/tmp/exact
mkdir -p "$out" "$work"
pack() {  # pack STAGE: the stage's files under $work, flat enough to come back
    (cd "$work" && find . -name '*.log' -o -name '*.json' -o -name 'metrics.jsonl' -o -name 'summary.json' \
        -o -name 'step_000300.png' -o -name 'step_000008.png' | tar -cf "$out/results-$1.tar" -T -)
}
for stage in "$@"; do
    case $stage in
    cost)
        python3 benchmarks/same_seed.py "$work/same_seed" 8 glyphs glyphs_online_dpo choice_gspo \
            --set trainer.val_every=100 >"$work/same_seed.log" 2>&1
        tail -4 "$work/same_seed.log"
        python3 -m omnialign bench recipe --recipe qwen_image_ocr_flowgrpo_lora --prompts 1 --steps 2 \
            --deterministic both --work /tmp/bench --out "$work/qwen_image_deterministic.json" \
            >"$work/qwen_image_deterministic.log" 2>&1
        tail -5 "$work/qwen_image_deterministic.log"
        ;;
    phase1)
        pids=()
        for name in a b; do
            python3 -m omnialign train glyphs_online_dpo name=$name trainer.total_steps=300 \
                trainer.deterministic=true trainer.progress=false "trainer.output_dir=$work/r300" \
                >"$work/r300_$name.log" 2>&1 &
            pids+=($!)
        done
        make test-gpu-1 2>&1 | tee "$work/phase1.log" | tail -4
        wait "${pids[@]}"
        python3 - "$work/r300" <<'EOF'
import sys
from pathlib import Path
from omnialign.metrics import read_metrics, without_timing
runs = [without_timing(read_metrics(Path(sys.argv[1]) / n / "metrics.jsonl")) for n in ("a", "b")]
last = runs[0][-1]
print(f"300-step glyphs_online_dpo pair: {len(runs[0])} and {len(runs[1])} records, identical: {runs[0] == runs[1]};"
      f" step 300 val reward {last.get('val/reward/mean')}, gold {last.get('val/gold/accuracy')}")
EOF
        ;;
    phase2)
        make test-gpu-2 2>&1 | tee "$work/phase2.log" | grep -E "passed|failed|peak|gap|Error" | tail -30
        ;;
    decode)
        python3 -m omnialign bench decode --model-size 4b --prompts 32 --max-new-tokens 48 --logit-scale 10 \
            --out "$work/decode.json" >"$work/decode.log" 2>&1
        tail -7 "$work/decode.log"
        ;;
    esac
    pack "$stage"
done
