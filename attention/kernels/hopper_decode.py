"""Host side of the Hopper decode kernel (attention_decode_hopper.py): which calls it serves, its split-KV count, and
its launch (with combine.py's merge after it when it splits).

plan_hopper_forward (hopper_forward.py) hands it the decode-sized calls (at most MAX_DECODE_ROWS packed rows per
sequence) that the Hopper kernels serve. ``ATTN_FUSED_HOPPER_DECODE=0`` sends them to the general kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attention.environment import getenv, switch

from .arguments import scale_log2
from .attention_decode_hopper import MAX_DECODE_ROWS, SMALL_DECODE_ROWS, attention_decode_hopper_kernel
from .combine import combine_launch, split_counter_buffer
from .configs import MAX_NUM_SPLITS, next_power_of_2
from .hopper_mixed import PersistentLaunch, decode_tile_rows
from .launch import KernelLaunch

__all__ = [
    "DECODE_HOPPER_ENV",
    "DECODE_HOPPER_GATHER_ENV",
    "DECODE_HOPPER_GATHER_PAGES_ENV",
    "DECODE_HOPPER_GATHER_TILE",
    "DECODE_HOPPER_GATHER_WIDE_TILE",
    "DECODE_HOPPER_HEADS_ENV",
    "DECODE_HOPPER_MERGE_ENV",
    "DECODE_HOPPER_ROUNDS_ENV",
    "DECODE_HOPPER_TILE",
    "DECODE_HOPPER_TILE_ENV",
    "GATHER_PAGE_SIZES",
    "GATHER_TWO_AN_SM_MAX_ROWS",
    "DecodeHopperPlan",
    "check_environment",
    "choose_decode_splits",
    "decode_hopper_unsupported_reason",
    "kv_heads_per_item",
    "plan_decode_hopper",
    "whole_round_programs",
]

DECODE_HOPPER_ENV = "ATTN_FUSED_HOPPER_DECODE"
"""``0``: decode calls go to the general kernel; unset or ``1``: to attention_decode_hopper_kernel, every one it
can run."""

DECODE_HOPPER_GATHER_ENV = "ATTN_FUSED_HOPPER_DECODE_GATHER"
"""Decode calls over pages of fewer than 16 tokens (GATHER_PAGE_SIZES), which attention_decode_hopper_kernel's
producer warps gather by cp.async (TMA cannot slice such pages into the swizzled tile): unset or ``1``, every one,
with DECODE_HOPPER_GATHER_TILE (DECODE_HOPPER_GATHER_WIDE_TILE for tiles of more than 32 rows); ``0``, none (the
general kernel's); five integers, every one with that tile instead (A/B measurements)."""

GATHER_PAGE_SIZES = (1, 2, 4, 8)
"""Page sizes the decode kernel gathers; 16 and more it reads by TMA."""

DECODE_HOPPER_GATHER_PAGES_ENV = "ATTN_FUSED_HOPPER_DECODE_GATHER_PAGES"
"""More page sizes to gather (comma-separated, e.g. ``16,64``) instead of reading them by TMA (A/B measurements).
H200, 2026-12-03, graph replays, cuDNN in the same process (docs/results/2026-12-03-h200-probe/out/gather16.txt):
gathered 16-token pages lost 0.3-1.2 % on every cell (64x4k 242.6-242.7 us against 241.0-241.1 by TMA, 128x2k 244.0
against 241.9-242.5, MHA 944.1-944.5 against 937.5-938.1, 1x8k 18.8-19.1 against 17.9-18.1), 64-token pages 1.1 %."""

DECODE_HOPPER_GATHER_TILE = (64, 3, 4, 2, 128)
"""(BLOCK_N, STAGES, producer warps, programs per SM, maxnreg) when the decode kernel gathers pages: two programs an
SM of 101.8 KB of shared memory each (the ring 3 x 2 x 16 KiB at d128; Triton 3.6 spills 120 B at maxnreg 128).
H200, 2026-12-02, graph replays, settled, against the general kernel in the same process, GQA 32/8 d128
(docs/results/2026-12-02-h200-e97c00a/out/run88/): 64x4k page 1 250.2-250.8 against 253.3-254.2 us (cuDNN
contiguous 245.1-245.3), page 8 247.2-247.3 against 253.0-253.9, 128x2k page 1 251.3-252.4 against 257.4-257.5,
32x2k page 1 68.8-69.7 against 74.9 (cuDNN 67.6-67.7), 1x8k page 1 18.8-18.9 against 22.0 (cuDNN 18.9), 8x4k
page 1 41.2-42.2 against 42.8-43.1, 32x4k verification (4 queries) page 1 130.0 against 138.5. One program an SM
(64, 4, 4, 1, 168) in the same call: 257.7-258.2 at 64x4k page 1, 268.8 at page 8, 134.8-134.9 on the verification,
as fast on 1x8k and 8x4k; it lost to the general kernel on the large cells, 1-6 %, in the earlier runs there, where
the small cells at pages 2 and 4 gathered as fast as at pages 1 and 8 (18.2-18.8 us at 1x8k against 21.6-22.2).
One producer warp and three stages (the thirtieth session's tile): 397 us at 64x4k page 1. The split rule sizes these
calls on the program slots (two an SM): 1x8k and 1x32k take 32 splits and the merge launch; 16 merged in the kernel
(sized on the SMs) tied at 1x8k page 1 and lost 5 % at 1x32k page 1 (43.5-43.7 against 41.4-41.8 us; H200, 2026-12-03,
docs/results/2026-12-03-h200-sweep/out/sweep-small.txt)."""

GATHER_TWO_AN_SM_MAX_ROWS = 32
"""The most rows of a decode tile gathered two programs an SM: at 64 rows (16 query heads a KV head x 4 queries) a
program takes 124 KB of shared memory (two do not fit an SM's 227) and Triton 3.6 spills 1,216 B at maxnreg 128
(312 at 32 rows, 132 at 16)."""

DECODE_HOPPER_GATHER_WIDE_TILE = (64, 4, 4, 1, 168)
"""The gather tile past GATHER_TWO_AN_SM_MAX_ROWS: one program an SM (the tile the thirty-second session's GPU suite
passed with as the default at pages of 1 token)."""

DECODE_HOPPER_TILE = (64, 3, 1, 168)
"""(BLOCK_N, STAGES, programs per SM, maxnreg). Shared memory at d128 with 16 rows: the ring 3 x 2 x 16 KiB, Q and
P 6 KiB. The two partitions take two warp groups' registers: at maxnreg 168 one program fits an SM, at 128 two.
H200, 2026-12-01, graph replays, paged p16 GQA 32/8 d128 (docs/results/2026-12-01-h200-aaa7744/sweep.txt and
scripts/decode_kernel_ab.py there), against the general kernel in the same process: 1x8k 22.7 against 24.8 us,
1x32k 50.2 / 52.7, 8x4k 50.1 / 51.8 (the split rule's counts); 64x4k 258.4 / 259.1, 128x2k 261.7 / 263.9, 64x4k MHA
982.7 / 989.1. Two programs an SM (maxnreg 128) were within 1 % either way; 2 stages lost 4 % at one program an SM,
4 and 6 stages 1-3 %. 128-key tiles (H200, 2026-12-02, docs/results/2026-12-02-h200-652e0ab/out/run94/): 64x4k 248.2
/ 249.2 against 246.1 / 246.1 us, MHA 971.2 / 968.0 against 959.2 / 961.9, 1x8k and 32x2k within 0.5 %. Swept again
(H200, 2026-12-03, docs/results/2026-12-03-h200-sweep/, cuDNN in the same process): 2 stages 3-4 % slower on the large
cells, 4 stages ~1 %, 5-6 stages 1-4 %; two programs an SM at 2 stages within 0.5 % of this tile on the large cells,
0.9 % faster on 32x2k (67.7 against 68.4 us), slower on 1x8k and MQA."""

DECODE_HOPPER_TILE_ENV = "ATTN_FUSED_HOPPER_DECODE_TILE"
"""Override of DECODE_HOPPER_TILE (A/B measurements): four integers, and a fifth for a fixed split count, e.g.
``64,4,1,168`` or ``64,3,2,128,16``."""

DECODE_HOPPER_HEADS_ENV = "ATTN_FUSED_HOPPER_DECODE_HEADS"
"""KV heads a decode item takes (HEADS: a tile holds BLOCK_N / HEADS keys of each, their query heads packed as one
group): an integer (1: one head an item; A/B measurements); unset, kv_heads_per_item's rule. Calls it cannot serve
that way (heads it does not divide, more than MAX_DECODE_ROWS rows, fewer than 16 keys a head a tile, pages that do
not hold or tile a head's keys, pages gathered by cp.async) take 1."""

DECODE_HOPPER_MERGE_ENV = "ATTN_FUSED_HOPPER_DECODE_MERGE"
"""``0``: split partials are merged by combine.py's kernel, a second launch; unset or ``1``: by the decode kernel
itself (the last split of each walk to finish) when there are at most FUSED_MERGE_MAX_SPLITS splits and one item a
program. Each item then pays a gpu-scope release and atomic before its next: H200, 2026-12-01, graph replays, against
the merge launch in the same process (docs/results/2026-12-01-h200-e3e2b7c/merge-ab.txt): 1x8k 22.6 / 21.8 against
22.4 / 22.4 us, 1x32k 49.2 / 49.5 against 49.8 / 49.7, 8x4k 51.0 / 49.6 against 49.9 / 49.8, MQA 32/1 64x4k 52.2 /
52.3 against 53.2 / 53.1; the ragged batch (62 items a program) 503.2 against 299.5, hence one item a program."""

FUSED_MERGE_MAX_SPLITS = 16
"""The most splits the decode kernel merges itself: a row's splits sit in one thread's registers (64 a thread at
16 splits x 4 rows x d128 over 4 warps). Tiles of 64 rows keep the merge launch: their warp group spills with the
merge compiled in (sm90, Triton 3.6: 88 B at d128 against 8 B without)."""

DECODE_HOPPER_ROUNDS_ENV = "ATTN_FUSED_HOPPER_DECODE_ROUNDS"
"""``0``: the decode kernel runs on every program (num_sms x programs per SM, or one an item); unset or ``1``: on
whole_round_programs's count."""

WHOLE_ROUNDS_MIN_FRACTION = 0.9
"""whole_round_programs gives up at most this share of the programs (enough SMs left to keep HBM busy)."""

MIN_SPLIT_TILES = 4
"""A split reads at least this many KV tiles (unless the walk is shorter)."""
BALANCE_SPLIT_TILES = 64
"""A split reads at most this many KV tiles (4096 keys at 64 a tile): a long sequence of a ragged batch (which the
host cannot see) is then no single program's whole work. H200 (sweep.txt above), 64 sequences of mean 4k and
max 32k keys: 16 splits 307.7 us, 8 326.3, 4 346.0, 1 494.0 (the general kernel 336.4); its price on 32 x 32k
keys, where whole walks would do: 8 splits 999.5 against 977.9 (the general kernel 987.5)."""
ITEM_COST_TILES = 1
"""The split rule's price of an item beyond its tiles (its walk's loads, its Q, its epilogue), in tiles."""
MERGE_COST_TILES = 4
"""The split rule's price of the merge launch, in tiles (H200: ~4 us, a program's time for about 4 64-key tiles
of K and V at d128)."""


def choose_decode_splits(*, walks: int, max_tiles: int, programs: int, mean_tiles: int | None = None) -> int:
    """Splits per (sequence, KV head) walk of at most ``max_tiles`` KV tiles: the power of 2 whose busiest program
    has the fewest tiles to stream, each of its items costing ITEM_COST_TILES more and the merge MERGE_COST_TILES,
    with splits of at least MIN_SPLIT_TILES tiles, at most MAX_NUM_SPLITS (the merge's bound). Powers of 2 only, as
    configs.choose_num_splits (whose sweeps found odd counts slower).

    ``mean_tiles``: the walks' mean length in tiles, when the host knows the sequences' lengths (a serving step
    does). The busiest program then takes a round of the longest walk's splits and the rest of its rounds of mean
    ones. None: every walk may be the longest (a ragged batch looks so to the host), and splits are at most
    BALANCE_SPLIT_TILES tiles, so that a long sequence is no single program's whole work.

    H200 (sweep.txt above), the rule's count against its neighbours: 1x8k 16 splits 22.7 us (8: 24.0, 32: 22.9);
    1x32k 16 50.2 (8: 55.3, 32: 51.8); 8x4k 2 50.1 (1: 52.7, 4: 51.1); MQA 32/1 64x4k 2 53.6 (1: 60.5, 4: 55.8);
    32x2k 1 78.0 (2: 83.3); 32x4k verification 1 139.5 (2: 148.6). With the mean known, uniform walks
    (docs/benchmarks_log.md, twenty-fourth session; 128 programs): 32x32k 1 split 936.2 us (the cap's 8: 952.5),
    64x16k 1 937.3 (4: 952.1), 128x8k 1 940.5 (2: 953.4), 16x32k 1 477.5 (8: 486.6), 8x32k 2 245.9, 4x32k 4 129.1.

    Example:
        >>> choose_decode_splits(walks=8, max_tiles=128, programs=132)  # 1 x 8k, GQA 32/8
        16
        >>> choose_decode_splits(walks=256, max_tiles=512, programs=132), choose_decode_splits(
        ...     walks=256, max_tiles=512, programs=132, mean_tiles=512)  # 32 x 32k: a ragged batch, or not
        (8, 1)
    """
    known = mean_tiles is not None
    mean_tiles = max_tiles if mean_tiles is None else min(mean_tiles, max_tiles)
    splits, candidates = 1, []
    while splits <= min(MAX_NUM_SPLITS, max(1, max_tiles // MIN_SPLIT_TILES)):
        if known or splits * BALANCE_SPLIT_TILES >= max_tiles:
            candidates.append(splits)
        splits *= 2

    def busiest(splits: int) -> int:
        rounds = -(-walks * splits // programs)
        return ((rounds - 1) * (-(-mean_tiles // splits) + ITEM_COST_TILES) + -(-max_tiles // splits)
                + ITEM_COST_TILES + (MERGE_COST_TILES if splits > 1 else 0))

    return min(candidates or [splits // 2], key=lambda splits: (busiest(splits), splits))


def whole_round_programs(items: int, programs: int) -> int:
    """Programs for ``items`` equal items (a program takes items pid, pid + programs, ...): the fewest that finish
    them in as many rounds as ``programs`` would, so that every program takes the same number of items (or one
    fewer); ``programs`` itself when that leaves fewer than WHOLE_ROUNDS_MIN_FRACTION of them, ``items`` when one
    round holds them all.

    A last round that keeps only some programs busy leaves HBM under-read while it runs. H200, 2026-12-01, graph
    replays, against every program in the same process (docs/benchmarks_log.md, twenty-fourth session): 32 x 32k
    (2048 items: 16 rounds of 128, against 68 programs with 16 and 64 with 15) 955.2 against 976.3 us; 62 x 4k (496
    items on 124) 237.6 / 244.4; 64 x 4k 242.0 / 245.3; the ragged batch 288.4 / 294.9; no cell slower. Fewer
    programs than whole rounds need (112 to 124 for 512 or 1,024 items) lost 4-10 %.

    Example:
        >>> whole_round_programs(512, 132)  # 64 x 4k, GQA 32/8: 4 rounds either way
        128
    """
    rounds = -(-items // programs)
    if rounds <= 1:
        return items
    fewer = -(-items // rounds)
    return fewer if fewer >= WHOLE_ROUNDS_MIN_FRACTION * programs else programs


@dataclass(frozen=True)
class DecodeHopperPlan(PersistentLaunch):
    """One call's launch of attention_decode_hopper_kernel (and the split merge), all but the tensors' addresses."""

    kv_descriptors: tuple[Any, ...]
    """K's and V's TMA descriptor makers (hopper_forward.RowsDescriptor); none when the kernel gathers small pages
    (GATHER: it takes K and V as pointers, with ``kv_row_strides``)."""
    kv_row_strides: tuple[int, int]
    """Elements between K's and V's token rows when the kernel gathers pages, else (0, 0)."""
    num_splits: int
    tile: tuple[int, int, int, int]
    """(BLOCK_N, STAGES, programs per SM, maxnreg): DECODE_HOPPER_TILE's (or DECODE_HOPPER_TILE_ENV's first four), or
    the gather tile's where the kernel gathers pages."""
    rows: int
    """Packed rows of a decode tile (hopper_mixed.decode_tile_rows of the longest sequence's queries x the group)."""
    partial_shape: tuple[int, int, int, int] | None
    """The split workspace [splits, total_q, H_q, D] (fp32, contiguous), None without a split."""
    combine: KernelLaunch | None
    """combine.py's merge launch, None without a split or with ``merge_rows`` (the kernel merges)."""
    kv_heads_per_item: int = 1
    """KV heads a decode item takes (HEADS; DECODE_HOPPER_HEADS_ENV): ``group_size`` and ``heads_kv`` then count
    an item's query heads and the items a sequence."""
    merge_rows: int = 0
    """> 0: the decode kernel merges its splits, this many rows at a time (FUSED_MERGE, MERGE_ROWS)."""
    total_q: int = 0
    head_dim: int = 128
    gather_warps: int = 0
    """> 0: the producer warps that gather small pages (GATHER), with no TMA descriptors."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, q_start: torch.Tensor | None,
                 kv_start: torch.Tensor | None, page_table: torch.Tensor | None, zero_tail: bool = False) -> None:
        """Launch on these tensors (as MixedHopperPlan.__call__)."""
        if self.partial_shape is None:
            partial_out = partial_lse = out  # unused
        else:
            splits, tokens, heads, head_dim = self.partial_shape
            partial_out = torch.empty(splits, tokens, heads, head_dim, dtype=torch.float32, device=q.device)
            partial_lse = torch.empty(splits, tokens, heads, dtype=torch.float32, device=q.device)
        counters = split_counter_buffer(q.device, self.num_seqs * self.heads_kv) if self.merge_rows else partial_lse
        self._launch_for(zero_tail, page_table)(
            k, v, q, out, partial_out, partial_lse, counters, cu_seqlens_q, cu_seqlens_kv,
            cu_seqlens_q if q_start is None else q_start, cu_seqlens_kv if kv_start is None else kv_start,
            cu_seqlens_q if page_table is None else page_table)
        if self.combine is not None:
            self.combine(partial_out, partial_lse, out, cu_seqlens_q, cu_seqlens_q if q_start is None else q_start,
                         partial_lse)

    def _kernel_launch(self, zero_tail: bool, table_stride: int) -> KernelLaunch:
        """attention_decode_hopper_kernel's launch, all but its 12 tensor arguments fixed."""
        block_n, stages, _, maxnreg = self.tile
        workspace = (0, 0, 0, 0)
        if self.partial_shape is not None:  # (contiguous: the strides follow from the shape)
            _, tokens, heads, head_dim = self.partial_shape
            workspace = (tokens * heads * head_dim, heads * head_dim, tokens * heads, heads)
        return KernelLaunch(
            attention_decode_hopper_kernel, (self.programs,),
            scalars=(self.num_seqs, self.heads_kv, self.num_splits, *self.batch_rows, self.q_token_stride,
                     self.out_token_stride, table_stride, self.softmax_scale_log2, *workspace,
                     self.total_q if zero_tail else 0, *self.kv_row_strides),
            constexprs={
                "GROUP_SIZE": self.group_size, "ROWS": self.rows, "BLOCK_N": block_n, "STAGES": stages,
                "PAGE_SIZE": self.page_size, "CAUSAL": self.causal, "BOTTOM_RIGHT": self.bottom_right,
                "HAS_Q_START": self.has_q_start, "HAS_KV_START": self.has_kv_start,
                "WRITE_PARTIAL": self.partial_shape is not None, "FUSED_MERGE": self.merge_rows > 0,
                "SPLITS_BLOCK": next_power_of_2(self.num_splits), "MERGE_ROWS": max(1, self.merge_rows),
                "GATHER": self.gather_warps, "HEAD_DIM": self.head_dim, "HEADS": self.kv_heads_per_item,
            },
            options={"num_warps": 4, "maxnreg": maxnreg}, descriptors=self.kv_descriptors,
        )


def decode_hopper_unsupported_reason(head_dim: int, group_size: int, max_seqlen_q: int,
                                     page_size: int) -> str | None:
    """None when attention_decode_hopper_kernel can run a decode-sized call that the Hopper kernels could (the
    checks of hopper_unsupported_reason, done by the caller) and is not switched off, else why not."""
    if not switch(DECODE_HOPPER_ENV, True):
        return f"{DECODE_HOPPER_ENV}=0"
    if head_dim not in (64, 128):
        return "needs head dim 64 or 128"
    if max(1, max_seqlen_q) * group_size > MAX_DECODE_ROWS:
        return f"needs at most {MAX_DECODE_ROWS} query rows (queries x query heads of a KV head) per sequence"
    block_n = _tile()[0]
    if _gathered(page_size):
        return None if _gather_tile() else f"pages of {page_size} tokens with {DECODE_HOPPER_GATHER_ENV}=0"
    if page_size and page_size % block_n and (block_n % page_size or page_size < 16):
        return (f"needs pages of {', '.join(map(str, GATHER_PAGE_SIZES))} or 16 to {block_n} tokens dividing "
                f"{block_n}, or a multiple of {block_n}")
    return None


def plan_decode_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, heads_kv: int,
                       batch_rows: tuple[int, int, int, int], *,
                       num_seqs: int, max_seqlen_q: int, max_seqlen_kv: int, total_q: int, softmax_scale: float,
                       causal: bool, bottom_right: bool, page_size: int, has_q_start: bool, has_kv_start: bool,
                       num_sms: int, num_splits: int | None = None,
                       mean_seqlen_kv: int | None = None) -> DecodeHopperPlan | None:
    """A DecodeHopperPlan for a decode-sized call the kernel serves (plan_hopper_forward checked the tensors), else
    None. q / out: 4-D views [B, S, H, D] (out's strides size the merge's stores); k / v: as attention_forward's
    (their geometry sizes the TMA descriptors); batch_rows as HopperPlan's;
    ``num_splits``: split-KV count (None: choose_decode_splits's, or DECODE_HOPPER_TILE_ENV's fifth entry);
    ``mean_seqlen_kv``: the sequences' mean KV length when the host knows it (the split rule's ``mean_tiles``)."""
    heads_q, head_dim = q.shape[2], q.shape[3]
    group_size = heads_q // heads_kv
    if decode_hopper_unsupported_reason(head_dim, group_size, max_seqlen_q, page_size):
        return None
    block_n, stages, programs_per_sm, maxnreg, *fixed_splits = _tile()
    rows = decode_tile_rows(group_size * max(1, max_seqlen_q))
    gather = _gather_tile(rows) if _gathered(page_size) else None
    if gather:
        block_n, stages, _, programs_per_sm, maxnreg = gather
    programs = num_sms * programs_per_sm

    def splits_for(heads: int) -> int:  # split count of items of ``heads`` KV heads
        if num_splits is not None:
            return num_splits
        if fixed_splits and fixed_splits[0] > 0:
            return fixed_splits[0]
        keys = block_n // heads
        return choose_decode_splits(walks=num_seqs * heads_kv // heads, max_tiles=-(-max_seqlen_kv // keys),
                                    programs=programs,
                                    mean_tiles=None if mean_seqlen_kv is None else -(-mean_seqlen_kv // keys))

    one_head_splits = splits_for(1)
    heads_per_item = kv_heads_per_item(heads_kv, group_size * max(1, max_seqlen_q), block_n, page_size,
                                       gathered=gather is not None, num_seqs=num_seqs, programs=programs,
                                       one_head_splits=one_head_splits)
    # the rule's items keep one split (the one-head walks take one); DECODE_HOPPER_HEADS_ENV's are split as their
    # tiles count
    num_splits = splits_for(heads_per_item) if getenv(DECODE_HOPPER_HEADS_ENV, "") else one_head_splits
    group_size, heads_kv = group_size * heads_per_item, heads_kv // heads_per_item
    rows = decode_tile_rows(group_size * max(1, max_seqlen_q))
    keys = block_n // heads_per_item  # a KV head's keys in a tile
    walks = num_seqs * heads_kv
    items = walks * num_splits
    partial_shape = combine = None
    merge_rows = 0
    if num_splits > 1:
        partial_shape = (num_splits, total_q, heads_q, head_dim)
        fused_merge = num_splits <= FUSED_MERGE_MAX_SPLITS and items <= programs and rows <= 32
        if fused_merge and switch(DECODE_HOPPER_MERGE_ENV, True):
            merge_rows = min(rows, 4 * max(1, FUSED_MERGE_MAX_SPLITS // next_power_of_2(num_splits)))
        else:
            combine = combine_launch(
                partial_shape, (total_q * heads_q * head_dim, heads_q * head_dim, head_dim),
                (total_q * heads_q, heads_q), out.stride()[:3], num_seqs=num_seqs, has_q_start=has_q_start,
                has_sink=False, max_seqlen_q=max_seqlen_q)
    launched = whole_round_programs(items, programs) if switch(DECODE_HOPPER_ROUNDS_ENV, True) else min(
        programs, items)
    from .hopper_forward import RowsDescriptor, _rows_matrix  # (hopper_forward imports this module)
    from .tma_promotion import DECODE_PROMOTION_ENV, promoted

    return DecodeHopperPlan(
        kv_descriptors=() if gather else (promoted(RowsDescriptor.of(k, keys, page_size), DECODE_PROMOTION_ENV),
                                          promoted(RowsDescriptor.of(v, keys, page_size), DECODE_PROMOTION_ENV)),
        kv_row_strides=(_rows_matrix(k)[0].stride(0), _rows_matrix(v)[0].stride(0)) if gather else (0, 0),
        programs=launched, num_splits=num_splits, group_size=group_size, heads_kv=heads_kv,
        num_seqs=num_seqs, batch_rows=batch_rows, q_token_stride=q.stride(-3), out_token_stride=out.stride(-3),
        softmax_scale_log2=scale_log2(softmax_scale), page_size=page_size, causal=causal,
        bottom_right=bool(bottom_right), has_q_start=has_q_start, has_kv_start=has_kv_start,
        tile=(block_n, stages, programs_per_sm, maxnreg), rows=rows, partial_shape=partial_shape, combine=combine,
        merge_rows=merge_rows, total_q=total_q, head_dim=head_dim, gather_warps=gather[2] if gather else 0,
        kv_heads_per_item=heads_per_item)


def kv_heads_per_item(heads_kv: int, rows: int, block_n: int, page_size: int, *, gathered: bool, num_seqs: int,
                      programs: int, one_head_splits: int) -> int:
    """KV heads a decode item takes (HEADS), for a call of ``num_seqs`` sequences of ``heads_kv`` KV heads of
    ``rows`` packed rows each, on ``programs`` programs, whose items of one head would take ``one_head_splits``
    splits: DECODE_HOPPER_HEADS_ENV's count where set; else the most heads that fill SMALL_DECODE_ROWS rows when
    the walks are not split and those items still fill WHOLE_ROUNDS_MIN_FRACTION of the programs; 1 where a tile of
    that many heads cannot be loaded or packed (``gathered``: pages gathered by cp.async, one head).

    H200, 2026-12-03, graph replays, cuDNN on contiguous K/V in the same process, GQA 32/8 d128 at 16-token pages
    (docs/results/2026-12-03-h200-heads/): bench_decode in alternating processes (out4/), the rule against one head
    an item, 64x4k 244.8-245.5 us against 245.7-245.9 (cuDNN 244.9-245.4), 128x2k 247.5-247.6 against 247.9-248.3,
    MHA 32/32 64x4k (four heads) 957.8-959.8 against 960.8-962.4, 32x32k on page runs 942.5-943.3 against
    947.6-949.5, 32x2k 67.7-68.4 against 68.1, 32x32k and FIFO pages unchanged; tile_sweep.py (out1/) read 64x4k
    0.5-0.7 % faster. Split walks lost (1x8k 18.9 against 17.9 us, 8x4k 40.2 against 39.7: twice the splits), as
    did 4 heads of GQA (16 rows: 64x4k 248.2 against 246.7) and two over 1-token pages gathered by cp.async (64x4k
    250.0-251.5 against 250.2-250.7 in out4/; not kept: one head there).

    Example:
        >>> kv_heads_per_item(8, 4, 64, 16, gathered=False, num_seqs=64, programs=132, one_head_splits=1)  # 64x4k
        2
        >>> kv_heads_per_item(32, 1, 64, 16, gathered=False, num_seqs=64, programs=132, one_head_splits=1)  # MHA
        4
        >>> kv_heads_per_item(8, 4, 64, 16, gathered=False, num_seqs=1, programs=132, one_head_splits=16)  # 1x8k
        1
    """
    def fits(heads: int) -> bool:
        keys = block_n // heads
        return (not gathered and heads_kv % heads == 0 and block_n % heads == 0 and keys >= 16
                and rows * heads <= MAX_DECODE_ROWS
                and (page_size == 0 or page_size % keys == 0 or (keys % page_size == 0 and page_size >= 16)))

    heads = _heads_override()
    if heads is not None:
        return heads if heads > 1 and fits(heads) else 1
    if one_head_splits > 1:
        return 1
    for heads in (8, 4, 2):
        if (rows * heads <= SMALL_DECODE_ROWS and fits(heads)
                and num_seqs * heads_kv // heads >= WHOLE_ROUNDS_MIN_FRACTION * programs):
            return heads
    return 1


def _heads_override() -> int | None:
    """DECODE_HOPPER_HEADS_ENV's count, None where unset."""
    value = getenv(DECODE_HOPPER_HEADS_ENV, "")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{DECODE_HOPPER_HEADS_ENV} must be an integer, got {value!r}") from None


def _gathered(page_size: int) -> bool:
    """Whether the decode kernel gathers pages of ``page_size`` tokens (GATHER_PAGE_SIZES, or
    DECODE_HOPPER_GATHER_PAGES_ENV's)."""
    return page_size in GATHER_PAGE_SIZES or bool(page_size) and page_size in _extra_gather_pages()


def _extra_gather_pages() -> tuple[int, ...]:
    """DECODE_HOPPER_GATHER_PAGES_ENV's page sizes (comma-separated positive integers)."""
    value = getenv(DECODE_HOPPER_GATHER_PAGES_ENV, "")
    if not value:
        return ()
    sizes = value.split(",")
    if not all(size.strip().isascii() and size.strip().isdigit() and int(size) > 0 for size in sizes):
        raise ValueError(f"{DECODE_HOPPER_GATHER_PAGES_ENV} must be comma-separated page sizes (positive integers), "
                         f"got {value!r}")
    return tuple(int(size) for size in sizes)


def check_environment() -> None:
    """Read every variable of the decode kernel's plans that is set: a bad value is a ValueError naming it, on any
    device (the plans read them on sm90 GPUs only)."""
    for name in (DECODE_HOPPER_ENV, DECODE_HOPPER_MERGE_ENV, DECODE_HOPPER_ROUNDS_ENV):
        switch(name, True)
    _tile()
    _gather_tile()
    _heads_override()
    _extra_gather_pages()


def _tile() -> tuple[int, ...]:
    override = getenv(DECODE_HOPPER_TILE_ENV, "")
    return _tile_override(DECODE_HOPPER_TILE_ENV, override, (4, 5)) if override else DECODE_HOPPER_TILE


def _tile_override(name: str, value: str, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """An A/B tile from environment variable ``name``: ``lengths`` integers, BLOCK_N (64 or 128: wgmma's M is a
    multiple of 64, and 256-key rings do not fit shared memory) first."""
    try:
        tile = tuple(int(x) for x in value.split(","))
    except ValueError:
        tile = ()
    if len(tile) not in lengths:
        raise ValueError(f"{name} must be {' or '.join(map(str, lengths))} comma-separated integers, got {value!r}")
    if tile[0] not in (64, 128):
        raise ValueError(f"{name}: BLOCK_N (its first integer) must be 64 or 128, got {tile[0]}")
    return tile


def _gather_tile(rows: int = SMALL_DECODE_ROWS) -> tuple[int, int, int, int, int] | None:
    """The gather tile for decode tiles of ``rows`` rows (DECODE_HOPPER_GATHER_TILE, DECODE_HOPPER_GATHER_WIDE_TILE
    past GATHER_TWO_AN_SM_MAX_ROWS, or DECODE_HOPPER_GATHER_ENV's): None when switched off."""
    value = getenv(DECODE_HOPPER_GATHER_ENV, "1")
    if value == "0":
        return None
    if value in ("", "1"):
        return DECODE_HOPPER_GATHER_TILE if rows <= GATHER_TWO_AN_SM_MAX_ROWS else DECODE_HOPPER_GATHER_WIDE_TILE
    return _tile_override(DECODE_HOPPER_GATHER_ENV, value, (5,))
