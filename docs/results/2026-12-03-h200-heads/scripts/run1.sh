#!/bin/bash
# Call 1 (2026-12-03, thirty-eighth session): the decode kernel with KV heads sharing a tile (HEADS,
# ATTN_FUSED_HOPPER_DECODE_HEADS) against the reference on the H200, then A/B against one head an item on the
# decode cells that missed cuDNN, cuDNN in the same process (the thirty-sixth session's tile_sweep.py). ~9 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
S=docs/results/2026-12-03-h200-sweep/scripts
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/gpu.txt
timeout 120 python3 -m pytest -q -x tests/gpu/test_hopper_decode_gpu.py -k "kv_heads or decode_kernel_matches" \
  2>&1 | tail -15 > $OUT/tests.txt
cat $OUT/tests.txt
H=ATTN_FUSED_HOPPER_DECODE_HEADS T=ATTN_FUSED_HOPPER_DECODE_TILE
timeout 230 python3 $S/tile_sweep.py --rounds 2 \
  --cells "32x2k p16|64x4k p16|128x2k p16|64x4k p16 served, FIFO pages|1x8k p16|8x4k p16|64x4k non-paged" \
  --variants "h2=$H=2" "h4=$H=4" "h2t128=$H=2;$T=128,3,1,168" 2>&1 | grep -v Warn | tee $OUT/sweep-gqa.txt
timeout 90 python3 $S/tile_sweep.py --rounds 2 --cells "64x4k p1|32x2k p1" --variants "h2=$H=2" 2>&1 | grep -v Warn \
  | tee $OUT/sweep-p1.txt
timeout 140 python3 $S/tile_sweep.py --rounds 2 --cells "64x4k MHA 32/32 p16|32x32k p16|32x4k verify q4 p16" \
  --variants "h2=$H=2" "h4=$H=4" "h8t128=$H=8;$T=128,3,1,168" 2>&1 | grep -v Warn | tee $OUT/sweep-mha.txt
