"""Padded bshd/sbhd <-> packed thd by index, for the flash adapters. No host synchronisation.

flash-attn's varlen kernels want the tokens of each sequence back to back (``thd``). A padded
``[b, s, h, d]`` (or ``[s, b, h, d]``) batch is packed into ``b*s`` rows: the first ``cu[b]`` rows
hold the real tokens in order and the remaining rows are filler the kernel never reads (their
count would need a device->host copy to know). Unpacking gathers each padded position from its
packed row and zeroes the padding. All indices come from ``cu_seqlens`` with device ops only, so
the adapters stay CUDA-graph capturable.
"""

from __future__ import annotations

from typing import Any

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


def rows_in_sequences(rows: int, cu_seqlens: Tensor, cu_seqlens_padded: Tensor | None = None) -> Tensor:
    """bool ``[rows]``: the thd rows some sequence owns. Sequence ``i`` owns ``[start_i, start_i + len_i)``, with
    ``start_i`` from ``cu_seqlens_padded`` (pad between sequences) or ``cu_seqlens``; rows past the last sequence
    or between sequences belong to none."""
    batch = cu_seqlens.numel() - 1
    row = torch.arange(rows, device=cu_seqlens.device)
    if cu_seqlens_padded is None:
        return row < cu_seqlens[batch].long()
    _, lengths = _starts_and_lengths(cu_seqlens, batch)
    starts = cu_seqlens_padded[:batch].long()
    sequence = torch.searchsorted(starts, row, right=True) - 1
    owner = sequence.clamp(min=0)
    return (sequence >= 0) & (row - starts[owner] < lengths[owner])


def zero_rows_outside_sequences(out: Tensor, cu_seqlens: Tensor, cu_seqlens_padded: Tensor | None = None,
                                owned: Tensor | None = None) -> Tensor:
    """Zero the thd rows of ``out [t, h, d]`` that belong to no sequence (:func:`rows_in_sequences`, or ``owned``
    when the caller has it), which flash-attn leaves unwritten: in place, or in a new tensor when ``out`` requires
    grad (flash-attn saves its output for the backward pass, and flash-attn 2 returns a view of it: autograd
    refuses a write into either)."""
    if out.shape[0] == 0:
        return out
    if owned is None:
        owned = rows_in_sequences(out.shape[0], cu_seqlens, cu_seqlens_padded)
    outside = ~owned[:, None, None]
    return out.masked_fill(outside, 0) if out.requires_grad else out.masked_fill_(outside, 0)


class _ZeroGradientsOutsideSequences(torch.autograd.Function):
    """The identity; its backward zeroes the gradient rows no sequence owns."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, owned: Tensor) -> Tensor:
        ctx.save_for_backward(owned)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (owned,) = ctx.saved_tensors
        return grad.masked_fill(~owned[:, None, None], 0), None


def zero_gradients_outside_sequences(x: Tensor, owned: Tensor) -> Tensor:
    """``x [t, h, d]`` as flash-attn's input, with the gradient of the rows outside ``owned`` (bool ``[t]``,
    :func:`rows_in_sequences`) zeroed on the way back (``x`` itself when it needs none). flash-attn's backward
    passes allocate dq / dk / dv with ``empty_like`` and write only the sequences' rows: the others hold garbage,
    which would reach the caller's thd padding, or a real token through :func:`pack_padded`'s filler rows (clamped
    to the last sequence's last position)."""
    if not (x.requires_grad and torch.is_grad_enabled()) or x.shape[0] == 0:
        return x
    return _ZeroGradientsOutsideSequences.apply(x, owned)
