#!/usr/bin/env bash
# Call 1 of the thirty-ninth session: where the page-1 cost lies (random pages against page runs, gathered alike),
# and MHA / GQA decode items of more KV heads over 128-key tiles. Usage: bash run1.sh (from the repository root; $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
probe=docs/results/2026-12-03-h200-sweep/scripts/tile_sweep.py
T128="ATTN_FUSED_HOPPER_DECODE_TILE=128,3,1,168"
timeout 150 python3 $probe --cells "64x4k p1|64x4k p1 runs|64x4k p16 runs|64x4k p16|64x4k non-paged" \
  > $OUT/page-order.txt 2>&1
timeout 220 python3 $probe --cells "64x4k MHA p16|64x4k MHA p16 runs|64x4k MHA non-paged" \
  --variants "h1=ATTN_FUSED_HOPPER_DECODE_HEADS=1" "t128h8=$T128" "t128h4=$T128;ATTN_FUSED_HOPPER_DECODE_HEADS=4" \
  > $OUT/mha-heads.txt 2>&1
timeout 150 python3 $probe --cells "64x4k p16|32x32k p16" \
  --variants "h1=ATTN_FUSED_HOPPER_DECODE_HEADS=1" "t128h2=$T128" > $OUT/gqa-heads.txt 2>&1
cat $OUT/*.txt
