#!/bin/bash
# Session 35, device call 5: the roles kernel's decode walks run by consumer group 0 alone over a 4-stage ring of 64-key
# tiles (the prefill ring's two slots, taken whole for the walk), against the two-half walks (abtree/halves: 8705afb,
# `git archive 8705afb | tar -x -C abtree/halves`) and main's mixed kernel; then the roles kernel's GPU tests at 1 and 3
# splits (a first attempt of this call was lost with its machine).
export PYTHONUNBUFFERED=1
D=docs/results/2026-12-02-h200-roles/scripts
S=docs/results/2026-12-02-h200-dephase/scripts
PYTHONPATH=. timeout 60 python3 $S/decode_cost.py --no-m2 --lone 8,16 2>&1 | grep -v Warn | tee $OUT/decode-cost.txt
for tree in abtree/halves . abtree/halves .; do
  PYTHONPATH=$tree timeout 45 python3 $D/roles_ab.py --rounds 1 --variants main,r1 --only M2 2>&1 | grep -v Warn \
    | sed "s|^|$tree |"
done | tee $OUT/ab.txt
PYTHONPATH=. timeout 45 python3 $D/roles_ab.py --rounds 1 --variants main,r1 --only M1 2>&1 | grep -v Warn | tee -a $OUT/ab.txt
for n in 1 3; do
  PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -k splits$n \
    tests/gpu/test_hopper_mixed_roles_gpu.py > $OUT/roles-tests-$n.txt 2>&1 &
done
wait
tail -n 2 $OUT/roles-tests-*.txt
