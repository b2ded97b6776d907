#!/usr/bin/env bash
# Fifty-second session: the mixed kernel's decode tiles prefetched into L2 (prefetch.global.L2) ahead of their TMA
# loads (ATTN_FUSED_HOPPER_MIXED_PREFETCH = tiles ahead). The diagnostic trees of calls 4-5 (decode_cost.sh's
# "same" and "prefill_same") put the decodes' whole cost beside M2's prefill in their TMA loads' DRAM latency.
# Usage (repository root; $OUT): bash prefetch.sh [tests] [ab]   (~190 s and ~200 s)
set -u
export PYTHONUNBUFFERED=1
for step in ${@:-tests ab}; do
  if [ "$step" = tests ]; then
    ATTN_FUSED_HOPPER_MIXED_PREFETCH=2 timeout 280 python3 -m pytest -q -m gpu tests/gpu/test_hopper_mixed_gpu.py \
      > $OUT/mixed_gpu_prefetch2.log 2>&1
    echo "mixed GPU tests, prefetch 2: rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/mixed_gpu_prefetch2.log | head; tail -1 $OUT/mixed_gpu_prefetch2.log
  else
    timeout ${LIMIT:-300} python3 -m benchmarks.env_ab \
      --cells "${CELLS:-M2 2k chunk,MX 2k chunk on 14k prefix + 128 decodes @2k non-paged,M1 2k prefill + 128 decodes @2k p16}" \
      --rounds ${ROUNDS:-4} ${VARIANTS:---variant ahead1=ATTN_FUSED_HOPPER_MIXED_PREFETCH=1 --variant ahead2=ATTN_FUSED_HOPPER_MIXED_PREFETCH=2 --variant ahead4=ATTN_FUSED_HOPPER_MIXED_PREFETCH=4} \
      --out $OUT/ab > $OUT/ab.log 2>&1
    echo "env_ab rc=$?"; grep -E "^\| M" $OUT/ab/env_ab.md; tail -3 $OUT/ab.log
  fi
done
