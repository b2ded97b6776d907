#!/usr/bin/env bash
# The sixty-eighth session's device calls (repository root; $OUT):
#   verify   the sixty-seventh session's untried GPU tests (its next.sh verify: the mixed kernel's device rule at its
#            threshold, the pair, captured steps, serving and input-layout tests with one-row decodes run as thd)
#   tail     the Gluon prefill kernel zeroing thd tail rows itself: tests/gpu/test_kernels_gpu.py -k zero_tail and the
#            Hopper prefill GPU tests, then tail_ab.py (against the memset it replaces, three rounds)
#   last     the first step cut to ~250 s: the tail tests, the device rule's new tests, tail_ab.py one round
#   first    one call of the two's most needed parts within 450 s, in this order: the tail tests, the device rule's new tests, the
#            captured-step / serving / input-layout tests (one-row decodes as thd), tail_ab.py two rounds
# Usage: bash docs/results/2026-12-05-s68/scripts/session.sh STEP ...
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1
here=docs/results/2026-12-05-s68/scripts
for step in "$@"; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    verify) bash docs/results/2026-12-05-h100-da2b7c2/scripts/next.sh verify ;;
    tail)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
      timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu/test_kernels_gpu.py -k zero_tail \
        tests/gpu/test_hopper_gpu.py > $OUT/tail-tests.log 2>&1
      echo "zero_tail + Hopper prefill GPU tests rc=$?"; tail -n 3 $OUT/tail-tests.log
      timeout 240 python3 $here/tail_ab.py --rounds 3 2>&1 | tee $OUT/tail-ab.txt ;;
    first)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
      timeout 120 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu/test_kernels_gpu.py -k zero_tail \
        tests/gpu/test_hopper_gpu.py > $OUT/tail-tests.log 2>&1
      echo "zero_tail + Hopper prefill GPU tests rc=$?"; tail -n 3 $OUT/tail-tests.log
      timeout 100 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/gpu/test_hopper_mixed_gpu.py \
        -k "device_rule_turns or device_lengths or captured_pair" tests/gpu/test_hopper_direct_launch_gpu.py \
        > $OUT/rule-new.log 2>&1
      echo "new device-rule tests rc=$?"; grep -c PASSED $OUT/rule-new.log; tail -n 1 $OUT/rule-new.log
      timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_decode_graph.py \
        tests/gpu/test_serving_gpu.py tests/gpu/test_input_layouts_gpu.py > $OUT/steps.log 2>&1
      echo "captured steps + serving + input layouts rc=$?"; tail -n 3 $OUT/steps.log
      timeout 70 python3 $here/tail_ab.py --rounds 2 2>&1 | tee $OUT/tail-ab.txt ;;
    last)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
      timeout 110 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu/test_kernels_gpu.py -k zero_tail \
        tests/gpu/test_hopper_gpu.py > $OUT/tail-tests.log 2>&1
      echo "zero_tail + Hopper prefill GPU tests rc=$?"; tail -n 3 $OUT/tail-tests.log
      timeout 80 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/gpu/test_hopper_mixed_gpu.py \
        -k "device_rule_turns or device_lengths or captured_pair" tests/gpu/test_hopper_direct_launch_gpu.py \
        > $OUT/rule-new.log 2>&1
      echo "new device-rule tests rc=$?"; grep -c PASSED $OUT/rule-new.log; tail -n 1 $OUT/rule-new.log
      timeout 50 python3 $here/tail_ab.py --rounds 1 2>&1 | tee $OUT/tail-ab.txt ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
