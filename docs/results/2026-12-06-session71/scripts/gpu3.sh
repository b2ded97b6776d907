#!/usr/bin/env bash
# The seventy-first session's third call: the hopper-decode-mixed shard's tests that the second call did not reach
# before T=440 (its first 145 of 183 passed: test_hopper_decode_gpu.py whole and 68 of test_hopper_mixed_gpu.py's
# 102), by node id in the shard's order (rest-ids.txt); then test_inputs.py's window cases on CUDA (their reference
# compare failed on the device attribute in the second call).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1
here=docs/results/2026-12-06-session71/scripts
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_inputs.py -k "windows_past or alibi_slopes_may" \
  > $OUT/inputs.log 2>&1
echo "inputs rc=$?"; tail -n 1 $OUT/inputs.log
timeout 420 python3 -c "import pytest, sys; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'gpu', \
  *open('$here/rest-ids.txt').read().splitlines()]))" > $OUT/rest.log 2>&1
echo "rest rc=$?"; tail -n 2 $OUT/rest.log; grep -E "^_+ test" $OUT/rest.log | head
