#!/bin/bash
# Call 6 (2026-12-03), carry [".device/fa4-b", ".device/fa4-c", ".device/flash_attn.sh"] on the machine call 5
# left warm: flash-attn-4 installed, then the decode and mixed suites twice (session 33's next_targets.sh: each
# verdict with its run-to-run spread) and benchmarks.targets over both. Outputs tarred (8 files come back).
export PYTHONUNBUFFERED=1 PYTHONPATH=. BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
cp .device/fa4-c/* /tmp/fa4w/ && bash .device/flash_attn.sh fa4-stage2 2>&1 | tail -1
R=/tmp/runs && mkdir -p $R
for run in a b; do
  timeout 125 python3 -m benchmarks.bench_mixed --budget-s 105 --quiet --out $R/$run > $R/$run-mixed.log 2>&1
  timeout 140 python3 -m benchmarks.bench_decode --budget-s 120 --quiet --cells "1x8k p16,32x2k p16,64x4k p16,128x2k p16,32x32k p16,MHA 32/32 p16,64x4k p1,32x2k p1,1x8k p1,non-paged" \
    --out $R/$run > $R/$run-decode.log 2>&1
done
python3 -m benchmarks.targets $R/a/decode.csv $R/a/mixed.csv $R/b/decode.csv $R/b/mixed.csv 2>&1 | tee $R/targets.md | head -60
tar czf $OUT/runs.tgz -C /tmp runs
