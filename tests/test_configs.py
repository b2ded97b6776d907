"""Launch-configuration choice: the tuned variant table, its ATTN_FUSED_VARIANTS override, and the
sweep's rule for what to turn on (benchmarks.sweep.pick_variants)."""

from __future__ import annotations

import pytest
import torch

from attention.kernels.configs import VARIANTS_ENV, mixed_batch, parse_variants, select_forward_config
from benchmarks.sweep import Measured, pick_variants
from tests.test_kernels import AttentionCase, build_inputs, check_output


def _config(max_seqlen_q: int, paged: bool, **kwargs):
    return select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4, max_seqlen_q=max_seqlen_q,
                                 interpret=False, paged=paged, **kwargs)


def test_parse_variants_reads_classes_flags_and_values() -> None:
    assert parse_variants(" decode/paged = paged_scalar_ids + prefetch_page_ids ; prefill/paged=small_block_m:16;"
                          "prefill/contiguous=none") == {
        "decode/paged": {"paged_scalar_ids": 1, "prefetch_page_ids": 1},
        "prefill/paged": {"small_block_m": 16},
        "prefill/contiguous": {},
    }
    assert parse_variants("") == {}


@pytest.mark.parametrize("text, message", [
    ("decode=tma", "unknown shape class 'decode'"),
    ("decode/paged=fast", "bad variant 'fast'"),
    ("decode/paged=small_block_m:x", "bad variant 'small_block_m:x'"),
    ("prefill/contiguous=tma+warp_specialize", "bad variant 'warp_specialize'.*expected one of paged_scalar_ids"),
])
def test_parse_variants_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_variants(text)


def test_the_override_reaches_only_its_class(monkeypatch) -> None:
    monkeypatch.setenv(VARIANTS_ENV, "decode/paged=paged_scalar_ids+rotate_kv_tiles;prefill/paged=small_block_m:16;"
                                     "decode/contiguous=none;prefill/contiguous=tma")
    decode_paged = _config(1, paged=True)
    assert decode_paged.paged_scalar_ids and decode_paged.rotate_kv_tiles and not decode_paged.tma
    assert _config(1, paged=False) == _config(1, paged=False, tuned=False)
    assert _config(512, paged=True).small_block_m == 16 and not _config(512, paged=True).paged_scalar_ids
    assert _config(512, paged=False).tma
    untuned = _config(1, paged=True, tuned=False)
    assert not (untuned.paged_scalar_ids or untuned.rotate_kv_tiles or untuned.small_block_m or untuned.tma)


def test_the_tables_tma_needs_wide_rows_and_a_long_kv_walk(monkeypatch) -> None:
    """tma from a variant table applies at head dim >= 128 over >= TMA_MIN_KV_LENGTH keys (unknown
    length: applies); an explicit ForwardConfig keeps whatever it says."""
    from attention.kernels.configs import TMA_MIN_KV_LENGTH

    monkeypatch.setenv(VARIANTS_ENV, "prefill/contiguous=tma+int32_offsets")
    assert _config(512, paged=False, max_seqlen_kv=TMA_MIN_KV_LENGTH).tma
    assert _config(512, paged=False).tma
    short = _config(512, paged=False, max_seqlen_kv=TMA_MIN_KV_LENGTH - 1)
    assert not short.tma and short.int32_offsets
    narrow = select_forward_config(head_dim_qk=64, head_dim_v=64, group_size=4, max_seqlen_q=512, interpret=False,
                                   max_seqlen_kv=1 << 14)
    assert not narrow.tma and narrow.int32_offsets


def test_small_tile_is_dropped_when_it_would_not_be_smaller(monkeypatch) -> None:
    """A decode-class tile of 16 rows has no smaller second tile: the override leaves it at 0."""
    monkeypatch.setenv(VARIANTS_ENV, "decode/paged=small_block_m:16")
    assert _config(1, paged=True).small_block_m == 0


def test_the_override_is_applied_by_attention_forward(monkeypatch) -> None:
    """Every variant a class can take, set through the environment, still computes the reference
    attention: a paged decode-class batch and a paged prefill-class batch (interpreter on CPU)."""
    from attention.kernels import attention_forward

    monkeypatch.setenv(VARIANTS_ENV, "decode/paged=paged_scalar_ids+prefetch_page_ids+rotate_kv_tiles;"
                                     "prefill/paged=paged_scalar_ids+prefetch_page_ids+rotate_kv_tiles")
    for q_lens in ((1, 1, 1), (1, 40, 3)):
        case = AttentionCase(q_lens, (50, 70, 33), heads=(4, 2), layout="paged", page_size=16, causal=True,
                             bottom_right=True, num_splits=None, dtype=torch.float16)
        inputs = build_inputs(case)
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
        check_output(case, inputs)


def test_pick_variants_wants_a_gain_everywhere() -> None:
    measured = [
        Measured("decode/paged", "a", "paged_scalar_ids", 1.10),
        Measured("decode/paged", "b", "paged_scalar_ids", 0.95),
        Measured("decode/paged", "a", "prefetch_page_ids", 1.06),
        Measured("decode/paged", "b", "prefetch_page_ids", 1.0),
        Measured("prefill/paged", "c", "small_block_m:16", 1.01),
        Measured("prefill/contiguous", "d", "", 1.5),  # a tile change: never picked
    ]
    assert pick_variants(measured) == "decode/paged=prefetch_page_ids;prefill/paged=none"


def test_a_variant_can_be_written_as_off(monkeypatch) -> None:
    """`field:0` turns a variant off (the table could turn one on for a class that loses with it)."""
    monkeypatch.setenv(VARIANTS_ENV, "decode/paged=int32_offsets")
    assert _config(1, paged=True).int32_offsets
    monkeypatch.setenv(VARIANTS_ENV, "decode/paged=int32_offsets:0")
    assert not _config(1, paged=True).int32_offsets
    assert pick_variants([Measured("decode/paged", "a", "int32_offsets", 1.05)]) == "decode/paged=int32_offsets"


def test_pick_variants_never_picks_a_wrong_or_failing_variant() -> None:
    measured = [Measured("decode/paged", "a", "fused_combine", 1.3),
                Measured("decode/paged", "b", "fused_combine", 0.0),  # wrong output or a failure there
                Measured("decode/paged", "a", "tma", 1.05)]
    assert pick_variants(measured) == "decode/paged=tma"


def test_pick_variants_counts_a_variant_as_off_where_it_did_not_run() -> None:
    """tma ran on one cell of three (pages holding whole tiles) and won there; prefetching won on all
    three. Where a set did not run, the kernel runs its largest subset that did (here: the default)."""
    measured = [
        Measured("prefill/paged", "p256", "tma", 1.32),
        Measured("prefill/paged", "p256", "prefetch_page_ids", 1.17),
        Measured("prefill/paged", "p16", "prefetch_page_ids", 1.26),
        Measured("prefill/paged", "mixed", "prefetch_page_ids", 1.20),
        Measured("prefill/paged", "mixed", "prefetch_page_ids+small_block_m:16", 1.38),
    ]
    # small tile + prefetch: 1.38 on the mixed batch, prefetch alone (1.17, 1.26) on the uniform ones
    assert pick_variants(measured) == "prefill/paged=prefetch_page_ids+small_block_m:16"
    assert pick_variants(measured[:4]) == "prefill/paged=prefetch_page_ids"
    # a combination that lost where it ran is not rescued by its subsets elsewhere
    slower = [*measured[:4], Measured("prefill/paged", "mixed", "prefetch_page_ids+small_block_m:16", 0.9)]
    assert pick_variants(slower) == "prefill/paged=prefetch_page_ids"


# The sweeps whose picks TUNED_VARIANTS holds: a later sweep's pick overrides an earlier one's
# classes. Re-tuning on a GPU means a new sweep file here and its pick in the table.
TUNED_FROM = ("docs/results/2026-11-30-h200-9a69b8b/sweep.md", "docs/results/2026-11-30-h200-ff89176/sweep.md")


def test_the_tuned_table_is_what_the_recorded_sweeps_picked() -> None:
    from pathlib import Path

    from attention.kernels.configs import TUNED_VARIANTS

    root = Path(__file__).resolve().parents[1]
    picked: dict[str, dict[str, int]] = {}
    for name in TUNED_FROM:
        last = (root / name).read_text().strip().splitlines()[-1]
        assert last.startswith("Picked"), f"{name} ends without its pick line"
        picked.update(parse_variants(last.split("ATTN_FUSED_VARIANTS=", 1)[1].rstrip("`")))
    assert picked == TUNED_VARIANTS


@pytest.mark.parametrize("head_dim, max_seqlen_kv, paged, causal, tile", [
    (128, 1024, False, False, (128, 64, 8, 2, 128)), (128, 1024, False, True, (128, 32, 8, 3, 128)),
    (128, 2048, False, True, (128, 64, 8, 2, 128)), (128, 2049, False, True, (128, 64, 8, 2, 128)),
    (128, 1024, True, True, (64, 64, 4, 3, 0)), (128, 2048, True, False, (64, 64, 4, 3, 0)),
    (128, 16384, True, True, (128, 128, 8, 3, 0)), (128, None, False, False, (128, 64, 8, 2, 128)),
    (64, 4096, False, False, (64, 64, 4, 3, 0)), (256, 1024, False, True, (128, 64, 8, 2, 0)),
])
def test_prefill_tiles_follow_head_dim_and_kv_length(head_dim, max_seqlen_kv, paged, causal, tile) -> None:
    """(block_m, block_n, warps, stages, register cap): SHORT_KV_TILES for d128 walks of at most 1024 / 2048
    keys (non-paged 1k walks by mask), PREFILL_TILE for longer non-paged d128 walks, 64x64 at d64, d256's own."""
    config = select_forward_config(head_dim_qk=head_dim, head_dim_v=head_dim, group_size=4, max_seqlen_q=2048,
                                   interpret=False, paged=paged, max_seqlen_kv=max_seqlen_kv, causal=causal)
    assert (config.block_m, config.block_n, config.num_warps, config.num_stages, config.max_registers) == tile
    assert config.block_q == config.block_m // 4


@pytest.mark.parametrize("num_q_tiles, tile", [(None, (2, 128)), (4096, (2, 128)), (2048, (2, 128)),
                                                (2047, (3, 0)), (512, (3, 0))])
def test_long_walks_of_few_q_tiles_keep_one_deep_program_per_sm(num_q_tiles, tile) -> None:
    """(stages, register cap) of the non-paged d128 long-walk tile: PREFILL_TILE (two programs per SM) from
    PREFILL_TILE_MIN_PROGRAMS q tiles on, FEW_PROGRAMS_TILE (one, three stages) below; paged keeps its own."""
    config = select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4, max_seqlen_q=2048,
                                   interpret=False, max_seqlen_kv=8192, causal=True, num_q_tiles=num_q_tiles)
    assert (config.num_stages, config.max_registers) == tile
    paged = select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4, max_seqlen_q=2048,
                                  interpret=False, paged=True, max_seqlen_kv=8192, num_q_tiles=num_q_tiles)
    assert (paged.block_n, paged.num_stages) == (128, 3)


@pytest.mark.parametrize("num_seqs, total_q, max_seqlen_q, mixed", [
    (129, 2048 + 128, 2048, True), (65, 2048 + 64, 2048, True),  # bench_mixed's M1 and M2
    (7, 1 + 17 + 513 + 2048 + 8192 + 3001 + 64, 8192, False), (16, 16 * 1024, 1024, False),  # ragged, equal prefill
    (1, 2048, 2048, False), (2, 2049, 2048, False),
])
def test_mixed_batches_are_told_from_host_values(num_seqs, total_q, max_seqlen_q, mixed) -> None:
    assert mixed_batch(num_seqs, total_q, max_seqlen_q) is mixed


@pytest.mark.parametrize("max_seqlen_kv, tile", [(2048, (64, 64, 4, 3, 0)), (16384, (128, 128, 8, 3, 0))])
def test_mixed_batches_over_a_contiguous_cache_take_the_paged_tile_and_a_small_one(max_seqlen_kv, tile) -> None:
    """A mixed batch over a non-paged cache: the paged tables' d128 tile, a 16-row tile for its decodes and the
    contiguous variants; the same call not mixed keeps the contiguous tile and no small tile."""
    kwargs = {"head_dim_qk": 128, "head_dim_v": 128, "group_size": 4, "max_seqlen_q": 2048, "interpret": False,
              "max_seqlen_kv": max_seqlen_kv, "causal": True, "num_q_tiles": 528}
    mixed = select_forward_config(**kwargs, mixed=True)
    assert (mixed.block_m, mixed.block_n, mixed.num_warps, mixed.num_stages, mixed.max_registers) == tile
    assert mixed.small_block_m == 16 and mixed.tma and mixed.int32_offsets and mixed.heavy_tiles_first
    plain = select_forward_config(**kwargs)
    assert plain.small_block_m == 0 and (plain.block_m, plain.num_warps) == (128, 8)
    paged = select_forward_config(**kwargs, paged=True)
    assert select_forward_config(**kwargs, paged=True, mixed=True) == paged  # paged calls: one table already


@pytest.mark.parametrize("group_size, tile", [(4, (16, 64, 128)), (8, (16, 64, 128)), (32, (32, 128, 0)),
                                              (64, (64, 64, 0))])
def test_decode_tiles_follow_the_packed_rows(group_size, tile) -> None:
    """Decode tiles (block_m, block_n, register cap): 16 rows capped at 128 registers with 64-key tiles,
    the 32-row MQA tile uncapped with 128-key tiles, larger tiles uncapped with 64-key tiles."""
    config = select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=group_size, max_seqlen_q=1,
                                   interpret=False, paged=True, max_seqlen_kv=4096)
    assert (config.block_m, config.block_n, config.max_registers) == tile
