#!/usr/bin/env bash
# Prepared for the next session, not run (this session's device time ran out): the prefill and mixed kernels'
# producers loading K a tile ahead of V (k-ahead.diff), with and without the held-back PV wait. Four trees in turn
# by benchmarks/tree_ab.py (abtree/: main; .: main + k-ahead.diff; abtree2/: main + wait-after-softmax.diff;
# abtree3/: both diffs), three rounds a tree, one pass (about 4-5 minutes; a second pass if time allows). Run the
# GPU tests of the kept variant before merging it.
# Setup, here (abtree*/ listed in .git/info/exclude; S=docs/results/2026-12-03-h200-l2/scripts):
#   for d in abtree abtree2 abtree3; do rm -rf $d; mkdir $d; git archive HEAD | tar -x -C $d; rm -rf $d/docs; done
#   git apply $S/k-ahead.diff; (cd abtree2 && patch -p1 < ../$S/wait-after-softmax.diff)
#   (cd abtree3 && patch -p1 < ../$S/wait-after-softmax.diff && patch -p1 < ../$S/k-ahead.diff)
# Usage: bash ab4.sh (from the repository root, abtree/, abtree2/, abtree3/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
python3 -m benchmarks.tree_ab --tree main=abtree --tree k-ahead=. --tree held=abtree2 --tree both=abtree3 \
  --cells "M2 part: prefill,chunk 2k on 30k p16,M2 2k chunk,M1 2k prefill" --rounds 3 --passes 1 --timeout 150 \
  --out $OUT/ab4
