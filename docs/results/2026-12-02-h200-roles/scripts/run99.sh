#!/bin/bash
# Session 34, device call 4: the producer read the decode rows from the wrong axis of the decode Q buffers ([2, rows, D]):
# its decode walks were all skipped while the consumers waited on them (calls 1-3 hung). Smoke launches with
# short time limits (one split, three splits), then, if one
# split ran, the GPU tests and roles_ab.py.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=docs/results/2026-12-02-h200-roles/scripts
smoke() {  # splits, decode queries (1 or 0)
  timeout 50 python3 - "$1" "$2" <<'PY' 2>&1 | grep -v Warn | tail -3
import os, sys, time, torch
os.environ["ATTN_FUSED_HOPPER_MIXED_ROLES"] = "1"
os.environ["ATTN_FUSED_HOPPER_MIXED_ROLES_SPLITS"] = sys.argv[1]
from dataclasses import replace
from tests.gpu.test_hopper_mixed_roles_gpu import CHUNK, _run
from tests.test_kernels import build_inputs, check_output
case = CHUNK if sys.argv[2] == "1" else replace(CHUNK, q_lens=(0,) * 30 + (1000,))
inputs = build_inputs(case, "cuda")
start = time.time()
_run(inputs)
torch.cuda.synchronize()
try:
    check_output(case, inputs)
    print("smoke splits", sys.argv[1], "decodes", sys.argv[2], "PASS", f"{time.time() - start:.1f} s")
except AssertionError as error:
    print("smoke splits", sys.argv[1], "decodes", sys.argv[2], "FAIL", str(error)[:1200])
PY
  echo "rc=${PIPESTATUS[0]}"
}
{ smoke 1 1; smoke 3 1; } | tee $OUT/smoke.txt
grep -q "splits 1 decodes 1 PASS" $OUT/smoke.txt || exit 0
for n in 1 2 3; do  # one process a split count: the compiles are CPU-bound
  ( timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu --maxfail=8 -k "splits$n" \
    tests/gpu/test_hopper_mixed_roles_gpu.py > $OUT/roles-tests-$n.txt 2>&1; echo "rc=$?" >> $OUT/roles-tests-$n.txt ) &
done; wait
for n in 1 2 3; do tail -2 $OUT/roles-tests-$n.txt; grep -E "^FAILED" $OUT/roles-tests-$n.txt | head -4; done
timeout 200 python3 $D/roles_ab.py --rounds 1 --variants main,r1,r3 2>&1 | grep -v Warn | tee $OUT/roles-ab.txt
