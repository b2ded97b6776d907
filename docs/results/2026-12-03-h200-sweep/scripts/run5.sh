#!/bin/bash
# Call 3 (2026-12-03), carry ["abtree"]: small-page decodes (gathered) on latency-bound cells: fixed split counts (the
# kernel merges up to 16 itself, more take the merge launch) and one program an SM with deeper rings, cuDNN beside
# them; then the decode kernel's GPU tests on abtree/rule (branch split-sms: splits sized on the SMs,
# not on the programs, which gives the gathered 1x8k / 1x32k 16 splits and 8x4k 2).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
S=docs/results/2026-12-03-h200-sweep/scripts
T=ATTN_FUSED_HOPPER_DECODE_TILE G=ATTN_FUSED_HOPPER_DECODE_GATHER
timeout 240 python3 $S/tile_sweep.py --rounds 2 --cells "1x8k p1|1x8k p4|1x32k p1|8x4k p1" \
  --variants "split2=$T=64,3,1,168,2" "split4=$T=64,3,1,168,4" "split16=$T=64,3,1,168,16" \
  "split32=$T=64,3,1,168,32" "one6=$G=64,6,4,1,168" 2>&1 | grep -v Warn | tee $OUT/sweep-small.txt
cd abtree/rule && PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_hopper_decode_gpu.py 2>&1 | tail -5 | tee $OUT/rule-decode-tests.txt
