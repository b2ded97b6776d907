#!/usr/bin/env bash
# Call 3: what the decode warps' loads cost beside M2's prefill: wide_probe.py on M2 whole and M2's prefill alone in
# the launch for main's kernel, the wide kernel, its decode warps loading only (real tiles, page ids read) and
# loading only the item's first tile again and again (L2 hits, no page ids), and computing only; three rounds.
# Usage: bash run3.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=docs/results/2026-12-03-h200-wide/scripts
R=/tmp/wide3 && mkdir -p $R
VARIANTS=main,wide,loads-only,loads-same,math-only CELLS="M2 whole,M2 prefill in launch" ROUNDS=3 \
  timeout 400 python3 $S/wide_probe.py --quiet > $R/probe.txt 2>&1
echo "probe rc=$?"
grep -v Warning $R/probe.txt
tar czf $OUT/wide3.tgz -C /tmp wide3
