"""Padded bshd/sbhd <-> packed thd by index, for the flash adapters. No host synchronisation.

flash-attn's varlen kernels want the tokens of each sequence back to back (``thd``). A padded
``[b, s, h, d]`` (or ``[s, b, h, d]``) batch is packed into ``b*s`` rows: the first ``cu[b]`` rows
hold the real tokens in order and the remaining rows are filler the kernel never reads (their
count would need a device->host copy to know). Unpacking gathers each padded position from its
packed row and zeroes the padding. All indices come from ``cu_seqlens`` with device ops only, so
the adapters stay CUDA-graph capturable.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _starts_and_lengths(cu_seqlens: Tensor, batch: int) -> tuple[Tensor, Tensor]:
    cu = cu_seqlens[: batch + 1].long()
    return cu[:-1], cu[1:] - cu[:-1]


def pack_padded(x: Tensor, cu_seqlens: Tensor, seq_first: bool) -> Tensor:
    """Padded ``x`` -> packed ``[b*s, h, d]`` (real tokens first, in sequence order).

    ``x``: bshd ``[b, s, h, d]`` (``seq_first=False``) or sbhd ``[s, b, h, d]`` (``seq_first=True``);
    ``cu_seqlens``: int ``[>= b+1]`` real lengths (only the first ``b+1`` entries are used).
    """
    seqlen, batch = (x.shape[0], x.shape[1]) if seq_first else (x.shape[1], x.shape[0])
    rows = batch * seqlen
    if rows == 0:
        return x.reshape((0,) + tuple(x.shape[2:]))
    starts, _ = _starts_and_lengths(cu_seqlens, batch)
    ends = cu_seqlens[1 : batch + 1].long().contiguous()
    packed_row = torch.arange(rows, device=x.device)
    sequence = torch.searchsorted(ends, packed_row, right=True).clamp_(max=batch - 1)
    position = (packed_row - starts[sequence]).clamp_(0, seqlen - 1)
    if seq_first:
        return x[position, sequence]
    return x[sequence, position]


def unpack_to_padded(packed: Tensor, cu_seqlens: Tensor, batch: int, seqlen: int, seq_first: bool) -> Tensor:
    """Inverse of :func:`pack_padded`: ``[>= cu[b], h, d]`` -> ``[b, s, h, d]`` or ``[s, b, h, d]``.

    Positions ``j >= len_i`` of sequence ``i`` come back as zeros.
    """
    if batch * seqlen == 0:
        shape = (seqlen, batch) if seq_first else (batch, seqlen)
        return packed.new_zeros(shape + tuple(packed.shape[1:]))
    starts, lengths = _starts_and_lengths(cu_seqlens, batch)
    position = torch.arange(seqlen, device=packed.device)
    if seq_first:
        index = starts[None, :] + position[:, None]           # [s, b]
        valid = position[:, None] < lengths[None, :]
    else:
        index = starts[:, None] + position[None, :]           # [b, s]
        valid = position[None, :] < lengths[:, None]
    index = torch.where(valid, index, 0).clamp_(max=max(packed.shape[0] - 1, 0))
    out = packed[index]
    return out.masked_fill_(~valid[..., None, None], 0)


def zero_rows_outside_sequences(out: Tensor, cu_seqlens: Tensor, cu_seqlens_padded: Tensor | None = None) -> Tensor:
    """Zero the thd rows of ``out [t, h, d]`` that belong to no sequence: in place, or in a new tensor when
    ``out`` requires grad (flash-attn saves its output for the backward pass, and flash-attn 2 returns a view
    of it: autograd refuses a write into either).

    Sequence ``i`` owns rows ``[start_i, start_i + len_i)`` with ``start_i`` from
    ``cu_seqlens_padded`` (pad between sequences) or ``cu_seqlens``; rows past the last sequence
    or between sequences are left unwritten by flash-attn and must read as zero.
    """
    if out.shape[0] == 0:
        return out
    batch = cu_seqlens.numel() - 1
    row = torch.arange(out.shape[0], device=out.device)
    if cu_seqlens_padded is None:
        valid = row < cu_seqlens[batch].long()
    else:
        _, lengths = _starts_and_lengths(cu_seqlens, batch)
        starts = cu_seqlens_padded[:batch].long()
        sequence = torch.searchsorted(starts, row, right=True) - 1
        owner = sequence.clamp(min=0)
        valid = (sequence >= 0) & (row - starts[owner] < lengths[owner])
    if out.requires_grad:
        return out.masked_fill(~valid[:, None, None], 0)
    return out.masked_fill_(~valid[:, None, None], 0)
