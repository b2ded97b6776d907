#!/usr/bin/env bash
# Call 2: pages of 16 (and 64) tokens gathered by cp.async, two programs an SM (the page-1 tile), against TMA.
# Usage: bash run2.sh (from the repository root; $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
probe=docs/results/2026-12-03-h200-sweep/scripts/tile_sweep.py
G="ATTN_FUSED_HOPPER_DECODE_GATHER_PAGES=16,64"
timeout 330 python3 $probe --cells "64x4k p16|64x4k p16 runs|128x2k p16|32x2k p16|8x4k p16|1x8k p16|32x32k p16|64x4k p64" \
  --variants "gather=$G" > $OUT/gather16.txt 2>&1
timeout 200 python3 $probe --cells "64x4k MHA p16|32x4k verify q4 p16|64x4k p1" --variants "gather=$G" \
  > $OUT/gather16-more.txt 2>&1
cat $OUT/*.txt
