#!/bin/bash
# Call 3 (2026-12-03), carry [".device/fa4-a", ".device/flash_attn.sh"]: flash-attn-4's first half copied in, then
# the host cost of an eager decode call, pinned to one core, four rounds (benchmarks/host_ab.py). About 3 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
bash .device/flash_attn.sh fa4-stage1
for i in 1 2 3 4; do timeout 40 taskset -c 5 python3 benchmarks/host_ab.py --label pinned; done 2>&1 | grep -v Warn \
  | tee $OUT/host-ab-pinned.txt
