"""Can the Triton kernels run in this process? Answered without importing Triton eagerly."""

from __future__ import annotations

import functools
import importlib.util

import torch

from attention.environment import getenv
from attention.versions import installed_version, parse_version

__all__ = [
    "interpreter_enabled", "interpreter_numpy_conflict", "kernels_interpreted", "note_kernels_defined",
    "triton_available",
]

_kernels_interpreted: bool | None = None
"""What TRITON_INTERPRET meant when the attention kernels were defined (None before): ``triton.jit`` reads it as it
wraps a function, so a later change does not reach them."""


def interpreter_enabled() -> bool:
    """True when TRITON_INTERPRET=1 now, i.e. kernels jitted from here on run on CPU tensors through Triton's
    interpreter (the values Triton reads as on: 1, true, on, yes). The attention kernels' own mode is
    ``kernels_interpreted()``'s."""
    value = getenv("TRITON_INTERPRET")
    return value is not None and value.strip().lower() in ("1", "true", "on", "yes")


def kernels_interpreted() -> bool:
    """Do the attention kernels run in Triton's interpreter? TRITON_INTERPRET as it was when they were defined (the
    first fused call imports them), as it is now before that."""
    defined = _kernels_interpreted
    return interpreter_enabled() if defined is None else defined


def note_kernels_defined() -> None:
    """Called by the first kernel module as it is imported, before its ``triton.jit`` functions are made."""
    global _kernels_interpreted
    if _kernels_interpreted is None:
        _kernels_interpreted = interpreter_enabled()


@functools.cache
def interpreter_numpy_conflict() -> str | None:
    """The reason Triton's interpreter cannot run the kernels with this numpy, or None. Triton before 3.7 converts a
    loop bound (a one-element array in its interpreter) with ``int()``, which numpy 2.4 refuses; every attention
    kernel's key loop has such bounds, the KV append's kernel none (Triton's fix: triton-lang/triton#9171, in 3.7.0).
    Read once: the distribution records take ~2 ms."""
    triton_version, numpy_version = installed_version("triton", "pytorch-triton"), installed_version("numpy")
    triton_release, numpy_release = parse_version(triton_version), parse_version(numpy_version)
    if triton_release is None or numpy_release is None:
        return None
    if triton_release < (3, 7) and numpy_release >= (2, 4):
        return (f"Triton {triton_version}'s interpreter cannot run the kernels with numpy {numpy_version} (numpy 2.4 "
                f"refuses the int() of a one-element array that Triton before 3.7 takes for a loop bound): install "
                f"numpy<2.4 or triton>=3.7")
    return None


def triton_available() -> str | None:
    """Return None when the fused Triton kernels can run here, else the reason they cannot.

    They can run when `triton` is importable and either a CUDA device of compute capability 8.0+
    is present or TRITON_INTERPRET=1 (CPU interpreter, used by the test suite; not Triton < 3.7's
    with numpy >= 2.4, see ``interpreter_numpy_conflict``).

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
    if kernels_interpreted():
        return interpreter_numpy_conflict()
    if not torch.cuda.is_available():
        if _kernels_interpreted is False and interpreter_enabled():
            return ("no CUDA device is visible, and the kernels were defined without TRITON_INTERPRET=1 (Triton reads "
                    "it as it defines them: set it before the process's first fused call)")
        return "no CUDA device is visible (set TRITON_INTERPRET=1 to run the kernels on CPU)"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"the CUDA device has compute capability {major}.{minor}; the kernels need 8.0 or newer"
    return None
