"""Host -> device copies of step metadata that do not make the host wait for the GPU.

``cuda_tensor.copy_(cpu_tensor)`` from pageable memory synchronizes the stream: the host then
waits for every kernel already queued (the previous step's layers) before it can prepare the next
step, so eager decoding cannot run ahead of the GPU. Copying from pinned memory with
``non_blocking=True`` queues the copy behind that work instead. The pinned block comes from torch's
caching host allocator, which does not hand it out again before the copy has run.

Example::

    >>> import torch
    >>> from inference.device_upload import upload
    >>> buffer = torch.zeros(3, dtype=torch.int32)
    >>> upload(buffer, torch.tensor([1, 2, 3], dtype=torch.int32))
    >>> buffer
    tensor([1, 2, 3], dtype=torch.int32)
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["upload"]


def upload(destination: Tensor, source: Tensor) -> None:
    """``destination.copy_(source)`` for a CPU ``source``; asynchronous when ``destination`` is on a GPU. A strided
    ``source`` (a box of a larger host table) is pinned as a contiguous copy: pinned with its strides it would
    take the whole span of the table, and torch stages a strided source for a copy to the GPU through pageable
    memory."""
    if destination.is_cuda:
        destination.copy_(source.contiguous().pin_memory(), non_blocking=True)
    else:
        destination.copy_(source)
