"""attention_forward: the host launcher of the fused Triton attention forward kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention.devices import current_device_index
from attention.environment import getenv, token_reader

from . import hopper_decode, hopper_forward, hopper_mixed, hopper_mixed_roles, tma_promotion
from .arguments import kernel_layout, normalize_window, scale_log2, validate_forward_arguments
from .attention_fwd_kernel import attention_fwd_kernel
from .availability import kernels_interpreted
from .combine import combine_launch, split_counter_buffer
from .configs import (
    MAX_NUM_SPLITS,
    VARIANTS_ENV,
    ForwardConfig,
    choose_num_splits,
    mixed_batch,
    num_streaming_multiprocessors,
    parse_variants,
    q_tile_count,
    select_forward_config,
)
from .hopper_decode import (
    DECODE_HOPPER_ENV,
    DECODE_HOPPER_GATHER_ENV,
    DECODE_HOPPER_GATHER_PAGES_ENV,
    DECODE_HOPPER_HEADS_ENV,
    DECODE_HOPPER_MERGE_ENV,
    DECODE_HOPPER_ROUNDS_ENV,
    DECODE_HOPPER_TILE_ENV,
    DecodeHopperPlan,
)
from .hopper_forward import (
    HOPPER_ENV,
    HOPPER_GROUPS_ENV,
    HOPPER_L2_SECTION_ENV,
    HOPPER_PINGPONG_ENV,
    HOPPER_SMALL_PAGES_ENV,
    HopperPlan,
    plan_hopper_forward,
)
from .hopper_mixed import (
    MIXED_HOPPER_DEVICE_RULE_ENV,
    MIXED_HOPPER_ENV,
    MIXED_HOPPER_L2_DEALT_ENV,
    MIXED_HOPPER_L2_SECTION_ENV,
    MIXED_HOPPER_QUEUE_ENV,
    MIXED_HOPPER_TILE_ENV,
    MixedHopperPlan,
)
from .hopper_mixed_roles import MIXED_ROLES_ENV, MIXED_ROLES_SPLITS_ENV, MixedRolesPlan
from .launch import KernelLaunch, tensor_key
from .page_gather import gather_pages, gathered_page_count
from .tma_promotion import DECODE_PROMOTION_ENV, PREFILL_PROMOTION_ENV

__all__ = ["attention_forward", "check_plan_environment", "kv_length_bucket", "kv_length_buckets", "launch_plan",
           "mean_kv_length", "packed_attention_forward", "PLAN_ENVIRONMENT", "plan_environment"]

_MAX_PLANS = 512
"""Launch plans kept (all dropped when full: a decode makes a new one per kv_length_bucket)."""
_NO_PLAN = object()
_SAME_AS_CU_SEQLENS = "cu_seqlens"
PLAN_ENVIRONMENT = (VARIANTS_ENV, HOPPER_ENV, HOPPER_GROUPS_ENV, HOPPER_PINGPONG_ENV, HOPPER_SMALL_PAGES_ENV,
                    HOPPER_L2_SECTION_ENV, MIXED_HOPPER_ENV, MIXED_HOPPER_TILE_ENV, MIXED_HOPPER_QUEUE_ENV,
                    MIXED_HOPPER_DEVICE_RULE_ENV, MIXED_HOPPER_L2_SECTION_ENV, MIXED_HOPPER_L2_DEALT_ENV,
                    MIXED_ROLES_ENV, MIXED_ROLES_SPLITS_ENV,
                    DECODE_HOPPER_ENV, DECODE_HOPPER_TILE_ENV, DECODE_HOPPER_HEADS_ENV, DECODE_HOPPER_MERGE_ENV,
                    DECODE_HOPPER_ROUNDS_ENV, DECODE_HOPPER_GATHER_ENV, DECODE_HOPPER_GATHER_PAGES_ENV,
                    PREFILL_PROMOTION_ENV, DECODE_PROMOTION_ENV, "TRITON_INTERPRET")
"""Every variable a launch plan depends on (every ``ATTN_FUSED_*`` the kernels read while planning, the
interpreter): tests/test_kernels.py checks that none is missing."""
plan_environment = token_reader(*PLAN_ENVIRONMENT)
"""PLAN_ENVIRONMENT's values, as key tokens."""


_checked_environment: tuple | None = None
"""plan_environment()'s tokens when check_plan_environment last passed."""


def check_plan_environment() -> None:
    """Read every PLAN_ENVIRONMENT variable that is set, whatever the device: a bad value is a ValueError naming it
    (the sm90 kernels' plans read theirs on sm90 GPUs only, so a typo would otherwise pass a CPU or sm80 run).
    Values that passed are not read again (~6 µs) until one changes."""
    global _checked_environment
    tokens = plan_environment()
    if tokens == _checked_environment:
        return
    for module in (hopper_forward, hopper_mixed, hopper_mixed_roles, hopper_decode, tma_promotion):
        module.check_environment()
    parse_variants(getenv(VARIANTS_ENV, ""))
    _checked_environment = tokens


@dataclass(frozen=True, eq=False)
class ForwardPlan:
    """What attention_forward launches for one key of its arguments (tensor metadata and host values).

    attention: the kernel launch, all but its 14 tensor arguments fixed; combine: the split merge, or
    None; partial_out_shape: the fp32 split workspace [splits, total_q, H_q, D_v] (None without
    split-KV; the LSEs are its first three dims); split_counters: the fused merge's arrival counters.
    """

    attention: KernelLaunch
    combine: KernelLaunch | None
    partial_out_shape: tuple[int, int, int, int] | None
    split_counters: int


@dataclass(frozen=True)
class GatherPlan:
    """Run the call over a contiguous copy of its pages (attention/kernels/page_gather.py): the first
    ``num_pages`` logical pages of each sequence, then attention_forward without a page table (the
    tables' configuration for a non-paged cache)."""

    num_pages: int


Plan = ForwardPlan | GatherPlan | HopperPlan | MixedHopperPlan | DecodeHopperPlan
"""What a key of attention_forward's arguments plans: the general kernel's launches, a page copy first, or one of
the Gluon sm90 kernels (prefill, mixed batch, decode)."""

_plans: dict[tuple, Plan | None] = {}
def _offsets_fit_int32(x: torch.Tensor) -> bool:
    """Does every element offset of `x` (from its first element) fit in int32?"""
    return sum((size - 1) * abs(stride) for size, stride in zip(x.shape, x.stride()) if size > 0) < 2**31


def _tma_ready(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Tensor descriptors need 16-byte aligned bases and 16-byte multiples for every non-unit stride;
    on a GPU the device-side descriptors also need Triton's scratch allocator (set here if unset)."""
    for x in (k, v):
        if x.data_ptr() % 16 or any(stride * x.element_size() % 16 for stride in x.stride()[:-1]):
            return False
    if k.is_cuda:
        import triton
        from triton.runtime._allocation import NullAllocator, _allocator

        if isinstance(_allocator.get(), NullAllocator):
            triton.set_allocator(_descriptor_scratch)
    return True


def _descriptor_scratch(size: int, alignment: int, stream: object) -> torch.Tensor:
    """Triton's scratch for device-side descriptors, on the device the kernel launches on (the current one: the
    launches make the tensors' device current). It held the first call's K, and took every later call's scratch
    on that K's device."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    q_start: torch.Tensor | None = None,
    kv_start: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    total_q: int | None = None,
    softmax_scale: float,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    bottom_right: bool = False,
    alibi_slopes: torch.Tensor | None = None,
    softmax_offset: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: ForwardConfig | None = None,
    zero_tail: bool = False,
    total_kv: int | None = None,
) -> torch.Tensor:
    """Varlen / paged / GQA attention forward for prefill, decode and mixed batches in one launch.

    Layout convention (4-D strided views, last dim contiguous):
      q:   [B, S_q, H_q, D_qk]   bshd: q; sbhd: q.transpose(0, 1); thd: q.unsqueeze(0).expand(B, ...)
      k/v: dense [B, S_kv, H_kv, D_qk / D_v] (same convention), or with `page_table` the paged
           cache [num_pages, page_size, H_kv, D_qk / D_v].
      out: like q with D_v; only rows of real query tokens are written.
    Sequence b has cu_seqlens_q[b+1] - cu_seqlens_q[b] queries starting at token q_start[b] of its
    row (kv likewise with kv_start, or logical page p at cache page page_table[b, p]). Query i sees
    key j iff i + off - left <= j <= i + off + right (unbounded sides skipped), off = len_kv - len_q
    when bottom_right else 0; a row that sees no key gets zeros. ALiBi adds -slope * |i + off - j|
    after scaling; softmax_offset adds exp(offset_h) to the denominator (attention sinks).

    ``total_kv``: the sequences' KV lengths summed, when the host knows them (a serving step does). The decode
    kernel then sizes its split-KV on their mean instead of taking every sequence to be the longest (which keeps
    splits short, in case the batch is ragged). A hint: a wrong value costs speed, never correctness.

    Host ints (max_seqlen_q, max_seqlen_kv, total_q, total_kv) only size the grid and pick configurations:
    no device value is read on the host, so the call can be captured in a CUDA graph and replayed
    with new cu_seqlens / page_table contents (within the same bounds). They are bounds: every
    sequence has at most max_seqlen_q queries and max_seqlen_kv keys, all together at most total_q
    queries. When num_seqs x ceil(max_seqlen_q / q tile) programs are no more than the token-indexed
    grid needs (decode; sequences of equal length), program ids name (sequence, q tile) directly.

    A prefill call over pages of fewer than 64 tokens whose sequences bring thousands of query rows each,
    and which the Gluon kernel below does not read in place, first copies its pages to a contiguous buffer
    and runs as over a non-paged cache, with that layout's configuration (attention/kernels/page_gather.py;
    ``config.gather_pages`` forces or forbids the copy).
    ``max_seqlen_kv`` then sizes that copy and must bound every sequence's KV length, as its name says.

    Each call is planned once per key of its arguments: the tensors' sizes, strides, dtypes, devices
    and 16-byte alignment, and the host values, with max_seqlen_kv rounded up (``kv_length_bucket``). A repeat
    call skips validation, configuration and Triton's argument binding and launches the compiled kernels
    directly (``attention.kernels.launch``).

    On an sm90 GPU, prefill-sized calls the Gluon kernel serves (attention/kernels/hopper_forward.py: fp16 /
    bf16, head dim 64, 128 or 256, no window, ALiBi or sinks, packed K/V, a non-paged cache, pages of a multiple
    of its KV tile (128 tokens, 64 at d256) or of 16 tokens to half a tile) run attention_fwd_hopper.py's kernel
    unless a config or split count is passed or ``ATTN_FUSED_HOPPER=0`` (``ATTN_FUSED_HOPPER_SMALL_PAGES=0``: pages
    smaller than a tile are not its).

    `config` overrides the launch configuration `select_forward_config` would pick (tuning sweeps:
    `python -m benchmarks.sweep`); it must pack whole query tokens (block_q * group <= block_m).

    ``zero_tail`` (thd: q / out with batch stride 0, sequences back to back from row 0): the output rows
    cu_seqlens_q[B] .. total_q - 1, which no sequence holds, are written as zeros by the kernel's own programs
    (instead of the caller zeroing the whole output first).

    The example needs a CUDA GPU (compute capability 8.0+), so doctest skips its GPU lines. Two
    sequences in bshd: 5 queries over 7 keys, and 3 queries over 5 keys.

    Example:
        >>> import torch
        >>> from attention.kernels import attention_forward
        >>> q = torch.randn(2, 5, 4, 64, device="cuda", dtype=torch.float16)  # doctest: +SKIP
        >>> k = v = torch.randn(2, 7, 2, 64, device="cuda", dtype=torch.float16)  # doctest: +SKIP
        >>> cu_q = torch.tensor([0, 5, 8], dtype=torch.int32, device="cuda")  # doctest: +SKIP
        >>> cu_kv = torch.tensor([0, 7, 12], dtype=torch.int32, device="cuda")  # doctest: +SKIP
        >>> out = attention_forward(q, k, v, torch.zeros(2, 5, 4, 64, device="cuda", dtype=torch.float16),
        ...                         cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=5,
        ...                         max_seqlen_kv=7, softmax_scale=0.125, causal=True,
        ...                         bottom_right=True)  # doctest: +SKIP
        >>> out.shape   # doctest: +SKIP
        torch.Size([2, 5, 4, 64])
    """
    if max_seqlen_q < 0 or max_seqlen_kv < 0:
        raise ValueError(f"max_seqlen_q / max_seqlen_kv must be >= 0, got {max_seqlen_q} / {max_seqlen_kv}")
    kv_length, mean_kv = kv_length_buckets(max_seqlen_kv, total_kv, cu_seqlens_q.shape[0] - 1)
    key = (tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(out), tensor_key(cu_seqlens_q),
           tensor_key(cu_seqlens_kv), tensor_key(q_start), tensor_key(kv_start), tensor_key(page_table),
           tensor_key(alibi_slopes), tensor_key(softmax_offset), max_seqlen_q, kv_length, mean_kv,
           total_q, softmax_scale, causal, tuple(window_size), bottom_right, num_splits, config, zero_tail,
           plan_environment(), current_device_index() if q.is_cuda else -1)
    plan = _plans.get(key, _NO_PLAN)
    if plan is _NO_PLAN:
        plan = _plan_forward(
            q, k, v, out, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, alibi_slopes, softmax_offset,
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=kv_length, total_q=total_q,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size, bottom_right=bottom_right,
            num_splits=num_splits, config=config, zero_tail=zero_tail, mean_seqlen_kv=mean_kv)
        _keep(key, plan)
    if plan is None:  # nothing to compute
        if zero_tail:
            out.zero_()
        return out
    if type(plan) is GatherPlan:
        k, v = gather_pages(k, v, page_table, plan.num_pages)
        return attention_forward(
            q, k, v, out, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, q_start=q_start,
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, total_q=total_q, softmax_scale=softmax_scale,
            causal=causal, window_size=window_size, bottom_right=bottom_right, alibi_slopes=alibi_slopes,
            softmax_offset=softmax_offset, num_splits=num_splits, zero_tail=zero_tail, total_kv=total_kv)
    launch_plan(plan, q, k, v, out, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, alibi_slopes,
                softmax_offset, zero_tail)
    return out


def kv_length_bucket(max_seqlen_kv: int) -> int:
    """The KV length a launch plan is made for: ``max_seqlen_kv`` rounded up to a multiple of 16 keys (every KV
    tile is a multiple of 16 keys), or of 1/16 of its power of two where that is more. A plan for more keys than a
    call has is right for it (the kernels read each sequence's length on the device; a CUDA graph's plan is made for
    the cache's capacity) and sizes its split-KV for at most 6.25 % more keys. A growing decode thus gets a new plan
    (about 0.2 ms of host time) every 16 steps below 512 keys, every 256 at 4k keys and every 2,048 at 32k.

    Example:
        >>> [kv_length_bucket(n) for n in (1, 300, 4096, 4097, 40000)]
        [16, 304, 4096, 4352, 40960]
    """
    quantum = max(16, 1 << max(0, max_seqlen_kv.bit_length() - 5))
    return -(-max_seqlen_kv // quantum) * quantum


def mean_kv_length(total_kv: int | None, num_seqs: int, kv_length: int) -> int | None:
    """The sequences' mean KV length a plan is made for (``kv_length_bucket`` of it, at most ``kv_length``, the
    bucket of the longest), from ``total_kv`` (their lengths summed) over ``num_seqs``; None without a total.

    Example:
        >>> mean_kv_length(64 * 4096, 64, 4096), mean_kv_length(1000, 3, 4096), mean_kv_length(None, 3, 4096)
        (4096, 336, None)
    """
    if total_kv is None or num_seqs <= 0:
        return None
    if total_kv < 0:
        raise ValueError(f"total_kv must be >= 0, got {total_kv}")
    return min(kv_length, kv_length_bucket(-(-total_kv // num_seqs)))


_BUCKETS: dict[tuple[int, int | None, int], tuple[int, int | None]] = {}
MAX_BUCKETS = 4096
"""(max_seqlen_kv, total_kv, num_seqs) combinations kv_length_buckets remembers (all dropped when full)."""


def kv_length_buckets(max_seqlen_kv: int, total_kv: int | None, num_seqs: int) -> tuple[int, int | None]:
    """``(kv_length_bucket(max_seqlen_kv), mean_kv_length(total_kv, num_seqs, that bucket))``, remembered: a
    layer's decode step asks for its previous step's lengths, or the layer before's, and a dict hit costs ~0.2 µs
    against ~1 µs for the arithmetic's calls.

    Example:
        >>> kv_length_buckets(4097, 3 * 1000, 3), kv_length_buckets(300, None, 2)
        ((4352, 1024), (304, None))
    """
    key = (max_seqlen_kv, total_kv, num_seqs)
    buckets = _BUCKETS.get(key)
    if buckets is None:
        bucket = kv_length_bucket(max_seqlen_kv)
        buckets = (bucket, mean_kv_length(total_kv, num_seqs, bucket))   # (raises on a negative total)
        if len(_BUCKETS) >= MAX_BUCKETS:
            _BUCKETS.clear()
        _BUCKETS[key] = buckets
    return buckets


def packed_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, batch: int,
    cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, q_start: torch.Tensor | None,
    kv_start: torch.Tensor | None, page_table: torch.Tensor | None, max_seqlen_q: int, max_seqlen_kv: int,
    total_q: int | None, softmax_scale: float, causal: bool, window_left: int, window_right: int,
    bottom_right: bool, alibi_slopes: torch.Tensor | None, softmax_offset: torch.Tensor | None,
    num_splits: int | None, zero_tail: bool = False, total_kv: int | None = None,
) -> Plan | None:
    """``attention_forward`` with positional arguments (the fused backend's path), with two differences
    that save a tensor view each per call: q, k, v and out may also be 3-D thd ``[T, H, D]``, seen as
    ``[batch, T, H, D]`` with a batch stride of 0 (the ``expand`` the launcher's convention asks for, made
    once per plan); q_start / kv_start are cu_seqlens-style, int32 ``[batch + 1]`` (the last entry is
    not read: the kernels see the same pointer as ``q_start[:-1]``). ``out`` may also have its heads
    flattened, ``[..., H_q * D_v]`` (DotProductAttention's output layout, unflattened once per plan).

    q, k or v whose last dim is strided, and cu_seqlens or starts that are, run on contiguous copies
    (``arguments.kernel_layout``), as the kernels read rows of ``d`` elements and int32 offsets at stride 1.

    Returns the plan it launched, which ``launch_plan`` runs again on tensors of the same metadata (sizes, strides,
    dtypes, devices, 16-byte alignment) with the same host arguments; None when there was nothing to compute,
    the pages were gathered first or the inputs were copied."""
    if max_seqlen_q < 0 or max_seqlen_kv < 0:
        raise ValueError(f"max_seqlen_q / max_seqlen_kv must be >= 0, got {max_seqlen_q} / {max_seqlen_kv}")
    if (q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or cu_seqlens_q.stride(0) != 1
            or cu_seqlens_kv.stride(0) != 1 or (q_start is not None and q_start.stride(0) != 1)
            or (kv_start is not None and kv_start.stride(0) != 1)):
        given = (q, k, v, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start)
        laid_out = kernel_layout(*given)
        if any(a is not b for a, b in zip(laid_out, given)):   # run on copies; no plan fits the given tensors
            packed_attention_forward(
                *laid_out[:3], out, batch, *laid_out[3:], page_table, max_seqlen_q, max_seqlen_kv, total_q,
                softmax_scale, causal, window_left, window_right, bottom_right, alibi_slopes, softmax_offset,
                num_splits, zero_tail, total_kv)
            return None
    kv_length, mean_kv = kv_length_buckets(max_seqlen_kv, total_kv, batch)
    # q_start / kv_start are usually the cu_seqlens themselves: their metadata is keyed already
    key = ("packed", batch, tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(out), tensor_key(cu_seqlens_q),
           tensor_key(cu_seqlens_kv), _SAME_AS_CU_SEQLENS if q_start is cu_seqlens_q else tensor_key(q_start),
           _SAME_AS_CU_SEQLENS if kv_start is cu_seqlens_kv else tensor_key(kv_start), tensor_key(page_table),
           tensor_key(alibi_slopes), tensor_key(softmax_offset), max_seqlen_q, kv_length, mean_kv,
           total_q, softmax_scale, causal, window_left, window_right, bottom_right, num_splits, zero_tail,
           plan_environment(), current_device_index() if q.is_cuda else -1)
    plan = _plans.get(key, _NO_PLAN)
    if plan is _NO_PLAN or type(plan) is GatherPlan:
        out4 = out.unflatten(-1, (q.shape[-2], -1)) if out.dim() < q.dim() else out
        q4, k4, v4, out4 = (x.expand(batch, -1, -1, -1) if x.dim() == 3 else x for x in (q, k, v, out4))
        q_start, kv_start = (None if x is None else x[:-1] for x in (q_start, kv_start))
        if plan is _NO_PLAN:
            plan = _plan_forward(
                q4, k4, v4, out4, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, alibi_slopes,
                softmax_offset, max_seqlen_q=max_seqlen_q, max_seqlen_kv=kv_length,
                total_q=total_q, softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right),
                bottom_right=bottom_right, num_splits=num_splits, config=None, zero_tail=zero_tail,
                mean_seqlen_kv=mean_kv)
            _keep(key, plan)
        if type(plan) is GatherPlan:
            attention_forward(
                q4, k4, v4, out4, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, q_start=q_start,
                kv_start=kv_start, page_table=page_table, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                total_q=total_q, softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right),
                bottom_right=bottom_right, alibi_slopes=alibi_slopes, softmax_offset=softmax_offset,
                num_splits=num_splits, zero_tail=zero_tail, total_kv=total_kv)
            return None
    if plan is None:
        if zero_tail:
            out.zero_()
        return None
    launch_plan(plan, q, k, v, out, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, alibi_slopes,
                softmax_offset, zero_tail)
    return plan


def _keep(key: tuple, plan: Plan | None) -> None:
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def launch_plan(plan: ForwardPlan | HopperPlan | MixedHopperPlan | DecodeHopperPlan, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_kv: torch.Tensor, q_start: torch.Tensor | None, kv_start: torch.Tensor | None,
                page_table: torch.Tensor | None, alibi_slopes: torch.Tensor | None,
                softmax_offset: torch.Tensor | None, zero_tail: bool = False) -> None:
    """Run a plan's launches on these tensors (only their addresses are read): tensors with the metadata of those
    the plan was made for, as ``packed_attention_forward`` or ``attention_forward`` took them. ``zero_tail``: out's
    rows past the last sequence come out zero; every kernel writes them itself (a ForwardPlan planned with it)."""
    if type(plan) in (HopperPlan, MixedHopperPlan, MixedRolesPlan, DecodeHopperPlan):
        plan(q, k, v, out, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, zero_tail)
        return
    placeholder = cu_seqlens_q  # any device tensor for pointers a constexpr flag disables
    if plan.partial_out_shape:  # (unpacked sizes: a tuple argument parses ~0.5 µs slower)
        splits, tokens, heads, head_dim_v = plan.partial_out_shape
        partial_out = torch.empty(splits, tokens, heads, head_dim_v, dtype=torch.float32, device=q.device)
        partial_lse = torch.empty(splits, tokens, heads, dtype=torch.float32, device=q.device)
    else:
        partial_out = partial_lse = out  # unused placeholders
    if softmax_offset is not None:
        softmax_offset = softmax_offset.reshape(-1)
    plan.attention(
        q, k, v, out, partial_out, partial_lse, cu_seqlens_q, cu_seqlens_kv,
        placeholder if q_start is None else q_start,
        placeholder if kv_start is None else kv_start,
        placeholder if page_table is None else page_table,
        placeholder if alibi_slopes is None else alibi_slopes,
        placeholder if softmax_offset is None else softmax_offset,
        split_counter_buffer(q.device, plan.split_counters) if plan.split_counters else placeholder,
    )
    if plan.combine is not None:
        _combine(plan.combine, partial_out, partial_lse, out, cu_seqlens_q, q_start, softmax_offset)


def _combine(launch: KernelLaunch, partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor,
             cu_seqlens_q: torch.Tensor, q_start: torch.Tensor | None, softmax_offset: torch.Tensor | None) -> None:
    """The split merge after the attention grid (a seam for benchmarks.latency_breakdown)."""
    launch(partial_out, partial_lse, out, cu_seqlens_q, cu_seqlens_q if q_start is None else q_start,
           partial_lse if softmax_offset is None else softmax_offset)


def _plan_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, q_start: torch.Tensor | None,
    kv_start: torch.Tensor | None, page_table: torch.Tensor | None, alibi_slopes: torch.Tensor | None,
    softmax_offset: torch.Tensor | None, *, max_seqlen_q: int, max_seqlen_kv: int, total_q: int | None,
    softmax_scale: float, causal: bool, window_size: tuple[int, int], bottom_right: bool,
    num_splits: int | None, config: ForwardConfig | None, zero_tail: bool = False,
    mean_seqlen_kv: int | None = None,
) -> Plan | None:
    """Validate the arguments and fix everything the launches need but the tensors' addresses (None:
    nothing to compute; a GatherPlan: copy the pages first; a HopperPlan: the Gluon sm90 kernel runs the
    call). Reads tensor metadata and host values only."""
    check_plan_environment()
    shapes = validate_forward_arguments(
        q, k, v, out, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, alibi_slopes, softmax_offset)
    window_left, window_right = normalize_window(window_size, causal)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite float, got {softmax_scale!r}")
    if total_q is None:
        total_q = shapes.max_tokens_q if q.stride(0) == 0 else shapes.num_seqs * shapes.max_tokens_q
    if total_q < 0:
        raise ValueError(f"total_q must be >= 0, got {total_q}")
    if zero_tail and ((out.stride(0) != 0 and shapes.num_seqs > 1) or total_q > shapes.max_tokens_q):
        raise ValueError("zero_tail needs thd rows: out with batch stride 0 (a [T, H, D] tensor expanded over the "
                         f"batch) and total_q <= its T; got out strides {tuple(out.stride())}, total_q {total_q}")
    if num_splits is not None and not 1 <= num_splits <= MAX_NUM_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_NUM_SPLITS}] or None, got {num_splits}")
    if shapes.num_seqs == 0 or total_q == 0 or max_seqlen_q == 0:
        return None

    group_size = shapes.num_heads_q // shapes.num_heads_kv
    config_given = config
    if config is None:
        config = select_forward_config(
            head_dim_qk=shapes.head_dim_qk, head_dim_v=shapes.head_dim_v, group_size=group_size,
            max_seqlen_q=max_seqlen_q, interpret=kernels_interpreted(), paged=shapes.paged, max_seqlen_kv=max_seqlen_kv,
            causal=window_right >= 0, num_q_tiles=q_tile_count(total_q, group_size, shapes.num_heads_kv),
            mixed=mixed_batch(shapes.num_seqs, total_q, max_seqlen_q))
    elif config.block_q * group_size > config.block_m or config.block_dqk < shapes.head_dim_qk \
            or config.block_dv < shapes.head_dim_v \
            or (config.small_block_m and not group_size <= config.small_block_m <= config.block_m):
        raise ValueError(f"config {config} does not fit group size {group_size} and head dims "
                         f"{shapes.head_dim_qk}/{shapes.head_dim_v}")

    if config_given is None and num_splits in (None, 1):
        hopper = plan_hopper_forward(
            q, k, v, out, num_seqs=shapes.num_seqs, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
            total_q=total_q, num_splits=num_splits, softmax_scale=softmax_scale, window=(window_left, window_right),
            bottom_right=bottom_right,
            page_size=shapes.page_size if shapes.paged else 0, alibi=alibi_slopes is not None,
            sink=softmax_offset is not None,
            has_q_start=q_start is not None, has_kv_start=kv_start is not None,
            num_sms=num_streaming_multiprocessors(q.device), mean_seqlen_kv=mean_seqlen_kv)
        if hopper is not None:
            return hopper

    if shapes.paged and config.gather_pages is not False:
        num_pages = gathered_page_count(
            page_size=shapes.page_size, table_pages=page_table.shape[1], num_seqs=shapes.num_seqs, total_q=total_q,
            group_size=group_size, max_seqlen_kv=max_seqlen_kv, window_bounded=window_left >= 0,
            kv_row_bytes=shapes.num_heads_kv * (shapes.head_dim_qk * k.element_size()
                                                + shapes.head_dim_v * v.element_size()),
            forced=config.gather_pages is True)
        if num_pages:
            return GatherPlan(num_pages)

    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs=shapes.num_seqs, num_kv_heads=shapes.num_heads_kv, total_q=total_q,
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, block_q=config.block_q,
            block_n=config.block_n, num_sms=num_streaming_multiprocessors(q.device), block_m=config.block_m)

    write_partial = num_splits > 1
    partial_out_shape = (num_splits, total_q, shapes.num_heads_q, shapes.head_dim_v) if write_partial else None
    # the workspace is allocated contiguous on every call: its strides follow from its shape
    heads, head_dim_v = shapes.num_heads_q, shapes.head_dim_v
    part_strides = (total_q * heads * head_dim_v, heads * head_dim_v, head_dim_v) if write_partial else (0, 0, 0)
    lse_strides = (total_q * heads, heads) if write_partial else (0, 0)

    alibi_stride_b = 0
    if alibi_slopes is not None and alibi_slopes.dim() == 2:
        alibi_stride_b = alibi_slopes.stride(0)
    page_scalar = shapes.paged and shapes.page_size % config.block_n == 0
    use_tma = config.tma and _tma_ready(k, v) and (not shapes.paged or (
        page_scalar and all(x.stride(0) == shapes.page_size * x.stride(1) for x in (k, v))))  # one row space
    page_granular = (shapes.paged and config.page_granular_tiles and not config.runtime_page_size
                     and shapes.page_size < config.block_n and config.block_n % shapes.page_size == 0)
    # Sequence-major grid (tiles_per_seq programs per sequence, no search) when it has no more programs
    # than the searched grid: decode, and batches whose sequences all have max_seqlen_q queries.
    tiles_per_seq = -(-max_seqlen_q // config.block_q)
    searched_programs = -(-total_q // config.block_q) + shapes.num_seqs
    seq_grid = shapes.num_seqs * tiles_per_seq <= searched_programs
    q_programs = shapes.num_seqs * tiles_per_seq if seq_grid else searched_programs
    # thd padding rows (zero_tail): up to 16 extra programs a KV head, 16 rows or more each
    tail_programs = min(-(-total_q // 16), 16) if zero_tail else 0
    grid = (q_programs + tail_programs, shapes.num_heads_kv, num_splits)
    fused_combine = write_partial and config.fused_combine
    # (the interpreter has no grid dependency control; CPU tensors outside it only reach tests/sm90_compile)
    dependent_launch = write_partial and not fused_combine and config.dependent_combine and not kernels_interpreted()
    attention = KernelLaunch(
        attention_fwd_kernel, grid,
        scalars=(
            shapes.num_seqs, tiles_per_seq if seq_grid else 0, shapes.page_size,
            k.shape[0] * k.shape[1] if shapes.paged else 0,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            *(page_table.stride() if page_table is not None else (0, 0)),
            alibi_stride_b,
            *part_strides, *lse_strides,
            scale_log2(softmax_scale),
            max(window_left, 0), max(window_right, 0),
            q_programs, total_q, -(-total_q // tail_programs) if tail_programs else 0,
        ),
        constexprs={
            "HEAD_DIM_QK": shapes.head_dim_qk, "HEAD_DIM_V": shapes.head_dim_v,
            "BLOCK_DQK": config.block_dqk, "BLOCK_DV": config.block_dv,
            "GROUP_SIZE": group_size, "BLOCK_M": config.block_m, "BLOCK_Q": config.block_q, "BLOCK_N": config.block_n,
            "PAGED": shapes.paged, "HAS_Q_START": q_start is not None, "HAS_KV_START": kv_start is not None,
            "WINDOW_LEFT_BOUNDED": window_left >= 0, "WINDOW_RIGHT_BOUNDED": window_right >= 0,
            "BOTTOM_RIGHT": bool(bottom_right), "HAS_ALIBI": alibi_slopes is not None,
            "HAS_SINK": softmax_offset is not None and (fused_combine or not write_partial),
            "WRITE_PARTIAL": write_partial,
            "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
            "PAGE_SCALAR": page_scalar and (config.paged_scalar_ids or use_tma),
            "PREFETCH_PAGES": config.prefetch_page_ids and shapes.paged,
            "ROTATE_KV": config.rotate_kv_tiles, "USE_TMA": use_tma,
            "SMALL_BLOCK_M": config.small_block_m, "SMALL_BLOCK_Q": max(1, config.small_block_m // group_size),
            "FUSED_COMBINE": fused_combine,
            "INDEX_INT32": config.int32_offsets and _offsets_fit_int32(k) and _offsets_fit_int32(v),
            "PAGE_SIZE": shapes.page_size if shapes.paged and not config.runtime_page_size else 0,
            "HEAVY_TILES_FIRST": config.heavy_tiles_first,
            "K_TRANSPOSED": config.transposed_k_loads, "LAUNCH_DEPENDENTS": dependent_launch, "SEQ_GRID": seq_grid,
            "PAGES_PER_TILE": config.block_n // shapes.page_size if page_granular else 0,
            "ZERO_TAIL": tail_programs > 0,
        },
        options={"num_warps": config.num_warps, "num_stages": config.num_stages,
                 "maxnreg": config.max_registers or None},
    )
    combine = None
    if write_partial and not fused_combine:
        combine = combine_launch(
            partial_out_shape, part_strides, lse_strides, out.stride()[:3], num_seqs=shapes.num_seqs,
            has_q_start=q_start is not None, has_sink=softmax_offset is not None, dependent_launch=dependent_launch,
            max_seqlen_q=max_seqlen_q if seq_grid and tiles_per_seq == 1 else None)
    return ForwardPlan(attention, combine, partial_out_shape, q_programs * grid[1] if fused_combine else 0)
