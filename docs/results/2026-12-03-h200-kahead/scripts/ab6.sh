#!/usr/bin/env bash
# Forty-third session, call 2: what 16-token pages cost our prefill kernel on M2's and M1's prefill parts (the same
# code, bench_mixed's prefill part read over 128-token pages, abtree5, or a non-paged cache, abtree6), and a producer
# that reads a tile's page ids as scalars instead of extracting them from one vector by shuffles (abtree7).
# Setup, here (each tree an export of HEAD without docs/; abtree*/ in .git/info/exclude; S: this scripts/ folder):
#   for d in abtree abtree5 abtree6 abtree7; do rm -rf $d; mkdir $d; git archive HEAD | tar -x -C $d; rm -rf $d/docs; done
#   (cd abtree5 && patch -p1 < ../$S/prefill-part-page128.diff); (cd abtree6 && patch -p1 < ../$S/prefill-part-dense.diff)
#   (cd abtree7 && patch -p1 < ../$S/scalar-pages.diff)
# Usage: bash ab6.sh (from the repository root, abtree/, abtree5/ .. abtree7/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/gpu.txt
python3 -m benchmarks.tree_ab --tree main=abtree --tree page128=abtree5 --tree dense=abtree6 --tree scalar-pages=abtree7 \
  --cells "part: prefill,chunk 2k on 30k p16,M2 2k chunk" --rounds 3 --passes 2 --timeout 110 --out $OUT/ab6
