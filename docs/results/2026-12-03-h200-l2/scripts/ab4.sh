#!/usr/bin/env bash
# Prepared for the next session, not run (this session's device time ran out): the prefill and mixed kernels'
# producers loading K a tile ahead of V (k-ahead.diff), with and without the held-back PV wait. Four trees in turn (abtree/: main;
# .: main + k-ahead.diff; abtree2/: main + wait-after-softmax.diff; abtree3/: both diffs), env_ab's default only,
# three rounds a tree, then a second pass while the time lasts. Add GPU tests of the kept variant before merging.
# Setup, here (abtree*/ listed in .git/info/exclude; S=docs/results/2026-12-03-h200-l2/scripts):
#   for d in abtree abtree2 abtree3; do rm -rf $d; mkdir $d; git archive HEAD | tar -x -C $d; rm -rf $d/docs; done
#   git apply $S/k-ahead.diff; (cd abtree2 && patch -p1 < ../$S/wait-after-softmax.diff)
#   (cd abtree3 && patch -p1 < ../$S/wait-after-softmax.diff && patch -p1 < ../$S/k-ahead.diff)
# Usage: bash ab4.sh (from the repository root, abtree/, abtree2/, abtree3/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
R=$OUT/ab4 && mkdir -p $R
C="M2 part: prefill,chunk 2k on 30k p16,M2 2k chunk,M1 2k prefill"
for pass in 1 2; do
  [ $pass = 2 ] && [ $SECONDS -gt 120 ] && break
  for tree in base kahead held heldk; do
    dir=.; [ $tree = base ] && dir=abtree; [ $tree = held ] && dir=abtree2; [ $tree = heldk ] && dir=abtree3
    ( cd $dir && PYTHONPATH=$PWD timeout 90 python3 -m benchmarks.env_ab --cells "$C" --rounds 3 --quiet \
        --out $R/$tree-$pass > $R/$tree-$pass.log 2>&1; echo "$tree $pass rc=$? at ${SECONDS}s" )
    grep -E "^\| (M2|chunk)" $R/$tree-$pass/env_ab.md | cut -d'|' -f2-6
  done
done
