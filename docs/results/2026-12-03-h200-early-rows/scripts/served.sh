#!/usr/bin/env bash
# M1 and M2 over pages in random order and over pages placed as InferenceParams' allocator places them (bench_mixed's
# "served, page runs" cells, 3a8f7db), main's mixed kernel (default) against the fortieth session's wide mixed kernel
# (ATTN_FUSED_HOPPER_MIXED_WIDE=1, ../../2026-12-03-h200-wide/scripts/wide-kernel.diff): do the decodes in one launch
# cost less when their pages lie in runs (fewer address translations beside the prefill)? env_ab, one process, three
# rounds; the parts alone (prefill and decode kernels) for reference.
# Setup, here: an export of HEAD without docs/ in abtree4, then (cd abtree4 && patch -p1 < ../$S/wide-kernel-at-3a8f7db.diff)
# (S: this scripts/ folder; the fortieth session's diff rebased on the ping-pong of ee7fdd6: _prefill_tiles takes
# ROW_SIDE_MASKS after PINGPONG_GROUP)
# Usage: bash served.sh (from the repository root, abtree4/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
cd abtree4 && PYTHONPATH=$PWD timeout 500 python3 -m benchmarks.env_ab \
  --cells "M2 2k chunk,M2 part,M2 probe,M2 served,M1 2k prefill,M1 probe,M1 served probe" --rounds 3 \
  --variant "wide=ATTN_FUSED_HOPPER_MIXED_WIDE=1" --quiet --out $OUT/served
