#!/usr/bin/env bash
# Call 1: the Hopper prefill and mixed GPU tests with the ping-pong on, then pingpong_ab.py (three rounds).
# Usage: bash run1.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=docs/results/2026-12-03-h200-pingpong/scripts
R=$OUT/pingpong && mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt 2>&1
git rev-parse HEAD > $R/commit.txt 2>&1; git status --short >> $R/commit.txt 2>&1
ATTN_FUSED_HOPPER_PINGPONG=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_hopper_gpu.py tests/gpu/test_hopper_mixed_gpu.py > $R/gpu-tests-pingpong.log 2>&1
echo "tests rc=$?"; tail -3 $R/gpu-tests-pingpong.log
ROUNDS=${ROUNDS:-3} timeout ${AB_LIMIT:-300} python3 $S/pingpong_ab.py > $R/ab.log 2>&1
echo "ab rc=$?"; cat $R/ab.log | grep -v Warning | tail -80
