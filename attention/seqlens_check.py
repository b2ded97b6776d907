"""Checks of the values in a call's ``cu_seqlens`` and padding masks (their shapes and dtypes are
``attention.inputs``'s).

Offsets past the end of q / k / v make a kernel read or write out of bounds, a ``max_seqlen_q`` below a
sequence's length makes the kernels skip its last rows, and a padding mask with padding before real
tokens (left padding) is read as right padding (its lengths are counted): all silently wrong. Reading
the values costs a host sync on a GPU, so by default they are checked where they already are on the host:

* ``ATTN_CHECK_SEQLENS`` unset: CPU tensors only (free);
* ``ATTN_CHECK_SEQLENS=1``: on every eager call (CUDA too: a host sync a call, for debugging);
* ``ATTN_CHECK_SEQLENS=0``: never.

Never inside torch.compile or a CUDA-graph capture, and not for a KV-cache step, whose cu_seqlens
``InferenceParams`` builds.

Example::

    >>> import torch
    >>> cu = torch.tensor([0, 6, 5], dtype=torch.int32)
    >>> check_cu_seqlens_values("thd", 10, 10, 2, cu, cu, None, None, None, None)
    Traceback (most recent call last):
    ...
    ValueError: cu_seqlens_q must be cumulative lengths: non-decreasing, from 0; got [0, 6, 5]
"""

from __future__ import annotations

from itertools import pairwise

import torch

from attention.environment import getenv
from attention.user_warnings import warn

__all__ = ["check_cu_seqlens_values", "check_padding_mask_values", "values_checked"]

ENV_NAME = "ATTN_CHECK_SEQLENS"


def values_checked(device: torch.device) -> bool:
    """Whether a call on ``device`` reads and checks its cu_seqlens (``ATTN_CHECK_SEQLENS``, see above)."""
    setting = getenv(ENV_NAME)
    if setting is None:
        return device.type == "cpu"
    if setting not in ("0", "1"):
        raise ValueError(f"{ENV_NAME} must be 0 or 1 (unset: check CPU tensors only); got {setting!r}")
    return setting == "1"


def _show(values: list[int], limit: int = 12) -> str:
    if len(values) <= limit:
        return str(values)
    return f"[{', '.join(map(str, values[:limit]))}, ... ({len(values)} entries)]"


def _offsets(name: str, cu: torch.Tensor, batch: int, padded: bool = False) -> list[int]:
    """The first ``batch + 1`` values: non-decreasing, from 0 (cumulative lengths) or, padded, from 0 or more."""
    values = cu[: batch + 1].tolist()
    if any(b < a for a, b in pairwise(values)) or (values[0] < 0 if padded else values[0] != 0):
        expected = "non-decreasing offsets >= 0" if padded else "cumulative lengths: non-decreasing, from 0"
        raise ValueError(f"{name} must be {expected}; got {_show(values)}")
    return values


def _check_side(
    side: str, fmt: str, rows: int, batch: int, cu: torch.Tensor, cu_padded: torch.Tensor | None,
    max_seqlen: int | None, pad_between_seqs: bool | None,
) -> None:
    """One side (``q`` or ``kv``): offsets in bounds, each sequence in its padded slot, none past max_seqlen."""
    name, tensor = f"cu_seqlens_{side}", "query_layer" if side == "q" else "key_layer"
    offsets = _offsets(name, cu, batch)
    lengths = [b - a for a, b in pairwise(offsets)]
    longest = max(lengths, default=0)
    if fmt == "thd":
        starts_name, starts = name, offsets
        if cu_padded is not None:
            starts_name = f"{name}_padded"
            starts = _offsets(starts_name, cu_padded, batch, padded=True)
            if pad_between_seqs is False and starts[:-1] != offsets[:-1]:   # padding after the last: packed (TE)
                raise ValueError(
                    f"pad_between_seqs=False says the sequences are packed, but {starts_name} {_show(starts)} starts "
                    f"them elsewhere than {name} {_show(offsets)}; pass pad_between_seqs=True or None (inferred)"
                )
            for i, (length, (a, b)) in enumerate(zip(lengths, pairwise(starts))):
                if length > b - a:
                    raise ValueError(f"{starts_name} leaves sequence {i} a slot of {b - a} rows for its {length} "
                                     f"tokens ({name})")
        if starts[-1] > rows:
            raise ValueError(f"{starts_name} ends at {starts[-1]}, past {tensor}'s {rows} tokens (dim 0 in thd)")
    elif longest > rows:
        raise ValueError(f"{name} gives sequence {lengths.index(longest)} {longest} tokens, past {tensor}'s {rows} "
                         f"positions (the s dim in {fmt})")
    if max_seqlen is not None and longest > max_seqlen:
        raise ValueError(f"max_seqlen_{side}={max_seqlen} is less than sequence {lengths.index(longest)}'s {longest} "
                         f"tokens ({name}); it must be at least the longest sequence's length")


def check_cu_seqlens_values(
    fmt: str,
    rows_q: int,
    rows_kv: int,
    batch: int,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_kv: torch.Tensor | None,
    cu_seqlens_q_padded: torch.Tensor | None,
    cu_seqlens_kv_padded: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_kv: int | None,
    pad_between_seqs: bool | None = None,
) -> None:
    """Refuse cu_seqlens whose values do not fit the call; reads them (a host sync on CUDA).

    ``rows_q`` / ``rows_kv``: the tokens q and k hold (thd: dim 0) or the positions of a sequence (bshd /
    sbhd: the s dim). Checks the first ``batch + 1`` entries of each given tensor (bshd / sbhd read no
    more, as TE): non-decreasing offsets >= 0 that end within q / k, padded offsets that give each
    sequence at least its length, and each length at most the given ``max_seqlen_q`` / ``max_seqlen_kv``.
    cu_seqlens (cumulative lengths) start at 0; padded offsets may start later, and start each sequence
    where the cu_seqlens do when ``pad_between_seqs`` is False (the caller's promise that no gaps lie between
    sequences; padding after the last one is allowed, as in TE).
    """
    for side, rows, cu, cu_padded, max_seqlen in (
        ("q", rows_q, cu_seqlens_q, cu_seqlens_q_padded, max_seqlen_q),
        ("kv", rows_kv, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv),
    ):
        if cu is not None:
            _check_side(side, fmt, rows, batch, cu, cu_padded, max_seqlen, pad_between_seqs)


def check_padding_mask_values(attention_mask: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
    """Refuse a ``[b, 1, 1, s]`` padding mask (True = padded) with a padded position before a real token: the
    lengths are counted from it, so each row's real tokens must come first (right padding). Warn where every position
    is padded (most likely a keep-mask)."""
    masks = attention_mask if isinstance(attention_mask, (tuple, list)) else (attention_mask,)
    names = ("attention_mask",) if len(masks) == 1 else ("attention_mask[0] (queries)", "attention_mask[1] (keys)")
    for name, mask in zip(names, masks):
        flat = mask.reshape(mask.shape[0], -1)
        if flat.numel() and bool(flat.all()):
            warn(f"{name} marks every position as padded (True = padded), so every output row is zero. A Hugging "
                 "Face attention_mask (1 = keep) means the opposite: pass ~mask.bool()")
        padding_before_real = (flat[:, :-1] & ~flat[:, 1:]).any(-1)
        if bool(padding_before_real.any()):
            row = int(padding_before_real.nonzero()[0, 0])
            raise ValueError(
                f"{name} row {row} pads a position before a real token: a padding mask [b, 1, 1, s] (True = "
                "padded) must be right-padded, each row's real tokens first. For left padding pass the tokens as "
                "thd with cu_seqlens_q_padded / cu_seqlens_kv_padded, or attn_mask_type='arbitrary' with the mask. "
                "(A Hugging Face attention_mask, 1 = keep, means the opposite: pass ~mask.bool().)"
            )
