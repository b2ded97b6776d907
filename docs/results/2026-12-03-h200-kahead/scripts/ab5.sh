#!/usr/bin/env bash
# Forty-third session, call 1: the producers loading K a tile ahead of V (k-ahead.diff), alone and with each of the
# forty-second session's other two diffs, against main and against no-p16-deps.diff alone. Five trees in turn by
# benchmarks/tree_ab.py, three rounds a tree, one pass. Diffs in ../../2026-12-03-h200-l2/scripts/.
# Setup, here (abtree*/ listed in .git/info/exclude; S=docs/results/2026-12-03-h200-l2/scripts):
#   for d in abtree abtree2 abtree3 abtree4; do rm -rf $d; mkdir $d; git archive HEAD | tar -x -C $d; rm -rf $d/docs; done
#   git apply $S/k-ahead.diff; (cd abtree2 && patch -p1 < ../$S/no-p16-deps.diff)
#   (cd abtree3 && patch -p1 < ../$S/k-ahead.diff && patch -p1 < ../$S/no-p16-deps.diff)
#   (cd abtree4 && patch -p1 < ../$S/k-ahead.diff && patch -p1 < ../$S/wait-after-softmax.diff)
# Usage: bash ab5.sh (from the repository root, abtree/ .. abtree4/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/gpu.txt
python3 -m benchmarks.tree_ab --tree main=abtree --tree k-ahead=. --tree no-p16=abtree2 --tree k-ahead+no-p16=abtree3 \
  --tree k-ahead+held=abtree4 --cells "M2 part: prefill,chunk 2k on 30k p16,M2 2k chunk,M1 2k prefill" --rounds 3 \
  --passes 1 --timeout 110 --out $OUT/ab5
