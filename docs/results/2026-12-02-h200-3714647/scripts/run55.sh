#!/bin/bash
# session 26, device call 5: the mixed kernel's prefill throttled (its producer sleeps ATTN_MIXED_SLEEP ns before
# each 64-key tile) so the decodes beside it keep the tensor cores' queue short; M1, alternated processes
export PYTHONUNBUFFERED=1
ab() { label=$1; shift; env "$@" PYTHONPATH=. timeout 200 python3 abtree/page_ab.py --label $label $EXTRA 2>&1 | grep -v Warn; }
EXTRA="--mixed --mixed-cells 1 --only none"
{
for i in 1 2; do
for ns in 0 300 800 1600 3000; do ab s$ns ATTN_MIXED_SLEEP=$ns; done
done
} | tee $OUT/sleep-ab.txt
