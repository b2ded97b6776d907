#!/usr/bin/env bash
# The sixty-eighth session's device calls (repository root; $OUT):
#   verify   the sixty-seventh session's untried GPU tests (its next.sh verify: the mixed kernel's device rule at its
#            threshold, the pair, captured steps, serving and input-layout tests with one-row decodes run as thd)
#   tail     the Gluon prefill kernel zeroing thd tail rows itself: tests/gpu/test_kernels_gpu.py -k zero_tail and the
#            Hopper prefill GPU tests, then tail_ab.py (against the memset it replaces, three rounds)
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
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
