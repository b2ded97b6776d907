"""The Gluon sm90 forward (attention/kernels/attention_fwd_hopper.py) against the fp32 reference, on an H100 /
H200: attention_forward routes prefill-sized calls to it; each case checks that it did (a HopperPlan), the
rows against the reference and that padding rows of out were not written."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import attention_forward
from attention.kernels import attention_fwd as launcher
from attention.kernels.hopper_forward import (
    HOPPER_ENV,
    HOPPER_GROUPS_ENV,
    HOPPER_L2_SECTION_ENV,
    HOPPER_PINGPONG_ENV,
    HOPPER_SMALL_PAGES_ENV,
    HopperPlan,
    hopper_unsupported_reason,
)
from tests.test_kernels import SENTINEL, AttentionCase, build_inputs, check_output

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm90 GPU (H100 / H200)"),
]

C = AttentionCase
RAGGED_Q = (300, 129, 1000, 64, 0, 700)
RAGGED_KV = (700, 129, 1000, 65, 0, 1500)
CASES = [
    *[C(RAGGED_Q, RAGGED_Q, heads=heads, d_qk=d, d_v=d, dtype=dtype, layout="thd", causal=causal)
      for heads in ((16, 4), (16, 16)) for d in (64, 128) for causal in (False, True)
      for dtype in ((torch.bfloat16,) if heads[0] != heads[1] else (torch.float16,))],
    *[C(RAGGED_Q, RAGGED_KV, heads=(16, 2), d_qk=d, d_v=d, dtype=torch.bfloat16, layout=layout, causal=True,
        bottom_right=True) for d in (64, 128) for layout in ("thd", "cache")],
    C(RAGGED_Q, RAGGED_KV, heads=(16, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="cache"),
    C((1024, 1024), (1024, 1024), heads=(16, 16), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="bshd", causal=True),
    C((640, 1024), (1024, 200), heads=(16, 16), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="bshd", causal=True,
      bottom_right=True),  # rows that see no key get zeros
    C((2048,), (2048 + 6144,), heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="cache", causal=True,
      bottom_right=True),  # a 2k chunk over a 6k prefix
    # paged, read in place (unowned slots hold NaN, table entries past a sequence's pages point past the
    # cache): pages of whole 128-key tiles, one TMA load a tile; pages of 16-64 keys, one TMA load a page
    C(RAGGED_Q, RAGGED_KV, heads=(16, 2), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=256,
      causal=True, bottom_right=True),
    C(RAGGED_Q, RAGGED_KV, heads=(16, 4), d_qk=64, d_v=64, dtype=torch.float16, layout="paged", page_size=128),
    *[C(RAGGED_Q, RAGGED_KV, heads=(16, 4), d_qk=d, d_v=d, dtype=torch.bfloat16, layout="paged", page_size=page_size,
        causal=causal, bottom_right=causal) for page_size, d, causal in ((16, 128, True), (32, 64, False),
                                                                         (64, 128, False), (16, 64, True))],
    C((2048,), (2048 + 6144,), heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=16,
      causal=True, bottom_right=True),
    # head dim 256 (64-key tiles): packed, a cache with bottom-right causal rows, pages of whole tiles and of 16 keys
    *[C(RAGGED_Q, RAGGED_Q, heads=heads, d_qk=256, d_v=256, dtype=dtype, layout="thd", causal=causal)
      for heads, dtype in (((16, 4), torch.bfloat16), ((8, 8), torch.float16)) for causal in (False, True)],
    C(RAGGED_Q, RAGGED_KV, heads=(16, 2), d_qk=256, d_v=256, dtype=torch.bfloat16, layout="cache", causal=True,
      bottom_right=True),
    *[C(RAGGED_Q, RAGGED_KV, heads=(16, 4), d_qk=256, d_v=256, dtype=torch.bfloat16, layout="paged",
        page_size=page_size, causal=causal, bottom_right=causal) for page_size, causal in ((64, False), (16, True))],
    # scores that rise along the keys in some rows of a tile: their running max moves every few tiles (within the
    # softmax's slack: P above 1) or every tile (a rescale of those rows' O); falling in the other rows
    *[C(RAGGED_Q, RAGGED_KV, heads=(16, 4), d_qk=d, d_v=d, dtype=dtype, layout=layout, page_size=16, causal=causal,
        bottom_right=causal, score_drift=drift)
      for d, dtype, layout, causal, drift in ((128, torch.bfloat16, "thd", True, 3.0),
                                              (128, torch.float16, "cache", False, 10.0),
                                              (64, torch.float16, "paged", True, 5.0),
                                              (256, torch.bfloat16, "cache", False, 10.0))],
]


def _run(case: AttentionCase, inputs: dict) -> None:
    launcher._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    kinds = {type(plan).__name__ for plan in launcher._plans.values()}
    assert kinds in ({"HopperPlan"}, {"HopperPlan", "GatherPlan"}), f"{case}: planned {kinds}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_hopper_kernel_matches_the_reference(case: AttentionCase) -> None:
    inputs = build_inputs(case, "cuda")
    _run(case, inputs)
    check_output(case, inputs)


@pytest.mark.parametrize("small_pages", ["1", "0"])
def test_small_pages_are_read_in_place_unless_switched_off(small_pages: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2k chunk over 16-token pages: read in place (one HopperPlan), or with ATTN_FUSED_HOPPER_SMALL_PAGES=0
    copied to a contiguous buffer first (GatherPlan, then a HopperPlan over the copy); the same rows either way."""
    monkeypatch.setenv(HOPPER_SMALL_PAGES_ENV, small_pages)
    case = C((2048,), (2048 + 1000,), heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged",
             page_size=16, causal=True, bottom_right=True)
    inputs = build_inputs(case, "cuda")
    _run(case, inputs)
    kinds = {type(plan).__name__ for plan in launcher._plans.values()}
    assert kinds == ({"HopperPlan"} if small_pages == "1" else {"HopperPlan", "GatherPlan"})
    check_output(case, inputs)


PINGPONG_CASES = [  # empty and key-less q tiles (both groups skip their turns), pages, both head dims
    C(RAGGED_Q, RAGGED_Q, heads=(16, 4), d_qk=64, d_v=64, dtype=torch.bfloat16, layout="thd", causal=True),
    C((640, 1024), (1024, 200), heads=(16, 16), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="bshd", causal=True,
      bottom_right=True),
    C(RAGGED_Q, RAGGED_KV, heads=(16, 4), d_qk=64, d_v=64, dtype=torch.bfloat16, layout="paged", page_size=16,
      causal=True, bottom_right=True),
    C(RAGGED_Q, RAGGED_KV, heads=(16, 2), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=256,
      causal=True, bottom_right=True),
]


@pytest.mark.parametrize("section_mib", ["0", "2", "1000"])
@pytest.mark.parametrize("causal", [True, False])
def test_program_order_sections(section_mib: str, causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTN_FUSED_HOPPER_L2_SECTION under a causal mask: one KV head a section (0), sections of 2 and 1 of 3 KV heads
    (2 MiB, 1,500 keys of 512 bytes a KV head), or every head in one (1000); without a mask always one KV head a
    section. Each program still gets its own (q tile, head)."""
    monkeypatch.setenv(HOPPER_L2_SECTION_ENV, section_mib)
    case = C(RAGGED_Q, RAGGED_KV, heads=(24, 3), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="thd",
             causal=causal, bottom_right=causal)
    inputs = build_inputs(case, "cuda")
    _run(case, inputs)
    expected = {"0": 8, "2": 16, "1000": 24}[section_mib] if causal else 8
    assert [plan.section_heads for plan in launcher._plans.values()] == [expected]
    check_output(case, inputs)


@pytest.mark.parametrize("pingpong", ["1", "0"])
@pytest.mark.parametrize("case", PINGPONG_CASES, ids=str)
def test_consumer_groups_with_and_without_ping_pong(case: AttentionCase, pingpong: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTN_FUSED_HOPPER_PINGPONG=1 / 0 (HOPPER_TILE picks per head dim when unset): the same rows either way."""
    monkeypatch.setenv(HOPPER_PINGPONG_ENV, pingpong)
    inputs = build_inputs(case, "cuda")
    _run(case, inputs)
    check_output(case, inputs)


@pytest.mark.parametrize("pingpong", ["1", "0"])
@pytest.mark.parametrize("case", [case for case in PINGPONG_CASES if case.d_qk == 64], ids=str)
def test_head_dim_64_on_two_consumer_groups(case: AttentionCase, pingpong: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTN_FUSED_HOPPER_GROUPS=2: d64 on two consumer groups (128-query tiles; HOPPER_TILE's three when unset), with
    and without ping-pong."""
    monkeypatch.setenv(HOPPER_GROUPS_ENV, "2")
    monkeypatch.setenv(HOPPER_PINGPONG_ENV, pingpong)
    inputs = build_inputs(case, "cuda")
    _run(case, inputs)
    assert [plan.groups for plan in launcher._plans.values() if type(plan) is HopperPlan] == [2]
    check_output(case, inputs)


def test_nan_padding_of_a_cache_stays_out_of_the_output() -> None:
    """Cache rows past each sequence's keys hold NaN: the kernel's V tiles read them (P is 0 there)."""
    case = C((600, 400), (633, 400), heads=(32, 32), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="cache",
             causal=True, bottom_right=True)
    inputs = build_inputs(case, "cuda")
    for x in (inputs["k"], inputs["v"]):
        for b, n in enumerate(case.kv_lens):
            x[b, n:] = float("nan")
    _run(case, inputs)
    check_output(case, inputs)


def test_sbhd_and_the_switch_keep_the_general_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    case = C((512, 512), (512, 512), heads=(16, 16), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="sbhd")
    inputs = build_inputs(case, "cuda")
    reason = hopper_unsupported_reason(inputs["q"], inputs["k"], inputs["v"], inputs["out"], page_size=0,
                                       window=(-1, -1), alibi=False, sink=False)
    assert reason is not None and "sbhd" in reason
    case = C((512, 512), (512, 512), heads=(16, 16), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="bshd")
    inputs = build_inputs(case, "cuda")
    monkeypatch.setenv(HOPPER_ENV, "0")
    launcher._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    assert not any(type(plan) is HopperPlan for plan in launcher._plans.values())
    check_output(case, inputs)


def test_cuda_graph_replay() -> None:
    """The launch reads no device value on the host: it captures into a CUDA graph and replays."""
    case = C((700, 300), (700, 300), heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="thd", causal=True)
    inputs = build_inputs(case, "cuda")
    _run(case, inputs)
    call = dict(inputs["call"])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **call)
    inputs["out_base"].fill_(SENTINEL)
    graph.replay()
    torch.cuda.synchronize()
    check_output(case, inputs)
