#!/bin/bash
# session 26, device call 1: where page 16's decode gap comes from (identity page table, non-paged), and the
# decode producers' L2 prefetch of the next tile's pages (ATTN_DECODE_PREFETCH 1: a line per page, 2: the KV
# head's rows), 4 ring stages; alternated processes, working tree (2c74d7c + the prefetch experiment)
export PYTHONUNBUFFERED=1
CELLS="64x4k p16,128x2k p16,32x2k p16,8x4k p16,1x32k p16,64x4k MQA,32x4k verify,ragged"
ab() { label=$1; shift; env "$@" PYTHONPATH=. timeout 150 python3 abtree/page_ab.py --label $label --only "$CELLS" $EXTRA 2>&1 | grep -v Warn; }
{
EXTRA="--identity --dense" ab base X=1
EXTRA="--mixed" ab pf1 ATTN_DECODE_PREFETCH=1
EXTRA="--mixed" ab pf2 ATTN_DECODE_PREFETCH=2
EXTRA="--mixed" ab base X=1
EXTRA="" ab st4 ATTN_FUSED_HOPPER_DECODE_TILE=64,4,1,168
EXTRA="" ab pf2 ATTN_DECODE_PREFETCH=2
EXTRA="" ab pf1 ATTN_DECODE_PREFETCH=1
} | tee $OUT/page-ab.txt
