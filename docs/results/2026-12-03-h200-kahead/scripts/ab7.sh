#!/usr/bin/env bash
# Forty-third session, call 4: the prefill kernel's K and V loads issued by two producer warps (K and the Q halves
# by one, V by another; abtree8, two-producers.diff) against main (abtree) and main's prefill parts over 128-token
# pages (abtree5, prefill-part-page128.diff: the most that fewer TMA issues could give). The mixed kernel is
# unchanged in abtree8 (M2 whole: a control).
# Setup, here (S: this scripts/ folder): exports of HEAD without docs/ in abtree, abtree5, abtree8, then
#   (cd abtree5 && patch -p1 < ../$S/prefill-part-page128.diff); (cd abtree8 && patch -p1 < ../$S/two-producers.diff)
# Usage: bash ab7.sh (from the repository root, abtree/, abtree5/, abtree8/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/gpu.txt
python3 -m benchmarks.tree_ab --tree main=abtree --tree two-producers=abtree8 --tree page128=abtree5 \
  --cells "part: prefill,chunk 2k on 30k p16,M2 2k chunk,d64 MHA 32 causal 4x4k,GQA 32/8 causal 1x16k" \
  --rounds 3 --passes 2 --timeout 140 --out $OUT/ab7
