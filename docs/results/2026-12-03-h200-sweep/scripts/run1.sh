#!/bin/bash
# Call 1 (2026-12-03): decode tile / gather-tile / rounds variants on the cells that missed cuDNN, cuDNN in the
# same process. About 6 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
S=docs/results/2026-12-03-h200-sweep/scripts
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/gpu.txt
T=ATTN_FUSED_HOPPER_DECODE_TILE G=ATTN_FUSED_HOPPER_DECODE_GATHER R=ATTN_FUSED_HOPPER_DECODE_ROUNDS
timeout 330 python3 $S/tile_sweep.py --rounds 2 \
  --cells "32x2k p16|32x2k p16 served, page runs|1x8k p16|8x4k p16|64x4k p16|128x2k p16|64x4k MHA 32/32 p16" \
  --variants "s4=$T=64,4,1,168" "s5=$T=64,5,1,168" "s6=$T=64,6,1,168" "two=$T=64,3,2,128" "two2=$T=64,2,2,128" \
  "allprog=$R=0" 2>&1 | grep -v Warn | tee $OUT/sweep-p16.txt
timeout 200 python3 $S/tile_sweep.py --rounds 2 --cells "32x2k p1|1x8k p1|64x4k p1" \
  --variants "one4=$G=64,4,4,1,168" "one6=$G=64,6,4,1,168" "two2st=$G=64,2,4,2,128" "two2w=$G=64,3,2,2,128" \
  "allprog=$R=0" 2>&1 | grep -v Warn | tee $OUT/sweep-p1.txt
