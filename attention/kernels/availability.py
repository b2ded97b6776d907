"""Can the Triton kernels run in this process? Answered without importing Triton eagerly."""

from __future__ import annotations

import importlib.util

import torch

from attention.environment import getenv

__all__ = ["interpreter_enabled", "triton_available"]


def interpreter_enabled() -> bool:
    """True when TRITON_INTERPRET=1, i.e. kernels run on CPU tensors through Triton's interpreter (the
    values Triton reads as on: 1, true, on, yes)."""
    value = getenv("TRITON_INTERPRET")
    return value is not None and value.strip().lower() in ("1", "true", "on", "yes")


def triton_available() -> str | None:
    """Return None when the fused Triton kernels can run here, else the reason they cannot.

    They can run when `triton` is importable and either a CUDA device of compute capability 8.0+
    is present or TRITON_INTERPRET=1 (CPU interpreter, used by the test suite).

    The answer depends on the machine: None on an H200, and on a CPU-only machine without
    TRITON_INTERPRET=1 "no CUDA device is visible (set TRITON_INTERPRET=1 to run the kernels on CPU)".

    Example:
        >>> from attention.kernels import triton_available
        >>> reason = triton_available()
        >>> reason is None or isinstance(reason, str)
        True
    """
    if importlib.util.find_spec("triton") is None:
        return "the `triton` package is not installed (pip install triton)"
    if interpreter_enabled():
        return None
    if not torch.cuda.is_available():
        return "no CUDA device is visible (set TRITON_INTERPRET=1 to run the kernels on CPU)"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"the CUDA device has compute capability {major}.{minor}; the kernels need 8.0 or newer"
    return None
