"""qkv formats and the conversions between them.

``bshd`` is ``[b, s, h, d]``, ``sbhd`` is ``[s, b, h, d]`` and ``thd`` is ``[t, h, d]`` with the
sequences concatenated along ``t``; ``cu_seqlens`` (int32 ``[b+1]``) hold cumulative real lengths and
``cu_seqlens_padded`` the offsets of each sequence when pad tokens sit between them. Nothing here
synchronises with the device: index tensors are built from ``cu_seqlens`` and host-side maxima.
"""

from __future__ import annotations

import torch

QKV_FORMATS = ("bshd", "sbhd", "thd")


def check_format(qkv_format: str) -> str:
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}; got {qkv_format!r}")
    return qkv_format


def batch_and_seqlen(x: torch.Tensor, qkv_format: str) -> tuple[int, int]:
    """``(b, s)`` of a 4-D bshd/sbhd tensor."""
    return (x.shape[0], x.shape[1]) if qkv_format == "bshd" else (x.shape[1], x.shape[0])


def cu_seqlens_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """``[b]`` lengths -> int32 ``[b+1]`` cumulative lengths starting at 0."""
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu[1:] = torch.cumsum(lengths, 0)
    return cu


def has_own_offsets(cu_seqlens_q: torch.Tensor | None, cu_seqlens_kv: torch.Tensor | None,
                    cu_seqlens_q_padded: torch.Tensor | None, cu_seqlens_kv_padded: torch.Tensor | None) -> bool:
    """Do thd offsets (``cu_seqlens_*_padded``) other than the cu_seqlens tensors themselves come with the call?
    (Read from the objects, no values: the inferred ``pad_between_seqs``.)"""
    return ((cu_seqlens_q_padded is not None and cu_seqlens_q_padded is not cu_seqlens_q)
            or (cu_seqlens_kv_padded is not None and cu_seqlens_kv_padded is not cu_seqlens_kv))


def full_cu_seqlens(batch_size: int, seqlen: int, device: torch.device) -> torch.Tensor:
    """cu_seqlens of ``batch_size`` sequences all of length ``seqlen``: ``[0, s, 2s, ...]``."""
    if seqlen == 0:   # arange takes no step of 0
        return torch.zeros(batch_size + 1, dtype=torch.int32, device=device)
    return torch.arange(0, (batch_size + 1) * seqlen, seqlen, dtype=torch.int32, device=device)


def lengths_from_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """TE padding mask ``[b, 1, 1, s]`` (True = padded) -> int32 ``[b]`` real lengths."""
    return (~mask.reshape(mask.shape[0], -1)).sum(-1, dtype=torch.int32)


def _token_index(starts: torch.Tensor, lengths: torch.Tensor, max_seqlen: int) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(max_seqlen, device=starts.device)
    index = starts.long()[:, None] + positions[None, :]
    valid = positions[None, :] < lengths.long()[:, None]
    return index, valid


def to_padded(
    x: torch.Tensor,
    qkv_format: str,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    cu_seqlens_padded: torch.Tensor | None = None,
) -> torch.Tensor:
    """Any format -> ``[b, max_seqlen, h, d]`` with each sequence at the start of its row.

    bshd/sbhd are views (the caller masks with cu_seqlens); thd tokens are gathered and the
    rows past each sequence's length are zero.
    """
    if qkv_format == "bshd":
        return x
    if qkv_format == "sbhd":
        return x.transpose(0, 1)
    starts = (cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens)[:-1]
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    index, valid = _token_index(starts, lengths, max_seqlen)
    index = torch.where(valid, index, 0).clamp_(max=max(x.shape[0] - 1, 0))
    if x.shape[0] == 0:   # no tokens: zeros, kept in x's autograd graph by its (empty, 0) sum
        return x.new_zeros(index.shape + x.shape[1:]) + x.sum()
    # where, not a product: the rows gathered for padding slots may hold NaN / inf (0 * NaN is NaN)
    return torch.where(valid[..., None, None], x[index], 0)


def from_padded(
    y: torch.Tensor,
    qkv_format: str,
    cu_seqlens: torch.Tensor,
    num_tokens: int,
    cu_seqlens_padded: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[b, s, h, d]`` -> the format ``qkv_format`` (inverse of ``to_padded``); thd has ``num_tokens`` rows
    and zeros wherever no sequence token lives."""
    if qkv_format == "bshd":
        return y
    if qkv_format == "sbhd":
        return y.transpose(0, 1)
    starts = (cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens)[:-1]
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    index, valid = _token_index(starts, lengths, y.shape[1])
    out = y.new_zeros((num_tokens,) + y.shape[2:])
    # Invalid positions scatter into a scratch row past the end, dropped afterwards.
    index = torch.where(valid, index, num_tokens)
    scratch = torch.cat([out, y.new_zeros((1,) + y.shape[2:])])
    scratch = scratch.index_copy(0, index.reshape(-1), y.reshape((-1,) + y.shape[2:]))
    return scratch[:num_tokens]


def valid_token_mask(cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """bool ``[b, max_seqlen]``: True where position ``i < len_b``."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.arange(max_seqlen, device=cu_seqlens.device)[None, :] < lengths[:, None]
