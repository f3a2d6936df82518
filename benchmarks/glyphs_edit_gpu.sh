#!/bin/bash
# The glyphs edit world on a GPU machine: pretrain the edit model at two settings of edit_copy (GPU 0), then train
# every glyphs_edit recipe from each for STEPS steps (both GPUs), validating every VAL_EVERY steps:
#   benchmarks/glyphs_edit_gpu.sh OUT [STEPS [VAL_EVERY]]
# writes OUT/pretrain_<v>/ (edit/, pretrain.json, log) and OUT/rl/ (glyphs_sweep.sh's runs and logs).
out=$1; steps=${2:-300}; every=${3:-50}
mkdir -p $out
for v in c05:0.5 c03:0.3; do
  name=${v%%:*}; d=$out/pretrain_$name; mkdir -p $d
  cp -r omnialign/worlds/glyphs/assets/{gold,recognizer,transformer,text_encoder} $d/
  CUDA_VISIBLE_DEVICES=0 ${PYTHON:-python} -m omnialign prepare glyphs --out $d --stages edit --edit-steps 2000 \
    --edit-copy ${v##*:} --eval-every 250 --device cuda > $d/log.txt 2>&1 &
done
wait
for v in c05 c03; do
  grep "edit step" $out/pretrain_$v/log.txt | tail -3
  [ -d $out/pretrain_$v/edit ] || { tail -20 $out/pretrain_$v/log.txt; exit 1; }
done
for v in c05 c03; do
  for r in glyphs_edit glyphs_edit_cps glyphs_edit_mixgrpo glyphs_edit_grpo_guard glyphs_edit_dppo glyphs_edit_nft \
           glyphs_edit_online_dpo; do
    echo "${r}_$v $r model.path=$out/pretrain_$v/edit"
  done
done | benchmarks/glyphs_sweep.sh $out/rl $steps $every
