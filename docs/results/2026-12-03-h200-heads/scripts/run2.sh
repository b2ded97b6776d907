#!/bin/bash
# Call 2 (2026-12-03, thirty-eighth session): two KV heads an item combined with two programs an SM (the thirty-sixth
# session's 0.9 % on 32x2k), on the large decode cells that missed cuDNN, cuDNN in the same process. ~6 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
S=docs/results/2026-12-03-h200-sweep/scripts
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/gpu.txt
H=ATTN_FUSED_HOPPER_DECODE_HEADS T=ATTN_FUSED_HOPPER_DECODE_TILE
timeout 330 python3 $S/tile_sweep.py --rounds 2 \
  --cells "32x2k p16|64x4k p16|128x2k p16|64x4k p16 served, FIFO pages|32x32k p16" \
  --variants "h2=$H=2" "two2=$T=64,2,2,128" "two3=$T=64,3,2,128" "h2two2=$H=2;$T=64,2,2,128" \
  "h2two3=$H=2;$T=64,3,2,128" 2>&1 | grep -v Warn | tee $OUT/sweep-gqa2.txt
timeout 150 python3 $S/tile_sweep.py --rounds 2 --cells "64x4k MHA 32/32 p16|64x4k MHA 32/32 p16 served, page runs" \
  --variants "h4=$H=4" "two2=$T=64,2,2,128" "h4two2=$H=4;$T=64,2,2,128" "h2=$H=2" 2>&1 | grep -v Warn \
  | tee $OUT/sweep-mha2.txt
