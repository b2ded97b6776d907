"""Which part of the mixed roles kernel's decode path hangs (session 34, device call 3): the kernel rewritten into
variants by text substitution, each launched on tests/gpu/test_hopper_mixed_roles_gpu.py's CHUNK at one split in a
process of its own (run under `timeout`: a hang shows as rc 124).

    timeout 45 python3 decode_bisect.py VARIANT     # full, nomerge, g1idle, idle
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time

import torch

SOURCE = "attention/kernels/attention_mixed_roles_hopper.py"
DECODE = """                o, m_i, l_sum = _decode_tiles(half_ring, count, first_tile, my_tiles, first_masked, kv_len, diag,
                                              qk_scale, CAUSAL, GROUP_SIZE, False, GROUP)"""
MERGE = "                o, l_sum = _merge_decode_halves(o, m_i, l_sum, merge_buffers, decodes, GROUP)"
OUT = """                if GROUP == 0:
                    _decode_rows_out("""
CONSUMER_DECODE_START = "            is_walk, seq, kv_head, q_len, kv_len, q_first, diag, num_tiles, first_masked, _, _, _ = _decode_walk("
VARIANTS = {
    "full": [],
    # the consumers without their decode branch (right only for batches without decode queries): the prefill
    # path's registers as the prefill kernel's
    "prefill-only": [("CONSUMER_DECODE", "")],
    "nomerge": [(MERGE, "")],
    "g1idle": [("my_tiles = stages if GROUP == 0 else num_tiles - stages", "my_tiles = stages if GROUP == 0 else 0")],
    "idle": [(DECODE, "                my_tiles = 0"), (MERGE, ""), (OUT, "                if GROUP == 7:\n"
                                                                   "                    _decode_rows_out(")],
}


def load(variant: str):
    text = open(SOURCE).read().replace("from .", "from attention.kernels.")
    for old, new in VARIANTS[variant]:
        if old == "CONSUMER_DECODE":
            start = text.index(CONSUMER_DECODE_START)
            end = text.index("        else:", start)
            text = text[:start] + "            pass\n" + text[end:]
            continue
        assert old in text, old
        text = text.replace(old, new)
    path = f"/tmp/roles_{variant}.py"
    open(path, "w").write(text)
    spec = importlib.util.spec_from_file_location(f"roles_{variant}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attention_mixed_roles_hopper_kernel


if __name__ == "__main__":
    variant = sys.argv[1]
    os.environ["ATTN_FUSED_HOPPER_MIXED_ROLES"] = "1"
    os.environ["ATTN_FUSED_HOPPER_MIXED_ROLES_SPLITS"] = "1"
    from attention.kernels import hopper_mixed_roles
    hopper_mixed_roles.attention_mixed_roles_hopper_kernel = load(variant)
    from tests.gpu.test_hopper_mixed_roles_gpu import CHUNK, _run
    from tests.test_kernels import build_inputs, check_output
    inputs = build_inputs(CHUNK, "cuda")
    start = time.time()
    _run(inputs)
    torch.cuda.synchronize()
    try:
        check_output(CHUNK, inputs)
        print(variant, "PASS", f"{time.time() - start:.1f} s")
    except AssertionError as error:
        print(variant, "ran, wrong:", str(error)[:600])
