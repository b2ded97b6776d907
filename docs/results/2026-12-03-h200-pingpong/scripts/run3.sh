#!/usr/bin/env bash
# Call 4 (after `bash .device/flash_attn.sh fa4-stage1` in call 3): flash-attn-4 installed, bench_prefill's d64 cells
# beside flash-attn-4 and SDPA cuDNN (ping-pong on at d64 by default, then off), then the GPU suite.
# Usage: BENCH_COMMIT=... bash run3.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT}
cp .device/fa4-c/* /tmp/fa4w/ && bash .device/flash_attn.sh fa4-stage2 > /dev/null 2>&1
R=$OUT/pingpong3 && mkdir -p $R
python3 -c "import torch, triton, flash_attn.cute; print(torch.__version__, triton.__version__)" > $R/versions.txt 2>&1
timeout 60 python3 -m benchmarks.bench_prefill --cells d64 --providers fused,flash4,sdpa_cudnn --quiet \
  --out $R/d64 > $R/d64.log 2>&1; echo "d64 rc=$?"
ATTN_FUSED_HOPPER_PINGPONG=0 timeout 45 python3 -m benchmarks.bench_prefill --cells d64 --providers fused --quiet \
  --out $R/d64-free > $R/d64-free.log 2>&1; echo "d64-free rc=$?"
T=330 bash scripts/gpu_tests.sh $R/gpu-suite > $R/gpu-suite.txt 2>&1; echo "suite rc=$?"
cat $R/versions.txt; grep -h "d64" $R/d64/*.md $R/d64-free/*.md 2>/dev/null | head -20; cat $R/gpu-suite.txt
