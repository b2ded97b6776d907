#!/usr/bin/env bash
# Fifty-second session, last call: (1) env_ab of the prefetch variant's loop without its prefetches
# (ATTN_FUSED_HOPPER_MIXED_PREFETCH past every walk: the per-tile loads alone); (2) ncu's full set with source of the
# mixed launch on the 2k chunk on 14k + 128 decodes @2k (non-paged), main against the "same" diagnostic tree (each
# decode item re-reads two tiles: no DRAM traffic, same math), for the partitions' stall samples (sass_mix.py).
# Usage: bash ncu_same.sh (repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")" && pwd)
CELL="MX 2k chunk on 14k prefix + 128 decodes @2k non-paged"
timeout 150 python3 -m benchmarks.env_ab --cells "M2 2k chunk,M1 2k prefill + 128 decodes @2k p16" --rounds 3 \
  --variant "loop_only=ATTN_FUSED_HOPPER_MIXED_PREFETCH=100000" --out $OUT/ab > $OUT/ab.log 2>&1
echo "env_ab rc=$?"; grep -E "^\| M" $OUT/ab/env_ab.md | grep -v served
rm -rf /tmp/dc_same && mkdir -p /tmp/dc_same && cp -r attention benchmarks inference tests scripts pyproject.toml /tmp/dc_same/
(cd /tmp/dc_same && patch -p1 -s < "$HERE/../../2026-12-04-h200-7be5989/scripts/decode_cost/same.diff") || { echo "same.diff does not apply"; exit 1; }
R=$OUT/ncu && mkdir -p $R
for tree in main same; do
  dir=$PWD; [ $tree = same ] && dir=/tmp/dc_same
  (cd $dir && PYTHONPATH=$dir timeout 170 ncu --clock-control none --kernel-name regex:attention_mixed_hopper \
    --launch-skip 2 --launch-count 1 --set full --import-source yes -o $R/$tree \
    python3 -m benchmarks.run_cell --cells "$CELL" --calls 3 > $R/$tree.log 2>&1)
  echo "== ncu $tree (rc=$?)"
  ncu --import $R/$tree.ncu-rep --page details > $R/$tree.txt 2>&1
  ncu --import $R/$tree.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip -9 > $R/$tree-sass.csv.gz
  rm -f $R/$tree.ncu-rep
  grep -E "^    (Duration|DRAM Throughput|L2 Hit Rate|SM Frequency|Memory Throughput|Compute \(SM\) Throughput)" $R/$tree.txt
done
