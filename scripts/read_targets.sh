#!/usr/bin/env bash
# The decode and mixed-batch targets read once on this GPU (~180 s on an H200; ~270 s the first time on a machine):
# bench_mixed and bench_decode with every competitor installed (CUDA-graph replays, L2 flushed), `benchmarks.targets`
# over this run and the earlier runs under /tmp/runs (a second call's table has both columns), and the host cost of an
# eager decode call pinned to one core, three rounds. Files: /tmp/runs/RUN/, the tables in /tmp/runs/targets.md; all
# of /tmp/runs in $OUT/runs-RUN.tgz after each step (a run cut short still brings back what it has).
# Usage (repository root, on the device): BENCH_COMMIT=<hash> bash scripts/read_targets.sh [RUN]   (RUN default a)
#   the hash written in the command: the device copy's .git may be stale (benchmarks/README.md)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT=<hash>}
run=${1:-a} R=/tmp/runs
mkdir -p $R/$run
save() { tar czf "$OUT/runs-$run.tgz" -C /tmp runs; }
bash scripts/device_versions.sh > $R/$run/versions.txt 2>&1
# a machine's first run compiles: a budget of 140 s left the last M2 cell unread on 2026-12-07
timeout 210 python3 -m benchmarks.bench_mixed --budget-s 200 --quiet --out $R/$run > $R/$run/mixed.log 2>&1
echo "bench_mixed rc=$?"; save
timeout 320 python3 -m benchmarks.bench_decode --budget-s 310 --quiet --out $R/$run > $R/$run/decode.log 2>&1
echo "bench_decode rc=$?"; save
runs=$(for d in $R/*/; do d=${d%/}; for f in $d/decode.csv $d/mixed.csv; do [ -f $f ] && echo "${d##*/}=$f"; done; done)
python3 -m benchmarks.targets $runs > $R/targets.md 2>&1
for i in 1 2 3; do timeout 25 taskset -c 5 python3 benchmarks/host_ab.py --label pinned; done 2>&1 \
  | grep -v Warn > $R/$run/host-ab-pinned.txt
save
cat $R/$run/versions.txt $R/targets.md $R/$run/host-ab-pinned.txt | head -90
