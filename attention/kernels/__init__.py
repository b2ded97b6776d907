"""Fused Triton attention forward kernels.

`triton_available()` answers without importing Triton; `attention_forward` (and the configuration
helpers) import Triton on first use, so a missing package is a reason, never an import-time crash.

Example:
    >>> from attention.kernels import triton_available, attention_forward
    >>> if triton_available() is None:
    ...     attention_forward(q, k, v, out, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
    ...                       max_seqlen_q=1, max_seqlen_kv=4096, softmax_scale=0.125)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .availability import triton_available

if TYPE_CHECKING:
    from .attention_fwd import attention_forward
    from .combine import combine_splits

__all__ = ["attention_forward", "combine_splits", "triton_available"]

_LAZY = {"attention_forward": ".attention_fwd", "combine_splits": ".combine"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
