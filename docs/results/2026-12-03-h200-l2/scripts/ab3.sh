#!/usr/bin/env bash
# Call 7: is the slowdown of call 5 the bar.arrive's cost or the new order? Three trees in alternating processes,
# two passes: abtree/ (without _after_softmax), . (the arrive before the PV wait: the wait after the softmax),
# abtree2/ (the same arrive at the top of the next step: the order of abtree/, the arrive's cost only).
# Usage: bash ab3.sh (from the repository root, abtree/ and abtree2/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
R=$OUT/ab3 && mkdir -p $R
C="M2 part: prefill,chunk 2k on 30k p16"
for pass in 1 2; do
  for tree in base before top; do
    dir=.; [ $tree = base ] && dir=abtree; [ $tree = top ] && dir=abtree2
    ( cd $dir && PYTHONPATH=$PWD timeout 150 python3 -m benchmarks.env_ab --cells "$C" --rounds 2 --quiet \
        --variant same=ATTN_FUSED_HOPPER_PINGPONG=0 --out $R/$tree-$pass > $R/$tree-$pass.log 2>&1
      echo "$tree $pass rc=$?" )
    grep -E "^\| (M2|chunk)" $R/$tree-$pass/env_ab.md | cut -d'|' -f2-6
  done
done
