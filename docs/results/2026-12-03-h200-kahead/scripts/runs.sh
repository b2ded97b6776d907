#!/usr/bin/env bash
# Forty-third session, call 5: the prefill kernel loads a KV tile whose 16-token pages lie one after another with
# one TMA load for K and one for V (the working tree: main + page-runs-branch.diff) against main before it (abtree:
# an export of `ed7d007`, which added bench_prefill's "served, page runs" chunks). First the Hopper GPU tests of the working tree (runs of pages
# among them), then tree_ab: the page-run chunks, the same chunks over pages in random order, M2's prefill part.
# Usage: bash runs.sh (from the repository root, abtree/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_gpu.py \
  > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu-tests.log
python3 -m benchmarks.tree_ab --tree main=abtree --tree runs=. \
  --cells "p16 served, page runs,chunk 2k on 30k p16,chunk 2k on 6k p16,M2 part: prefill" \
  --rounds 3 --passes 2 --timeout 100 --out $OUT/runs
