#!/bin/bash
# Call 4 (2026-12-03, thirty-eighth session): bench_decode's own timing, one KV head an item
# (ATTN_FUSED_HOPPER_DECODE_HEADS=1) against kv_heads_per_item's rule (unset), alternating processes, three each,
# on the cells the rule changes; cuDNN in every process. ~4 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=. BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT}
R=/tmp/ab && mkdir -p $R
save() { tar czf $OUT/ab.tgz -C /tmp ab; }
CELLS="32x2k p16,64x4k p16,64x4k p1,128x2k p16,32x32k p16,MHA 32/32 p16"
for i in 1 2 3; do
  for v in one rule; do
    if [ $v = one ]; then export ATTN_FUSED_HOPPER_DECODE_HEADS=1; else unset ATTN_FUSED_HOPPER_DECODE_HEADS; fi
    timeout 100 python3 -m benchmarks.bench_decode --cells "$CELLS" --providers fused,sdpa_cudnn --quiet \
      --out $R/$v$i > $R/$v$i.log 2>&1
    save
  done
done
unset ATTN_FUSED_HOPPER_DECODE_HEADS
python3 -m benchmarks.targets one1=$R/one1/decode.csv rule1=$R/rule1/decode.csv one2=$R/one2/decode.csv \
  rule2=$R/rule2/decode.csv one3=$R/one3/decode.csv rule3=$R/rule3/decode.csv > $R/targets.md 2>&1
save
