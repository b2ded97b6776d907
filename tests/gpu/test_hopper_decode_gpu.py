"""The Gluon sm90 decode kernel (attention/kernels/attention_decode_hopper.py) against the fp32 reference, on an
H100 / H200 (every decode-sized call it can run goes there); each case checks that it ran (a DecodeHopperPlan, with
the split count asked for), the rows against the reference and that padding rows of out were not written."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import attention_forward, combine, hopper_decode
from attention.kernels import attention_fwd as launcher
from attention.kernels.hopper_decode import (
    DECODE_HOPPER_ENV,
    DECODE_HOPPER_GATHER_ENV,
    DECODE_HOPPER_MERGE_ENV,
    DECODE_HOPPER_TILE,
    DECODE_HOPPER_TILE_ENV,
)
from tests.test_kernels import AttentionCase, build_inputs, check_output, load_inputs_into

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm90 GPU (H100 / H200)"),
]

C = AttentionCase
Q = (1,) * 12
KV = (1, 17, 64, 65, 300, 1000, 1024, 2047, 2500, 4096, 31, 128)
GQA = dict(heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, causal=True, bottom_right=True)
CASES = [
    *[C(Q, KV, layout="paged", page_size=page_size, **GQA) for page_size in (16, 32, 64, 128, 256)],
    C(Q, KV, layout="cache", **GQA),
    C(Q, KV, heads=(16, 4), d_qk=64, d_v=64, dtype=torch.float16, layout="paged", page_size=16),
    C(Q, KV, heads=(32, 1), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=64, causal=True,
      bottom_right=True),  # MQA: 32-row tiles
    C(Q, KV, heads=(16, 16), d_qk=128, d_v=128, dtype=torch.float16, layout="cache", causal=True,
      bottom_right=True),  # MHA: one row of a 16-row tile
    # speculative verification: 4 query tokens x 4 heads (16 rows), ragged query counts, 64 rows at group 16
    C((4, 3, 4, 1, 2, 4), (4096, 77, 4, 33, 1200, 4), layout="paged", page_size=16, **GQA),
    C((4, 1, 2), (900, 40, 3), heads=(32, 2), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged",
      page_size=32, causal=True, bottom_right=True),
    # top-left causal: a decode row sees the first key only
    C(Q, KV, heads=(16, 2), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=32, causal=True),
    # sequences with no queries or no keys between the others
    C((1, 0, 1) + Q, (300, 20, 0) + KV, layout="paged", page_size=16, **GQA),
]
GATHER_CASES = [  # pages of fewer than 16 tokens, gathered by cp.async (DECODE_HOPPER_GATHER_ENV)
    *[C(Q, KV, layout="paged", page_size=page_size, **GQA) for page_size in (1, 2, 4, 8)],
    C(Q, KV, heads=(16, 4), d_qk=64, d_v=64, dtype=torch.float16, layout="paged", page_size=1),
    C(Q, KV, heads=(32, 1), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=4, causal=True,
      bottom_right=True),  # MQA
    C((4, 3, 4, 1, 2, 4), (4096, 77, 4, 33, 1200, 4), layout="paged", page_size=8, **GQA),  # verification
    C((4, 3, 4, 1), (4096, 77, 4, 2000), heads=(16, 1), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged",
      page_size=1, causal=True, bottom_right=True),  # 64-row tiles: the wide gather tile, one program an SM
    C(Q, KV, heads=(16, 2), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=2, causal=True),
    C((1, 0, 1) + Q, (300, 20, 0) + KV, layout="paged", page_size=1, **GQA),
    C((1,), (8192,), layout="paged", page_size=1, num_splits=None, **GQA),  # split, merged by the kernel
    C((1, 1, 1, 1), (32768, 5, 4000, 0), layout="paged", page_size=4, num_splits=None, **GQA),
]
SPLIT_CASES = [
    C((1,), (8192,), layout="paged", page_size=16, num_splits=None, **GQA),  # the rule's splits (1 x 8k)
    C((1, 1, 1, 1), (32768, 5, 4000, 0), layout="paged", page_size=16, num_splits=None, **GQA),
    C((4, 1, 2), (3000, 700, 64), layout="cache", num_splits=None, **GQA),
]


def _run(inputs: dict, splits: int | None = None) -> None:
    launcher._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    plans = list(launcher._plans.values())
    assert [type(plan).__name__ for plan in plans] == ["DecodeHopperPlan"], f"planned {plans}"
    if splits is not None:
        assert plans[0].num_splits == splits


@pytest.mark.parametrize("case", CASES, ids=str)
def test_decode_kernel_matches_the_reference(case: AttentionCase) -> None:
    inputs = build_inputs(case, "cuda")
    _run(inputs, splits=1)
    check_output(case, inputs)


@pytest.mark.parametrize("tile", ["1", "64,3,1,1,168"], ids=["gather-tile", "gather-1-warp-1-program-an-sm"])
@pytest.mark.parametrize("case", GATHER_CASES, ids=str)
def test_gathered_pages_match_the_reference(monkeypatch: pytest.MonkeyPatch, case: AttentionCase, tile: str) -> None:
    monkeypatch.setenv(DECODE_HOPPER_GATHER_ENV, tile)
    inputs = build_inputs(case, "cuda")
    _run(inputs, splits=None if case.num_splits is None else 1)
    plan = next(iter(launcher._plans.values()))
    wide = plan.rows > hopper_decode.GATHER_TWO_AN_SM_MAX_ROWS
    expected = (hopper_decode.DECODE_HOPPER_GATHER_WIDE_TILE if wide else hopper_decode.DECODE_HOPPER_GATHER_TILE) \
        if tile == "1" else (64, 3, 1, 1, 168)
    assert (plan.gather_warps, *plan.tile[2:]) == (expected[2], *expected[3:])
    check_output(case, inputs)
    _counters_are_zero()


CASES_128_KEYS = [  # 8 / 16 / 32-row decode tiles over 128-key tiles (P's layout for PV: 8 rows went wrong at 128)
    (DECODE_HOPPER_TILE_ENV, "128,3,1,168", C(Q, KV, layout="paged", page_size=16, **GQA)),
    (DECODE_HOPPER_TILE_ENV, "128,2,1,168", C(Q, KV, layout="cache", **GQA)),
    (DECODE_HOPPER_TILE_ENV, "128,3,1,168", C(Q, KV, heads=(16, 1), d_qk=128, d_v=128, dtype=torch.bfloat16,
                                             layout="paged", page_size=128, causal=True, bottom_right=True)),
    (DECODE_HOPPER_TILE_ENV, "128,3,1,168", C((1, 1, 1, 1), (32768, 5, 4000, 0), layout="paged", page_size=16,
                                             num_splits=None, **GQA)),  # split, merged by the kernel
    (DECODE_HOPPER_GATHER_ENV, "128,3,4,1,168", C(Q, KV, layout="paged", page_size=1, **GQA)),
    (DECODE_HOPPER_GATHER_ENV, "128,3,4,1,168", C(Q, KV, heads=(32, 1), d_qk=128, d_v=128, dtype=torch.bfloat16,
                                                  layout="paged", page_size=4, causal=True, bottom_right=True)),
]


@pytest.mark.parametrize("name, tile, case", CASES_128_KEYS, ids=str)
def test_128_key_tiles_match_the_reference(monkeypatch: pytest.MonkeyPatch, name: str, tile: str,
                                           case: AttentionCase) -> None:
    """The tile overrides' 128-key tiles (A/B measurements; 64 keys are the default), TMA-loaded and gathered."""
    monkeypatch.setenv(name, tile)
    inputs = build_inputs(case, "cuda")
    _run(inputs, splits=None if case.num_splits is None else 1)
    assert next(iter(launcher._plans.values())).tile[0] == 128
    check_output(case, inputs)
    _counters_are_zero()


MHA16 = {"heads": (16, 16), "d_qk": 128, "d_v": 128, "dtype": torch.bfloat16, "causal": True, "bottom_right": True}
CASES_KV_HEADS = [  # KV heads sharing a tile (DECODE_HOPPER_HEADS_ENV): (heads an item, tile override, case)
    (2, None, C(Q, KV, layout="paged", page_size=16, **GQA)),  # 32 keys a head: two pages a head a tile
    (4, None, C(Q, KV, layout="paged", page_size=16, **GQA)),  # 16 keys a head: a page; 16 rows
    (2, None, C(Q, KV, layout="paged", page_size=64, **GQA)),  # a page holds a head's keys of two tiles
    (2, None, C(Q, KV, layout="paged", page_size=256, **GQA)),
    (2, None, C(Q, KV, layout="cache", **GQA)),
    (2, "128,3,1,168", C(Q, KV, layout="paged", page_size=16, **GQA)),  # 64 keys a head
    (8, "128,3,1,168", C(Q, KV, layout="paged", page_size=16, **MHA16)),  # 8 heads of one row: 8 rows, 16 keys each
    (8, "128,3,1,168", C(Q, KV, layout="cache", **MHA16)),
    (4, None, C(Q, KV, heads=(16, 4), d_qk=64, d_v=64, dtype=torch.float16, layout="paged", page_size=16)),
    (2, None, C((4, 3, 4, 1, 2, 4), (4096, 77, 4, 33, 1200, 4), layout="paged", page_size=16, **GQA)),  # 32 rows
    (2, None, C(Q, KV, heads=(16, 2), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=32,
                causal=True)),  # top-left causal
    (2, None, C((1, 0, 1) + Q, (300, 20, 0) + KV, layout="paged", page_size=16, **GQA)),
    (2, None, C((1,), (8192,), layout="paged", page_size=16, num_splits=None, **GQA)),  # split, merged by the kernel
    (2, None, C((1, 1, 1, 1), (32768, 5, 4000, 0), layout="paged", page_size=16, num_splits=None, **GQA)),
]


@pytest.mark.parametrize("heads, tile, case", CASES_KV_HEADS, ids=str)
def test_kv_heads_sharing_a_tile_match_the_reference(monkeypatch: pytest.MonkeyPatch, heads: int, tile: str | None,
                                                     case: AttentionCase) -> None:
    """An item of ``heads`` KV heads (their rows masked against the other heads' keys) against the reference."""
    monkeypatch.setenv(hopper_decode.DECODE_HOPPER_HEADS_ENV, str(heads))
    if tile is not None:
        monkeypatch.setenv(DECODE_HOPPER_TILE_ENV, tile)
    inputs = build_inputs(case, "cuda")
    _run(inputs, splits=None if case.num_splits is None else 1)
    assert next(iter(launcher._plans.values())).kv_heads_per_item == heads
    check_output(case, inputs)
    _counters_are_zero()


RULE_CASES = [  # batches whose walks take one split and fill the SMs: kv_heads_per_item's rule packs KV heads
    # (heads an item, case)
    (2, C((1,) * 64, (1, 17, 64, 65, 300, 1000, 1024, 2047, 2500, 4096, 31, 128) * 5 + (4096, 77, 3000, 16),
          layout="paged", page_size=16, **GQA)),
    (2, C((1,) * 64, (4096, 100, 2047, 9) * 16, layout="cache", **GQA)),
    (1, C((1,) * 64, (4096, 1, 2047, 300) * 16, layout="paged", page_size=1, **GQA)),  # gathered: one head
    (4, C((1,) * 32, (4096, 1, 2047, 300) * 8, layout="paged", page_size=16, **MHA16)),
]


@pytest.mark.parametrize("heads, case", RULE_CASES, ids=str)
def test_the_rule_packs_kv_heads_on_large_batches(heads: int, case: AttentionCase) -> None:
    inputs = build_inputs(case, "cuda")
    _run(inputs, splits=1)
    assert next(iter(launcher._plans.values())).kv_heads_per_item == heads
    check_output(case, inputs)


def _counters_are_zero() -> None:
    assert all(not counters.any() for counters in combine._split_counters.values())


@pytest.mark.parametrize("merge", [None, "0"])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=str)
def test_split_decode_matches_the_reference(monkeypatch: pytest.MonkeyPatch, case: AttentionCase,
                                            merge: str | None) -> None:
    """Merged by the kernel's last split of each walk (its counters back to zeros) or, with
    ATTN_FUSED_HOPPER_DECODE_MERGE=0, by combine.py's launch."""
    if merge is not None:
        monkeypatch.setenv(DECODE_HOPPER_MERGE_ENV, merge)
    inputs = build_inputs(case, "cuda")
    for _ in range(2):  # the second call finds the counters the first left
        _run(inputs)
        plan = next(iter(launcher._plans.values()))
        assert plan.num_splits > 1 and (plan.merge_rows > 0) is (plan.combine is None)
        assert merge is None or plan.merge_rows == 0
        check_output(case, inputs)
        _counters_are_zero()


@pytest.mark.parametrize("splits", [2, 3, 7, 16, 64])
def test_fixed_split_counts_match_the_reference(monkeypatch: pytest.MonkeyPatch, splits: int) -> None:
    """Splits with no tiles (a walk shorter than the split count) write empty partials the merge ignores; up to 16
    (8 walks, at most 128 items: one a program) the kernel merges, an odd count in a power-of-2 block; 64 go to
    combine.py."""
    monkeypatch.setenv(DECODE_HOPPER_TILE_ENV, ",".join(map(str, (*DECODE_HOPPER_TILE, splits))))
    case = C((1,) * 4, (17, 300, 2047, 4096), heads=(16, 2), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged",
             page_size=16, causal=True, bottom_right=True, num_splits=None)
    inputs = build_inputs(case, "cuda")
    _run(inputs, splits=splits)
    assert (next(iter(launcher._plans.values())).merge_rows > 0) is (splits <= 16)
    check_output(case, inputs)
    _counters_are_zero()


def test_the_switch_sends_decodes_to_the_general_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    case = C(Q, KV, layout="paged", page_size=16, num_splits=None, **GQA)
    monkeypatch.setenv(DECODE_HOPPER_ENV, "0")
    inputs = build_inputs(case, "cuda")
    launcher._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    assert {type(plan).__name__ for plan in launcher._plans.values()} == {"ForwardPlan"}
    check_output(case, inputs)


@pytest.mark.parametrize("switch, gathered", [(None, True), ("0", False)])
def test_small_pages_are_gathered_unless_switched_off(monkeypatch: pytest.MonkeyPatch, switch: str | None,
                                                       gathered: bool) -> None:
    """Pages of 1-8 tokens go to the decode kernel's gather by default (DECODE_HOPPER_GATHER_TILE: two programs an
    SM), to the general kernel with DECODE_HOPPER_GATHER_ENV=0."""
    if switch is not None:
        monkeypatch.setenv(DECODE_HOPPER_GATHER_ENV, switch)
    case = C(Q, KV, layout="paged", page_size=1, num_splits=None, **GQA)
    inputs = build_inputs(case, "cuda")
    launcher._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    kinds = {type(plan).__name__ for plan in launcher._plans.values()}
    assert ("DecodeHopperPlan" in kinds) is gathered, kinds
    check_output(case, inputs)
    _counters_are_zero()


@pytest.mark.parametrize("num_splits", [1, None])
def test_cuda_graph_replay_with_new_lengths(num_splits: int | None) -> None:
    """Lengths are read on the device: a graph captured once replays a batch whose long sequence moved."""
    first = C((1, 1, 1) + Q, (5000, 40, 700) + KV, layout="paged", page_size=16, num_splits=num_splits, **GQA)
    inputs = build_inputs(first, "cuda")
    _run(inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    second = C((1, 1, 1) + Q, (700, 5000, 40) + KV, layout="paged", page_size=16, num_splits=num_splits, **GQA)
    moved = build_inputs(second, "cuda")
    load_inputs_into(inputs, moved)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        _counters_are_zero()
    moved["out_base"].copy_(inputs["out_base"])
    check_output(second, moved)
