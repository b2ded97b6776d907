"""Whether the fused backend can take CPU tensors here: tests that hand it some skip, with the reason, where not."""

import pytest
import torch


def cpu_fused_reason() -> str | None:
    """Why the fused backend cannot run CPU tensors here (None: it can): it needs Triton, and on a CUDA host the
    interpreter (conftest sets TRITON_INTERPRET only where CUDA is absent)."""
    from attention.backends.fused import FusedBackend
    from attention.kernels.availability import kernels_interpreted

    reason = FusedBackend().availability_reason()
    if reason is None and torch.cuda.is_available() and not kernels_interpreted():
        reason = "CPU tensors run the fused kernels only under TRITON_INTERPRET=1"
    return reason


def skip_without_cpu_fused() -> None:
    """Skip the calling test unless the fused backend runs CPU tensors here (cpu_fused_reason)."""
    reason = cpu_fused_reason()
    if reason:
        pytest.skip(reason)
