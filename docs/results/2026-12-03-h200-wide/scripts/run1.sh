#!/usr/bin/env bash
# Call 1: the wide mixed kernel (ATTN_FUSED_HOPPER_MIXED_WIDE) through its GPU tests, then bench_mixed's M1 / M2 and
# their probes (fused only) in alternating processes: main's mixed kernel, the wide kernel at 208 / 88 and at
# 216 / 72. Usage: BENCH_COMMIT=... bash run1.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT}
S=docs/results/2026-12-03-h200-wide/scripts
R=/tmp/wide && mkdir -p $R
save() { tar czf $OUT/wide.tgz -C /tmp wide; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt 2>&1
ATTN_FUSED_HOPPER_MIXED_WIDE=1 timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_hopper_mixed_gpu.py -k wide > $R/gpu-tests-wide.log 2>&1
rc=$?
tail -4 $R/gpu-tests-wide.log; echo "tests rc=$rc"
save
CELLS="M1 2k prefill + 128,M2 2k chunk,probe"
for i in 1 2; do
  for v in default wide wide216; do
    [ $i = 2 ] && [ $v = wide216 ] && continue
    [ $rc = 124 ] && [ $v != default ] && continue  # a hang in the tests: time main's kernel only
    case $v in
      default) unset ATTN_FUSED_HOPPER_MIXED_WIDE ;;
      wide) export ATTN_FUSED_HOPPER_MIXED_WIDE=1 ;;
      wide216) export ATTN_FUSED_HOPPER_MIXED_WIDE=128,2,16,2,216,72,168 ;;
    esac
    cells=$CELLS
    [ $i = 1 ] && [ $v = default ] && cells="$CELLS,M2 part: prefill"
    timeout 75 python3 -m benchmarks.bench_mixed --cells "$cells" --providers fused --quiet --out $R/$v$i \
      > $R/$v$i.log 2>&1
    echo "$v$i rc=$?"
    save
  done
done
unset ATTN_FUSED_HOPPER_MIXED_WIDE
python3 $S/summary.py $R | tee $R/summary.txt
save
