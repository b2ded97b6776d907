#!/usr/bin/env bash
# Call 5: the mixed kernel's register split 192 / 104 (consumers / decode warp group; MIXED_HOPPER_TILE's is
# 176 / 136): its GPU tests with the split forced, then bench_mixed's M1 / M2 and their probes (fused only),
# alternating processes, three rounds. Usage: BENCH_COMMIT=... bash run4.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT}
R=/tmp/ab && mkdir -p $R
save() { tar czf $OUT/ab.tgz -C /tmp ab; }
SPLIT="64,2,64,3,192,104,128"
ATTN_FUSED_HOPPER_MIXED_TILE=$SPLIT timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_hopper_mixed_gpu.py > $R/gpu-tests-192.log 2>&1
tail -2 $R/gpu-tests-192.log
save
CELLS="M1 2k prefill + 128,M2 2k chunk,probe"
for i in 1 2 3; do
  for v in default r192; do
    if [ $v = r192 ]; then export ATTN_FUSED_HOPPER_MIXED_TILE=$SPLIT; else unset ATTN_FUSED_HOPPER_MIXED_TILE; fi
    timeout 70 python3 -m benchmarks.bench_mixed --cells "$CELLS" --providers fused --quiet --out $R/$v$i \
      > $R/$v$i.log 2>&1
    save
  done
done
unset ATTN_FUSED_HOPPER_MIXED_TILE
for f in $R/*/mixed.csv; do echo "== $f"; grep -E ",fused," $f | cut -d, -f3,4,7; done > $R/summary.txt
save
cat $R/summary.txt
