#!/usr/bin/env bash
# OUT=$OUT bash benchmarks/decode_h100_7975e9e/candidates/flat.sh, on the device from the repository root (the
# site's wheels in .dev/site_min.tar.xz, as the session notes build it): the candidate draw beside the code's, the
# flattened attention alone (every config), then in the compiled decoder at batch 128 with the micro's best config at
# 128 x 320 beside the code (one process).
set -uo pipefail
mkdir -p /tmp/site && tar xJf .dev/site_min.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 benchmarks/decode_h100_7975e9e/candidates/flat_bench.py draw 2>&1 | tee $OUT/draw4x.log
python3 benchmarks/decode_h100_7975e9e/candidates/flat_bench.py micro $OUT/flat_micro.json 2>&1 | tee $OUT/flat_micro.log | cut -c1-400
for b in ${BATCHES:-128}; do
    python3 benchmarks/decode_h100_7975e9e/candidates/flat_bench.py decode $OUT/flat_decode.jsonl $b $OUT/flat_micro.json >$OUT/flat_decode_b$b.log 2>&1
    echo "decode batch $b rc=$?"; grep -E "^(==|FLAT)" $OUT/flat_decode_b$b.log
done
