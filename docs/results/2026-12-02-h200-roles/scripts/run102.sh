#!/bin/bash
# Session 34, device call 7: calls 4-6 dealt one list of prefill splits and decode walks; the deal gave some
# programs 8 prefill splits where the mean was 3.9 (M2, one split). Now each list dealt on its own: M2 whole and its
# prefill probe, main / one split / three splits, outputs against main's.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=docs/results/2026-12-02-h200-roles/scripts
timeout 170 python3 $D/roles_ab.py --rounds 1 --variants main,r1,r3 --only "M2" 2>&1 | grep -v Warn \
  | tee $OUT/roles-ab-dealt.txt
