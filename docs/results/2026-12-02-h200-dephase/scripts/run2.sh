#!/bin/bash
# Session 35, device call 2: the roles kernel's decode walks with their page rows read a stage ahead (this tree)
# against main's mixed kernel in the same process, and main's roles kernel (abtree/main, 320db3a); then the whole GPU
# suite (scripts/gpu_tests.sh: every kernel's GPU tests, the roles kernel's at 1-3 splits among them).
export PYTHONUNBUFFERED=1
D=docs/results/2026-12-02-h200-roles/scripts
for step in ".:M" "abtree/main:M2" ".:M2"; do
  tree=${step%%:*}
  PYTHONPATH=$tree timeout 120 python3 $D/roles_ab.py --rounds 1 --variants main,r1 --only "${step##*:}" 2>&1 \
    | grep -v Warn | sed "s|^|$tree |"
done | tee $OUT/prefetch-ab.txt
T=330 bash scripts/gpu_tests.sh /tmp/gpu-tests > $OUT/gpu-tests.txt 2>&1; cat $OUT/gpu-tests.txt
grep -h -E "FAILED|Error" /tmp/gpu-tests/*.log | head -20; tar czf $OUT/gpu-tests.tgz -C /tmp gpu-tests
