#!/bin/bash
# Session 34, device call 1: the one-role-a-program mixed kernel's first run: a smoke launch (a hang shows as a
# timeout), its GPU tests, the decode / mixed kernels' tests (_decode_tiles gained PART), then roles_ab.py.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=docs/results/2026-12-02-h200-roles/scripts
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 90 python3 - > $OUT/smoke.txt 2>&1 <<'PY'
import os, torch
os.environ["ATTN_FUSED_HOPPER_MIXED_ROLES"] = "1"
from tests.gpu.test_hopper_mixed_roles_gpu import CHUNK, _run
from tests.test_kernels import build_inputs, check_output
for splits in ("1", "3"):
    os.environ["ATTN_FUSED_HOPPER_MIXED_ROLES_SPLITS"] = splits
    inputs = build_inputs(CHUNK, "cuda")
    _run(inputs)
    torch.cuda.synchronize()
    try:
        check_output(CHUNK, inputs)
        print("smoke", splits, "PASS")
    except AssertionError as error:
        print("smoke", splits, "FAIL", str(error)[:1500])
PY
echo "smoke rc=$?"; tail -5 $OUT/smoke.txt
for n in 1 2 3; do  # one process a split count: the compiles are CPU-bound
  ( timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu --maxfail=8 -k "splits$n" \
    tests/gpu/test_hopper_mixed_roles_gpu.py > $OUT/roles-tests-$n.txt 2>&1; echo "rc=$?" >> $OUT/roles-tests-$n.txt ) &
done; wait
for n in 1 2 3; do tail -2 $OUT/roles-tests-$n.txt; grep -E "^FAILED" $OUT/roles-tests-$n.txt | head -6; done
timeout 230 python3 $D/roles_ab.py --rounds 1 --variants main,r1,r2,r3,r4 2>&1 | grep -v Warn | tee $OUT/roles-ab.txt
