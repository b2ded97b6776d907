#!/usr/bin/env bash
# The seventy-second session's device calls (repository root; $OUT), chained inside the warm window:
#   one      carry [".device/fa4-a", ".device/old"]: the GPU and its clocks; flash-attn-4's first part staged; the
#            test files the seventy-first session's last fixes touched, whole, on CUDA; pre_step of 64 decodes on
#            this host, the head against 5a45880 (before its single validation, carried as .device/old), three
#            alternating rounds pinned to one core
#   two      carry [".device/fa4-b"]: the second part
#   targets  carry [".device/fa4-c"]: flash-attn-4 installed, then every target read again (bench_mixed,
#            bench_decode with every provider, the targets table, host_ab pinned; needs BENCH_COMMIT) ~590 s
#   suite    the whole GPU suite (13 shards, T=560), logs packed into $OUT/gpu-logs.tgz
# Usage: BENCH_COMMIT=<hash> bash docs/results/2026-12-06-s72/scripts/calls.sh STEP
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1
next=docs/results/2026-12-06-h100-66a9869/scripts/next.sh
for step in "$@"; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    one)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
      bash $next stage-a
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hf.py tests/test_inputs.py \
        tests/test_inference_params.py tests/test_selection.py > $OUT/changed.log 2>&1
      echo "changed files rc=$?"; tail -n 1 $OUT/changed.log; grep -E "^(FAILED|ERROR)" $OUT/changed.log | head -20
      for i in 1 2 3; do
        PYTHONPATH=$PWD timeout 40 taskset -c 5 python3 benchmarks/host_ab.py --label head
        PYTHONPATH=$PWD/.device/old timeout 40 taskset -c 5 python3 .device/old/benchmarks/host_ab.py --label 5a45880
      done 2>&1 | grep -v Warn | tee $OUT/host-ab.txt ;;
    two) bash $next stage-b ;;
    targets) bash $next install targets ;;
    suite) T=${T:-560} bash $next suite ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
