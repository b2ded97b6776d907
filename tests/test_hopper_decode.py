"""Host side of the Gluon sm90 decode kernel (attention/kernels/hopper_decode.py) on CPU: which calls it takes, its
split rule and the launches a plan makes, with the kernel stubbed (it runs in tests/gpu/test_hopper_decode_gpu.py and
compiles for sm90 in tests/sm90_compile.py)."""

from __future__ import annotations

import re

import pytest
import torch

from attention.kernels import hopper_decode, hopper_forward
from attention.kernels.configs import MAX_NUM_SPLITS
from attention.kernels.hopper_decode import (
    DECODE_HOPPER_ENV,
    DECODE_HOPPER_GATHER_ENV,
    DECODE_HOPPER_GATHER_PAGES_ENV,
    DECODE_HOPPER_GATHER_TILE,
    DECODE_HOPPER_MERGE_ENV,
    DECODE_HOPPER_ROUNDS_ENV,
    DECODE_HOPPER_TILE_ENV,
    DecodeHopperPlan,
    choose_decode_splits,
    decode_hopper_unsupported_reason,
    whole_round_programs,
)
from attention.kernels.hopper_forward import plan_hopper_forward
from tests.test_hopper_forward import _RecordedLaunch


@pytest.mark.parametrize("switch, page_size, taken", [
    (None, 16, True),
    (None, 0, True),
    ("1", 256, True),
    ("0", 16, False),
    (None, 1, True),  # pages under 16 tokens: gathered by cp.async
    (None, 8, True),
    (None, 12, False),  # pages that neither divide a tile nor hold whole ones
    (None, 48, False),
])
def test_the_switch_and_the_pages(monkeypatch: pytest.MonkeyPatch, switch: str | None, page_size: int,
                                  taken: bool) -> None:
    if switch is not None:
        monkeypatch.setenv(DECODE_HOPPER_ENV, switch)
    reason = decode_hopper_unsupported_reason(128, 4, 1, page_size)
    assert (reason is None) is taken, reason
    if page_size in (12, 48):
        assert "needs pages of 1, 2, 4, 8 or 16 to 64 tokens" in reason


@pytest.mark.parametrize("value, tile", [(None, DECODE_HOPPER_GATHER_TILE), ("1", DECODE_HOPPER_GATHER_TILE),
                                         ("64,6,2,1,168", (64, 6, 2, 1, 168)), ("0", None)])
def test_the_gather_switch(monkeypatch: pytest.MonkeyPatch, value: str | None, tile: tuple | None) -> None:
    if value is not None:
        monkeypatch.setenv(DECODE_HOPPER_GATHER_ENV, value)
    assert hopper_decode._gather_tile() == tile
    wide = hopper_decode.DECODE_HOPPER_GATHER_WIDE_TILE if value in (None, "1") else tile
    assert hopper_decode._gather_tile(64) == wide  # 64-row tiles: one program an SM (two do not fit)
    for page_size in (1, 2, 4, 8):
        reason = decode_hopper_unsupported_reason(128, 4, 1, page_size)
        assert reason == (None if tile else f"pages of {page_size} tokens with {DECODE_HOPPER_GATHER_ENV}=0")
    assert decode_hopper_unsupported_reason(128, 4, 1, 16) is None  # TMA's pages, whatever the switch


@pytest.mark.parametrize("name, value, message", [
    (DECODE_HOPPER_TILE_ENV, "64,3", "must be 4 or 5 comma-separated integers, got '64,3'"),
    (DECODE_HOPPER_TILE_ENV, "64,3,one,168", "must be 4 or 5 comma-separated integers"),
    (DECODE_HOPPER_TILE_ENV, "32,3,1,168", "BLOCK_N (its first integer) must be 64 or 128, got 32"),
    (DECODE_HOPPER_GATHER_ENV, "256,3,4,2,128", "BLOCK_N (its first integer) must be 64 or 128, got 256"),
    (DECODE_HOPPER_GATHER_ENV, "64,4,4", "must be 5 comma-separated integers"),
])
def test_tile_overrides_are_checked(monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    """A tile override the kernel cannot run is refused by name before any launch."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(f"{name}") + ".*" + re.escape(message)):
        decode_hopper_unsupported_reason(128, 4, 1, 1 if name == DECODE_HOPPER_GATHER_ENV else 16)


def test_limits_are_named() -> None:
    assert "head dim" in decode_hopper_unsupported_reason(96, 4, 1, 16)
    assert "query rows" in decode_hopper_unsupported_reason(128, 4, 17, 16)  # 17 queries x 4 heads > 64 rows


@pytest.mark.parametrize("walks, max_tiles, splits", [
    (8, 128, 16),  # 1 x 8k, GQA 32/8: an 8-tile split per program
    (8, 512, 16),  # 1 x 32k
    (64, 64, 2),  # 8 x 4k
    (512, 64, 1),  # 64 x 4k: whole walks, about four a program
    (1024, 32, 1),  # 128 x 2k
    (256, 512, 8),  # 32 x 32k: splits of at most BALANCE_SPLIT_TILES
    (512, 512, 16),  # 64 sequences of up to 32k (a ragged batch looks so to the host)
    (8, 3, 1),  # walks too short to split
    (1, 16384, 64),  # 1M keys: MAX_NUM_SPLITS
])
def test_the_split_rule(walks: int, max_tiles: int, splits: int) -> None:  # lengths unknown to the host
    chosen = choose_decode_splits(walks=walks, max_tiles=max_tiles, programs=132)
    assert chosen == splits and chosen & (chosen - 1) == 0  # a power of 2
    tiles_per_split = -(-max_tiles // chosen)
    assert tiles_per_split <= hopper_decode.BALANCE_SPLIT_TILES or chosen == MAX_NUM_SPLITS
    assert chosen == 1 or tiles_per_split >= hopper_decode.MIN_SPLIT_TILES


@pytest.mark.parametrize("walks, max_tiles, mean_tiles, splits", [
    (256, 512, 512, 1),  # 32 x 32k, every sequence as long: whole walks, two rounds (the cap would take 8)
    (1024, 128, 128, 1),  # 128 x 8k
    (64, 512, 512, 2),  # 8 x 32k: 128 items fill the SMs once
    (32, 512, 512, 4),  # 4 x 32k
    (512, 512, 64, 16),  # 64 sequences of mean 4k and one of 32k: the long walk's splits stay short
    (8, 128, 128, 16),  # 1 x 8k: as without the mean
    (512, 64, 64, 1),  # 64 x 4k
    (512, 8, 2, 1),  # 64 sequences of up to 512 keys, mean 128: too short to split
])
def test_the_split_rule_with_the_mean_known(walks: int, max_tiles: int, mean_tiles: int, splits: int) -> None:
    assert choose_decode_splits(walks=walks, max_tiles=max_tiles, programs=132, mean_tiles=mean_tiles) == splits
    # the same lengths unknown: the rule as before, its splits capped
    unknown = choose_decode_splits(walks=walks, max_tiles=max_tiles, programs=132)
    assert -(-max_tiles // unknown) <= hopper_decode.BALANCE_SPLIT_TILES


@pytest.mark.parametrize("total_kv, splits", [(None, 8), (32 * 32768, 1), (31 * 1024 + 32768, 16)])
def test_attention_forward_plans_on_the_mean_it_is_given(monkeypatch: pytest.MonkeyPatch, total_kv: int | None,
                                                         splits: int) -> None:
    """32 sequences of up to 32k keys: the decode plan's split count, without the lengths' sum and with one of
    32 x 32k (uniform) or of 31 x 1k + 32k (ragged); each its own plan."""
    from attention.kernels import attention_fwd

    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setattr(hopper_forward, "_on_sm90", lambda q: True, raising=False)
    monkeypatch.setattr(attention_fwd, "num_streaming_multiprocessors", lambda device: 132)
    monkeypatch.setattr(attention_fwd, "launch_plan", lambda *args, **kwargs: None)
    monkeypatch.setattr(attention_fwd, "_plans", {})
    q = torch.randn(32, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.randn(64, 16, 8, 128, dtype=torch.bfloat16)
    cu = torch.arange(33, dtype=torch.int32)
    attention_fwd.attention_forward(q, k, k, q, cu_seqlens_q=cu, cu_seqlens_kv=cu * 32768,
                                    page_table=torch.zeros(32, 2048, dtype=torch.int32), max_seqlen_q=1,
                                    max_seqlen_kv=32768, softmax_scale=0.1, total_kv=total_kv)
    (plan,) = attention_fwd._plans.values()
    assert isinstance(plan, DecodeHopperPlan) and plan.num_splits == splits


@pytest.mark.parametrize("items, programs", [
    (512, 128),  # 64 x 4k, GQA 32/8: 4 rounds of 128, not 3 of 132 and one of 116
    (2048, 128),  # 32 x 32k in 8 splits: 16 rounds
    (496, 124),  # 62 x 4k
    (2112, 132),  # 33 x 32k: whole rounds already
    (100, 100),  # one round: a program an item
    (133, 132),  # 2 rounds on 67 programs would leave half the SMs idle
    (8192, 131),  # the ragged batch: 63 rounds
])
def test_whole_rounds(items: int, programs: int) -> None:
    assert whole_round_programs(items, 132) == programs
    rounds = -(-items // 132)
    assert -(-items // programs) == rounds  # never a round more
    assert programs >= hopper_decode.WHOLE_ROUNDS_MIN_FRACTION * 132 or programs == items


@pytest.mark.parametrize("switch, programs", [(None, 128), ("1", 128), ("0", 132)])
def test_the_plan_runs_on_whole_rounds(monkeypatch: pytest.MonkeyPatch, switch: str | None, programs: int) -> None:
    """64 x 4k: 256 items of two KV heads, one split each (as one-head walks take); ATTN_FUSED_HOPPER_DECODE_ROUNDS=0
    keeps every SM's program."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is not None:
        monkeypatch.setenv(DECODE_HOPPER_ROUNDS_ENV, switch)
    plan = _plan(*_paged_decodes(num_seqs=64), max_seqlen_kv=4096)
    assert (plan.num_splits, plan.programs) == (1, programs)


def _paged_decodes(num_seqs: int = 8, queries: int = 1, heads: tuple[int, int] = (32, 8), page_size: int = 16):
    total = num_seqs * queries
    q = torch.randn(1, total, heads[0], 128, dtype=torch.bfloat16).expand(num_seqs, -1, -1, -1)
    k = torch.randn(8192 // page_size, page_size, heads[1], 128, dtype=torch.bfloat16)
    return q, k, total


def _plan(q, k, total, *, max_seqlen_q=1, max_seqlen_kv=8192, num_splits=None, num_sms=132):
    return plan_hopper_forward(q, k, k, q, num_seqs=q.shape[0], max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                               total_q=total, num_splits=num_splits, softmax_scale=0.1, window=(-1, 0),
                               bottom_right=True, page_size=k.shape[1], alibi=False, sink=False, has_q_start=True,
                               has_kv_start=False, num_sms=num_sms)


@pytest.mark.parametrize("switch, planned", [(None, DecodeHopperPlan), ("0", type(None))])
def test_plan_hopper_forward_hands_decodes_to_the_decode_kernel(monkeypatch: pytest.MonkeyPatch, switch: str | None,
                                                                planned: type) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is not None:
        monkeypatch.setenv(DECODE_HOPPER_ENV, switch)
    assert type(_plan(*_paged_decodes())) is planned
    # 16 queries x 4 heads fill a 64-row tile; 17 are the general kernel's (too few rows for the prefill kernel)
    assert type(_plan(*_paged_decodes(num_seqs=2, queries=16), max_seqlen_q=16)) is planned
    assert _plan(*_paged_decodes(num_seqs=2, queries=17), max_seqlen_q=17) is None


@pytest.mark.parametrize("heads, max_seqlen_q, rows", [((32, 8), 1, 8), ((32, 8), 2, 8), ((32, 8), 3, 16),
                                                       ((32, 8), 4, 16), ((32, 8), 5, 32), ((32, 2), 4, 64),
                                                       ((32, 1), 1, 32), ((16, 16), 1, 8), ((32, 4), 1, 8),
                                                       ((32, 2), 1, 16)])
def test_tiles_have_a_row_for_every_query_of_the_longest_sequence(monkeypatch: pytest.MonkeyPatch,
                                                                  heads: tuple[int, int], max_seqlen_q: int,
                                                                  rows: int) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    q, k, total = _paged_decodes(num_seqs=4, queries=max_seqlen_q, heads=heads)
    assert _plan(q, k, total, max_seqlen_q=max_seqlen_q).rows == rows


def test_a_split_plan_launches_the_kernel_then_the_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setenv(DECODE_HOPPER_TILE_ENV, "64,3,2,128")
    kernel, merge = _RecordedLaunch(), []
    monkeypatch.setattr(hopper_decode, "attention_decode_hopper_kernel", kernel)
    q, k, total = _paged_decodes(num_seqs=1)
    plan = _plan(q, k, total)
    assert (plan.num_splits, plan.programs, plan.partial_shape) == (32, 256, (32, 1, 32, 128))
    object.__setattr__(plan, "combine", lambda *tensors: merge.append(tensors))
    cu = torch.tensor([0, 1], dtype=torch.int32)
    q_thd, out = q[0], torch.empty(1, 32, 128, dtype=torch.bfloat16)
    plan(q_thd, k, k, out, cu, cu, cu, None, torch.zeros(1, 512, dtype=torch.int32))
    (grid, args, kwargs), = kernel.calls
    assert grid == (256, 1, 1)
    assert [list(d.block_shape) for d in args[:2]] == [[16, 128], [16, 128]]  # a TMA load a page
    assert args[2] is q_thd and args[3] is out
    partial_out, partial_lse = args[4:6]
    assert partial_out.shape == (32, 1, 32, 128) and partial_lse.shape == (32, 1, 32)
    assert partial_out.dtype == partial_lse.dtype == torch.float32
    assert (kwargs["WRITE_PARTIAL"], kwargs["ROWS"], kwargs["BLOCK_N"], kwargs["STAGES"]) == (True, 8, 64, 3)
    assert kwargs["maxnreg"] == 128 and kwargs["FUSED_MERGE"] is False  # 32 splits: more than the kernel merges
    assert args[-3] == 0 and args[-2:] == (0, 0)  # no rows past the last sequence to zero; TMA, no row strides
    (merged,) = merge
    assert merged[0] is partial_out and merged[1] is partial_lse and merged[2] is out


@pytest.mark.parametrize("switch", [None, "0"])
def test_up_to_16_splits_the_kernel_merges_itself(monkeypatch: pytest.MonkeyPatch, switch: str | None) -> None:
    """1 x 8k: 16 splits, merged by the last split of each walk (no second launch), its arrival counters one per
    (sequence, KV head); ATTN_FUSED_HOPPER_DECODE_MERGE=0 merges with combine.py's launch instead."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is not None:
        monkeypatch.setenv(DECODE_HOPPER_MERGE_ENV, switch)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_decode, "attention_decode_hopper_kernel", kernel)
    q, k, total = _paged_decodes(num_seqs=1)
    plan = _plan(q, k, total)
    assert plan.num_splits == 16
    assert (plan.combine is None) is (switch is None) and (plan.merge_rows == 4) is (switch is None)
    object.__setattr__(plan, "combine", None)  # (not launched here: no kernel of combine.py runs on CPU)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    plan(q[0], k, k, torch.empty(1, 32, 128, dtype=torch.bfloat16), cu, cu, cu, None,
         torch.zeros(1, 512, dtype=torch.int32))
    (_, args, kwargs), = kernel.calls
    assert kwargs["FUSED_MERGE"] is (switch is None) and kwargs["SPLITS_BLOCK"] == 16
    if switch is None:
        counters = args[6]
        assert counters.dtype == torch.int32 and counters.numel() >= 8 and not counters.any()


def test_the_kernel_merges_only_when_each_program_has_one_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 sequences of up to 32k keys: 16 splits of 512 walks, 62 items a program; each would pay an arrival, so
    combine.py merges (as for 64-row tiles)."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    q, k, total = _paged_decodes(num_seqs=64)
    plan = _plan(q, k, total, max_seqlen_kv=32768)
    assert plan.num_splits == 16 and plan.merge_rows == 0 and plan.combine is not None
    # 4 queries x 16 heads: 64-row tiles keep the merge launch (their warp group would spill with the merge)
    q, k, total = _paged_decodes(num_seqs=1, queries=4, heads=(32, 2))
    plan = _plan(q, k, total, max_seqlen_q=4)
    assert plan.rows == 64 and plan.num_splits > 1 and plan.merge_rows == 0 and plan.combine is not None


def test_one_split_writes_the_output_and_merges_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_decode, "attention_decode_hopper_kernel", kernel)
    q, k, total = _paged_decodes(num_seqs=64)
    plan = _plan(q, k, total, max_seqlen_kv=4096, num_splits=1)
    assert plan.combine is None and plan.partial_shape is None and plan.num_splits == 1
    cu = torch.arange(65, dtype=torch.int32)
    plan(q[0], k, k, q[0], cu, cu, cu, None, torch.zeros(64, 512, dtype=torch.int32), zero_tail=True)
    (_, args, kwargs), = kernel.calls
    assert kwargs["WRITE_PARTIAL"] is False and args[-3] == total  # zero_tail: rows cu_seqlens_q[-1] .. total - 1


@pytest.mark.parametrize("value, warps, stages, per_sm", [(None, 4, 3, 2), ("64,3,1,1,168", 1, 3, 1),
                                                          ("64,6,2,1,168", 2, 6, 1)])
def test_pages_under_16_tokens_launch_with_pointers_and_row_strides(monkeypatch: pytest.MonkeyPatch,
                                                                    value: str | None, warps: int, stages: int,
                                                                    per_sm: int) -> None:
    """1-token pages: no TMA descriptors (the producer warps gather rows by cp.async from K's and V's pointers,
    their token rows H_kv x D elements apart), on the gather tile's programs an SM and registers; the prefill
    kernel's page rule does not refuse them for a decode. Switched off, the general kernel's."""
    monkeypatch.setattr(hopper_forward, "_on_sm90", lambda q: True)
    monkeypatch.setenv(DECODE_HOPPER_GATHER_ENV, "0")
    assert _plan(*_paged_decodes(num_seqs=64, page_size=1), max_seqlen_kv=4096, num_splits=1) is None
    monkeypatch.delenv(DECODE_HOPPER_GATHER_ENV)
    if value is not None:
        monkeypatch.setenv(DECODE_HOPPER_GATHER_ENV, value)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_decode, "attention_decode_hopper_kernel", kernel)
    q, k, total = _paged_decodes(num_seqs=64, page_size=1)
    plan = _plan(q, k, total, max_seqlen_kv=4096, num_splits=1)
    assert type(plan) is DecodeHopperPlan and plan.kv_descriptors == () and plan.kv_row_strides == (1024, 1024)
    assert plan.tile[2:] == ((2, 128) if per_sm == 2 else (1, 168)) and plan.programs <= 132 * per_sm
    cu = torch.arange(65, dtype=torch.int32)
    plan(q[0], k, k, q[0], cu, cu, cu, None, torch.zeros(64, 4096, dtype=torch.int32))
    (_, args, kwargs), = kernel.calls
    assert args[0] is k and args[1] is k and args[-2:] == (1024, 1024)
    assert (kwargs["GATHER"], kwargs["STAGES"], kwargs["PAGE_SIZE"], kwargs["HEAD_DIM"]) == (warps, stages, 1, 128)
    # a prefill over the same pages is not the Hopper kernels' (its tiles read whole pages of 16 tokens and more)
    assert _plan(*_paged_decodes(num_seqs=1, queries=4096, page_size=1), max_seqlen_q=4096) is None


@pytest.mark.parametrize("value, page_size, gathered", [(None, 16, False), ("16,64", 16, True), ("16,64", 64, True),
                                                       ("64", 16, False), ("16", 0, False)])
def test_more_page_sizes_gathered_where_the_switch_says(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                        page_size: int, gathered: bool) -> None:
    """DECODE_HOPPER_GATHER_PAGES_ENV (A/B): pages of the sizes it names are gathered by cp.async (no TMA
    descriptors, the gather tile's two programs an SM, one KV head an item); a non-paged cache never is."""
    monkeypatch.setattr(hopper_forward, "_on_sm90", lambda q: True)
    if value is not None:
        monkeypatch.setenv(DECODE_HOPPER_GATHER_PAGES_ENV, value)
    q, _, total = _paged_decodes(num_seqs=64)
    k = torch.empty(64 * 4096 // max(page_size, 1), max(page_size, 1), 8, 128, dtype=torch.bfloat16)  # geometry only
    if not page_size:
        k = k.view(64, 4096, 8, 128)
    plan = plan_hopper_forward(q, k, k, q, num_seqs=64, max_seqlen_q=1, max_seqlen_kv=4096, total_q=total,
                               num_splits=None, softmax_scale=0.1, window=(-1, 0), bottom_right=True,
                               page_size=page_size, alibi=False, sink=False, has_q_start=True, has_kv_start=False,
                               num_sms=132)
    assert type(plan) is DecodeHopperPlan
    assert (plan.gather_warps > 0) is gathered and (plan.kv_descriptors == ()) is gathered
    assert plan.kv_heads_per_item == (1 if gathered else 2) and plan.tile[2] == (2 if gathered else 1)


@pytest.mark.parametrize("value, heads, page_size, tile, per_item", [
    (None, (32, 8), 16, None, 2),  # the rule: 2 x 4 query heads fill a tile's 8 rows
    (None, (32, 32), 16, None, 4),  # MHA: 8 heads would leave 8 keys a head a tile
    (None, (32, 8), 1, None, 1),  # gathered pages: one head an item
    (None, (32, 1), 16, None, 1),
    ("1", (32, 8), 16, None, 1),
    ("2", (32, 8), 16, None, 2),  # 32 keys a head: two 16-token pages a head a tile
    ("4", (32, 8), 16, None, 4),  # 16 keys a head: a page
    ("8", (32, 8), 16, None, 1),  # 8 keys a head a tile: fewer than 16
    ("8", (32, 8), 16, "128,3,1,168", 8),
    ("2", (32, 8), 0, None, 2),
    ("2", (32, 8), 256, None, 2),  # a page holds a head's keys
    ("2", (32, 8), 1, None, 1),
    ("16", (32, 8), 16, None, 1),  # more than the sequence's KV heads
    ("2", (32, 1), 16, None, 1),  # MQA: one KV head
    ("4", (32, 2), 16, None, 1),  # 16 heads a KV head x 4: more than 64 rows
])
def test_kv_heads_share_a_tile_where_the_switch_says(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                   heads: tuple[int, int], page_size: int, tile: str | None,
                                                   per_item: int) -> None:
    """64 sequences of 4k keys, one split: an item of ``per_item`` KV heads (kv_heads_per_item's rule, or
    DECODE_HOPPER_HEADS_ENV's) counts their query heads as one group and its sequence as heads_kv / per_item items;
    its TMA loads are a head's BLOCK_N / per_item keys (or a page of them)."""
    monkeypatch.setattr(hopper_forward, "_on_sm90", lambda q: True)
    if value is not None:
        monkeypatch.setenv(hopper_decode.DECODE_HOPPER_HEADS_ENV, value)
    if tile is not None:
        monkeypatch.setenv(DECODE_HOPPER_TILE_ENV, tile)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_decode, "attention_decode_hopper_kernel", kernel)
    q, k, total = _paged_decodes(num_seqs=64, heads=heads, page_size=page_size or 16)
    if page_size == 0:
        k = torch.randn(64, 4096, heads[1], 128, dtype=torch.bfloat16)
    plan = _plan(q, k, total, max_seqlen_kv=4096, num_splits=1)
    group = heads[0] // heads[1]
    assert (plan.kv_heads_per_item, plan.group_size, plan.heads_kv) == (per_item, group * per_item,
                                                                        heads[1] // per_item)
    if page_size == 1:
        assert plan.kv_descriptors == () and plan.gather_warps > 0
        return
    block_n = plan.tile[0]
    keys = block_n // per_item
    cu = torch.arange(65, dtype=torch.int32)
    plan(q[0], k, k, q[0], cu, cu, cu, None, None if page_size == 0 else torch.zeros(64, 4096, dtype=torch.int32))
    (_, args, kwargs), = kernel.calls
    assert kwargs["HEADS"] == per_item and kwargs["GROUP_SIZE"] == group * per_item
    assert [list(d.block_shape) for d in args[:2]] == [[min(keys, page_size or keys), 128]] * 2


def test_kv_heads_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hopper_forward, "_on_sm90", lambda q: True)
    monkeypatch.setenv(hopper_decode.DECODE_HOPPER_HEADS_ENV, "two")
    with pytest.raises(ValueError, match="ATTN_FUSED_HOPPER_DECODE_HEADS must be an integer, got 'two'"):
        _plan(*_paged_decodes(num_seqs=4), max_seqlen_kv=4096, num_splits=1)


@pytest.mark.parametrize("num_seqs, max_seqlen_kv, per_item", [(64, 4096, 2), (32, 2048, 2), (29, 2048, 1),
                                                               (8, 4096, 1), (1, 8192, 1)])
def test_kv_heads_share_a_tile_only_on_unsplit_walks_that_fill_the_programs(monkeypatch: pytest.MonkeyPatch,
                                                                          num_seqs: int, max_seqlen_kv: int,
                                                                          per_item: int) -> None:
    """The rule takes two GQA heads an item when one-head items take one split and half as many items still fill
    90 % of the programs (32 x 2k: 128 items on 132 SMs; 29 x 2k: 116); split walks (8 x 4k, 1 x 8k) keep one head,
    whose split count stays the one-head rule's."""
    monkeypatch.setattr(hopper_forward, "_on_sm90", lambda q: True)
    plan = _plan(*_paged_decodes(num_seqs=num_seqs), max_seqlen_kv=max_seqlen_kv)
    assert plan.kv_heads_per_item == per_item
    monkeypatch.setenv(hopper_decode.DECODE_HOPPER_HEADS_ENV, "1")
    assert plan.num_splits == _plan(*_paged_decodes(num_seqs=num_seqs), max_seqlen_kv=max_seqlen_kv).num_splits
