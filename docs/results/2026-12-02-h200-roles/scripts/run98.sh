#!/bin/bash
# Session 34, device call 3: the decode path of the mixed roles kernel hung (call 2: one split without decodes
# passed, with decodes rc=124): variants of its decode branch, one process each under a time limit.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=docs/results/2026-12-02-h200-roles/scripts
for v in idle g1idle nomerge full; do
  timeout 45 python3 $D/decode_bisect.py $v 2>&1 | grep -v Warn | tail -2; echo "$v rc=${PIPESTATUS[0]}"
done | tee $OUT/bisect.txt
