#!/usr/bin/env bash
# Call 4 (after `bash .device/flash_attn.sh fa4-stage1` in call 3): flash-attn-4 installed (the stage-2 wheels and
# .device/fa4-c's two), then the targets read once on main (bench_mixed, then every bench_decode cell), then
# the host cost of an eager decode call pinned to one core. Outputs tarred after every step. About 480 s.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT}
cp .device/fa4-c/* /tmp/fa4w/ && bash .device/flash_attn.sh fa4-stage2
R=/tmp/runs && mkdir -p $R
save() { tar czf $OUT/runs.tgz -C /tmp runs; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader > $R/gpu.txt
python3 -c "import torch, triton, flash_attn.cute; print(torch.__version__, triton.__version__)" >> $R/gpu.txt 2>&1
timeout 110 python3 -m benchmarks.bench_mixed --budget-s 100 --quiet --out $R/a > $R/a-mixed.log 2>&1
save
timeout 330 python3 -m benchmarks.bench_decode --budget-s 320 --quiet --out $R/a > $R/a-decode.log 2>&1
save
python3 -m benchmarks.targets $R/a/decode.csv $R/a/mixed.csv > $R/targets.md 2>&1
for i in 1 2 3; do timeout 25 taskset -c 5 python3 benchmarks/host_ab.py --label pinned; done 2>&1 | grep -v Warn \
  > $R/host-ab-pinned.txt
save
cat $R/targets.md $R/host-ab-pinned.txt | head -80
