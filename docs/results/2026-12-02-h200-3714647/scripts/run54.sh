#!/bin/bash
# session 26, device call 4: the decode kernel's items by SM id (ATTN_DECODE_SMID=1, on 132 programs: a sequence's
# KV heads on neighbouring SMs) against program ids on 132 programs and the default 128; alternated processes
export PYTHONUNBUFFERED=1
ab() { label=$1; shift; env "$@" PYTHONPATH=. timeout 200 python3 abtree/page_ab.py --label $label $EXTRA 2>&1 | grep -v Warn; }
EXTRA="--dense --only 64x4k_p16,128x2k_p16,32x32k_p16,64x4k_MHA"
{
for i in 1 2; do
ab smid ATTN_FUSED_HOPPER_DECODE_ROUNDS=0 ATTN_DECODE_SMID=1
ab pid132 ATTN_FUSED_HOPPER_DECODE_ROUNDS=0
ab base X=1
done
} | tee $OUT/smid-ab.txt
