#!/usr/bin/env bash
# Call 8: the held-back PV wait (abtree2/: dc7c80f's successor with wait-after-softmax.diff) under ncu's full set
# and source view on M2's prefill part, with the consumers' turns (flash-attn-4's d128 schedule) and without.
# Usage: bash ncu4.sh (from the repository root, abtree2/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
R=$OUT/ncu4 && mkdir -p $R
cd abtree2 && export PYTHONPATH=$PWD
for pp in 1 0; do
  ATTN_FUSED_HOPPER_PINGPONG=$pp timeout 150 ncu --clock-control none --kernel-name regex:attention_fwd_hopper \
    --launch-skip 2 --launch-count 1 --set full --import-source yes -o $R/held-pp$pp \
    python3 -m benchmarks.run_cell --cells "M2 part: prefill" --calls 3 > /dev/null 2>&1
  echo "== held, turns=$pp (rc=$?)"
  ncu --import $R/held-pp$pp.ncu-rep --page details > $R/held-pp$pp.txt 2>&1
  ncu --import $R/held-pp$pp.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip -9 > $R/held-pp$pp-sass.csv.gz
  rm -f $R/held-pp$pp.ncu-rep
  grep -E "Duration|SM Active|SM Frequency|highest-utilized|Executed Instructions  " $R/held-pp$pp.txt
done
