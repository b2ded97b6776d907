#!/usr/bin/env bash
# Call 1: is ncu usable, and what do M2's kernels read from DRAM and hit in L2? Each cell's third call of our kernel
# (the mixed launch, its probe without decode queries, the prefill kernel on the chunk, the decode kernel), then
# the full set on the prefill kernel and on the M2 launch.
# Usage: bash ncu1.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/ncu1 && mkdir -p $R
which ncu; ncu --version | tail -1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
M=$M,lts__t_sectors_op_read.sum,lts__t_sectors_op_read_lookup_hit.sum,lts__t_sectors_op_read_lookup_miss.sum
M=$M,sm__cycles_elapsed.avg.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
K='regex:attention_(mixed|fwd|decode)_hopper'
i=0
for cell in "M2 2k chunk" "M2 probe" "M2 part: prefill" "M2 part: 64 decodes" "M1 2k prefill" "M1 probe" \
            "M1 part: prefill"; do
  i=$((i+1))
  timeout 120 ncu --clock-control none --kernel-name "$K" --launch-skip 2 --launch-count 1 --metrics $M --csv \
    python3 -m benchmarks.run_cell --cells "$cell" --calls 3 > $R/m$i.csv 2> $R/m$i.err
  echo "== $cell (rc=$?)"; grep -v '^==PROF==' $R/m$i.csv | grep -v '| ran' | cut -d, -f5,12- | tail -n +1 | head -20
done
for cell in "M2 part: prefill" "M2 2k chunk"; do
  i=$((i+1))
  timeout 150 ncu --clock-control none --kernel-name "$K" --launch-skip 2 --launch-count 1 --set full \
    -o $R/full$i python3 -m benchmarks.run_cell --cells "$cell" --calls 3 > $R/full$i.log 2>&1
  echo "== full $cell (rc=$?)"
  ncu --import $R/full$i.ncu-rep --page details > $R/full$i.txt 2>&1; wc -l $R/full$i.txt
done
