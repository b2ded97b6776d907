#!/bin/bash
# session 26, device call 2: random page order's cost, translation or DRAM order (pages shuffled within 2 MB
# blocks), and the mixed kernel on whole rounds of its (sequence, KV head) walks (ATTN_MIXED_ROUNDS=1),
# alternated processes
export PYTHONUNBUFFERED=1
ab() { label=$1; shift; env "$@" PYTHONPATH=. timeout 200 python3 abtree/page_ab.py --label $label $EXTRA 2>&1 | grep -v Warn; }
{
EXTRA="--identity --blocks --dense --only 64x4k_p16,128x2k_p16,32x32k_p16" ab base X=1
for i in 1 2; do
EXTRA="--mixed --mixed-cells 2 --only none" ab rounds ATTN_MIXED_ROUNDS=1
EXTRA="--mixed --mixed-cells 2 --only none" ab base X=1
done
} | tee $OUT/page-ab2.txt
