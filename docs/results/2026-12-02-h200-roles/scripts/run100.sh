#!/bin/bash
# Session 34, device call 5: the roles kernel ran M2's prefill (decodes without queries) in 1,592 us at one split
# against the prefill kernel's ~851 (call 4). Its consumers spill ~700 B with the decode branch compiled in, 60 B
# without: the same probe with the decode branch removed from the consumers (decode_bisect.py's prefill-only), at
# one and three splits, beside main's mixed kernel and the prefill part alone (the prefill kernel).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=docs/results/2026-12-02-h200-roles/scripts
timeout 300 python3 $D/roles_ab.py --rounds 1 --variants main,r1,r3 --only "M2 p" --parts --kernel-variant prefill-only \
  2>&1 | grep -v Warn | tee $OUT/roles-ab-prefill-only.txt
