#!/usr/bin/env bash
# Call 2: pingpong_ab.py on the head-dim-64 cells (and one d128 control), four rounds.
# Usage: bash run2.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=docs/results/2026-12-03-h200-pingpong/scripts
R=$OUT/pingpong2 && mkdir -p $R
git rev-parse HEAD > $R/commit.txt 2>&1; git status --short >> $R/commit.txt 2>&1
CELLS="MHA full 4x4k,d64 MHA 32 causal 4x4k,d64 MHA 32 full 4x4k,d64 GQA 32/8 causal 1x16k,d64 GQA 32/8 causal 4x4k,\
d64 GQA 32/8 full 4x4k,d64 MHA causal 16x1k,d64 MHA full 1x16k,d64 chunk 2k on 14k p16" \
ROUNDS=4 timeout 400 python3 $S/pingpong_ab.py > $R/ab.log 2>&1
echo "ab rc=$?"; grep -v Warning $R/ab.log | tail -80
