"""The current CUDA device, and making a tensor's GPU current for a launch.

Triton's launcher and flash-attn-4 launch on the current device's current stream, so a call whose tensors live on
another GPU (a model spread over GPUs in one process) must make their device current first. The read is torch's C
binding: ``torch.cuda.current_device()`` costs a few Python frames on every decode call.

    >>> with on_device_of(torch.zeros(1)):   # a CPU tensor: nothing to make current
    ...     pass
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

__all__ = ["current_device_index", "on_device_of"]

current_device_index = getattr(torch._C, "_cuda_getDevice", lambda: None)
"""``current_device_index()``: the current CUDA device's index; None on CPU builds, which have no binding."""


def on_device_of(tensor: Tensor) -> contextlib.AbstractContextManager:
    """``torch.cuda.device(tensor.device)`` where ``tensor`` is on a GPU other than the current one, else a no-op."""
    if tensor.is_cuda and tensor.get_device() != current_device_index():
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()
