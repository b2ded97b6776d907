#!/usr/bin/env bash
# The prefill producer reading a tile's page ids as scalars before it waits for the ring slot
# (early-page-rows.diff): their load's latency behind the wait, and no shuffles between the slot's release and
# the TMA loads (main extracts each page's row from a lane by a shuffle reduction after the wait). The Hopper
# GPU tests on that tree, then tree_ab against main.
# Setup, here (S: this scripts/ folder): exports of HEAD without docs/ in abtree and abtree3, then
#   (cd abtree3 && patch -p1 < $S/early-page-rows.diff)
# Usage: bash early.sh (from the repository root, abtree/ and abtree3/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
(cd abtree3 && PYTHONPATH=$PWD timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_gpu.py \
  tests/gpu/test_hopper_mixed_gpu.py > $OUT/gpu-tests.log 2>&1); echo "gpu tests rc=$?"
tail -3 $OUT/gpu-tests.log
python3 -m benchmarks.tree_ab --tree main=abtree --tree early=abtree3 \
  --cells "chunk 2k on 6k p16,chunk 2k on 30k p16,M2 part: prefill,M1 part: prefill,M2 2k chunk,M1 2k prefill" \
  --rounds 3 --passes 2 --timeout 120 --out $OUT/early
