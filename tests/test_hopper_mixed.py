"""Host side of the Gluon sm90 mixed-batch kernel (attention/kernels/hopper_mixed.py) on CPU: which mixed batches
it takes, and the launch a plan makes, with the kernel stubbed (it runs in tests/gpu/test_hopper_mixed_gpu.py and
compiles for sm90 in tests/sm90_compile.py)."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import hopper_forward, hopper_mixed
from attention.kernels.attention_fwd import kv_length_buckets
from attention.kernels.hopper_forward import plan_hopper_forward
from attention.kernels.hopper_mixed import (
    MIXED_HOPPER_DEVICE_RULE_ENV,
    MIXED_HOPPER_ENV,
    MIXED_HOPPER_L2_DEALT_ENV,
    MIXED_HOPPER_L2_SECTION_ENV,
    MIXED_HOPPER_PREFILL_TILE,
    MIXED_HOPPER_QUEUE_ENV,
    MIXED_HOPPER_TILE_ENV,
    PREFILL_TO_DECODE_RATIO,
    MixedHopperPlan,
    decode_tile_rows,
    mixed_decode_rows,
    mixed_hopper_unsupported_reason,
    prefill_outweighs_decodes,
)
from tests.test_hopper_forward import _RecordedLaunch


@pytest.mark.parametrize("switch, page_size, taken", [
    (None, 16, True),  # every mixed batch the kernel can run, paged or not (it measured faster on all but one tie)
    (None, 0, True),
    ("1", 64, True),
    ("0", 16, False),
    (None, 8, False),  # pages under 16 tokens: a TMA load per page would be tiny
    (None, 48, False),  # pages that neither divide a tile nor hold whole ones
])
def test_the_switch_and_the_pages(monkeypatch: pytest.MonkeyPatch, switch: str | None, page_size: int,
                                  taken: bool) -> None:
    if switch is not None:
        monkeypatch.setenv(MIXED_HOPPER_ENV, switch)
    reason = mixed_hopper_unsupported_reason(128, 4, 65, page_size)
    assert (reason is None) is taken, reason


def test_limits_are_named() -> None:
    assert "head dims" in mixed_hopper_unsupported_reason(96, 4, 65, 16)
    assert "query heads per KV head" in mixed_hopper_unsupported_reason(128, 128, 65, 16)
    assert "sequences" in mixed_hopper_unsupported_reason(128, 4, hopper_mixed.MIXED_HOPPER_MAX_SEQS, 16)


def _paged_mixed_batch(num_decodes: int = 64, page_size: int = 16):
    total = 2048 + num_decodes
    q = torch.randn(1, total, 32, 128, dtype=torch.bfloat16)
    k = torch.randn(4096, page_size, 8, 128, dtype=torch.bfloat16)
    return q, k, total


@pytest.mark.parametrize("switch, planned", [(None, MixedHopperPlan), ("0", type(None))])
def test_plan_hopper_forward_hands_mixed_batches_to_the_mixed_kernel(monkeypatch: pytest.MonkeyPatch,
                                                                     switch: str | None, planned: type) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is not None:
        monkeypatch.setenv(MIXED_HOPPER_ENV, switch)
    q, k, total = _paged_mixed_batch()
    plan = plan_hopper_forward(q, k, k, q, num_seqs=65, max_seqlen_q=2048, max_seqlen_kv=4096, total_q=total,
                               softmax_scale=0.1,
                               window=(-1, 0), bottom_right=True, page_size=16, alibi=False, sink=False,
                               has_q_start=False, has_kv_start=False, num_sms=132)
    assert type(plan) is planned


@pytest.mark.parametrize("rows, tile_rows", [(1, 8), (4, 8), (5, 8), (8, 8), (9, 16), (16, 16), (17, 32), (64, 64)])
def test_decode_tiles_have_room_for_their_rows_and_are_a_power_of_two_from_8(rows: int, tile_rows: int) -> None:
    assert decode_tile_rows(rows) == tile_rows


@pytest.mark.parametrize("group_size, queries, rows", [
    (4, (2048,) + (1,) * 128, 8),  # a prefill + one-token decodes: a group's rows, at least 8
    (8, (2048,) + (1,) * 64, 8), (1, (700, 1, 1), 8), (16, (500,) + (1,) * 8, 16), (32, (500, 1), 32),
    (4, (2048,) + (4,) * 64, 16),  # verification steps: room for 4 queries of a 4-head group
    (4, (2048, 900) + (1,) * 64, 16),  # a second prefill: the host cannot tell, so 16
    (4, (2048, 0, 2) + (1,) * 64, 8),  # one query each on average: the 2-query decode (8 rows) still fits
    (32, (2048,) + (4,) * 8, 32),
])
def test_mixed_decode_tiles_fit_verification_steps_unless_the_host_values_rule_them_out(
        group_size: int, queries: tuple[int, ...], rows: int) -> None:
    assert mixed_decode_rows(group_size, len(queries), sum(queries), max(queries)) == rows


def test_a_plan_launches_one_program_per_sm_with_page_sized_boxes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setenv(MIXED_HOPPER_TILE_ENV, "64,2,64,3,176,136,128")
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_mixed, "attention_mixed_hopper_kernel", kernel)
    q, k, total = _paged_mixed_batch(num_decodes=300)
    plan = plan_hopper_forward(q, k, k, q, num_seqs=301, max_seqlen_q=2048, max_seqlen_kv=4096, total_q=total,
                               softmax_scale=0.1,
                               window=(-1, 0), bottom_right=True, page_size=16, alibi=False, sink=False,
                               has_q_start=False, has_kv_start=False, num_sms=132)
    cu = torch.zeros(302, dtype=torch.int32)
    plan(q, k, k, q, cu, cu, None, None, torch.zeros(301, 1024, dtype=torch.int32))
    (grid, args, kwargs), = kernel.calls
    assert grid == (132, 1, 1)
    q_desc, k_desc, v_desc, k_decode_desc, v_decode_desc = args[:5]
    assert list(q_desc.block_shape) == [64, 128]
    assert all(list(d.block_shape) == [16, 128] for d in (k_desc, v_desc, k_decode_desc, v_decode_desc))
    assert args[5] is q and args[13] == 301 and args[14] == 8  # q by pointer (decode rows), sequences, KV heads
    assert args[12] is cu  # the queue's slot, unread by a dealt launch: no counters looked up
    assert args[-1] == 32 and not kwargs["QUEUE"]  # 16 MiB hold all 8 KV heads' 4k keys: one section, items dealt
    assert kwargs["LOG2_MAX_SEQS"] == 9 and 2 ** kwargs["LOG2_MAX_SEQS"] > 301
    assert (kwargs["BLOCK_N"], kwargs["DECODE_BLOCK_N"], kwargs["PAGE_SIZE"], kwargs["maxnreg"]) == (64, 64, 16, 128)
    assert kwargs["DECODE_ROWS"] == 8  # one query token each beside the prefill: a 4-head group's rows, at least 8
    assert args[-2] == 0  # no rows past the last sequence to zero
    plan(q, k, k, q, cu, cu, None, None, torch.zeros(301, 1024, dtype=torch.int32), zero_tail=True)
    assert kernel.calls[-1][1][-2] == total  # zero_tail: the kernel zeroes rows cu_seqlens_q[-1] .. total - 1


@pytest.mark.parametrize("max_seqlen_kv, env, sections", [
    (4096, {}, (32, False)),  # 2 MiB a KV head: every head in one 16 MiB section, dealt
    (16384, {}, (8, True)),  # 8 MiB a KV head (M2's 14k prefix + 2k chunk): sections of 2 KV heads off the queue
    (65536, {}, (4, True)),  # past the budget: one KV head a section
    (6144, {}, (32, False)),  # 24 MiB (the 2k chunk on a 4k prefix): past a section, but L2 holds it: dealt
    (6144, {MIXED_HOPPER_L2_DEALT_ENV: "0"}, (20, True)),  # 3 MiB a KV head: sections of 5
    (10240, {}, (12, True)),  # 40 MiB: past what L2 holds through dealt rounds, sections of 3 KV heads
    (16384, {MIXED_HOPPER_L2_SECTION_ENV: "8"}, (4, True)),
    (16384, {MIXED_HOPPER_QUEUE_ENV: "0"}, (32, False)),  # the dealt order forced
])
def test_long_prefills_run_in_l2_sections_off_a_queue(monkeypatch: pytest.MonkeyPatch, max_seqlen_kv: int,
                                                      env: dict[str, str], sections: tuple[int, bool]) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_mixed, "attention_mixed_hopper_kernel", kernel)
    q, k, total = _paged_mixed_batch(num_decodes=300)
    plan = plan_hopper_forward(q, k, k, q, num_seqs=301, max_seqlen_q=2048, max_seqlen_kv=max_seqlen_kv,
                               total_q=total, softmax_scale=0.1, window=(-1, 0), bottom_right=True, page_size=16,
                               alibi=False, sink=False, has_q_start=False, has_kv_start=False, num_sms=132)
    plan(q, k, k, q, torch.zeros(302, dtype=torch.int32), torch.zeros(302, dtype=torch.int32), None, None,
         torch.zeros(301, 1024, dtype=torch.int32))
    assert len(kernel.calls) == 2  # without total_kv both tiles launch, the device picking one: the same order
    for _, args, kwargs in kernel.calls:
        assert (args[-1], kwargs["QUEUE"]) == sections  # (query heads a section, the queue on)
        if kwargs["QUEUE"]:  # the prefill items' queue: counters left zeros by every launch
            assert args[12] is hopper_mixed.split_counter_buffer(q.device, 2)
            assert args[12].dtype == torch.int32 and args[12].numel() >= 2


@pytest.mark.parametrize("value", ["16MiB", "-4", " 8", "²"])
def test_a_section_budget_that_is_not_a_whole_number_is_refused_by_name(monkeypatch: pytest.MonkeyPatch,
                                                                        value: str) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setenv(MIXED_HOPPER_L2_SECTION_ENV, value)
    q, k, total = _paged_mixed_batch(num_decodes=300)
    with pytest.raises(ValueError, match=MIXED_HOPPER_L2_SECTION_ENV):
        plan_hopper_forward(q, k, k, q, num_seqs=301, max_seqlen_q=2048, max_seqlen_kv=16384, total_q=total,
                            softmax_scale=0.1, window=(-1, 0), bottom_right=True, page_size=16, alibi=False,
                            sink=False, has_q_start=False, has_kv_start=False, num_sms=132)


@pytest.mark.parametrize("override, launched", [
    ("64,2,64,3,176,136,128", (64, 3, 0)),  # BLOCK_N, DECODE_STAGES, DECODE_V_STAGES (0: as many as K's)
    ("128,2,64,2,208,72,128,1", (128, 2, 1)),
])
def test_the_tile_override_may_name_fewer_decode_v_slots(monkeypatch: pytest.MonkeyPatch, override: str,
                                                         launched: tuple[int, int, int]) -> None:
    """ATTN_FUSED_HOPPER_MIXED_TILE's optional eighth integer: the decode ring's V slots (0, K's, when absent)."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setenv(MIXED_HOPPER_TILE_ENV, override)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_mixed, "attention_mixed_hopper_kernel", kernel)
    q, k, total = _paged_mixed_batch(num_decodes=300)
    plan = plan_hopper_forward(q, k, k, q, num_seqs=301, max_seqlen_q=2048, max_seqlen_kv=4096, total_q=total,
                               softmax_scale=0.1, window=(-1, 0), bottom_right=True, page_size=16, alibi=False,
                               sink=False, has_q_start=False, has_kv_start=False, num_sms=132)
    cu = torch.zeros(302, dtype=torch.int32)
    plan(q, k, k, q, cu, cu, None, None, torch.zeros(301, 1024, dtype=torch.int32))
    (_, _, kwargs), = kernel.calls
    assert (kwargs["BLOCK_N"], kwargs["DECODE_STAGES"], kwargs["DECODE_V_STAGES"]) == launched


@pytest.mark.parametrize("override", ["64,2,64", "128,2,64,2,208,72,128,1,9", "128,2,64,2,208,72,x"])
def test_a_tile_override_of_another_length_is_refused(monkeypatch: pytest.MonkeyPatch, override: str) -> None:
    monkeypatch.setenv(MIXED_HOPPER_TILE_ENV, override)
    with pytest.raises(ValueError, match="ATTN_FUSED_HOPPER_MIXED_TILE must hold 7 or 8 comma-separated integers"):
        hopper_mixed._tile(128)


@pytest.mark.parametrize("override, head_dim, decode_rows, registers", [
    (None, 128, 8, (192, 104)),  # one-token decodes of groups up to 8: the prefill consumers take the decodes' spare
    (None, 128, 16, (176, 136)),  # verification steps: the decode loop keeps its registers
    (None, 64, 8, (208, 72)),  # d64: MIXED_HOPPER_PREFILL_TILE's (its whole decode ring fits beside 128-key tiles)
    (None, 64, 16, (192, 104)),  # d64's 16-row decode tiles: MIXED_HOPPER_PREFILL_TILE's too
    ("64,2,64,3,176,136,128", 128, 8, (176, 136)),  # the A/B override wins
])
def test_register_split_follows_the_decode_tiles(monkeypatch: pytest.MonkeyPatch, override: str | None,
                                                 head_dim: int, decode_rows: int, registers: tuple[int, int]) -> None:
    if override is not None:
        monkeypatch.setenv(MIXED_HOPPER_TILE_ENV, override)
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    queries = 1 if decode_rows == 8 else 4
    total = 2048 + 64 * queries
    q = torch.empty(1, total, 32, head_dim, dtype=torch.bfloat16)
    k = torch.empty(4096, 16, 8, head_dim, dtype=torch.bfloat16)
    plan = plan_hopper_forward(q, k, k, q, num_seqs=65, max_seqlen_q=2048, max_seqlen_kv=16384, total_q=total,
                               softmax_scale=0.1, window=(-1, 0), bottom_right=True, page_size=16, alibi=False,
                               sink=False, has_q_start=False, has_kv_start=False, num_sms=132)
    assert type(plan) is MixedHopperPlan and plan.decode_rows == decode_rows
    consumer, decode = plan.tile[4:6]
    assert (consumer, decode) == registers and 2 * consumer + decode + 24 <= 512  # 65,536 registers / 128 lanes


@pytest.mark.parametrize("chunk, kv, decodes, context, heavy", [
    # bench_mixed's M1 / M2 and tile_rule_cells' batches: True where the prefill tile measured faster on the H200
    # (MIXED_HOPPER_PREFILL_TILE's docstring), False where slower
    (2048, 16384, 64, 4096, True), (2048, 2048, 128, 2048, False),
    (2048, 6144, 64, 4096, False), (2048, 30720, 64, 4096, True), (1024, 16384, 64, 4096, True),
    (4096, 16384, 64, 4096, True), (2048, 16384, 32, 4096, True), (2048, 16384, 128, 4096, True),
    (2048, 16384, 64, 8192, True), (2048, 16384, 128, 2048, True), (2048, 2048, 32, 2048, False),
    (2048, 8192, 128, 2048, True), (4096, 4096, 64, 2048, True),
])
def test_the_prefill_tile_goes_to_the_batches_it_measured_faster_on(chunk: int, kv: int, decodes: int, context: int,
                                                                    heavy: bool) -> None:
    """The rule on the host values a call's plan sees (attention_forward's buckets of the lengths)."""
    kv_length, mean_kv = kv_length_buckets(kv, kv + decodes * context, decodes + 1)
    assert prefill_outweighs_decodes(decodes + 1, chunk, kv_length, mean_kv, causal=True, group_size=4) is heavy


def test_the_rule_without_a_mean_kv_length_and_at_its_edges() -> None:
    assert not prefill_outweighs_decodes(65, 2048, 16384, None, causal=True, group_size=4)
    # one decode as long as the prefill; 64 of them
    assert prefill_outweighs_decodes(2, 2048, 16384, 16384, causal=True, group_size=4)
    assert not prefill_outweighs_decodes(65, 2048, 16384, 16384, causal=True, group_size=4)
    # without the causal mask the prefill's rows see all 4k keys: twice the pairs of the causal prefill
    assert prefill_outweighs_decodes(65, 4096, 4096, 2176, causal=False, group_size=4)


@pytest.mark.parametrize("group_size, heavy", [(1, False), (4, True), (32, True)])
def test_the_heads_a_kv_head_weigh_the_prefill_against_the_decodes_bytes(group_size: int, heavy: bool) -> None:
    """A 4k prefill + 64 decodes at 2k (ratio 61 pairs a decode token): GQA 32/8 and MQA take the prefill tile (0.90 /
    0.92x on the H200), MHA's decodes read 4x GQA's bytes a token: not."""
    kv_length, mean_kv = kv_length_buckets(4096, 4096 + 64 * 2048, 65)
    assert prefill_outweighs_decodes(65, 4096, kv_length, mean_kv, causal=True, group_size=group_size) is heavy


def _m2_plan(head_dim: int = 128, queries: int = 1, page_size: int = 16, mean_kv: int | None = 4352) -> MixedHopperPlan:
    """plan_hopper_forward's plan of M2's shape (a 2k chunk on a 14k prefix beside 64 decodes of ``queries``
    queries), the tensor checks passed (callers patch hopper_unsupported_reason)."""
    total = 2048 + 64 * queries
    q = torch.empty(1, total, 32, head_dim, dtype=torch.bfloat16)
    k = (torch.empty(4096, page_size, 8, head_dim, dtype=torch.bfloat16) if page_size
         else torch.empty(65, 16384, 8, head_dim, dtype=torch.bfloat16))
    return plan_hopper_forward(q, k, k, q, num_seqs=65, max_seqlen_q=2048, max_seqlen_kv=16384, total_q=total,
                               softmax_scale=0.1, window=(-1, 0), bottom_right=True, page_size=page_size,
                               alibi=False, sink=False, has_q_start=False, has_kv_start=False, num_sms=132,
                               mean_seqlen_kv=mean_kv)


@pytest.mark.parametrize("head_dim, queries, page_size, mean_kv, heavy_tile, device_picks", [
    (128, 1, 16, 4352, True, False),  # M2: one-token decodes, page 16
    (128, 1, 0, 4352, True, False),  # non-paged
    (128, 1, 64, 4352, True, False), (128, 1, 256, 4352, True, False),  # pages that divide or hold 128-key boxes
    (128, 1, 16, 16384, False, False),  # decodes as long as the prefill: they outweigh it
    (128, 1, 16, None, False, True),  # no total_kv: the host cannot tell; the device picks between the two
    (128, 4, 16, 4352, True, False),  # verification steps (16-row decode tiles): their own register split
    (128, 4, 16, None, False, True),
    (64, 1, 16, None, True, False),  # d64: the whole decode ring fits beside 128-key tiles, every batch takes them
    (64, 4, 16, None, True, False),  # d64 with 16-row decode tiles: the whole ring too
])
def test_plans_take_the_prefill_tile_where_the_rule_and_the_kernel_allow(
        monkeypatch: pytest.MonkeyPatch, head_dim: int, queries: int, page_size: int, mean_kv: int | None,
        heavy_tile: bool, device_picks: bool) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    plan = _m2_plan(head_dim, queries, page_size, mean_kv)
    assert type(plan) is MixedHopperPlan
    assert (plan.tile == MIXED_HOPPER_PREFILL_TILE.get((head_dim, plan.decode_rows))) is heavy_tile, plan.tile
    if heavy_tile:
        assert plan.descriptors[1].block[0] == min(128, page_size or 128)  # prefill K boxes: 128 keys or a page
    assert (plan.heavy_plan is not None) is device_picks
    if device_picks:
        assert plan.heavy_plan.tile == MIXED_HOPPER_PREFILL_TILE[head_dim, plan.decode_rows]
        assert plan.heavy_plan.descriptors[1].block[0] == 16 and plan.heavy_plan.heavy_plan is None


@pytest.mark.parametrize("mean_kv, env, rules", [
    (None, None, [(2, 64), (1, 128)]),  # the host has no lengths: both tiles, the light one first
    (None, "1", [(2, 64), (1, 128)]),
    (None, "0", [(0, 64)]),  # switched off: the 64-key tile alone, as before the device rule
    (4352, None, [(0, 128)]),  # the host's lengths pick the prefill tile: one launch
    (16384, None, [(0, 64)]),
])
def test_without_host_lengths_both_tiles_launch_and_the_device_picks(
        monkeypatch: pytest.MonkeyPatch, mean_kv: int | None, env: str | None, rules: list[tuple[int, int]]) -> None:
    """Each launch of the pair reads the lengths on the device and returns unless the rule picks its tile
    (TILE_RULE 1: a heavy prefill, 2: not), at the host rule's ratio; with lengths on the host nothing is left to
    the device."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if env is not None:
        monkeypatch.setenv(MIXED_HOPPER_DEVICE_RULE_ENV, env)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_mixed, "attention_mixed_hopper_kernel", kernel)
    plan = _m2_plan(mean_kv=mean_kv)
    q, k, total = _paged_mixed_batch()
    cu = torch.zeros(66, dtype=torch.int32)
    plan(q, k, k, q, cu, cu, None, None, torch.zeros(65, 1024, dtype=torch.int32), zero_tail=True)
    assert [(kwargs["TILE_RULE"], kwargs["BLOCK_N"]) for _, _, kwargs in kernel.calls] == rules
    for _, args, kwargs in kernel.calls:
        assert kwargs["RULE_RATIO"] == (PREFILL_TO_DECODE_RATIO if kwargs["TILE_RULE"] else 0)
        assert args[6] is q and args[7] is cu and args[-2] == total  # both write out, either zeroes its tail rows


def test_an_override_or_pages_the_prefill_tile_cannot_box_leave_one_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    assert _m2_plan(mean_kv=None, page_size=192).heavy_plan is None  # 192-token pages: 64-key boxes only
    monkeypatch.setenv(MIXED_HOPPER_TILE_ENV, "64,2,64,3,192,104,128")
    assert _m2_plan(mean_kv=None).heavy_plan is None


def test_a_device_rule_switch_that_is_not_0_or_1_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MIXED_HOPPER_DEVICE_RULE_ENV, "yes")
    with pytest.raises(ValueError, match=MIXED_HOPPER_DEVICE_RULE_ENV):
        hopper_mixed.check_environment()


def test_an_override_wins_over_the_prefill_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MIXED_HOPPER_TILE_ENV, "64,2,64,3,192,104,128")
    assert hopper_mixed._tile(128, 8, heavy_prefill=True, page_size=16) == (64, 2, 64, 3, 192, 104, 128)


@pytest.mark.parametrize("page_size, block_n", [(16, 128), (64, 128), (256, 128), (0, 128), (192, 64), (320, 64)])
def test_pages_the_prefill_tile_cannot_box_keep_the_64_key_tile(page_size: int, block_n: int) -> None:
    """Pages of a multiple of 64 keys that neither divide 128 nor hold whole 128-key boxes."""
    assert hopper_mixed._tile(64, 8, page_size=page_size)[0] == block_n
    assert hopper_mixed._tile(128, 8, heavy_prefill=True, page_size=page_size)[0] == block_n
