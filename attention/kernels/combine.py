"""Split-KV merge: combine per-split (O, LSE) partials into the final output, applying sinks once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import next_power_of_2
from .launch import KernelLaunch
from .sequence_lookup import find_sequence

__all__ = ["combine_launch", "combine_splits", "combine_splits_kernel", "split_counter_buffer"]

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def combine_splits_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr,
    cu_seqlens_q_ptr, q_start_ptr, softmax_offset_ptr,
    num_seqs, num_splits,
    stride_part_split, stride_part_tok, stride_part_head,
    stride_lse_split, stride_lse_tok,
    stride_ob, stride_os, stride_oh,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
    HAS_Q_START: tl.constexpr, HAS_SINK: tl.constexpr, WAIT_FOR_PRIMARY: tl.constexpr,
    SEQ_GRID: tl.constexpr,
):
    """Grid (packed token upper bound, H_q). out = sum_s w_s O_s / (sum_s w_s + exp(sink)).

    w_s = exp2(lse_s - m); partial LSEs are in log2 units; empty splits carry lse = -inf.
    WAIT_FOR_PRIMARY (launched with programmatic dependent launch): find the sequence, then wait
    until the attention grid has finished and its partials are visible.
    SEQ_GRID > 0 (at most SEQ_GRID queries per sequence): program t is query t % SEQ_GRID of sequence
    t // SEQ_GRID, found without a binary search over cu_seqlens_q.
    """
    head = tl.program_id(1)
    if SEQ_GRID > 0:
        seq = tl.program_id(0) // SEQ_GRID
        q_begin = tl.load(cu_seqlens_q_ptr + seq)
        token = q_begin + tl.program_id(0) % SEQ_GRID
    else:
        token = tl.program_id(0)
        seq = find_sequence(cu_seqlens_q_ptr, num_seqs, token, 1, False)
        q_begin = tl.load(cu_seqlens_q_ptr + seq)
    if token >= tl.load(cu_seqlens_q_ptr + seq + 1):
        return
    if WAIT_FOR_PRIMARY:
        tl.extra.cuda.gdc_wait()
    token64 = token.to(tl.int64)

    offs_split = tl.arange(0, BLOCK_SPLITS)
    offs_split64 = offs_split.to(tl.int64)
    offs_dv = tl.arange(0, BLOCK_DV)
    split_valid = offs_split < num_splits
    lse = tl.load(partial_lse_ptr + offs_split64 * stride_lse_split + token64 * stride_lse_tok + head,
                  mask=split_valid, other=float("-inf"))
    m = tl.max(lse, 0)
    if HAS_SINK:
        sink = tl.load(softmax_offset_ptr + head).to(tl.float32) * LOG2E
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    weights = tl.math.exp2(lse - m_safe)
    denominator = tl.sum(weights, 0)
    if HAS_SINK:
        denominator += tl.math.exp2(sink - m_safe)

    part_ptrs = (partial_out_ptr + offs_split64[:, None] * stride_part_split + token64 * stride_part_tok
                 + head * stride_part_head + offs_dv[None, :])
    partial = tl.load(part_ptrs, mask=split_valid[:, None] & (offs_dv < HEAD_DIM_V)[None, :], other=0.0)
    o = tl.sum(partial * weights[:, None], 0) / tl.where(denominator > 0.0, denominator, 1.0)

    out_token = token - q_begin
    if HAS_Q_START:
        out_token += tl.load(q_start_ptr + seq)
    out_ptrs = out_ptr + seq.to(tl.int64) * stride_ob + out_token.to(tl.int64) * stride_os + head * stride_oh + offs_dv
    tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=offs_dv < HEAD_DIM_V)


_SEQ_GRID_MAX_QUERIES = 16
"""Up to this many queries per sequence the combine grid is (sequence, query slot): a compile per
power of two, and at most that factor more programs than tokens."""


def combine_launch(
    partial_out_shape: tuple[int, int, int, int],
    partial_out_strides: tuple[int, int, int],
    partial_lse_strides: tuple[int, int],
    out_strides: tuple[int, int, int],
    *,
    num_seqs: int,
    has_q_start: bool,
    has_sink: bool,
    dependent_launch: bool = False,
    max_seqlen_q: int | None = None,
) -> KernelLaunch | None:
    """The merge's launch for partials of this shape and these strides (None: nothing to merge).

    Call it with (partial_out, partial_lse, out, cu_seqlens_q, q_start or cu_seqlens_q,
    softmax_offset or partial_lse); see ``combine_splits`` for the arguments."""
    num_splits, total_q, num_heads, head_dim_v = partial_out_shape
    if total_q == 0 or num_heads == 0:
        return None
    use_seq_grid = max_seqlen_q is not None and 0 < max_seqlen_q <= _SEQ_GRID_MAX_QUERIES
    seq_grid = next_power_of_2(max_seqlen_q) if use_seq_grid else 0  # query slots per sequence
    return KernelLaunch(
        combine_splits_kernel, (num_seqs * seq_grid if seq_grid else total_q, num_heads),
        scalars=(num_seqs, num_splits, *partial_out_strides, *partial_lse_strides, *out_strides),
        constexprs={
            "HEAD_DIM_V": head_dim_v, "BLOCK_DV": max(16, next_power_of_2(head_dim_v)),
            "BLOCK_SPLITS": max(2, next_power_of_2(num_splits)),
            "HAS_Q_START": has_q_start, "HAS_SINK": has_sink, "WAIT_FOR_PRIMARY": dependent_launch,
            "SEQ_GRID": seq_grid,
        },
        options={"num_warps": 4 if head_dim_v * num_splits >= 2048 else 2, "launch_pdl": dependent_launch or None},
    )


def combine_splits(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    q_start: torch.Tensor | None,
    softmax_offset: torch.Tensor | None,
    dependent_launch: bool = False,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """Merge split-KV partials into `out`.

    partial_out: fp32 [num_splits, total_q, H_q, D_v] (last dim contiguous), each split's output
        normalised by its own softmax sum; partial_lse: fp32 [num_splits, total_q, H_q], log2 units.
    out: 4-D strided view [B, S_q, H_q, D_v] (same convention as attention_forward's `out`).
    Only the rows of real query tokens are written. ``dependent_launch``: launch with programmatic
    dependent launch (sm90+), after an attention launch that let its dependents start.
    ``max_seqlen_q`` (an upper bound on every sequence's queries; decode-sized): one program per
    (sequence, query slot) that knows its sequence, instead of one per packed token that searches.

    Example:
        >>> combine_splits(partial_out, partial_lse, out, cu_seqlens_q=cu, q_start=None,
        ...                softmax_offset=None)  # doctest: +SKIP
    """
    launch = combine_launch(
        tuple(partial_out.shape), partial_out.stride()[:3], partial_lse.stride()[:2], out.stride()[:3],
        num_seqs=cu_seqlens_q.numel() - 1, has_q_start=q_start is not None, has_sink=softmax_offset is not None,
        dependent_launch=dependent_launch, max_seqlen_q=max_seqlen_q)
    if launch is not None:
        launch(partial_out, partial_lse, out, cu_seqlens_q, cu_seqlens_q if q_start is None else q_start,
               partial_lse if softmax_offset is None else softmax_offset)
    return out


_split_counters: dict[tuple, torch.Tensor] = {}


def split_counter_buffer(device: torch.device, size: int) -> torch.Tensor:
    """Arrival counters of a merge done by the attention kernel itself (the last split to finish merges), at least
    ``size`` of them: zeros, and left zeros by every launch. Kept per device and stream (two streams must not share
    counters); grown on demand."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    buffer = _split_counters.get(key)
    if buffer is None or buffer.numel() < size:
        buffer = torch.zeros(max(size, 2 * (0 if buffer is None else buffer.numel())), dtype=torch.int32, device=device)
        _split_counters[key] = buffer
    return buffer
