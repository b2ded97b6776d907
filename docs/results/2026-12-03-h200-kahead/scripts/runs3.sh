#!/usr/bin/env bash
# Prepared for the next session, not run (this session's device time was spent): the page-run loads branched on a
# warp vote (page-runs-vote.diff: page-runs-branch.diff with the branch's condition passed through
# `vote.sync.all`, which ptxas sees as uniform across the warp). Its sm90 SASS (Triton 3.6, the d128 page-16 launch):
# the producer 416 instructions against main's 390, one BSSY, 18 WARPSYNC / ELECT against main's 16 (the branch
# without the vote: 840, 24, 102). Triton 3.9's ptxas spills 4 B in that launch (main: none); 3.6's, the H200's,
# none. First the Hopper GPU tests (pages in runs among them), then tree_ab against main.
# Setup, here (S: this scripts/ folder): an export of HEAD without docs/ in abtree; in the working tree
#   git apply $S/page-runs-vote.diff
# Usage: bash runs3.sh (from the repository root, abtree/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=$PWD timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_gpu.py \
  > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu-tests.log
python3 -m benchmarks.tree_ab --tree main=abtree --tree vote=. \
  --cells "chunk 2k on 6k p16,chunk 2k on 30k p16,M2 part: prefill,M1 part: prefill" --rounds 3 --passes 2 \
  --timeout 100 --out $OUT/runs3
