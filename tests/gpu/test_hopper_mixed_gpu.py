"""The Gluon sm90 mixed-batch kernel (attention/kernels/attention_mixed_hopper.py) against the fp32 reference, on an
H100 / H200 (every mixed batch it can run goes there); each case checks that it ran (a MixedHopperPlan), the rows
against the reference and that padding rows of out were not written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from attention.kernels import attention_forward
from attention.kernels import attention_fwd as launcher
from attention.kernels.hopper_mixed import (
    MIXED_HOPPER_DEVICE_RULE_ENV,
    MIXED_HOPPER_ENV,
    MIXED_HOPPER_L2_DEALT_ENV,
    MIXED_HOPPER_L2_SECTION_ENV,
    MIXED_HOPPER_PREFILL_TILE,
    MIXED_HOPPER_TILE_ENV,
    PREFILL_TO_DECODE_RATIO,
    prefill_outweighs_decodes,
)
from tests.test_kernels import SENTINEL, AttentionCase, build_inputs, check_output, load_inputs_into

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm90 GPU (H100 / H200)"),
]

C = AttentionCase
DECODES_Q = (1,) * 12
DECODES_KV = (1, 17, 64, 65, 300, 1000, 1024, 2047, 2500, 4096, 31, 128)
MIXED_Q = DECODES_Q + (300, 700)  # decodes, a prefill, a chunk
MIXED_KV = DECODES_KV + (300, 2900)
ONE_TOKEN_DECODE_CASES = [
    *[C(DECODES_Q + (700,), DECODES_KV + (2000,), heads=heads, d_qk=128, d_v=128, dtype=torch.bfloat16,
        layout="paged", page_size=16, causal=True, bottom_right=True) for heads in ((32, 8), (16, 2), (8, 8))],
    C((2, 0) + DECODES_Q + (900,), (77, 30) + DECODES_KV + (1500,), heads=(32, 8), d_qk=128, d_v=128,
      dtype=torch.bfloat16, layout="paged", page_size=16, causal=True, bottom_right=True),
]
"""A prefill beside one-token decodes (groups 4, 8 and 1), and a 2-query decode beside a sequence of none: with the
call's real token count, decode tiles of 8 rows (a group's rows; 2 queries x 4 heads)."""
VERIFICATION_STEPS_CASE = C((1, 4, 1, 3, 2) + DECODES_Q + (700,), (50, 900, 1, 2049, 64) + DECODES_KV + (2000,),
                            heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=16,
                            causal=True, bottom_right=True)
"""Group 4 with verification steps of 2-4 queries beside a prefill (decode tiles of 16 rows)."""
CASES = [
    *[C(MIXED_Q, MIXED_KV, heads=(32, 8), d_qk=128, d_v=128, dtype=dtype, layout="paged", page_size=page_size,
        causal=True, bottom_right=True)
      for page_size, dtype in ((16, torch.bfloat16), (32, torch.float16), (64, torch.bfloat16), (256, torch.bfloat16))],
    C(MIXED_Q, MIXED_KV, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="cache", causal=True,
      bottom_right=True),
    C(MIXED_Q, MIXED_KV, heads=(16, 4), d_qk=64, d_v=64, dtype=torch.float16, layout="paged", page_size=16),
    # group 8 (decode tiles of 16 rows): a full decode tile (2 queries x 8 heads), verification rows (4 x 8 = 32
    # packed rows) and 8 x 8 as prefill items
    C((4, 2, 4, 1, 8) + DECODES_Q + (500,), (900, 77, 4, 33, 1200) + DECODES_KV + (1800,), heads=(16, 2), d_qk=128,
      d_v=128, dtype=torch.bfloat16, layout="paged", page_size=16, causal=True, bottom_right=True),
    # a prefill beside one-token decodes (with build_inputs' padded total_q the host plans 16-row decode tiles;
    # test_mixed_kernel_with_eight_row_decode_tiles runs them on 8)
    *ONE_TOKEN_DECODE_CASES,
    VERIFICATION_STEPS_CASE,
    # MQA (group 32: decode tiles of 32 rows, full at one query token)
    C(MIXED_Q, MIXED_KV, heads=(32, 1), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=64,
      causal=True, bottom_right=True),
    # top-left causal: a decode row sees the first key only; a 9-token sequence is a prefill item at group 8
    C(DECODES_Q + (9, 600), DECODES_KV + (40, 650), heads=(16, 2), d_qk=128, d_v=128, dtype=torch.bfloat16,
      layout="paged", page_size=32, causal=True),
    # sequences with no queries or no keys between the others
    C((1, 0, 1) + DECODES_Q + (400, 1), (300, 20, 0) + DECODES_KV + (900, 128), heads=(32, 8), d_qk=128, d_v=128,
      dtype=torch.bfloat16, layout="paged", page_size=16, causal=True, bottom_right=True),
    # scores rising along the keys in some rows (running maxes that move every few tiles), falling in others
    C(MIXED_Q, MIXED_KV, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=16,
      causal=True, bottom_right=True, score_drift=3.0),
]
"""Every batch is mixed (configs.mixed_batch: the longest sequence has at least 8x the average queries)."""


def _run(inputs: dict) -> None:
    launcher._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    kinds = {type(plan).__name__ for plan in launcher._plans.values()}
    assert kinds == {"MixedHopperPlan"}, f"planned {kinds}"


@pytest.mark.parametrize("device_rule", ["0", "1"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_mixed_kernel_matches_the_reference(case: AttentionCase, device_rule: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Without total_kv: the 64-key tile alone (``0``), or both tiles launched and the device's lengths picking
    (``1``, the default: the prefill tile on these batches at d128)."""
    monkeypatch.setenv(MIXED_HOPPER_DEVICE_RULE_ENV, device_rule)
    inputs = build_inputs(case, "cuda")
    _run(inputs)
    check_output(case, inputs)


ONE_V_SLOT_TILE = "128,2,64,2,192,104,128,1"
"""128-key prefill tiles beside a decode ring of two K slots and one V slot, MIXED_HOPPER_PREFILL_TILE's d128 entry for
8-row decode tiles (hopper_mixed.MIXED_HOPPER_TILE's docstring has its M1 / M2 figures)."""


@pytest.mark.parametrize("case", CASES, ids=str)
def test_mixed_kernel_with_one_decode_v_slot(case: AttentionCase, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same batches on ONE_V_SLOT_TILE: the decode loop's V slot and phase (attention_fwd_hopper._v_slot) and the
    wider prefill tiles."""
    monkeypatch.setenv(MIXED_HOPPER_TILE_ENV, ONE_V_SLOT_TILE)
    inputs = build_inputs(case, "cuda")
    _run(inputs)
    (plan,) = launcher._plans.values()
    assert plan.tile[0] == 128 and plan.tile[7] == 1, plan.tile
    check_output(case, inputs)


EIGHT_ROW_CASES = [
    *ONE_TOKEN_DECODE_CASES,
    C(DECODES_Q + (700,), DECODES_KV + (2000,), heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16,
      layout="cache", causal=True, bottom_right=True),
]
"""Mixed batches of one-token decodes (and a 2-query one at group 4) beside a prefill, run with total_q their real
token count: the host then plans decode tiles of 8 rows (mixed_decode_rows), and at d128 the register split of
MIXED_HOPPER_SMALL_DECODE_REGISTERS. (build_inputs passes a padded bound, which plans 16-row tiles.)"""


@pytest.mark.parametrize("device_rule", ["0", "1"])
@pytest.mark.parametrize("case", EIGHT_ROW_CASES, ids=str)
def test_mixed_kernel_with_eight_row_decode_tiles(case: AttentionCase, device_rule: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MIXED_HOPPER_DEVICE_RULE_ENV, device_rule)
    inputs = build_inputs(case, "cuda")
    inputs["call"]["total_q"] = sum(case.q_lens)
    _run(inputs)
    (plan,) = launcher._plans.values()
    assert plan.decode_rows == 8, plan.decode_rows
    check_output(case, inputs)


HEAVY_PREFILL_CASES = [
    *EIGHT_ROW_CASES,
    VERIFICATION_STEPS_CASE,  # 16-row decode tiles
    replace(ONE_TOKEN_DECODE_CASES[0], heads=(32, 1), page_size=64),  # MQA (32-row decode tiles)
    replace(VERIFICATION_STEPS_CASE, d_qk=64, d_v=64),  # d64 verification steps (16 rows)
    # d64: 128-key prefill tiles beside the whole decode ring, over pages and a non-paged cache
    replace(ONE_TOKEN_DECODE_CASES[0], d_qk=64, d_v=64),
    replace(EIGHT_ROW_CASES[-1], heads=(16, 4), d_qk=64, d_v=64, dtype=torch.float16),
]
"""Mixed batches whose prefill outweighs their decodes (hopper_mixed.prefill_outweighs_decodes) with decode tiles of
8, 16 or 32 rows, at d128 and d64: MIXED_HOPPER_PREFILL_TILE's tiles."""


@pytest.mark.parametrize("case", HEAVY_PREFILL_CASES, ids=str)
def test_a_heavy_prefill_runs_on_the_prefill_tile(case: AttentionCase) -> None:
    """The batches with their real token count and total_kv, as a serving step passes them: the plan takes
    MIXED_HOPPER_PREFILL_TILE's tile for its head dim and decode tile rows without an override."""
    inputs = build_inputs(case, "cuda")
    inputs["call"]["total_q"] = sum(case.q_lens)
    inputs["call"]["total_kv"] = sum(case.kv_lens)
    _run(inputs)
    (plan,) = launcher._plans.values()
    assert plan.tile == MIXED_HOPPER_PREFILL_TILE[case.d_qk, plan.decode_rows], (plan.tile, plan.decode_rows)
    check_output(case, inputs)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_prefill_items_in_l2_sections_off_the_queue(case: AttentionCase, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same batches with sections of one KV head (a 0 MiB budget, none dealt for fitting L2), their prefill
    items taken off the queue (MQA: one section, dealt)."""
    monkeypatch.setenv(MIXED_HOPPER_L2_SECTION_ENV, "0")
    monkeypatch.setenv(MIXED_HOPPER_L2_DEALT_ENV, "0")
    inputs = build_inputs(case, "cuda")
    _run(inputs)
    (plan,) = launcher._plans.values()
    heads_q, heads_kv = case.heads
    assert plan.section_heads == (heads_q // heads_kv if heads_kv > 1 else 0), plan.section_heads
    check_output(case, inputs)


def test_the_switch_sends_mixed_batches_to_the_general_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2k chunk on a 2k prefix beside decodes over 16-token pages: the mixed kernel by default, the general one
    with ATTN_FUSED_HOPPER_MIXED=0; both match the reference."""
    case = C((2048,) + (1,) * 40, (4096,) + (2048,) * 40, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16,
             layout="paged", page_size=16, causal=True, bottom_right=True, num_splits=None)
    for switch, kind in ((None, "MixedHopperPlan"), ("0", "ForwardPlan")):
        if switch is not None:
            monkeypatch.setenv(MIXED_HOPPER_ENV, switch)
        inputs = build_inputs(case, "cuda")
        launcher._plans.clear()
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
        assert {type(plan).__name__ for plan in launcher._plans.values()} == {kind}
        check_output(case, inputs)


def replay_with_new_lengths(run: Callable[[dict], None], replays: int = 1) -> None:
    """A graph captured on a mixed batch (``run`` plans and checks it first) replayed ``replays`` times on a batch
    whose prefill moved to another sequence; every replay matches the reference."""
    first = C((1, 1, 600) + DECODES_Q, (900, 40, 700) + DECODES_KV, heads=(32, 8), d_qk=128, d_v=128,
              dtype=torch.bfloat16, layout="paged", page_size=16, causal=True, bottom_right=True)
    inputs = build_inputs(first, "cuda")
    run(inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    second = C((600, 1, 1) + DECODES_Q, (700, 900, 40) + DECODES_KV, heads=(32, 8), d_qk=128, d_v=128,
               dtype=torch.bfloat16, layout="paged", page_size=16, causal=True, bottom_right=True)
    moved = build_inputs(second, "cuda")
    for _ in range(replays):
        load_inputs_into(inputs, moved)
        graph.replay()
        torch.cuda.synchronize()
        moved["out_base"].copy_(inputs["out_base"])
        check_output(second, moved)


def test_cuda_graph_replay_with_new_lengths() -> None:
    """The schedule is built on the device from cu_seqlens_q: a graph captured once replays a batch whose prefill
    moved to another sequence."""
    replay_with_new_lengths(_run)


def test_cuda_graph_replays_leave_the_queue_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replays of a launch whose prefill items come off the queue: each launch leaves the queue at zero for the
    next, so every replay runs every item."""
    monkeypatch.setenv(MIXED_HOPPER_L2_SECTION_ENV, "0")
    monkeypatch.setenv(MIXED_HOPPER_L2_DEALT_ENV, "0")

    def run(inputs: dict) -> None:
        _run(inputs)
        (plan,) = launcher._plans.values()
        assert plan.section_heads == 4, plan.section_heads

    replay_with_new_lengths(run, replays=3)


LIGHT_BATCH = C((256,) + (1,) * 40, (256,) + (2048,) * 40, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16,
                layout="paged", page_size=16, causal=True, bottom_right=True, num_pages=5200, max_pages=257)
"""A 256-token prefill beside 40 decodes at 2k: the decodes outweigh it (prefill_outweighs_decodes), the 64-key tile."""
HEAVY_BATCH = replace(LIGHT_BATCH, kv_lens=(4096,) + (64,) * 40)
"""The same shapes (tokens, pages, page table) with the prefill's chunk on a 3,840-token prefix and short decodes:
the prefill outweighs them, the prefill tile."""


def _planned_without_total_kv(case: AttentionCase, inputs: dict, max_seqlen_kv: int | None = None) -> Any:
    """Plan and run ``inputs``' call as a CUDA graph's capture plans it (no total_kv; max_seqlen_kv a bound when
    given), with its real token count (8-row decode tiles); returns the plan: both tiles."""
    inputs["call"]["total_q"] = sum(case.q_lens)
    if max_seqlen_kv is not None:
        inputs["call"]["max_seqlen_kv"] = max_seqlen_kv
    _run(inputs)
    (plan,) = launcher._plans.values()
    assert plan.tile_rule == 2 and plan.heavy_plan is not None and plan.heavy_plan.tile_rule == 1
    assert (plan.tile[0], plan.heavy_plan.tile[0], plan.decode_rows) == (64, 128, 8)
    return plan


def _check_each_launch_alone(case: AttentionCase, inputs: dict, plan: Any, heavy: bool) -> None:
    """The pair's two launches each alone: the one the rule picks on the device's lengths writes every row, the
    other returns at once and leaves out's sentinel."""
    call = inputs["call"]
    for launch, runs in ((replace(plan, heavy_plan=None), not heavy), (plan.heavy_plan, heavy)):
        inputs["out_base"].fill_(SENTINEL)
        launcher.launch_plan(launch, inputs["q"], inputs["k"], inputs["v"], inputs["out"], call["cu_seqlens_q"],
                             call["cu_seqlens_kv"], call.get("q_start"), call.get("kv_start"), call["page_table"],
                             None, None)
        torch.cuda.synchronize()
        if runs:
            check_output(case, inputs)
        else:
            assert bool((inputs["out_base"] == SENTINEL).all()), f"tile rule {launch.tile_rule} ran on {case}"


@pytest.mark.parametrize("case, heavy", [(LIGHT_BATCH, False), (HEAVY_BATCH, True)], ids=["light", "heavy"])
def test_without_host_lengths_the_device_lengths_pick_the_launch_that_runs(case: AttentionCase, heavy: bool) -> None:
    """Both launches together match the reference; each alone runs only on its side of the rule."""
    inputs = build_inputs(case, "cuda")
    plan = _planned_without_total_kv(case, inputs, max_seqlen_kv=4096)
    check_output(case, inputs)
    _check_each_launch_alone(case, inputs, plan, heavy)


def _threshold_batch(group_size: int, causal: bool, extra: int) -> AttentionCase:
    """A 128-token chunk on a 1,024-key prefix (the longest sequence) beside 16 one-token decodes whose KV tokens sum
    to the largest count the prefill still outweighs (prefill_outweighs_decodes), plus ``extra``."""
    pairs_twice = 128 * (2 * 1024 - 128) if causal else 2 * 128 * 1024
    decode_tokens = pairs_twice * group_size // (2 * PREFILL_TO_DECODE_RATIO) + extra
    lengths = [decode_tokens // 16 + (i < decode_tokens % 16) for i in range(16)]
    return C((128,) + (1,) * 16, (1024,) + tuple(lengths), heads=(8 * group_size, 8) if group_size < 8 else (16, 2),
             d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=16, causal=causal, bottom_right=True)


@pytest.mark.parametrize("extra", [0, 1], ids=["at the threshold", "one token past"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "no mask"])
@pytest.mark.parametrize("group_size", [1, 4, 8])
def test_the_device_rule_turns_where_the_host_rule_does(group_size: int, causal: bool, extra: int) -> None:
    """Batches one KV token either side of the rule's threshold, causal or not, at 1, 4 and 8 query heads a KV head:
    the launch that runs is the one prefill_outweighs_decodes picks with the exact mean KV length."""
    case = _threshold_batch(group_size, causal, extra)
    num_seqs, total_kv = len(case.kv_lens), sum(case.kv_lens)
    heavy = prefill_outweighs_decodes(num_seqs, 128, 1024, total_kv / num_seqs, causal, group_size)
    assert heavy is (extra == 0)
    inputs = build_inputs(case, "cuda")
    plan = _planned_without_total_kv(case, inputs)
    _check_each_launch_alone(case, inputs, plan, heavy)


def test_a_captured_pair_replays_light_and_heavy_steps() -> None:
    """A graph captured on a light step (both tiles launched, planned without lengths) replays a heavy one and the
    light one again: the device picks per replay, and every replay matches the reference."""
    inputs = build_inputs(LIGHT_BATCH, "cuda")
    _planned_without_total_kv(LIGHT_BATCH, inputs, max_seqlen_kv=4096)
    check_output(LIGHT_BATCH, inputs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    for case in (HEAVY_BATCH, LIGHT_BATCH, HEAVY_BATCH):
        moved = build_inputs(case, "cuda")
        load_inputs_into(inputs, moved)
        graph.replay()
        torch.cuda.synchronize()
        moved["out_base"].copy_(inputs["out_base"])
        check_output(case, moved)
