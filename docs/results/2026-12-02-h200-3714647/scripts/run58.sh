#!/bin/bash
# session 26, device call 8: bench_decode's page-order cells (served after a history of earlier requests, prompts of
# different lengths: TE's FIFO list against the run allocator), beside the random-order and non-paged cells
export PYTHONUNBUFFERED=1 PYTHONPATH=. BENCH_COMMIT=${BENCH_COMMIT:-unset}
timeout 230 python3 -m benchmarks.bench_decode --budget-s 210 --cells "64x4k p16,128x2k p16,64x4k non-paged" --out /tmp/decode > /tmp/decode.log 2>&1; tail -1 /tmp/decode.log
cp /tmp/decode/decode.md /tmp/decode/decode.csv /tmp/decode/decode.png /tmp/decode.log $OUT/ 2>&1
grep "^| [0-9]" $OUT/decode.md | cut -c1-300 | head -8
