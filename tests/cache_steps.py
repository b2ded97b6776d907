"""Step inputs and outputs of KV-cache steps in each qkv format, shared by the cache-step tests.

A step brings ``n`` new tokens for each of its sequences. thd packs them back to back; bshd / sbhd left-align
them in a zero-padded batch of ``max(n)`` rows, one batch row per sequence in the step's order.

Example::

    >>> new = {"a": [torch.ones(2, 1, 4)] * 3, "b": [torch.ones(1, 1, 4)] * 3}
    >>> [t.shape for t in step_inputs("sbhd", new, torch.float32, "cpu")][0]
    torch.Size([2, 2, 1, 4])
"""

from __future__ import annotations

import torch

__all__ = ["step_inputs", "step_rows"]


def step_inputs(fmt: str, new: dict[str, list[torch.Tensor]], dtype: torch.dtype,
                device: str) -> tuple[torch.Tensor, ...]:
    """The step's q / k / v on ``device`` from ``new`` (sequence -> ``[q, k, v]``, each ``[n, heads, dim]``):
    packed (thd) or left-aligned in a zero-padded batch (bshd ``[b, max n, heads, dim]``, sbhd transposed)."""
    if fmt == "thd":
        return tuple(torch.cat([tensors[i] for tensors in new.values()]).to(device, dtype) for i in range(3))
    longest = max(tensors[0].shape[0] for tensors in new.values())
    batch = []
    for i in range(3):
        padded = torch.zeros(len(new), longest, *next(iter(new.values()))[i].shape[1:], dtype=dtype, device=device)
        for row, tensors in enumerate(new.values()):
            padded[row, : tensors[i].shape[0]] = tensors[i]
        batch.append(padded.transpose(0, 1).contiguous() if fmt == "sbhd" else padded)
    return tuple(batch)


def step_rows(fmt: str, out: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Each sequence's new rows of a step's output, ``[n, h * d_v]``, in the step's order."""
    if fmt == "thd":
        return list(torch.split(out, lengths))
    if fmt == "sbhd":
        out = out.transpose(0, 1)
    return [out[row, :n] for row, n in enumerate(lengths)]
