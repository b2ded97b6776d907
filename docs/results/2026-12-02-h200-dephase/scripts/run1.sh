#!/bin/bash
# Session 35, device call 1: the roles kernel with its decodes in one block a program, placed by program id, and its
# prefill splits a query head's q tiles at a time (this tree), against main's roles kernel (abtree/main: 320db3a,
# `git archive 320db3a | tar -x -C abtree/main`) and main's mixed kernel, M1 / M2 alternating trees; first the roles
# kernel's GPU tests at one split on this tree.
export PYTHONUNBUFFERED=1
D=docs/results/2026-12-02-h200-roles/scripts
start=$SECONDS
PYTHONPATH=. timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu -k splits1 \
  tests/gpu/test_hopper_mixed_roles_gpu.py > $OUT/roles-tests.txt 2>&1; tail -2 $OUT/roles-tests.txt
for round in 1 2; do
  only=M; [ $round = 2 ] && only=M2
  for tree in abtree/main .; do
    [ $((SECONDS - start)) -gt 480 ] && break
    PYTHONPATH=$tree timeout 120 python3 $D/roles_ab.py --rounds 1 --variants main,r1 --only "$only" 2>&1 \
      | grep -v Warn | sed "s|^|$tree |"
  done
done | tee $OUT/dephase-ab.txt
