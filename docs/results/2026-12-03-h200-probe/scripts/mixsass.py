"""SASS loops of the mixed kernel (d128 page 16 causal, 8-row decode tiles) for ATTN_FUSED_HOPPER_MIXED_TILE values: each
backward branch's body with wgmmas, its length, spill loads/stores (LDL/STL) and wgmma shapes."""
import os
import re
import subprocess
import sys

from attention.kernels import hopper_mixed
from tests import sm90_compile as s

for spec in sys.argv[1:]:
    os.environ["ATTN_FUSED_HOPPER_MIXED_TILE"] = spec
    label, fn, args, cx, w, st = s.mixed_hopper_launches()[0]
    k = s.compile_for_sm90(fn, args, cx, w, st)
    print(spec, s.register_usage(k), flush=True)
    open("/tmp/k.cubin", "wb").write(k.asm["cubin"])
    nvd = "/tmp/t36/lib/python3.11/site-packages/triton/backends/nvidia/bin/nvdisasm"
    lines = subprocess.run([nvd, "-c", "/tmp/k.cubin"], capture_output=True, text=True).stdout.splitlines()
    pos = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s*\.(L_x_\d+):", line)
        if m:
            pos[m.group(1)] = i
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", line)
        if m and m.group(1) in pos and pos[m.group(1)] < i:
            body = lines[pos[m.group(1)]:i + 1]
            if len(body) > 3000:
                continue
            hg = sorted(set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", " ".join(body))))
            if hg:
                print("  loop", len(body), "spill ops", sum(1 for b in body if "STL" in b or "LDL" in b), hg)
