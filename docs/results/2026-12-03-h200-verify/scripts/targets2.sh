#!/bin/bash
# Call 3 (2026-12-03, thirty-seventh session): the targets read twice on one machine (so each verdict comes
# with its run-to-run spread; every decode cell and both mixed cells a run), then the host cost of an eager decode
# call pinned to one core. flash-attn-4 is installed by the two calls before it (.device/flash_attn.sh fa4-stage1,
# fa4-stage2). About 450 s; the outputs are tarred after every step, so a call cut short still returns them.
export PYTHONUNBUFFERED=1 PYTHONPATH=. BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT}
R=/tmp/runs && mkdir -p $R
save() { tar czf $OUT/runs.tgz -C /tmp runs; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader > $R/gpu.txt
python3 -c "import torch, triton, flash_attn.cute; print(torch.__version__, triton.__version__)" >> $R/gpu.txt 2>&1
for run in a b; do
  timeout 120 python3 -m benchmarks.bench_mixed --budget-s 100 --quiet --out $R/$run > $R/$run-mixed.log 2>&1
  save
  timeout 170 python3 -m benchmarks.bench_decode --budget-s 150 --quiet --out $R/$run > $R/$run-decode.log 2>&1
  save
done
python3 -m benchmarks.targets $R/a/decode.csv $R/a/mixed.csv $R/b/decode.csv $R/b/mixed.csv > $R/targets.md 2>&1
head -12 $R/targets.md
for i in 1 2 3 4; do timeout 30 taskset -c 5 python3 benchmarks/host_ab.py --label pinned; done 2>&1 | grep -v Warn \
  | tee $R/host-ab-pinned.txt
save
