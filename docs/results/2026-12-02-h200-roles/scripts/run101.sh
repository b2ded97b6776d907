#!/bin/bash
# Session 34, device call 6: call 5 ran M2's prefill in the roles kernel without its decode branch in 1,473 us at one
# split against the prefill kernel's 852: its items ran all heads of a q tile at once, the whole cache in flight.
# Now KV head by KV head (the prefill kernel's order): M2 whole and its prefill probe, main / one split / three splits,
# each output against main's (max |difference|).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=docs/results/2026-12-02-h200-roles/scripts
timeout 240 python3 $D/roles_ab.py --rounds 1 --variants main,r1,r3 --only "M2" 2>&1 | grep -v Warn \
  | tee $OUT/roles-ab-kv-major.txt
