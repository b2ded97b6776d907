#!/usr/bin/env bash
# The seventy-fourth session's device calls (repository root; $OUT), chained inside the warm window:
#   first    carry [".device/hostold"] (attention, inference, benchmarks at 46dd309: before the module-call fast path
#            and the environment tokens): the host A/B of those two changes on the GPU's host (host_ab, old and new
#            trees alternating, pinned, four rounds each); then on an H200 the last session's h200 step (the tile
#            64,2,2,128 on every GQA decode cell, the prefill promotion on M2), elsewhere the GPU suite's shards
#            that the commits after 48a5c07 touch (all but flash) and the CPU test files of those commits, T=420                                    ~560 s
#   suite    the whole GPU suite but its flash shard (T=480)
#   cpuhost  on an H200 first the last session's h200 step; then the CPU suite (make test's `-m "not gpu"`) on this
#            CUDA host, its files in 14 parallel shards (T=420, or 240 after the h200 step): tests that assume no CUDA
#            (the first call found three in tests/test_te_compat.py)
# Usage: bash docs/results/2026-12-06-s74/scripts/calls.sh STEP ...
set -u
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
here=$(dirname "$0")
last=docs/results/2026-12-06-h100-dd9d8e8/scripts/calls.sh
gpu() { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; }
for step in "$@"; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    first)
      gpu | tee $OUT/gpu.txt
      python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
      for i in 1 2 3 4; do
        PYTHONPATH=.device/hostold timeout 30 taskset -c 5 python3 .device/hostold/benchmarks/host_ab.py --label old
        PYTHONPATH=$PWD timeout 30 taskset -c 5 python3 benchmarks/host_ab.py --label new
      done 2>&1 | grep -v Warn | tee $OUT/host-ab.txt
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        PYTHONPATH=$PWD bash $last h200
      else
        T=420 PYTHONPATH=$PWD bash $here/calls.sh suite
      fi ;;
    suite)
      export PYTHONPATH=$PWD
      timeout 60 python3 docs/results/2026-12-06-h100-dd9d8e8/scripts/check_promotion.py 2>&1 | grep -v Warn \
        | tee $OUT/check-promotion.txt
      ( timeout ${T:-480} python3 -m pytest -q -rs -p no:cacheprovider tests/test_module_call.py tests/test_selection.py \
          tests/test_tma_promotion.py tests/test_launch.py tests/test_te_compat.py tests/test_fused_backend.py \
          tests/test_cache_step_calls.py > $OUT/cpu-files.log 2>&1; echo "cpu files rc=$?" >> $OUT/cpu-files.log ) &
      SHARDS="kernels-a kernels-b variants hopper hopper-decode hopper-mixed hopper-mixed-roles grid-a grid-b grid-c grid-d cache-compile other-device" \
        T=${T:-480} bash scripts/gpu_tests.sh $OUT/gpu-logs
      echo "shards rc=$?"; for f in $OUT/gpu-logs/*.log; do echo "$(basename $f): $(tail -n 2 $f | tr '\n' ' ')"; done
      wait; tail -n 2 $OUT/cpu-files.log
      grep -hE "^(FAILED|ERROR)" $OUT/gpu-logs/*.log $OUT/cpu-files.log | head -20
      tar czf $OUT/gpu-logs.tgz -C $OUT gpu-logs && rm -r $OUT/gpu-logs ;;
    cpuhost)
      export PYTHONPATH=$PWD
      gpu
      T=420
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash $last h200; T=240; fi
      mkdir -p $OUT/cpuhost
      files=$(ls tests/test_*.py tests/gpu/test_*.py)
      for i in $(seq 0 12); do
        shard=$(echo $files | tr ' ' '\n' | awk -v i=$i 'NR % 13 == i')
        ( timeout $T python3 -m pytest -q -rs -p no:cacheprovider -m "not gpu" $shard > $OUT/cpuhost/$i.log 2>&1
          echo "rc=$?" >> $OUT/cpuhost/$i.log ) &
      done
      ( timeout $T python3 -m pytest -q -p no:cacheprovider -m "not gpu" attention inference benchmarks \
          > $OUT/cpuhost/doctests.log 2>&1; echo "rc=$?" >> $OUT/cpuhost/doctests.log ) &
      wait
      for f in $OUT/cpuhost/*.log; do echo "$(basename $f): $(tail -n 2 $f | tr '\n' ' ')"; done
      grep -hE "^(FAILED|ERROR)" $OUT/cpuhost/*.log | head -40 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
