#!/bin/bash
# Prepared in session 34, not run: branch roles-dephase (each program's decode walks in one block placed by its
# program id) against main's roles kernel, one device call. Before the call, on the CPU machine:
#   mkdir -p abtree/dephase && git archive roles-dephase | tar -x -C abtree/dephase      # carry ["abtree"]
# Then: the roles GPU tests on the branch (one split, the default), and M1 / M2 in alternating processes, main's tree
# and the branch's (roles_ab.py from this tree; each process plans with its own tree's kernel).
export PYTHONUNBUFFERED=1
D=docs/results/2026-12-02-h200-roles/scripts
PYTHONPATH=abtree/dephase timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -k splits1 \
  abtree/dephase/tests/gpu/test_hopper_mixed_roles_gpu.py > $OUT/dephase-tests.txt 2>&1; tail -2 $OUT/dephase-tests.txt
for round in 1 2; do
  for tree in abtree/dephase .; do
    PYTHONPATH=$tree timeout 150 python3 $D/roles_ab.py --rounds 1 --variants main,r1 --only "M" 2>&1 | grep -v Warn \
      | sed "s|^|$tree |"
  done
done | tee $OUT/dephase-ab.txt
