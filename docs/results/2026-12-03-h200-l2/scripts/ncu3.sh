#!/usr/bin/env bash
# Call 4: our prefill kernel on M2's prefill part with the consumers' turns (ATTN_FUSED_HOPPER_PINGPONG=1, off at
# d128 by default) under ncu's full set, its source view (call 3 has the free-issue one), and both settings timed
# on M1's and M2's prefill parts (env_ab, three rounds).
# Usage: bash ncu3.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/ncu3 && mkdir -p $R
ATTN_FUSED_HOPPER_PINGPONG=1 timeout 200 ncu --clock-control none --kernel-name regex:attention_fwd_hopper \
  --launch-skip 2 --launch-count 1 --set full --import-source yes -o $R/turns-m2 \
  python3 -m benchmarks.run_cell --cells "M2 part: prefill" --calls 3 > $R/turns-m2.log 2>&1
echo "== full, turns (rc=$?)"; tail -1 $R/turns-m2.log
ncu --import $R/turns-m2.ncu-rep --page details > $R/turns-m2.txt 2>&1
ncu --import $R/turns-m2.ncu-rep --page source --csv --print-source sass > $R/turns-m2-sass.csv 2>&1
rm -f $R/turns-m2.ncu-rep
grep -E "Duration|SM Active|SM Frequency|highest-utilized|Warp Cycles Per Issued|Executed Instructions  " $R/turns-m2.txt
timeout 240 python3 -m benchmarks.env_ab --cells "M2 part: prefill,M1 part: prefill" --rounds 3 --quiet \
  --variant free=ATTN_FUSED_HOPPER_PINGPONG=0 --variant turns=ATTN_FUSED_HOPPER_PINGPONG=1 --out $R/ab > $R/ab.log 2>&1
echo "== env_ab (rc=$?)"; cat $R/ab/env_ab.md 2>/dev/null || tail -20 $R/ab.log
