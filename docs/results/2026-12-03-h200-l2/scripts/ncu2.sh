#!/usr/bin/env bash
# Call 3 (after `bash .device/flash_attn.sh fa4-stage1` in call 2): flash-attn-4 installed, then its prefill
# kernel on M1's and M2's prefill parts under ncu (the metrics of ncu1.sh), then the full set with the source
# view (SASS, stall samples) of its kernel and ours on M2's prefill part.
# Usage: bash ncu2.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/fa4-c/* /tmp/fa4w/ 2>/dev/null; bash .device/flash_attn.sh fa4-stage2 2>&1 | tail -1
R=$OUT/ncu2 && mkdir -p $R
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
M=$M,lts__t_sectors_op_read.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_active.avg
M=$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,launch__grid_size
M=$M,launch__registers_per_thread,launch__block_size
K='regex:flash|Flash'
i=0
for cell in "M2 part: prefill" "M1 part: prefill"; do
  i=$((i+1))
  timeout 150 ncu --clock-control none --kernel-name "$K" --launch-skip 2 --launch-count 2 --metrics $M --csv \
    python3 -m benchmarks.run_cell --cells "$cell" --providers flash4 --calls 3 > $R/m$i.csv 2> $R/m$i.err
  echo "== flash4 $cell (rc=$?)"; grep -v '^==PROF==' $R/m$i.csv | grep -v '| ran' | cut -d, -f5,12- | head -30
done
for provider in flash4 fused; do
  timeout 200 ncu --clock-control none --kernel-name "$( [ $provider = fused ] && echo regex:attention_fwd_hopper || echo "$K")" \
    --launch-skip 2 --launch-count 1 --set full --import-source yes -o $R/$provider-m2 \
    python3 -m benchmarks.run_cell --cells "M2 part: prefill" --providers $provider --calls 3 > $R/$provider-m2.log 2>&1
  echo "== full $provider M2 prefill (rc=$?)"; tail -2 $R/$provider-m2.log
  ncu --import $R/$provider-m2.ncu-rep --page details > $R/$provider-m2.txt 2>&1; wc -l $R/$provider-m2.txt
  ncu --import $R/$provider-m2.ncu-rep --page source --csv --print-source sass > $R/$provider-m2-sass.csv \
    2> $R/$provider-m2-sass.err
  echo "== source $provider: rc=$? $(wc -l < $R/$provider-m2-sass.csv) lines"; head -c 600 $R/$provider-m2-sass.err
done
ls -la $R
