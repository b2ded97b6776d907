#!/bin/bash
# session 26, device call 7: run56's bench_decode cells again, the harness now keeping paged timings apart by page
# order (run56 shared the random-order timings with the served cells)
export PYTHONUNBUFFERED=1 PYTHONPATH=. BENCH_COMMIT=75766c1+memo-fix
timeout 200 python3 -m benchmarks.bench_decode --budget-s 180 --cells "64x4k p16,128x2k p16,64x4k non-paged" --out /tmp/decode > /tmp/decode.log 2>&1; tail -1 /tmp/decode.log
cp /tmp/decode/decode.md /tmp/decode/decode.csv /tmp/decode/decode.png /tmp/decode.log $OUT/ 2>&1
grep "^| [0-9]" $OUT/decode.md | cut -c1-300 | head -8
