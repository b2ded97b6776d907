"""fp32 first-principles attention: the oracle every backend is compared with.

This module deliberately shares no code with the ``attention`` or ``inference`` packages. It
works one sequence at a time, builds explicit boolean masks, computes in fp32 and uses a plain
softmax. Clarity beats speed: use it on small shapes only.

Example::

    >>> q, k, v = torch.randn(4, 2, 8), torch.randn(6, 1, 8), torch.randn(6, 1, 8)
    >>> reference_one_sequence(q, k, v, causal=True, bottom_right=True).shape
    torch.Size([4, 2, 8])
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["default_alibi_slopes", "reference_attention", "reference_one_sequence"]

QKV_FORMATS = ("bshd", "sbhd", "thd")
ATTN_MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
BIAS_TYPES = ("no_bias", "post_scale_bias", "pre_scale_bias", "alibi")


def default_alibi_slopes(num_heads: int) -> Tensor:
    """TransformerEngine's default ALiBi slopes, fp32 ``[num_heads]``.

    With ``n`` the largest power of two ``<= num_heads``: ``2^(-8k/n)`` for ``k = 1..n``, then
    ``2^(-4(2m-1)/n)`` for ``m = 1..num_heads-n``.

    Example: ``default_alibi_slopes(2)`` -> ``[2^-4, 2^-8]``.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    n = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * (2 * m - 1) / n) for m in range(1, num_heads - n + 1)]
    return torch.tensor(slopes, dtype=torch.float32)


def _visible_keys(
    s_q: int, s_kv: int, *, causal: bool, window_size: tuple[int, int], bottom_right: bool,
    device: torch.device | str | None = None,
) -> Tensor:
    """Bool ``[s_q, s_kv]``: True where query ``i`` may see key ``j``."""
    left, right = window_size
    if causal:
        right = 0
    diagonal_offset = s_kv - s_q if bottom_right else 0
    i = torch.arange(s_q, device=device).view(s_q, 1)
    j = torch.arange(s_kv, device=device).view(1, s_kv)
    visible = torch.ones(s_q, s_kv, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= j <= i + diagonal_offset + right
    if left >= 0:
        visible &= j >= i + diagonal_offset - left
    return visible


def reference_one_sequence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    bottom_right: bool = False,
    alibi_slopes: Tensor | None = None,
    bias: Tensor | None = None,
    bias_type: str = "post_scale_bias",
    mask: Tensor | None = None,
    softmax_offset: Tensor | None = None,
) -> Tensor:
    """Attention of one sequence, fp32 ``[s_q, h, d_v]``.

    Shapes: ``q [s_q, h, d_qk]``, ``k [s_kv, h_kv, d_qk]``, ``v [s_kv, h_kv, d_v]`` (any float
    dtype, computed in fp32). GQA: ``h % h_kv == 0``; query head ``n`` uses kv head
    ``n // (h // h_kv)``.

    Semantics:

    - Diagonal offset ``off = s_kv - s_q`` if ``bottom_right`` else ``0``. Query ``i`` may see
      key ``j`` iff ``j <= i + off + right`` (when ``right >= 0``) and ``j >= i + off - left``
      (when ``left >= 0``), ``(left, right) = window_size``, -1 = unbounded. ``causal=True``
      sets ``right = 0`` (keeping the given ``left``).
    - ``mask``: bool ``[h or 1, s_q, s_kv]``, True = masked out, combined with the above.
    - Logits: ``scale * q.k`` with ``scale = softmax_scale or 1/sqrt(d_qk)``; ``bias``
      (``[h or 1, s_q or 1, s_kv]``) gives ``scale*q.k + bias`` (``post_scale_bias``) or
      ``scale*(q.k + bias)`` (``pre_scale_bias``); ``alibi_slopes [h]`` then adds
      ``-slope_h * |i + off - j|``.
    - Masked logits are -inf. ``softmax_offset [h]`` adds ``exp(offset_h)`` to each row's
      softmax denominator (an extra logit column, dropped after the softmax).
    - A query row that sees no key returns zeros.

    Example::

        >>> q = k = v = torch.ones(2, 1, 4)
        >>> reference_one_sequence(q, k, v, causal=True)[:, 0, 0]
        tensor([1., 1.])
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be 3-D [s, h, d]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    s_q, num_heads, head_dim_qk = q.shape
    s_kv, num_kv_heads, _ = k.shape
    if k.shape[2] != head_dim_qk:
        raise ValueError(f"k head dim {k.shape[2]} != q head dim {head_dim_qk}")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} except the last dim")
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(f"q heads ({num_heads}) must be a multiple of k heads ({num_kv_heads})")
    if bias_type not in ("post_scale_bias", "pre_scale_bias"):
        raise ValueError(f"bias_type must be post_scale_bias or pre_scale_bias, got {bias_type!r}")
    if len(window_size) != 2:
        raise ValueError(f"window_size must be (left, right), got {window_size!r}")
    head_dim_v = v.shape[2]
    scale = 1.0 / math.sqrt(head_dim_qk) if softmax_scale is None else float(softmax_scale)

    group_size = num_heads // num_kv_heads
    q32 = q.float()
    k32 = k.float().repeat_interleave(group_size, dim=1)  # [s_kv, h, d_qk]
    v32 = v.float().repeat_interleave(group_size, dim=1)  # [s_kv, h, d_v]

    dot = torch.einsum("ihd,jhd->hij", q32, k32)  # [h, s_q, s_kv]
    if bias is not None:
        if bias.dim() != 3:
            raise ValueError(f"bias must be 3-D [h or 1, s_q or 1, s_kv], got {tuple(bias.shape)}")
        bias32 = bias.float().expand(num_heads, s_q, s_kv)
        logits = scale * (dot + bias32) if bias_type == "pre_scale_bias" else scale * dot + bias32
    else:
        logits = scale * dot

    diagonal_offset = s_kv - s_q if bottom_right else 0
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().reshape(-1)
        if slopes.numel() != num_heads:
            raise ValueError(f"alibi_slopes must have {num_heads} entries, got {slopes.numel()}")
        i = torch.arange(s_q, device=q.device).view(s_q, 1)
        j = torch.arange(s_kv, device=q.device).view(1, s_kv)
        distance = (i + diagonal_offset - j).abs().float()  # [s_q, s_kv]
        logits = logits - slopes.view(num_heads, 1, 1) * distance

    visible = _visible_keys(
        s_q, s_kv, causal=causal, window_size=tuple(window_size), bottom_right=bottom_right, device=q.device
    ).expand(num_heads, s_q, s_kv)
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() != 3:
            raise ValueError(f"mask must be bool [h or 1, s_q, s_kv], got {mask.dtype} "
                             f"{tuple(mask.shape)}")
        visible = visible & ~mask.expand(num_heads, s_q, s_kv)
    logits = logits.masked_fill(~visible, float("-inf"))

    if softmax_offset is not None:
        sink = softmax_offset.float().reshape(-1)
        if sink.numel() != num_heads:
            raise ValueError(f"softmax_offset must have {num_heads} entries, got {sink.numel()}")
        sink_column = sink.view(num_heads, 1, 1).expand(num_heads, s_q, 1)
        logits = torch.cat([logits, sink_column], dim=2)  # [h, s_q, s_kv + 1]

    if logits.shape[2] == 0:
        return torch.zeros(s_q, num_heads, head_dim_v, dtype=torch.float32, device=q.device)
    # Plain softmax; rows with no visible key come out NaN and are zeroed below.
    row_max = logits.amax(dim=2, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    exp_logits = torch.exp(logits - row_max)
    probs = exp_logits / exp_logits.sum(dim=2, keepdim=True)
    probs = probs[:, :, :s_kv]
    sees_some_key = visible.any(dim=2, keepdim=True)  # [h, s_q, 1]
    probs = torch.where(sees_some_key, probs, 0.0)

    out = torch.einsum("hij,jhd->ihd", probs, v32)  # [s_q, h, d_v]
    return out.reshape(s_q, num_heads, head_dim_v)


def _lengths_from_cu_seqlens(cu_seqlens: Tensor, batch_size: int, name: str) -> list[int]:
    values = [int(x) for x in cu_seqlens.reshape(-1).tolist()]
    if len(values) < batch_size + 1:
        raise ValueError(f"{name} needs at least {batch_size + 1} entries, got {len(values)}")
    values = values[: batch_size + 1]
    lengths = [b - a for a, b in zip(values[:-1], values[1:])]
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    if any(length < 0 for length in lengths):
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    return lengths


def _offsets_from_cu_seqlens(cu_seqlens: Tensor, batch_size: int) -> list[int]:
    return [int(x) for x in cu_seqlens.reshape(-1).tolist()[:batch_size]]


def _slice_for_sequence(tensor: Tensor, index: int, len_q: int, len_kv: int, name: str) -> Tensor:
    """``tensor [1|b, 1|h, 1|s_q, 1|s_kv]`` -> ``[1|h, len_q, len_kv]`` for sequence ``index``."""
    if tensor.dim() != 4:
        raise ValueError(f"{name} must be 4-D [1|b, 1|h, 1|s_q, 1|s_kv], got {tuple(tensor.shape)}")
    per_sequence = tensor[index if tensor.shape[0] > 1 else 0]
    if per_sequence.shape[1] != 1:
        if per_sequence.shape[1] < len_q:
            raise ValueError(f"{name} has {per_sequence.shape[1]} query rows, need {len_q}")
        per_sequence = per_sequence[:, :len_q]
    if per_sequence.shape[2] != 1:
        if per_sequence.shape[2] < len_kv:
            raise ValueError(f"{name} has {per_sequence.shape[2]} key columns, need {len_kv}")
        per_sequence = per_sequence[:, :, :len_kv]
    return per_sequence.expand(per_sequence.shape[0], len_q, len_kv)


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    qkv_format: str,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_kv: Tensor | None = None,
    cu_seqlens_q_padded: Tensor | None = None,
    cu_seqlens_kv_padded: Tensor | None = None,
    attn_mask_type: str = "no_mask",
    window_size: tuple[int, int] | None = None,
    bottom_right_diagonal: bool | None = None,
    softmax_scale: float | None = None,
    alibi_slopes: Tensor | None = None,
    bias: Tensor | None = None,
    bias_type: str = "no_bias",
    attention_mask: Tensor | None = None,
    softmax_offset: Tensor | None = None,
) -> Tensor:
    """Batched attention with TransformerEngine's semantics, fp32, heads flattened.

    Shapes: ``bshd`` q ``[b, s_q, h, d_qk]`` -> ``[b, s_q, h*d_v]``; ``sbhd`` q
    ``[s_q, b, h, d_qk]`` -> ``[s_q, b, h*d_v]``; ``thd`` q ``[t_q, h, d_qk]`` ->
    ``[t_q, h*d_v]``. k/v likewise with ``s_kv``/``t_kv`` and ``h_kv`` heads.

    Semantics:

    - Sequence ``i``'s tokens: bshd/sbhd, the first ``len_i`` positions of batch entry ``i``
      (``len_i`` from ``cu_seqlens_*`` when given, else the full ``s``); thd, rows
      ``[offset_i, offset_i + len_i)`` with ``offset_i`` from ``cu_seqlens_*_padded`` if given,
      else from ``cu_seqlens_*`` (required for thd). Each sequence goes through
      :func:`reference_one_sequence`; every other output position is 0. Only the first
      ``b + 1`` cu_seqlens entries are used for bshd/sbhd.
    - ``causal``/``padding_causal``: causal, top-left. ``*_causal_bottom_right``: causal,
      bottom-right. ``no_mask``/``padding``/``arbitrary``: not causal, aligned by
      ``bottom_right_diagonal`` (None -> True). Bottom-right uses each sequence's own lengths.
      The same alignment applies to the window and to ALiBi.
    - ``bias_type="alibi"``: ``alibi_slopes`` ``[h]`` or ``[b, h]``, defaulting to
      :func:`default_alibi_slopes`. ``post_scale_bias``/``pre_scale_bias``: ``bias``
      ``[1|b, 1|h, 1|s_q, s_kv]`` (dense formats only), sliced to
      ``[i or 0, :, :len_q_i, :len_kv_i]``.
    - ``attention_mask`` (``arbitrary`` only): bool broadcastable to ``[b, h, s_q, s_kv]``,
      True = masked, sliced per sequence like the bias.

    Example::

        >>> q = k = v = torch.randn(2, 5, 4, 8)
        >>> cu = torch.tensor([0, 3, 8], dtype=torch.int32)
        >>> out = reference_attention(q, k, v, qkv_format="bshd", cu_seqlens_q=cu,
        ...                           cu_seqlens_kv=cu, attn_mask_type="padding_causal")
        >>> out.shape, bool(out[0, 3:].eq(0).all())
        (torch.Size([2, 5, 32]), True)
    """
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    if attn_mask_type not in ATTN_MASK_TYPES:
        raise ValueError(f"attn_mask_type must be one of {ATTN_MASK_TYPES}, got {attn_mask_type!r}")
    if bias_type not in BIAS_TYPES:
        raise ValueError(f"bias_type must be one of {BIAS_TYPES}, got {bias_type!r}")
    if bias_type in ("no_bias", "alibi") and bias is not None:
        raise ValueError(f"bias must be None for bias_type={bias_type!r}")
    if bias_type in ("post_scale_bias", "pre_scale_bias") and bias is None:
        raise ValueError(f"bias is required for bias_type={bias_type!r}")
    if bias is not None and qkv_format == "thd":
        raise ValueError("bias is not supported with qkv_format='thd'")
    if alibi_slopes is not None and bias_type != "alibi":
        raise ValueError(f"alibi_slopes requires bias_type='alibi', got {bias_type!r}")
    if attention_mask is not None and attn_mask_type != "arbitrary":
        raise ValueError(f"attention_mask is only used with attn_mask_type='arbitrary', "
                         f"got {attn_mask_type!r}")
    if attn_mask_type == "arbitrary" and attention_mask is None:
        raise ValueError("attention_mask is required for attn_mask_type='arbitrary'")

    expected_dims = 3 if qkv_format == "thd" else 4
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != expected_dims:
            raise ValueError(f"{name} must be {expected_dims}-D for {qkv_format}, "
                             f"got {tuple(tensor.shape)}")

    if qkv_format == "sbhd":
        out_bshd = reference_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            qkv_format="bshd", cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
            attn_mask_type=attn_mask_type, window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal, softmax_scale=softmax_scale,
            alibi_slopes=alibi_slopes, bias=bias, bias_type=bias_type,
            attention_mask=attention_mask, softmax_offset=softmax_offset,
        )
        return out_bshd.transpose(0, 1).contiguous()

    causal = "causal" in attn_mask_type
    if attn_mask_type in ("causal", "padding_causal"):
        bottom_right = False
    elif attn_mask_type.endswith("bottom_right"):
        bottom_right = True
    else:
        bottom_right = True if bottom_right_diagonal is None else bool(bottom_right_diagonal)
    window = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))

    num_heads, head_dim_v = q.shape[-2], v.shape[-1]
    if qkv_format == "thd":
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError("qkv_format='thd' requires cu_seqlens_q and cu_seqlens_kv")
        batch_size = cu_seqlens_q.numel() - 1
        if cu_seqlens_kv.numel() - 1 != batch_size:
            raise ValueError(f"cu_seqlens_q ({cu_seqlens_q.numel()}) and cu_seqlens_kv "
                             f"({cu_seqlens_kv.numel()}) must have the same length")
        lengths_q = _lengths_from_cu_seqlens(cu_seqlens_q, batch_size, "cu_seqlens_q")
        lengths_kv = _lengths_from_cu_seqlens(cu_seqlens_kv, batch_size, "cu_seqlens_kv")
        offsets_q = _offsets_from_cu_seqlens(
            cu_seqlens_q if cu_seqlens_q_padded is None else cu_seqlens_q_padded, batch_size)
        offsets_kv = _offsets_from_cu_seqlens(
            cu_seqlens_kv if cu_seqlens_kv_padded is None else cu_seqlens_kv_padded, batch_size)
        out = torch.zeros(q.shape[0], num_heads * head_dim_v, dtype=torch.float32)
    else:
        batch_size, max_seqlen_q, max_seqlen_kv = q.shape[0], q.shape[1], k.shape[1]
        if k.shape[0] != batch_size or v.shape[0] != batch_size:
            raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
        lengths_q = (_lengths_from_cu_seqlens(cu_seqlens_q, batch_size, "cu_seqlens_q")
                     if cu_seqlens_q is not None else [max_seqlen_q] * batch_size)
        lengths_kv = (_lengths_from_cu_seqlens(cu_seqlens_kv, batch_size, "cu_seqlens_kv")
                      if cu_seqlens_kv is not None else [max_seqlen_kv] * batch_size)
        if max(lengths_q, default=0) > max_seqlen_q or max(lengths_kv, default=0) > max_seqlen_kv:
            raise ValueError(f"cu_seqlens lengths ({lengths_q}, {lengths_kv}) exceed the sequence "
                             f"dims ({max_seqlen_q}, {max_seqlen_kv})")
        out = torch.zeros(batch_size, max_seqlen_q, num_heads * head_dim_v, dtype=torch.float32)

    if bias_type == "alibi":
        slopes = default_alibi_slopes(num_heads) if alibi_slopes is None else alibi_slopes.float()
        if slopes.shape not in ((num_heads,), (batch_size, num_heads)):
            raise ValueError(f"alibi_slopes must be [h] or [b, h] = [{batch_size}, {num_heads}], "
                             f"got {tuple(slopes.shape)}")

    for index in range(batch_size):
        len_q, len_kv = lengths_q[index], lengths_kv[index]
        if qkv_format == "thd":
            start_q, start_kv = offsets_q[index], offsets_kv[index]
            if start_q + len_q > q.shape[0] or start_kv + len_kv > k.shape[0]:
                raise ValueError(f"sequence {index} runs past the token dim of q/k")
            q_i = q[start_q : start_q + len_q]
            k_i, v_i = k[start_kv : start_kv + len_kv], v[start_kv : start_kv + len_kv]
        else:
            q_i, k_i, v_i = q[index, :len_q], k[index, :len_kv], v[index, :len_kv]

        slopes_i = None
        if bias_type == "alibi":
            slopes_i = slopes if slopes.dim() == 1 else slopes[index]
        bias_i = None if bias is None else _slice_for_sequence(bias, index, len_q, len_kv, "bias")
        mask_i = None
        if attention_mask is not None:
            mask_i = _slice_for_sequence(attention_mask, index, len_q, len_kv, "attention_mask")

        out_i = reference_one_sequence(
            q_i, k_i, v_i,
            softmax_scale=softmax_scale, causal=causal, window_size=window,
            bottom_right=bottom_right, alibi_slopes=slopes_i, bias=bias_i,
            bias_type="pre_scale_bias" if bias_type == "pre_scale_bias" else "post_scale_bias",
            mask=mask_i, softmax_offset=softmax_offset,
        ).reshape(len_q, num_heads * head_dim_v)
        if qkv_format == "thd":
            out[start_q : start_q + len_q] = out_i
        else:
            out[index, :len_q] = out_i
    return out
