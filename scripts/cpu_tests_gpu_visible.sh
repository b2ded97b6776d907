#!/usr/bin/env bash
# The CPU suite (-m "not gpu") on a CUDA host with the GPU left visible, as a user there runs pytest without
# `make test` (which hides the GPU): the test files in 13 shards and the doctests, in parallel, a log each, then a
# line per log and the failures. Tests meant for the interpreter take the `cpu_fused` fixture; the rest meet the GPU.
# Usage: scripts/cpu_tests_gpu_visible.sh [LOG_DIR]   (env T = per-shard time limit in seconds, default 300)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
logs=${1:-cpu-test-logs}
mkdir -p "$logs" && rm -f "$logs"/*.log
T=${T:-300}
files=$(ls tests/test_*.py)
for i in $(seq 0 12); do
  shard=$(echo "$files" | awk -v i=$i 'NR % 13 == i')
  ( timeout "$T" python3 -m pytest -q -rs -p no:cacheprovider -m "not gpu" $shard > "$logs/$i.log" 2>&1
    echo "rc=$?" >> "$logs/$i.log" ) &
done
( timeout "$T" python3 -m pytest -q -p no:cacheprovider -m "not gpu" attention inference benchmarks \
    > "$logs/doctests.log" 2>&1; echo "rc=$?" >> "$logs/doctests.log" ) &
wait
for f in "$logs"/*.log; do echo "${f##*/}: $(tail -n 2 "$f" | tr '\n' ' ')"; done
grep -hE "^(FAILED|ERROR)" "$logs"/*.log | head -60
! grep -qvx "rc=0" <(tail -qn 1 "$logs"/*.log)
