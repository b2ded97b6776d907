"""Launch configurations for the attention forward kernels: small, explicit heuristics.

No autotuning at call time: the configuration is a pure function of host-known sizes (head dims,
GQA group size, the largest query length, the GPU's SM count), so a call never benchmarks and a
CUDA graph can capture it. Tune the tables below on the H200 and record the results here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from attention.environment import getenv

__all__ = [
    "FEW_PROGRAMS_TILE",
    "GATHER_MAX_BYTES",
    "GATHER_MAX_PAGE_SIZE",
    "GATHER_MIN_PACKED_ROWS",
    "MAX_NUM_SPLITS",
    "MIXED_BATCH_RATIO",
    "PREFILL_TILE",
    "PREFILL_TILE_MIN_PROGRAMS",
    "VARIANTS_ENV",
    "ForwardConfig",
    "choose_num_splits",
    "mixed_batch",
    "next_power_of_2",
    "num_streaming_multiprocessors",
    "parse_variants",
    "q_tile_count",
    "select_forward_config",
    "shape_class",
    "tma_pays",
]

MAX_NUM_SPLITS = 64
"""Upper bound on the split-KV count (bounds the combine kernel's register tile)."""

_FILL_PROGRAMS_PER_SM = 4
"""Split-KV fills the GPU up to about this many (sequence, q-tile, KV head, split) programs per SM."""

_BALANCE_CHUNK_KEYS = 4096
"""Decode-class splits read at most this many keys each (the per-program length of B64 x 4k)."""

_DECODE_MAX_ROWS = 64
"""Packed rows (query tokens x group size) up to which the small-tile "decode" class is used."""

_DECODE_MAX_REGISTERS = 128
"""Register cap (ptxas ``maxnreg``) of 16-row decode tiles, 4 warps: four programs fit an SM. Uncapped,
ptxas gave some variants 139-158 registers, three programs per SM, and 64x4k (512 programs: one wave
at four per SM) ran a second wave: pages 16 / 64 / 256 and the non-paged cache 311-329 µs uncapped
against 258-261 capped; page 1 (111 registers) and the split cells (fewer programs per SM) ran the
same either way (H200, 2026-11-30, docs/results/2026-11-30-h200-ff89176/sweep.md, "no register cap").
The 32-row MQA tile holds twice the accumulators and spills under the cap (72.2 against 59.2 µs at
64x4k); it stays uncapped."""


@dataclass(frozen=True)
class ForwardConfig:
    """One launch configuration of the forward kernel.

    block_m: packed rows per program (query tokens x query heads of one KV head), a power of 2 >= 16.
    block_q: query tokens per program, block_m // group_size (>= 1).
    block_n: keys per KV tile, a power of 2 >= 16.
    block_dqk / block_dv: head dims padded to a power of 2 >= 16 (masked when padded).
    paged_scalar_ids: with a paged cache whose page_size is a multiple of block_n, read one page id
        per KV tile and address the tile as contiguous slots (else one page id per key).
    prefetch_page_ids: with a paged cache, load the next KV tile's page ids one iteration ahead.
    small_block_m: 0, or a packed-row count (power of 2, >= group size, <= block_m) for a second,
        small tile that sequences with at most small_block_m // group queries (decodes in a mixed
        batch) use instead of the block_m-row tile.
    rotate_kv_tiles: each program walks its fully visible KV tiles starting at a program-dependent
        offset (wrapping around), so sequences of a non-paged cache, whose rows start at the same
        offsets, are not streamed in lockstep (non-paged decode measured 14 % below paged).
    tma: K/V tiles through device-side tensor descriptors (Hopper's bulk tensor copies): non-paged
        caches, and paged ones whose pages hold whole tiles (page_size % block_n == 0, pages
        contiguous); falls back to pointer loads otherwise or when a stride or base is not 16-byte
        aligned.
    fused_combine: with split-KV, the last split program of each (q tile, KV head) to finish merges
        the splits itself (arrival counters), instead of a second kernel launch (H200, commit
        d1211d1: 1x8k 34.8 against 24.9 µs with the launch; 32x4k verify 1.13x in an earlier sweep).
    int32_offsets: per-key offsets of a tile in 32 bits whenever every element offset of k and v
        fits, instead of 64. ptxas (tests/sm90_compile.py --registers) finds no register saving at
        the production tiles (d128 prefill 255 vs 206 registers contiguous); the sweep measures it.
    transposed_k_loads: K tiles are read as [D, keys] (K^T) directly instead of [keys, D] like V
        with a shared-memory transpose (sharing V's layout, page ids load once per tile).
    runtime_page_size: the kernel reads the page size as a runtime value instead of compiling it in
        (a division per key; one compile for every page size).
    dependent_combine: with split-KV on a GPU, the combine kernel is launched with programmatic
        dependent launch: it starts while the attention grid runs and waits for it on the device
        (H200, commit d1211d1: 0.99-1.00x on 1x8k, 1x32k, 8x4k, 32x2k, verify and MQA).
    page_granular_tiles: with a paged cache whose pages are smaller than a KV tile (block_n a multiple of
        page_size), read each tile page by page: one page id per page and per thread instead of one per
        key (see the kernel's _load_tile_by_pages).
    gather_pages: over a paged cache, whether the launcher first copies each sequence's pages into a
        contiguous buffer and runs the call as over a non-paged cache, with the tables' configuration for
        that layout (attention/kernels/page_gather.py):
        None (the tables' value) lets its rule decide (GATHER_MAX_PAGE_SIZE, GATHER_MIN_PACKED_ROWS,
        GATHER_MAX_BYTES); True copies whenever the copy fits GATHER_MAX_BYTES and no sliding window
        bounds the walk; False never copies. Not a ``VARIANT_FIELDS`` entry: the sweep compares it by hand.
    heavy_tiles_first: a sequence's q tiles run last tile first. Under a causal mask the last tile
        sees the most keys, so the longest programs start early instead of ending the launch alone.
    max_registers: 0, or a cap on registers per thread passed to ptxas (``maxnreg``). Decode tiles
        cap at 128 so four 4-warp programs fit one SM (65536 registers): see select_forward_config.
    Which of these a shape class turns on is the table ``TUNED_VARIANTS``
    (measured on the H200 by ``python -m benchmarks.sweep``), overridable with ``ATTN_FUSED_VARIANTS``.
    """

    block_m: int
    block_q: int
    block_n: int
    block_dqk: int
    block_dv: int
    num_warps: int
    num_stages: int
    paged_scalar_ids: bool = False
    prefetch_page_ids: bool = False
    small_block_m: int = 0
    rotate_kv_tiles: bool = False
    tma: bool = False
    fused_combine: bool = False
    int32_offsets: bool = False
    heavy_tiles_first: bool = False
    transposed_k_loads: bool = False
    runtime_page_size: bool = False
    dependent_combine: bool = False
    page_granular_tiles: bool = False
    max_registers: int = 0
    gather_pages: bool | None = None


VARIANT_FIELDS = ("paged_scalar_ids", "prefetch_page_ids", "small_block_m", "rotate_kv_tiles", "tma", "fused_combine",
                  "int32_offsets", "heavy_tiles_first", "transposed_k_loads",
                  "runtime_page_size", "dependent_combine", "page_granular_tiles")
"""The ForwardConfig fields a shape class can switch (kernel variants), as opposed to its tile sizes."""

SHAPE_CLASSES = ("decode/paged", "decode/contiguous", "prefill/paged", "prefill/contiguous")
"""Keys of the variant table: the config's class ("decode": packed rows <= 64) and the KV layout."""

TUNED_VARIANTS: dict[str, dict[str, int]] = {
    "decode/paged": {},
    "decode/contiguous": {},
    "prefill/paged": {"paged_scalar_ids": 1, "prefetch_page_ids": 1, "small_block_m": 16, "int32_offsets": 1,
                      "heavy_tiles_first": 1},
    "prefill/contiguous": {"tma": 1, "int32_offsets": 1, "heavy_tiles_first": 1},
}
"""Variants on by default per shape class: ``benchmarks.sweep --layout-only``'s picks on the H200
(bf16, Triton 3.6, 2026-11-30; prefill classes docs/results/2026-11-30-h200-9a69b8b/sweep.md, decode
classes docs/results/2026-11-30-h200-ff89176/sweep.md; tests/test_configs.py checks the table against
the picks recorded there), speedups over every variant off (``tma`` only where ``tma_pays``; the
kernel drops what does not apply, e.g. one page id per tile when pages are smaller than a tile):
  decode/paged and decode/contiguous: none. With 16-row tiles capped at 128 registers
    (_DECODE_MAX_REGISTERS) every 64x4k cell runs at 258-261 µs without variants; before the cap
    ptxas gave some variants 139-158 registers and a second wave, and the variant picks (tma on
    non-paged caches, K^T loads, 32-bit offsets) were each a way around that.
  prefill/paged: one page id per tile + page ids prefetched a tile ahead + a 16-row tile for short
    sequences + 32-bit offsets + heavy q tiles first: 2k prefill + 128 decodes 1.43x (509.8 ->
    356.2 µs), chunk 2k on 30k at page 16 1.51x, chunk 2k on 6k at page 256 1.50x.
  prefill/contiguous: tma + 32-bit offsets + heavy q tiles first: GQA causal 4x4k 1.12x, MHA causal
    1x16k 1.09x, a 2k chunk on 30k 1.18x (tma only at d >= 128 over >= 2048 keys; d256 0.99x)."""

VARIANTS_ENV = "ATTN_FUSED_VARIANTS"
"""Environment override of ``TUNED_VARIANTS``, e.g. ``decode/paged=paged_scalar_ids+prefetch_page_ids;
prefill/paged=small_block_m:16`` (classes not named keep their table entry; ``none`` clears one).
``python -m benchmarks.sweep --variants-out FILE`` writes the string its measurements favour."""


def parse_variants(text: str) -> dict[str, dict[str, int]]:
    """Parse a ``ATTN_FUSED_VARIANTS`` string into ``{shape class: {field: value}}``.

    Example:
        >>> parse_variants("decode/paged=paged_scalar_ids+small_block_m:16;prefill/contiguous=none")
        {'decode/paged': {'paged_scalar_ids': 1, 'small_block_m': 16}, 'prefill/contiguous': {}}
    """
    table: dict[str, dict[str, int]] = {}
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        shape_class, _, flags = entry.partition("=")
        shape_class = shape_class.strip()
        if shape_class not in SHAPE_CLASSES:
            raise ValueError(f"{VARIANTS_ENV}: unknown shape class {shape_class!r} in {entry!r}; "
                             f"expected one of {', '.join(SHAPE_CLASSES)}")
        table[shape_class] = {}
        for flag in filter(None, (f.strip() for f in flags.split("+"))):
            if flag == "none":
                continue
            name, _, value = flag.partition(":")
            if name not in VARIANT_FIELDS or (value and not value.isdigit()):
                raise ValueError(f"{VARIANTS_ENV}: bad variant {flag!r} in {entry!r}; expected one of "
                                 f"{', '.join(VARIANT_FIELDS)}, optionally ':<int>'")
            table[shape_class][name] = int(value) if value else 1
    return table


PREFILL_TILE = (128, 64, 8, 2, 128)
"""(block_m, block_n, warps, stages, register cap) of d128 prefill over a non-paged cache (or packed K/V)
walking more than SHORT_KV_TILES' keys, when the call has at least PREFILL_TILE_MIN_PROGRAMS q tiles. Two
stages and at most 128 registers per thread let two 8-warp programs share an SM (shared memory 96 KiB each;
ptxas gave the uncapped tile more than 128 registers, one program per SM), so one program's Q load and
output store overlap the other's loop. H200, 2026-11-30, commit 9f215ab, thd 16k tokens bf16, against
FEW_PROGRAMS_TILE (docs/results/2026-11-30-h200-9f215ab/tiles.md): 4x4k MHA full / causal 1.020x / 1.020x,
GQA 32/8 1.037x / 1.040x; 1x16k MHA 1.002x / 0.992x, GQA 1.014x / 1.026x. Uncapped at two stages: 0.81-0.93x."""

FEW_PROGRAMS_TILE = (128, 64, 8, 3, 0)
"""The long-walk tile of calls with fewer q tiles than PREFILL_TILE_MIN_PROGRAMS: one program per SM, three
stages. Such calls (a chunk over a long prefix) walk many keys per program, so a program's fixed work is a
small share and a deeper pipeline pays. H200, 2026-11-30, code of f360216, against PREFILL_TILE
(docs/results/2026-11-30-h200-f360216/chunk-ab.md): a 2k chunk GQA 32/8 on a 6k / 14k / 30k prefix (512 q
tiles) 1.056x / 1.019x / 1.003x, a 4k chunk on 4k (1,024) 1.023x; thd causal 2x8k (4,096) 0.988x GQA, 0.980x
MHA."""

PREFILL_TILE_MIN_PROGRAMS = 2048
"""q tiles (128 packed rows each, times KV heads) from which PREFILL_TILE replaces FEW_PROGRAMS_TILE: between
the 1,024 of a 4k chunk (FEW_PROGRAMS_TILE 1.023x) and the 4,096 of 16k-token thd batches (PREFILL_TILE)."""

def q_tile_count(total_q: int, group_size: int, num_heads_kv: int) -> int:
    """A call's 128-row q tiles (query tokens x GQA group, packed) times its KV heads: select_forward_config's
    ``num_q_tiles``.

    Example:
        >>> q_tile_count(total_q=2048, group_size=4, num_heads_kv=8)
        512
    """
    return -(-total_q * group_size // 128) * num_heads_kv


SHORT_KV_TILES = (
    (1024, (128, 64, 8, 2, 128), (128, 32, 8, 3, 128), (64, 64, 4, 3, 0)),
    (2048, (128, 64, 8, 2, 128), (128, 64, 8, 2, 128), (64, 64, 4, 3, 0)),
)
"""Prefill tiles (block_m, block_n, warps, stages, register cap) of d <= 128 calls whose KV walks are at most
that many keys: non-paged without, then with a causal mask, then paged. Short walks pay each program's fixed
work (sequence lookup, Q load, output store) often, so two 8-warp programs per SM (a 128-register cap) hide
it best. H200, 2026-11-30, commit 9f215ab, thd 16k tokens bf16 (docs/results/2026-11-30-h200-9f215ab/tiles.md),
speedups over the earlier tiles (16x1k 128x32 4 warps 3 stages, 8x2k 64x64 4 warps 3 stages):
  16x1k 128x64 8 warps 2 stages capped: MHA / GQA 32/8 full 1.031x / 1.083x, causal 1.010x / 1.014x;
  16x1k causal 128x32 8 warps 3 stages capped: MHA 1.045x, GQA 1.051x (full 1.010x / 1.019x);
  8x2k 128x64 8 warps 2 stages capped: MHA full / causal 1.023x / 0.996x, GQA 1.047x / 1.062x.
Paged caches keep 64x64 4 warps (commit 5642f28: 2k prefill + 128 decodes at 2k 1.23x over 128x128); a 2k
chunk on 14k + 64 decodes keeps the long-walk 128x128 (64x64 there 0.89x)."""

GATHER_MAX_PAGE_SIZE = 64
"""Pages smaller than this are copied to a contiguous buffer before a prefill call that reads them often
(GATHER_MIN_PACKED_ROWS); larger pages hold whole 64-key tiles, which the kernel reads with one page id.
H200, commit dc3ccf8, 2k chunk GQA 32/8 d128 bf16 causal, tuned paged kernel -> pages copied first
(benchmarks.sweep --names tuned, docs/results/2026-11-30-h200-dc3ccf8/sweep-gather.md): page 16 on a
6k prefix 545.9 -> 507.7 µs, on 30k 2173.4 -> 2142.6; page 256 on 6k 513.2 -> 507.1, on 30k 2109.8 ->
2124.5 (the copy does not pay where the kernel already reads whole tiles per page)."""

GATHER_MIN_PACKED_ROWS = 4096
"""The page copy needs at least this many packed query rows (query tokens x GQA group size) per sequence
on average: the copy reads and writes each sequence's K/V once, the kernel reads them once per q tile
of 128 packed rows. A decode or mixed batch (mostly one-token sequences) never copies. Chosen, not
swept: the 2k chunks above (8192 packed rows) gain; the copy of a 6k-token prefix cost ~25 µs there."""

GATHER_MAX_BYTES = 1 << 30
"""Largest page copy (K and V together) the launcher makes; larger calls run over the pages. A CUDA
graph capture sizes the copy by the cache's capacity, so a long-context capture stays on the pages."""

TMA_MIN_KV_LENGTH = 2048
"""The variant tables' ``tma`` is used for head dims >= 128 over KV walks of at least this many keys
only: a descriptor's setup pays off over long walks of wide rows (H200, tma + 32-bit offsets
against 32-bit offsets alone: d128 at 4k-30k keys 1.01-1.09x; 16x1k causal 0.91x, d64 4x4k 0.66x)."""


def tma_pays(config: ForwardConfig, max_seqlen_kv: int) -> bool:
    """Whether the variant tables' ``tma`` applies to a call (see ``TMA_MIN_KV_LENGTH``)."""
    return config.block_dqk >= 128 and max_seqlen_kv >= TMA_MIN_KV_LENGTH


def _with_variants(config: ForwardConfig, shape_class: str, group_size: int, override: str,
                   long_kv: bool) -> ForwardConfig:
    variants = {**TUNED_VARIANTS, **parse_variants(override)}.get(shape_class)
    if not variants:
        return config
    values = {name: bool(value) for name, value in variants.items() if name != "small_block_m"}
    if values.get("tma") and not tma_pays(config, TMA_MIN_KV_LENGTH if long_kv else 0):
        values["tma"] = False
    small = variants.get("small_block_m", 0)
    if small and group_size <= small < config.block_m:  # else the second tile would be no smaller
        values["small_block_m"] = next_power_of_2(small)
    return replace(config, **values)


def next_power_of_2(value: int) -> int:
    """Smallest power of 2 >= value (1 for value <= 1)."""
    return 1 if value <= 1 else 1 << (int(value) - 1).bit_length()


def select_forward_config(
    *,
    head_dim_qk: int,
    head_dim_v: int,
    group_size: int,
    max_seqlen_q: int,
    interpret: bool,
    paged: bool = False,
    tuned: bool = True,
    max_seqlen_kv: int | None = None,
    causal: bool = False,
    num_q_tiles: int | None = None,
    mixed: bool = False,
) -> ForwardConfig:
    """Pick block sizes, warps and stages for one call, then the class's tuned variants.

    Shape classes: "decode" (few packed rows per sequence: decode, speculative verify, short
    chunks) uses a 16..64-row tile so tensor cores serve the packed GQA heads without wasting much
    work; "prefill" uses 128-row tiles (64 for head dim 256, register/smem bound). Interpreter mode
    uses the smallest legal tiles so CPU tests stay fast (with the same variants, so CI runs them).
    ``paged`` picks the variant table's layout; ``tuned=False`` leaves every variant off (the sweep's
    baseline); ``max_seqlen_kv`` (None: long) decides whether a table's ``tma`` applies (``tma_pays``) and
    picks SHORT_KV_TILES, whose non-paged entries differ with ``causal`` (a causal mask of any alignment).
    ``num_q_tiles`` (128-row q tiles times KV heads; None: many) picks the non-paged long-walk tile.
    ``mixed`` (``mixed_batch``: decodes beside a prefill) gives a non-paged prefill-class call the paged
    tables' d128 tile and the small decode tile (MIXED_CONTIGUOUS_SMALL_BLOCK_M).

    Measured on the H200 with L2 flushed (benchmarks/sweep.py, bf16, Triton 3.6, 2026-11-30; the
    full table is docs/results/2026-11-30-h200/sweep.md):
      decode d128 GQA 32/8 (block_m 16): block_n 64, 4 warps, 2 stages: 64x4k page 16 266.7 µs
        (4.03 TB/s); 3 stages 277, block_n 128 286, block_n 32 307, 2 warps 391, 8 warps 378.
        Again at commit 60d3fff (docs/results/2026-11-30-h200-60d3fff/sweep-tiles.md) on nine decode
        cells: 64x4k 254.2 µs against 257.1-322.6 for every other tile, 3-6 stages with page ids a
        tile ahead included; 1x8k 24.6 against 24.1 (32-key tiles) and 26.0-29.6.
      decode MQA 32/1 (block_m 32, 64x4k page 16, same sweep): block_n 128 55.3 µs, 64 61.3.
      prefill d128 (4x4k, GQA causal / MHA full): 128x64 8 warps 3 stages 427 / 453 TFLOP/s;
        4 stages 415 / 458, 128x128 2 stages 418 / 461, 64x64 4 warps 411 / 443.
        Exception to follow up: 16x1k causal 64x64 4 warps 281 vs 264.
      prefill d128 over a paged cache: 128-key tiles, 3 stages (the page-table gather of a tile costs
        the same at 64 or 128 keys). Page-id variants on both tiles (µs, page 16 unless named):
        a 2k chunk on 30k 3145 vs 3454, on 6k page 256 685 vs 832 (one page id per tile),
        2k on 14k + 64 decodes 2041 vs 2242, 2k prefill + 128 decodes 666 vs 677.
      d64 (4x4k, tuned variants, commit 5642f28): 64x64 4 warps 3 stages full 417, causal 378 TFLOP/s
        against 128x64 8 warps 324 / 387. d256 causal: 128x64 8 warps 2 stages 467 (3 stages and
        128x128 exceed shared memory; 64x64 4 warps 327).
      KV walks of at most 1024 / 2048 keys at d128: SHORT_KV_TILES; longer non-paged walks: PREFILL_TILE,
      FEW_PROGRAMS_TILE below PREFILL_TILE_MIN_PROGRAMS q tiles.
      The Triton warp-specialized kernel was removed in favour of the Gluon Hopper kernel
      (attention_fwd_hopper.py); its measured figures are in docs/benchmarks_log.md's history.

    Example:
        >>> select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4,
        ...                       max_seqlen_q=1, interpret=False).block_m
        16
    """
    long_kv = max_seqlen_kv is None or max_seqlen_kv >= TMA_MIN_KV_LENGTH
    return _select_forward_config(head_dim_qk, head_dim_v, group_size, max_seqlen_q, interpret, paged, tuned,
                                  getenv(VARIANTS_ENV, "") if tuned else "", long_kv,
                                  _short_kv_tiles(max_seqlen_kv, causal),
                                  num_q_tiles is None or num_q_tiles >= PREFILL_TILE_MIN_PROGRAMS, mixed and not paged)


def _short_kv_tiles(max_seqlen_kv: int | None, causal: bool) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The (non-paged, paged) tiles of the SHORT_KV_TILES entry of the smallest bound holding ``max_seqlen_kv``
    keys; None for longer walks or None (a config cache key that changes at those bounds only, not on every
    decode step)."""
    if max_seqlen_kv is not None:
        for bound, full_tile, causal_tile, paged_tile in SHORT_KV_TILES:
            if max_seqlen_kv <= bound:
                return causal_tile if causal else full_tile, paged_tile
    return None


@functools.lru_cache(maxsize=512)
def _select_forward_config(head_dim_qk: int, head_dim_v: int, group_size: int, max_seqlen_q: int, interpret: bool,
                           paged: bool, tuned: bool, variants_override: str, long_kv: bool,
                           short_kv_tiles: tuple[tuple[int, ...], tuple[int, ...]] | None,
                           many_q_tiles: bool, mixed_contiguous: bool) -> ForwardConfig:
    """select_forward_config's work, cached: a decode call asks the same question every step."""
    max_registers = 0
    block_dqk = max(16, next_power_of_2(head_dim_qk))
    block_dv = max(16, next_power_of_2(head_dim_v))
    block_d = max(block_dqk, block_dv)
    group_rows = max(16, next_power_of_2(group_size))
    packed_rows = group_size * max(1, max_seqlen_q)

    if interpret:
        block_m, block_n, num_warps, num_stages = group_rows, 16, 4, 1
    elif packed_rows <= _DECODE_MAX_ROWS:
        block_m = max(group_rows, next_power_of_2(packed_rows))
        block_n, num_warps, num_stages = (128 if block_m == 32 else 64), 4, 2
        max_registers = _DECODE_MAX_REGISTERS if block_m <= 16 else 0
    elif block_d <= 64:
        block_m, block_n, num_warps, num_stages = 64, 64, 4, 3
    elif block_d == 128 and short_kv_tiles:
        block_m, block_n, num_warps, num_stages, max_registers = \
            short_kv_tiles[1] if paged or mixed_contiguous else short_kv_tiles[0]
    elif block_d == 128 and (paged or mixed_contiguous):
        block_m, block_n, num_warps, num_stages = 128, 128, 8, 3
    elif block_d == 128:
        block_m, block_n, num_warps, num_stages, max_registers = PREFILL_TILE if many_q_tiles else FEW_PROGRAMS_TILE
    else:
        block_m, block_n, num_warps, num_stages = 128, 64, 8, 2
    block_m = max(block_m, group_rows)
    config = ForwardConfig(
        block_m=block_m,
        block_q=max(1, block_m // group_size),
        block_n=block_n,
        block_dqk=block_dqk,
        block_dv=block_dv,
        num_warps=num_warps,
        num_stages=num_stages,
        max_registers=max_registers,
    )
    if not tuned:
        return config
    config = _with_variants(config, shape_class(group_size, max_seqlen_q, paged), group_size, variants_override,
                            long_kv)
    small = MIXED_CONTIGUOUS_SMALL_BLOCK_M
    if mixed_contiguous and packed_rows > _DECODE_MAX_ROWS and group_size <= small < config.block_m:
        config = replace(config, small_block_m=small)
    return config


MIXED_BATCH_RATIO = 8
"""A prefill-class call is a mixed batch (``mixed_batch``) when its longest sequence has at least this many times
the batch's average queries: a prefill or a chunk beside decodes (2k + 128 decodes: 121x; 2k + 64: 62x), not a
ragged prefill (the GPU tests' 1 ... 8192 tokens over 7 sequences: 4.1x)."""

MIXED_CONTIGUOUS_SMALL_BLOCK_M = 16
"""A mixed batch over a non-paged cache takes the paged tables' d128 tile (SHORT_KV_TILES' paged entry, else 128x128
8 warps 3 stages) and, as the paged class, a tile of this many rows for its decodes, keeping the contiguous
variants (tma, 32-bit offsets, heavy tiles first). H200, 2026-12-01, one launch, graph replays, settled
(abtree/dense_mixed_ab.py, docs/results/2026-12-01-h200-5956217/dense-mixed-ab.txt): one 2k prefill + 128
decodes at 2k 446.4 -> 307.0 µs (before: the contiguous causal short-walk tile 128x64 8 warps, no small tile;
the small tile alone 398.0); a 2k chunk on 14k + 64 decodes at 4k 1331.0 -> 1190.0 (before: FEW_PROGRAMS_TILE;
the small tile alone 1310.7, 64x64 4 warps 1254.3)."""


def mixed_batch(num_seqs: int, total_q: int, max_seqlen_q: int) -> bool:
    """Whether a call looks like decodes beside a prefill (MIXED_BATCH_RATIO): host values only.

    Example:
        >>> mixed_batch(num_seqs=129, total_q=2048 + 128, max_seqlen_q=2048), mixed_batch(7, 13836, 8192)
        (True, False)
    """
    return num_seqs > 1 and max_seqlen_q * num_seqs >= MIXED_BATCH_RATIO * total_q


def shape_class(group_size: int, max_seqlen_q: int, paged: bool) -> str:
    """The variant table's class of a call: "decode" (at most _DECODE_MAX_ROWS packed rows per sequence)
    or "prefill", then "/paged" or "/contiguous"."""
    packed_rows = group_size * max(1, max_seqlen_q)
    return ("decode" if packed_rows <= _DECODE_MAX_ROWS else "prefill") + ("/paged" if paged else "/contiguous")


_SM_COUNT_CACHE: dict[int, int] = {}


def num_streaming_multiprocessors(device: torch.device) -> int:
    """SM count of a CUDA device (cached); 4 for CPU tensors (interpreter: keep grids small)."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT_CACHE:
        _SM_COUNT_CACHE[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT_CACHE[index]


def choose_num_splits(
    *,
    num_seqs: int,
    num_kv_heads: int,
    total_q: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    block_q: int,
    block_n: int,
    num_sms: int,
    block_m: int = 16,
) -> int:
    """Split-KV count from host-known sizes only (no device sync).

    Two reasons to split, whichever asks for more, rounded to a power of two:
      fill: fewer than ``_FILL_PROGRAMS_PER_SM`` (sequence, q-tile, KV head) programs per SM leave
        the memory system idle; split up to about that many, never past it. A decode tile of more
        than 16 packed rows (``block_m``: MQA's 32 heads per KV head) counts block_m / 16 times: each
        split writes a partial output per query head, so more heads per program ask for fewer splits.
      balance (decode class only: one q tile per sequence): no program reads more than
        ``_BALANCE_CHUNK_KEYS`` keys, so one long sequence of a ragged batch does not run alone
        after the short ones finish (the kernel gives each split an even share of its own
        sequence's range, so short sequences become short splits).
    Never split KV ranges of four tiles or fewer, and keep at least two tiles per split.

    Measured on the H200 (benchmarks/sweep.py, bf16 GQA 32/8 d128 page 16, 2026-11-30, µs):
      1x8k: 64 splits 26.6 (32: 27.4, 16: 33.8); 8x4k: 8 splits 53.5 (4: 60.2, 16: 57.2);
      32x2k: 2 splits 85.1 (1: 106.7, 3: 97.6, 4: 89.8); 32x4k verify q4: 2 splits 150.3 (3: 172.1);
      64x4k: 1 split 266.8 (2: 273.3); 32x32k: 2, 4 or 8 splits ~1000 (1: 1490, 3: 1151);
      MQA 32/1 64x4k: 4 splits 69.8, 8: 75.7 (9: 79.0) (commit 0e8bdd5: 4 splits 59.2, 8: 65.3);
      ragged 64 (mean 4k, max 32k): 8 splits 373.8, 16: 356.4 (1: 1214). Odd split counts measured consistently
      slower than their power-of-two neighbours.

    Example:
        >>> choose_num_splits(num_seqs=1, num_kv_heads=8, total_q=1, max_seqlen_q=1,
        ...                   max_seqlen_kv=32768, block_q=4, block_n=64, num_sms=132)
        64
    """
    q_tiles_per_seq = -(-max(1, max_seqlen_q) // block_q)
    q_tiles = min(-(-total_q // block_q) + num_seqs, num_seqs * q_tiles_per_seq)
    programs = max(1, num_kv_heads * q_tiles)
    kv_tiles = -(-max(0, max_seqlen_kv) // block_n)
    if kv_tiles <= 4:
        return 1
    balance = 1
    if q_tiles_per_seq == 1:
        programs *= max(1, block_m // 16)
        balance = next_power_of_2(-(-max_seqlen_kv // _BALANCE_CHUNK_KEYS))
    fill = _floor_power_of_2(_FILL_PROGRAMS_PER_SM * num_sms // programs)
    return max(1, min(max(fill, balance), _floor_power_of_2(kv_tiles // 2), MAX_NUM_SPLITS))


def _floor_power_of_2(value: int) -> int:
    """Largest power of 2 <= value (1 for value <= 1)."""
    return 1 if value <= 1 else 1 << (int(value).bit_length() - 1)
