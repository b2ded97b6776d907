#!/usr/bin/env bash
# Call 5: the PV wait held after the softmax (_after_softmax) against the tree without it (abtree/: the commit
# before, docs removed), alternating processes, two rounds: bench_prefill's d128 / d64 cells and bench_mixed's M1
# / M2 (fused only); then the Hopper prefill and mixed GPU tests on the new tree.
# Usage: bash ab1.sh (from the repository root, abtree/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
R=$OUT/ab1 && mkdir -p $R
P="MHA 32 causal 4x4k,MHA 32 full 4x4k,GQA 32/8 causal 1x16k,chunk 2k on 30k p16"
for round in 1 2; do
  for tree in base new; do
    dir=.; [ $tree = base ] && dir=abtree
    ( cd $dir && PYTHONPATH=$PWD timeout 120 python3 -m benchmarks.bench_mixed --providers fused --cells "M1,M2" \
        --quiet --out $R/$tree-mixed-$round > $R/$tree-mixed-$round.log 2>&1; echo "$tree mixed $round rc=$?" )
    ( cd $dir && PYTHONPATH=$PWD timeout 120 python3 -m benchmarks.bench_prefill --providers fused --cells "$P" \
        --quiet --out $R/$tree-prefill-$round > $R/$tree-prefill-$round.log 2>&1; echo "$tree prefill $round rc=$?" )
  done
done
for f in $R/*-*-[12]/*.md; do echo "== $f"; grep -E "^\| (M1|M2|d64|MHA|GQA|chunk)" $f | cut -d'|' -f2-4; done
export PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_gpu.py > $R/t-hopper.log 2>&1 &
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_mixed_gpu.py > $R/t-mixed.log 2>&1 &
wait; tail -2 $R/t-hopper.log $R/t-mixed.log
