"""Host-side validation of attention_forward's arguments: shapes, dtypes, strides. Never syncs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention.masks import WINDOW_BOUND_LIMIT

__all__ = ["ForwardShapes", "kernel_layout", "normalize_window", "scale_log2", "validate_forward_arguments"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class ForwardShapes:
    """Sizes read from tensor metadata only."""

    num_seqs: int
    max_tokens_q: int
    num_heads_q: int
    num_heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    paged: bool
    page_size: int


def scale_log2(softmax_scale: float) -> float:
    """The softmax scale in log2 units, as every kernel takes it (they exponentiate with exp2).

    Example:
        >>> round(scale_log2(1.0), 6)
        1.442695
    """
    return float(softmax_scale) * math.log2(math.e)


def normalize_window(window_size: tuple[int, int], causal: bool) -> tuple[int, int]:
    """(left, right) with -1 = unbounded, at most masks.WINDOW_BOUND_LIMIT; causal forces right = 0.

    Example:
        >>> normalize_window((-1, -1), causal=True)
        (-1, 0)
    """
    if len(window_size) != 2:
        raise ValueError(f"window_size must be a (left, right) pair, got {window_size!r}")
    left, right = window_size
    left, right = min(int(left), WINDOW_BOUND_LIMIT), min(int(right), WINDOW_BOUND_LIMIT)   # (int32 positions)
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be -1 (unbounded) or >= 0, got {window_size!r}")
    if causal:
        right = 0
    return left, right


def kernel_layout(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor,
    q_start: torch.Tensor | None, kv_start: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """The tensors as the kernels read them: q, k, v with a contiguous last dim and the offsets at stride 1,
    each the tensor given where it is so, else a contiguous copy (starts that are their cu_seqlens stay so).

    Example:
        >>> q = torch.zeros(4, 2, 16)[..., ::2]           # every other element of the last dim
        >>> cu = torch.tensor([0, 4], dtype=torch.int32)
        >>> laid_out = kernel_layout(q, q, q, cu, cu, cu, None)
        >>> laid_out[0].stride(), laid_out[3] is cu, laid_out[5] is laid_out[3]
        ((16, 8, 1), True, True)
    """
    def rows(x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] <= 1 or x.stride(-1) == 1:
            return x
        return x.contiguous() if x.numel() else x.new_empty(x.shape)   # (contiguous() keeps an empty view's strides)

    def offsets(x: torch.Tensor) -> torch.Tensor:
        return x if x.numel() <= 1 or x.stride(0) == 1 else x.contiguous()

    cu_q, cu_kv = offsets(cu_seqlens_q), offsets(cu_seqlens_kv)
    starts = [cu_q if start is cu_seqlens_q else cu_kv if start is cu_seqlens_kv
              else None if start is None else offsets(start) for start in (q_start, kv_start)]
    return (rows(q), rows(k), rows(v), cu_q, cu_kv, *starts)


def _check_int32_vector(name: str, tensor: torch.Tensor, length: int, device: torch.device) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int32 or tensor.dim() != 1:
        got = f"{tensor.dtype} {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name} must be a 1-D int32 tensor of length {length}, got {got}")
    if tensor.numel() != length:
        raise ValueError(f"{name} must have length {length}, got {tensor.numel()}")
    if tensor.device != device:
        raise ValueError(f"{name} must be on {device}, got {tensor.device}")
    if length > 1 and tensor.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got stride {tensor.stride(0)}")


def _check_strided_4d(name: str, tensor: torch.Tensor, layout: str) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name} must be a 4-D tensor {layout}, got shape {got}")
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {tensor.stride()}")


def validate_forward_arguments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    q_start: torch.Tensor | None,
    kv_start: torch.Tensor | None,
    page_table: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    softmax_offset: torch.Tensor | None,
) -> ForwardShapes:
    """Raise ValueError naming the argument for any malformed input; return the sizes."""
    _check_strided_4d("q", q, "[B, S_q, H_q, D_qk]")
    paged = page_table is not None
    kv_layout = "[num_pages, page_size, H_kv, D]" if paged else "[B, S_kv, H_kv, D]"
    _check_strided_4d("k", k, kv_layout)
    _check_strided_4d("v", v, kv_layout)
    _check_strided_4d("out", out, "[B, S_q, H_q, D_v]")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, tensor in (("k", k), ("v", v), ("out", out)):
        if tensor.dtype != q.dtype:
            raise ValueError(f"{name} must have q's dtype {q.dtype}, got {tensor.dtype}")
        if tensor.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {tensor.device}")

    num_seqs, max_tokens_q, num_heads_q, head_dim_qk = q.shape
    num_heads_kv, head_dim_v = k.shape[2], v.shape[3]
    if k.shape[3] != head_dim_qk:
        raise ValueError(f"k's head dim must equal q's ({head_dim_qk}), got {k.shape[3]}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must match k in its first three dims {tuple(k.shape[:3])}, got {tuple(v.shape[:3])}")
    for name, dim in (("D_qk", head_dim_qk), ("D_v", head_dim_v)):
        if dim % 8 != 0 or not 8 <= dim <= MAX_HEAD_DIM:
            raise ValueError(f"head dim {name} must be a multiple of 8 in [8, {MAX_HEAD_DIM}], got {dim}")
    if num_heads_kv == 0 or num_heads_q % num_heads_kv != 0:
        raise ValueError(f"H_q ({num_heads_q}) must be a positive multiple of H_kv ({num_heads_kv})")
    if tuple(out.shape) != (num_seqs, max_tokens_q, num_heads_q, head_dim_v):
        raise ValueError(
            f"out must have shape {(num_seqs, max_tokens_q, num_heads_q, head_dim_v)}, got {tuple(out.shape)}")

    device = q.device
    _check_int32_vector("cu_seqlens_q", cu_seqlens_q, num_seqs + 1, device)
    _check_int32_vector("cu_seqlens_kv", cu_seqlens_kv, num_seqs + 1, device)
    if q_start is not None:
        _check_int32_vector("q_start", q_start, num_seqs, device)
    if kv_start is not None:
        if paged:
            raise ValueError("kv_start applies to dense k/v only; pass None with a page_table")
        _check_int32_vector("kv_start", kv_start, num_seqs, device)

    page_size = 1
    if paged:
        if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != num_seqs:
            raise ValueError(
                f"page_table must be int32 [B={num_seqs}, max_pages_per_seq], "
                f"got {page_table.dtype} {tuple(page_table.shape)}")
        if page_table.device != device:
            raise ValueError(f"page_table must be on {device}, got {page_table.device}")
        page_size = k.shape[1]
        if page_size < 1:
            raise ValueError(f"k (paged cache) must have page_size >= 1, got {page_size}")
    elif k.shape[0] != num_seqs:
        raise ValueError(f"dense k must have batch size B={num_seqs} (from q), got {k.shape[0]}")

    if alibi_slopes is not None:
        if alibi_slopes.dtype != torch.float32 or tuple(alibi_slopes.shape) not in (
                (num_heads_q,), (num_seqs, num_heads_q)):
            raise ValueError(
                f"alibi_slopes must be float32 [H_q={num_heads_q}] or [B={num_seqs}, H_q], "
                f"got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device or alibi_slopes.stride(-1) != 1:
            raise ValueError(f"alibi_slopes must be on {device} with a contiguous last dim, got {alibi_slopes.device} "
                             f"with strides {alibi_slopes.stride()}")
    if softmax_offset is not None:
        if softmax_offset.dtype != torch.float32 or softmax_offset.numel() != num_heads_q:
            raise ValueError(
                f"softmax_offset must be float32 with H_q={num_heads_q} elements, "
                f"got {softmax_offset.dtype} {tuple(softmax_offset.shape)}")
        if softmax_offset.device != device:
            raise ValueError(f"softmax_offset must be on {device}, got {softmax_offset.device}")
    return ForwardShapes(
        num_seqs=num_seqs,
        max_tokens_q=max_tokens_q,
        num_heads_q=num_heads_q,
        num_heads_kv=num_heads_kv,
        head_dim_qk=head_dim_qk,
        head_dim_v=head_dim_v,
        paged=paged,
        page_size=page_size,
    )
