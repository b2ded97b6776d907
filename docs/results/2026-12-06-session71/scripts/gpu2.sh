#!/usr/bin/env bash
# The seventy-first session's second call: the changed test files again (after the GPU-host fixes of their fused
# cases), then the shard that ran past T=380 in the first call (hopper-decode-mixed), alone.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1
timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/test_call_plans.py tests/test_fused_backend.py \
  tests/test_selection.py tests/test_inputs.py tests/test_cache_step_calls.py tests/test_inference_params.py \
  > $OUT/changed.log 2>&1
echo "changed files rc=$?"; tail -n 1 $OUT/changed.log; grep -E "^_+ test" $OUT/changed.log | head -20
SHARDS="hopper-decode-mixed" T=${T:-440} bash scripts/gpu_tests.sh $OUT/gpu-logs
echo "shard rc=$?"; tail -n 2 $OUT/gpu-logs/*.log
