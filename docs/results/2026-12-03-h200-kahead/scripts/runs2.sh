#!/usr/bin/env bash
# Forty-third session, call 6: the page-run loads predicated instead of branched on (the working tree: main +
# page-runs-predicated.diff) against main before them (abtree: an export of `ed7d007`): tree_ab on the chunks over pages in random order and in page runs,
# then the Hopper GPU tests of the paged cases (pages in runs among them).
# Usage: bash runs2.sh (from the repository root, abtree/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
python3 -m benchmarks.tree_ab --tree main=abtree --tree runs=. \
  --cells "chunk 2k on 6k p16,M2 part: prefill,chunk 2k on 30k p16 served" --rounds 3 --passes 1 --timeout 80 \
  --out $OUT/runs2
PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_gpu.py -k "paged" \
  > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu-tests.log
