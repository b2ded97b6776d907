#!/bin/bash
# Call 4 (2026-12-03): the host cost of the eager decode calls, this tree against c78faaa's (the thirtieth session's,
# whose 27.2 µs is the targets table's figure), alternating processes pinned to one core (carry abtree/c78faaa:
# `git archive c78faaa attention inference benchmarks | tar x -C abtree/c78faaa`). About 120 s.
export PYTHONUNBUFFERED=1
for i in 1 2 3 4 5; do
  PYTHONPATH=. timeout 30 taskset -c 5 python3 benchmarks/host_ab.py --label now
  PYTHONPATH=abtree/c78faaa timeout 30 taskset -c 5 python3 abtree/c78faaa/benchmarks/host_ab.py --label c78faaa
done 2>&1 | grep -v Warn | tee $OUT/host-ab.txt
