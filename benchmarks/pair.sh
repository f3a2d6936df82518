#!/bin/bash
# Two `omnialign bench recipe` runs side by side, one per GPU of a 2-GPU machine, so that a
# before/after comparison shares the machine and the moment:
#   benchmarks/pair.sh OUT NAME_A "ARGS_A" NAME_B "ARGS_B"
# writes OUT/NAME_{A,B}.json and .log.
out=$1
CUDA_VISIBLE_DEVICES=0 ${PYTHON:-python} -m omnialign bench recipe $3 --work /tmp/bench_$2 --out $out/$2.json > $out/$2.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 ${PYTHON:-python} -m omnialign bench recipe $5 --work /tmp/bench_$4 --out $out/$4.json > $out/$4.log 2>&1 &
wait
for n in $2 $4; do echo "== $n"; grep -v Warning $out/$n.log | tail -4; done
