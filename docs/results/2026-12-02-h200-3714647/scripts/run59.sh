#!/bin/bash
# session 26, device call 10: bench_decode's served page-run cells (every decode cell that trails cuDNN on random
# pages), SDPA competitors
export PYTHONUNBUFFERED=1 PYTHONPATH=. BENCH_COMMIT=${BENCH_COMMIT:-unset}
timeout 200 python3 -m benchmarks.bench_decode --budget-s 170 --cells "served, page runs" --out /tmp/decode > /tmp/decode.log 2>&1; tail -1 /tmp/decode.log
cp /tmp/decode/decode.md /tmp/decode/decode.csv /tmp/decode/decode.png /tmp/decode.log $OUT/ 2>&1
grep "^| [0-9]" $OUT/decode.md | cut -c1-300 | head -8
