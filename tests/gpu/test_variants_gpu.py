"""Kernel variants (``ForwardConfig`` fields) and direct launches on CUDA, vs the fp32 reference.

Each variant runs realistic cases it is meant for: page-table addressing on paged mixed batches,
the small second tile on mixed batches, the rotated walk on non-paged caches, TMA descriptors on
varlen prefill and non-paged caches, heavy tiles first on causal prefill. Direct launches
(``KernelLaunch``) must run the very kernel Triton's own path launches: outputs bit-identical, in
eager calls and in a captured CUDA graph.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.test_kernels import SENTINEL, AttentionCase, build_inputs, check_output

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

if torch.cuda.is_available():
    from attention.kernels import attention_forward, launch
    from attention.kernels.configs import select_forward_config
    from attention.kernels.hopper_forward import HOPPER_ENV

TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}
C = AttentionCase
MIXED_Q = (1,) * 12 + (300, 700, 4)
MIXED_KV = (4096, 17, 900, 2048, 1, 3000, 64, 4000, 129, 2500, 800, 1000) + (300, 2900, 1500)

CASES = {
    "paged": C(MIXED_Q, MIXED_KV, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged",
               page_size=16, causal=True, bottom_right=True, num_splits=None),
    "paged256": C(MIXED_Q, MIXED_KV, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.float16, layout="paged",
                  page_size=256, causal=True, bottom_right=True, num_splits=None),
    "cache": C(MIXED_Q, MIXED_KV, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="cache",
               causal=True, bottom_right=True, num_splits=None),
    "decode": C((1,) * 16, (4096,) * 8 + (100, 2000, 3000, 7, 5000, 4096, 64, 1), heads=(32, 8), d_qk=128,
                d_v=128, dtype=torch.bfloat16, layout="cache", causal=True, bottom_right=True, num_splits=None),
    "thd": C((1, 17, 513, 2048, 3001), (1, 17, 513, 2048, 3001), heads=(32, 8), d_qk=128, d_v=128,
             dtype=torch.float16, layout="thd", causal=True, num_splits=None),
    "thd-d64-window": C((700, 2048), (700, 2048), heads=(16, 4), d_qk=64, d_v=64, dtype=torch.bfloat16,
                        layout="bshd", window=(128, 128)),
}
VARIANTS = [
    ("paged_scalar_ids", "paged256"), ("prefetch_page_ids", "paged"), ("prefetch_page_ids", "paged256"),
    ("small_block_m", "paged"), ("small_block_m", "cache"), ("rotate_kv_tiles", "decode"),
    ("rotate_kv_tiles", "cache"), ("tma", "thd"), ("tma", "cache"), ("tma", "thd-d64-window"),
    ("paged_scalar_ids+prefetch_page_ids", "paged256"), ("small_block_m+prefetch_page_ids", "paged"),
    ("small_block_m+paged_scalar_ids+prefetch_page_ids+rotate_kv_tiles", "paged256"),
    ("small_block_m+rotate_kv_tiles+tma", "cache"),
    ("fused_combine", "decode"), ("fused_combine", "paged"), ("fused_combine+prefetch_page_ids", "paged256"),
    ("tma", "paged256"), ("tma+prefetch_page_ids+fused_combine", "paged256"),
    ("int32_offsets", "paged"), ("int32_offsets", "decode"),
    ("dependent_combine", "decode"), ("dependent_combine", "paged"), ("runtime_page_size", "paged"),
    ("runtime_page_size+transposed_k_loads+prefetch_page_ids", "paged256"),
    ("transposed_k_loads", "decode"), ("transposed_k_loads+int32_offsets", "paged"), ("heavy_tiles_first", "thd"),
    ("heavy_tiles_first+small_block_m+prefetch_page_ids+int32_offsets", "paged"),
    ("page_granular_tiles", "paged"),
    ("page_granular_tiles+small_block_m+prefetch_page_ids+int32_offsets+heavy_tiles_first", "paged"),
]
"""(ForwardConfig fields joined by '+', case): single variants, then the combinations the sweep measures."""


def _config(case: AttentionCase, fields: str):
    base = select_forward_config(head_dim_qk=case.d_qk, head_dim_v=case.d_v, group_size=case.heads[0] // case.heads[1],
                                 max_seqlen_q=max(case.q_lens), interpret=False, tuned=False)
    return replace(base, **{field: 16 if field == "small_block_m" else True for field in fields.split("+")})


@pytest.mark.parametrize("fields, case_name", VARIANTS, ids=[f"{f}-{c}" for f, c in VARIANTS])
def test_variant_matches_the_reference(fields: str, case_name: str) -> None:
    case = CASES[case_name]
    inputs = build_inputs(case, "cuda")
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"],
                      config=_config(case, fields))
    check_output(case, inputs, TOLERANCE[case.dtype])


@pytest.mark.parametrize("case_name", ["paged", "decode", "thd"])
def test_direct_launch_runs_the_same_kernel(case_name: str, monkeypatch) -> None:
    from attention.kernels import attention_fwd

    case = CASES[case_name]
    inputs = build_inputs(case, "cuda")
    monkeypatch.setenv(HOPPER_ENV, "0")  # the general kernel's launches (the Hopper kernel's go through Triton)
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", False)
    monkeypatch.setattr(attention_fwd, "_plans", {})
    expected = attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"].clone(), **inputs["call"])
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", True)
    monkeypatch.setattr(attention_fwd, "_plans", {})
    for _ in range(3):  # the first call plans and compiles, the next ones launch directly
        out = attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"].clone(), **inputs["call"])
        assert torch.equal(out, expected)
    graph_out = inputs["out"].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], graph_out, **inputs["call"])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, expected)
    assert all(plan is None or plan.attention._direct for plan in attention_fwd._plans.values())


@pytest.mark.parametrize("case_name, num_splits", [("decode", 8), ("paged", 4), ("paged256", 16)])
def test_fused_combine_eager_and_captured(case_name: str, num_splits: int) -> None:
    """The last split merges (no combine launch): right in eager calls and in replays of a captured
    graph, and its arrival counters are back to zeros after every launch."""
    from attention.kernels import combine

    case = replace(CASES[case_name], num_splits=num_splits)
    inputs = build_inputs(case, "cuda")
    config = _config(case, "fused_combine")
    call = {**inputs["call"], "num_splits": num_splits}
    for _ in range(2):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **call, config=config)
        check_output(case, inputs, TOLERANCE[case.dtype])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **call, config=config)
    for _ in range(3):
        inputs["out_base"].fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        check_output(case, inputs, TOLERANCE[case.dtype])
        assert all(not counters.any() for counters in combine._split_counters.values())
