"""Host side of the Gluon Hopper forward (attention_fwd_hopper.py): which calls it serves, and their launch.

attention_forward plans a call here first (``plan_hopper_forward``); a HopperPlan runs it, anything else
goes to the general kernel. ``ATTN_FUSED_HOPPER=0`` turns the Hopper kernel off (A/B measurements).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attention.environment import getenv, switch

from .arguments import scale_log2
from .attention_decode_hopper import MAX_DECODE_ROWS
from .attention_fwd_hopper import HOPPER_ROWS_PER_GROUP, attention_fwd_hopper_kernel
from .availability import kernels_interpreted
from .configs import mixed_batch
from .hopper_decode import DecodeHopperPlan, plan_decode_hopper
from .hopper_mixed import MixedHopperPlan, plan_mixed_hopper
from .launch import KernelLaunch
from .tma_promotion import PREFILL_PROMOTION_ENV, promoted

__all__ = [
    "HOPPER_ENV", "HOPPER_GROUPS_ENV", "HOPPER_L2_SECTION_ENV", "HOPPER_PINGPONG_ENV", "HOPPER_SMALL_PAGES_ENV",
    "HOPPER_TILE", "HopperPlan", "THREE_GROUP_REGISTERS",
    "check_environment",
    "consumer_groups",
    "hopper_unsupported_reason",
    "plan_hopper_forward",
    "section_budget_mib",
    "section_heads",
]

HOPPER_ENV = "ATTN_FUSED_HOPPER"
"""``0`` sends every call to the general kernel; unset or ``1``: calls the Hopper kernel serves go to it."""

HOPPER_TILE = {64: (128, 2, 240, True, 3), 128: (128, 2, 240, False, 2), 256: (64, 2, 240, False, 2)}
"""Head dim -> (BLOCK_N, STAGES, consumer registers, ping-pong, consumer groups). 128 keys per tile and two stages:
Q (32 KiB) and the K and V rings (2 x 2 x 32 KiB at d128) fill most of sm90's shared memory, one program per SM;
each consumer warp group holds O, S and two P tiles in 240 registers. H200, 2026-11-30 (abtree harness, bf16 thd 16k
tokens, against this tile in the same process): three stages lost 1-7 % on every d128 / d64 cell (MHA full
4x4k 593.4 -> 578.8 TFLOP/s).

At d256, 64 keys a tile: Q 64 KiB and the rings 2 x 2 x 32 KiB (192 KiB), O alone 128 registers a thread; compiled
for sm90 (Triton 3.6) without spills, where 128-key tiles at one stage spill 1,140 B. H200, 2026-12-03 (env_ab, two
rounds, against the general kernel, where d256 ran before; docs/results/2026-12-03-h200-d904944/out/call9): MHA 16
full 4x4k 1,776.3 against 2,211.9 us, causal 987.7 against 1,231.0 (1.25x both).

Ping-pong (the two consumer groups take turns to issue their wgmmas, FlashAttention-3's schedule, on named barriers): on
at d64, off at d128 and d256 (not measured there). H200, 2026-12-03, graph replays, settled, alternated in one process,
3-4 rounds, mean µs, free issue -> ping-pong (docs/results/2026-12-03-h200-pingpong): d64 GQA 32/8 causal 1x16k 2,522 ->
2,419, 4x4k 727 -> 703, MHA causal 16x1k 299 -> 285, 4x4k 743 -> 723, full cells 0.3-1.3 % faster, a 2k chunk on 14k
over 16-token pages 609 -> 611; d128 within 1 % on four cells, 1.1-3.1 % slower on the 2k chunks on 14k and 30k over
16-token pages and GQA causal 1x16k (3,611 -> 3,724): there the warp schedulers already interleave the two groups (an
earlier ping-pong on an mbarrier pair lost 0-3 % at d128 too). Again with P converted by PTX
(hopper_softmax.packed_16bit; 2026-12-04, tree_ab, docs/results/2026-12-04-h200-10b3ebc/out/call9): 0.993-1.000 of the
time without either, 1.001-1.005 of P converted by PTX alone, on M2's prefill part, MHA full 4x4k and GQA causal 1x16k.
And with the prefill loop split at the first masked tile (2026-12-04, docs/results/2026-12-04-h200-b01f509/out/call3):
0.994-1.004 of the split loop alone on the same cells and M2.

Three consumer groups at d64 (a q tile of 192 queries, FlashAttention-3's d64 shape; their ping-pong a round robin),
at THREE_GROUP_REGISTERS. H200, 2026-12-04, tree_ab two passes of two rounds, bf16 thd, against the commit before
(two groups) (docs/results/2026-12-04-h200-aff6109/out/call4): MHA 32 full 4x4k 1,284.7 -> 1,244.0 us (0.968),
causal 719.5 -> 686.7 (0.954); two groups with the same mask code 0.995 / 0.991. (Before the mask code of
hopper_softmax._mask_tile, ptxas spilled ~30 loads a tile at 160 registers and three groups ran causal 2.7 % slower;
64-key tiles with three groups, spill-free then, 4-5 % slower.) d128's S and O do not fit 160 registers."""

HOPPER_GROUPS_ENV = "ATTN_FUSED_HOPPER_GROUPS"
"""``2`` / ``3``: consumer warp groups (64 query rows each, a q tile of 128 / 192 queries) at head dim 64 (A/B
measurements); unset: HOPPER_TILE's. Other head dims keep HOPPER_TILE's (three groups' registers do not hold d128's
S and O)."""

THREE_GROUP_REGISTERS = 160
"""Registers a worker consumer thread with three consumer groups. Triton pads the worker partitions (4 + 4 + 1 warps)
to whole warp groups, so the launch has 16 warps at maxnreg 128 (65,536 / 512 threads); setmaxnreg then gives the
worker consumers 160 each, the producer's warp group 24 and the default partition (the first consumer) the rest,
168 (Triton's AllocateWarpGroups)."""

HOPPER_PINGPONG_ENV = "ATTN_FUSED_HOPPER_PINGPONG"
"""``1`` / ``0``: the consumer groups' ping-pong on / off at every head dim (A/B measurements); unset: HOPPER_TILE's."""

HOPPER_SMALL_PAGES_ENV = "ATTN_FUSED_HOPPER_SMALL_PAGES"
"""``0``: a paged call whose pages hold fewer keys than a KV tile is not this kernel's (attention_forward may
copy its pages to a contiguous buffer first, the rule of page_gather.py); unset or ``1``: the kernel reads
such pages in place, one TMA load per page (A/B measurements). H200, 2026-12-01 (abtree/pages_ab.py, GQA 32/8
d128 bf16 causal, settled, 300 ms windows; docs/results/2026-12-01-h200-5956217/pages-ab.txt), in place against
copied first: a 2k chunk on a 6k / 14k / 30k prefix at page 16 1.011x / 1.008x / 0.989x, page 32 1.049x /
1.026x / 1.015x; page 64 (which the copy rule leaves to the general kernel) 1.26-1.30x; 8 chunks of 2k on 62k
prefixes (a copy past GATHER_MAX_BYTES: the general kernel over the pages) 1.26-1.33x. Nothing is copied."""

HOPPER_L2_SECTION_MIB = 8
"""K and V bytes (MiB) of the KV heads in one section of the program order under a causal mask
(attention_fwd_hopper._program_tile): the longest walks start first among the section's heads, whose K/V the
programs in flight share in L2. Without a mask every walk is as long, and a section is one KV head (the order
before). H200, 2026-12-03 (env_ab, graph replays, settled, three rounds; docs/results/2026-12-03-h200-early-rows),
against one KV head a section: 8 MiB took M1's prefill part (one 2k causal sequence, GQA 32/8) from 89.4 to 82.3 µs
and MHA causal 4x4k from 1,142.8 to 1,114.5, the other causal cells within 0.7 %; 32 MiB lost up to 1.2 % on the 16k
causal cells, and sections without a mask 2-7 % (MHA full 4x4k 1,875 µs one KV head a section, 1,915 at 8 MiB,
1,996-2,008 at 32). A q tile's heads side by side over every head re-read K/V from DRAM (2026-12-01: MHA full
4x4k 536 TFLOP/s against 593 one KV head a section)."""

HOPPER_L2_SECTION_ENV = "ATTN_FUSED_HOPPER_L2_SECTION"
"""MiB of K/V a section of the program order holds under a causal mask (A/B measurements); ``0``: one KV head a
section; unset: HOPPER_L2_SECTION_MIB."""

HOPPER_MIN_PAGE_SIZE = 16
"""Smallest page read in place: a KV tile of 128 keys takes 8 TMA loads of 16 rows each. Smaller pages (1, 2,
4, 8 tokens) would take 16-128 loads a tile, and a slice of the 128-byte swizzled tile must start at a
multiple of 8 rows."""

HOPPER_MIN_QUERIES_PER_SEQUENCE = 64
"""The kernel gives each sequence whole 128-row q tiles of one query head: a batch that averages fewer
queries per sequence (decode) is the general kernel's (GQA packing, split-KV). A batch whose longest sequence has
many times the average queries (configs.mixed_batch) is not this kernel's either: its grid would give every
sequence the longest one's q tiles, and a decode a 128-row tile per query head; the mixed kernel
(hopper_mixed.py) takes such batches, the general kernel those it cannot run. H200, 2026-12-01, graph
replays, settled, this kernel against the general one (abtree/hopper_mixed_ab.py, docs/results/2026-12-01-h200-5956217/
hopper-mixed-ab.txt): a 2k chunk on 14k + 30 decodes at 4k 1343.6 / 1233.6 µs at page 16, 1271.9 / 1061.3
non-paged; a 4k prefill + 60 decodes at 2k 889.8 / 506.3; a thd prefill of 8k + 63 x 128 tokens 1406.9 / 1238.0."""


MAX_GRID_Z = 65535
"""CUDA's limit on a grid's third dimension (the prefill kernel's sequences)."""


def _rows_matrix(x: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """A [B, S, H, D] strided view (or thd [T, H, D]) as (2-D view [token rows, H * D], rows per batch step),
    or None when its tokens are not rows of one matrix with heads packed (sbhd) or TMA cannot read it."""
    thd = x.dim() == 3
    if thd:
        x = x.unsqueeze(0)
    batch_stride, token_stride, head_stride, dim_stride = x.stride()
    batch_stride = 0 if thd else batch_stride  # one batch entry: as the launcher's expanded thd views
    batches, tokens, heads, head_dim = x.shape
    if dim_stride != 1 or head_stride != head_dim or token_stride < heads * head_dim:
        return None
    if batch_stride % token_stride or (token_stride * x.element_size()) % 16 or x.data_ptr() % 16:
        return None
    batch_rows = batch_stride // token_stride
    rows = (batches - 1) * batch_rows + tokens
    if rows >= 2**31:  # TMA coordinates and the kernel's row arithmetic are 32-bit
        return None
    return torch.as_strided(x, (rows, heads * head_dim), (token_stride, 1)), batch_rows


@dataclass(frozen=True)
class RowsDescriptor:
    """Makes TMA descriptors over tensors of one geometry (a plan's key fixes it): the 2-D row view of
    ``_rows_matrix`` with blocks of [block rows, head dim], or of one page over pages smaller than that (a TMA load a
    page). Checks and layout are worked out once per plan. A plan's KernelLaunch calls it for the first launch at each
    tensor address and keeps the encoded descriptor (attention.kernels.launch): 6 us a descriptor on this project's
    CPU, paid every launch before."""

    rows: int
    width: int
    token_stride: int
    block: tuple[int, int]
    float16: bool

    @staticmethod
    def of(x: torch.Tensor, block_rows: int, page_size: int = 0) -> RowsDescriptor:
        """The geometry of ``x`` (which ``_rows_matrix`` accepts), blocks of ``block_rows`` (one page's rows with
        pages smaller than that)."""
        matrix, _ = _rows_matrix(x)
        block = (min(block_rows, page_size) if page_size else block_rows, x.shape[-1])
        return RowsDescriptor(matrix.shape[0], matrix.shape[1], matrix.stride(0), block, x.dtype == torch.float16)

    def __call__(self, x: torch.Tensor) -> Any:
        """The descriptor over ``x``, a tensor of the planned geometry."""
        view = torch.as_strided(x, (self.rows, self.width), (self.token_stride, 1))
        return TensorDescriptor(view, view.shape, view.stride(), list(self.block),
                                _shared_layout(self.block, self.float16))


@functools.cache
def _shared_layout(block: tuple[int, int], float16: bool) -> Any:
    """The swizzled shared-memory layout of a [rows, head dim] TMA block, made once (Triton builds it in ~15 us
    on this project's CPU; a decode call needs two, a mixed batch five)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float16 if float16 else gl.bfloat16)


def hopper_unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *,
                              page_size: int, window: tuple[int, int], alibi: bool, sink: bool,
                              gathered_pages: bool = False) -> str | None:
    """None when attention_fwd_hopper_kernel can run this call, else why not. ``page_size``: 0 for a
    non-paged call; ``window``: normalized (left, right), -1 unbounded (a causal mask is right == 0);
    ``gathered_pages``: pages of fewer than HOPPER_MIN_PAGE_SIZE tokens pass too (the decode kernel gathers them;
    its own rule, hopper_decode.decode_hopper_unsupported_reason, decides)."""
    if not _on_sm90(q):
        return "needs an sm90 GPU (Hopper), not the interpreter"
    if not switch(HOPPER_ENV, True):
        return f"{HOPPER_ENV}=0"
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype == out.dtype:
        return "needs fp16 or bf16 q, k, v and out of one dtype"
    head_dim = q.shape[-1]
    if head_dim not in HOPPER_TILE or k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        return f"needs head dims in {sorted(HOPPER_TILE)}, equal for q/k and v"
    if window[0] >= 0 or window[1] > 0 or alibi or sink:
        return "needs no sliding window, ALiBi or sinks"
    matrices = [_rows_matrix(x) for x in (q, k, v, out)]
    if any(matrix is None for matrix in matrices):
        return "needs tokens as rows of a 2-D matrix with heads packed along it, 16-byte aligned (not sbhd)"
    block_n = HOPPER_TILE[head_dim][0]
    if page_size and any(matrix[1] != page_size for matrix in matrices[1:3]):
        return "needs the cache's pages stored one after another"
    return _page_size_reason(page_size, block_n, 1 if gathered_pages else HOPPER_MIN_PAGE_SIZE) if page_size else None


def _on_sm90(q: torch.Tensor) -> bool:
    """q is on an sm90 GPU and the kernels would compile for it (not the interpreter)."""
    return not kernels_interpreted() and q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0)


def _page_size_reason(page_size: int, block_n: int, min_page_size: int = HOPPER_MIN_PAGE_SIZE) -> str | None:
    """None when the kernel reads pages of ``page_size`` tokens in place with ``block_n``-key tiles: whole tiles
    per page, or (unless switched off) whole pages of at least ``min_page_size`` tokens per tile."""
    if page_size % block_n == 0:
        return None
    if not switch(HOPPER_SMALL_PAGES_ENV, True):
        return f"{HOPPER_SMALL_PAGES_ENV}=0 and pages of fewer than {block_n} tokens"
    if block_n % page_size or page_size < min_page_size:
        return (f"needs pages of a multiple of {block_n} tokens, or of {min_page_size} to {block_n // 2} "
                f"tokens dividing {block_n}")
    return None


@dataclass(frozen=True)
class HopperPlan:
    """One call's launch of attention_fwd_hopper_kernel, all but the tensors' addresses."""

    grid: tuple[int, int, int]
    group_size: int
    batch_rows: tuple[int, int, int, int]
    """q, k, v, out: rows from one batch entry to the next (0 for thd)."""
    out_token_stride: int
    """Elements from one output row (token) to the next, read when planned: a call may pass ``out`` with its
    heads flattened (DotProductAttention's layout, through packed_attention_forward)."""
    softmax_scale_log2: float
    page_size: int
    causal: bool
    bottom_right: bool
    has_q_start: bool
    has_kv_start: bool
    section_heads: int
    """Query heads a section of the program order (section_heads)."""
    groups: int
    """Consumer warp groups of 64 query rows a program (consumer_groups)."""
    descriptors: tuple[RowsDescriptor, RowsDescriptor, RowsDescriptor]
    """Q's, K's and V's TMA descriptor makers."""
    total_q: int
    """out's rows (thd): a zero_tail launch zeros those past the last sequence."""
    launches: dict = field(default_factory=dict, compare=False, repr=False)
    """The kernel's KernelLaunch per (zero_tail, page table row stride), both fixed by attention_forward's key and
    known at the first call: later calls skip Triton's argument binding (attention.kernels.launch)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, q_start: torch.Tensor | None,
                 kv_start: torch.Tensor | None, page_table: torch.Tensor | None, zero_tail: bool = False) -> None:
        """Launch on these tensors: q, k, v as planned (4-D views or 3-D thd), ``out`` as planned or with
        its heads flattened (only its address is read). ``zero_tail`` (thd): out's rows past the last sequence
        are written as zeros, by one more sequence's programs in the grid."""
        table_stride = 0 if page_table is None else page_table.stride(0)
        launch = self.launches.get((zero_tail, table_stride))
        if launch is None:
            launch = self.launches[zero_tail, table_stride] = self._kernel_launch(q.shape[-1], table_stride, zero_tail)
        launch(q, k, v, out, cu_seqlens_q, cu_seqlens_kv,
               cu_seqlens_q if q_start is None else q_start, cu_seqlens_kv if kv_start is None else kv_start,
               cu_seqlens_q if page_table is None else page_table)

    def _kernel_launch(self, head_dim: int, table_stride: int, zero_tail: bool) -> KernelLaunch:
        """attention_fwd_hopper_kernel's launch, all but its 9 tensor arguments fixed."""
        block_n, stages, consumer_registers, pingpong, _ = HOPPER_TILE[head_dim]
        if self.groups == 3:
            consumer_registers = min(consumer_registers, THREE_GROUP_REGISTERS)
        q_tiles, heads_kv, sequences = self.grid
        return KernelLaunch(
            attention_fwd_hopper_kernel, (q_tiles, heads_kv, sequences + 1) if zero_tail else self.grid,
            scalars=(*self.batch_rows, self.out_token_stride, table_stride, self.softmax_scale_log2,
                     self.section_heads, self.total_q if zero_tail else 0),
            constexprs={"GROUP_SIZE": self.group_size, "BLOCK_N": block_n, "STAGES": stages,
                        "PAGE_SIZE": self.page_size, "CAUSAL": self.causal, "BOTTOM_RIGHT": self.bottom_right,
                        "HAS_Q_START": self.has_q_start, "HAS_KV_START": self.has_kv_start,
                        "CONSUMER_REGISTERS": consumer_registers,
                        "PINGPONG": switch(HOPPER_PINGPONG_ENV, pingpong),
                        "GROUPS": self.groups, "ZERO_TAIL": zero_tail},
            # the launch's registers a thread, before setmaxnreg splits them: 12 or 16 warps' share of 65,536
            options={"num_warps": 4, "maxnreg": 168 if self.groups == 2 else 128}, descriptors=self.descriptors)


def consumer_groups(head_dim: int) -> int:
    """Consumer warp groups (64 query rows each) of the prefill kernel at ``head_dim``: HOPPER_TILE's, or at head dim
    64 HOPPER_GROUPS_ENV's.

        >>> consumer_groups(128)
        2
    """
    groups = HOPPER_TILE[head_dim][4]
    value = getenv(HOPPER_GROUPS_ENV, "") if head_dim == 64 else ""
    if value:
        if value not in ("2", "3"):
            raise ValueError(f"{HOPPER_GROUPS_ENV} must be 2 or 3 (consumer warp groups at head dim 64), got {value!r}")
        groups = int(value)
    return groups


def check_environment() -> None:
    """Read every variable of the prefill kernel's plans that is set: a bad value is a ValueError naming it, on any
    device (the plans read them on sm90 GPUs only)."""
    for name in (HOPPER_ENV, HOPPER_SMALL_PAGES_ENV, HOPPER_PINGPONG_ENV):
        switch(name, True)
    consumer_groups(64)   # (head dim 64: the one that reads HOPPER_GROUPS_ENV)
    section_budget_mib(HOPPER_L2_SECTION_ENV, HOPPER_L2_SECTION_MIB)


def section_budget_mib(env: str, default_mib: int) -> int:
    """An L2 section's MiB (section_heads' budget): the variable ``env`` where set, else ``default_mib``; a value
    that is not a whole number (0, 1, 2, ...) is refused naming the variable."""
    value = getenv(env, "") or str(default_mib)   # unset or empty: the default
    if not (value.isascii() and value.isdigit()):   # ("²".isdigit() holds)
        raise ValueError(f"{env} must be a whole number of MiB (0, 1, 2, ...), got {value!r}")
    return int(value)


def section_heads(heads_q: int, heads_kv: int, max_seqlen_kv: int, kv_bytes_per_token: int, causal: bool,
                  budget_mib: int | None = None) -> int:
    """Query heads a section of the prefill kernel's program order. Under a causal mask: the KV heads whose K and V
    (``max_seqlen_kv`` tokens of ``kv_bytes_per_token`` bytes a KV head) fit ``budget_mib`` MiB (None:
    HOPPER_L2_SECTION_MIB or HOPPER_L2_SECTION_ENV's), at least one, at most all, with their query heads. Without one
    every walk is as long: one KV head's.

    Example (GQA 32/8, d 128, bf16: 512 bytes a token a KV head):
        >>> section_heads(32, 8, 2048, 512, True), section_heads(32, 8, 16384, 512, True)
        (32, 4)
        >>> section_heads(32, 8, 2048, 512, False), section_heads(32, 8, 16384, 512, True, budget_mib=16)
        (4, 8)
    """
    kv_heads = 1
    if causal:
        if budget_mib is None:
            budget_mib = section_budget_mib(HOPPER_L2_SECTION_ENV, HOPPER_L2_SECTION_MIB)
        kv_heads = min(heads_kv, max(1, (budget_mib << 20) // max(1, max_seqlen_kv * kv_bytes_per_token)))
    return kv_heads * (heads_q // heads_kv)


def plan_hopper_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *, num_seqs: int,
                        max_seqlen_q: int, max_seqlen_kv: int, total_q: int, softmax_scale: float,
                        num_splits: int | None = None,
                        window: tuple[int, int], bottom_right: bool, page_size: int, alibi: bool, sink: bool,
                        has_q_start: bool, has_kv_start: bool, num_sms: int,
                        mean_seqlen_kv: int | None = None) -> HopperPlan | MixedHopperPlan | DecodeHopperPlan | None:
    """A HopperPlan when the kernel serves this call and suits it (enough query rows per sequence to fill
    128-row tiles, enough of them to fill the GPU); for a mixed batch (configs.mixed_batch) a MixedHopperPlan when
    the mixed kernel serves it (hopper_mixed.py); for a decode-sized call (at most 64 packed rows a sequence) a
    DecodeHopperPlan when the decode kernel serves it (hopper_decode.py; ``num_splits``: its split count, None to
    choose; ``mean_seqlen_kv``: the sequences' mean KV length, when known, for its split rule and the mixed kernel's
    tile rule); else None.
    Tensors as attention_forward's (4-D views; k / v paged caches [pages, page_size, H_kv, D] when page_size > 0)."""
    heads_q, heads_kv = q.shape[2], k.shape[2]
    mixed = mixed_batch(num_seqs, total_q, max_seqlen_q)
    decode_sized = not mixed and max(1, max_seqlen_q) * (heads_q // heads_kv) <= MAX_DECODE_ROWS
    if hopper_unsupported_reason(q, k, v, out, page_size=page_size, window=window, alibi=alibi, sink=sink,
                                 gathered_pages=decode_sized):
        return None
    batch_rows = tuple(_rows_matrix(x)[1] for x in (q, k, v, out))
    if mixed:  # this grid: mostly empty programs, decodes in 128-row tiles
        return plan_mixed_hopper(q, k, v, heads_kv, batch_rows, num_seqs=num_seqs, out_token_stride=out.stride(-3),
                                 softmax_scale=softmax_scale, causal=window[1] == 0, bottom_right=bottom_right,
                                 page_size=page_size, has_q_start=has_q_start, has_kv_start=has_kv_start,
                                 num_sms=num_sms, total_q=total_q, max_seqlen_q=max_seqlen_q,
                                 max_seqlen_kv=max_seqlen_kv, mean_seqlen_kv=mean_seqlen_kv)
    if decode_sized:
        return plan_decode_hopper(q, k, v, out, heads_kv, batch_rows, num_seqs=num_seqs, max_seqlen_q=max_seqlen_q,
                                  max_seqlen_kv=max_seqlen_kv, total_q=total_q, softmax_scale=softmax_scale,
                                  causal=window[1] == 0, bottom_right=bottom_right, page_size=page_size,
                                  has_q_start=has_q_start, has_kv_start=has_kv_start, num_sms=num_sms,
                                  num_splits=num_splits, mean_seqlen_kv=mean_seqlen_kv)
    groups = consumer_groups(q.shape[-1])
    block_m = groups * HOPPER_ROWS_PER_GROUP
    if total_q < HOPPER_MIN_QUERIES_PER_SEQUENCE * num_seqs or -(-total_q // block_m) * heads_q < num_sms:
        return None  # decode-like, or too few programs without split-KV
    if num_seqs + 1 > MAX_GRID_Z:  # the grid's third dim: a sequence each, and one for a zero_tail launch's tail
        return None
    group_size = heads_q // heads_kv
    block_n = HOPPER_TILE[q.shape[-1]][0]
    causal = window[1] == 0
    return HopperPlan(
        descriptors=(RowsDescriptor.of(q, HOPPER_ROWS_PER_GROUP),
                     promoted(RowsDescriptor.of(k, block_n, page_size), PREFILL_PROMOTION_ENV),
                     promoted(RowsDescriptor.of(v, block_n, page_size), PREFILL_PROMOTION_ENV)),
        grid=(-(-max_seqlen_q // block_m) * group_size, heads_kv, num_seqs), group_size=group_size, groups=groups,
        batch_rows=batch_rows, out_token_stride=out.stride(-3),
        softmax_scale_log2=scale_log2(softmax_scale), page_size=page_size, causal=causal,
        bottom_right=bool(bottom_right), has_q_start=has_q_start, has_kv_start=has_kv_start, total_q=total_q,
        section_heads=section_heads(heads_q, heads_kv, max_seqlen_kv, (k.shape[-1] + v.shape[-1]) * k.element_size(),
                                    causal))
