#!/usr/bin/env bash
# The seventy-first session's device call (repository root; $OUT): the test files this session changed, on the GPU
# (fused on CUDA: copies and pickles after a Hopper launch, the kernels' interpreter mode, logging), then the whole
# GPU suite (scripts/gpu_tests.sh through the seventieth session's next.sh, logs packed into $OUT/gpu-logs.tgz).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_call_plans.py tests/test_fused_backend.py \
  tests/test_selection.py tests/test_inputs.py tests/test_cache_step_calls.py tests/test_inference_params.py \
  > $OUT/changed.log 2>&1
echo "changed files rc=$?"; tail -n 3 $OUT/changed.log; grep -E "^(FAILED|ERROR)" $OUT/changed.log | head -20
T=${T:-380} bash docs/results/2026-12-06-h100-66a9869/scripts/next.sh suite
echo "suite rc=$?"
