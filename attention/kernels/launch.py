"""Launching Triton kernels without re-binding every argument on every call.

``kernel[grid](*args, **constexprs)`` binds and specializes all arguments in Python on each call:
on the H200's host one launch of the ~80-argument attention kernel cost ~160 µs (benchmarks,
2026-11-30). ``CachedLaunch`` compiles through that path once per specialization, keys the
compiled kernel by what Triton specializes on (argument dtypes; 16-byte alignment and int32 range
of pointers and integers; the constexpr values; warps, stages; device) and afterwards launches
the compiled kernel directly (``CompiledKernel[grid](*all_args)``).

Opt-in: ``ATTN_TRITON_FAST_LAUNCH=1`` (read at import) turns it on; otherwise, and in the
interpreter, every launch takes Triton's own path. Measured on the H200 (2026-11-30) it gained
nothing: computing the key in Python costs what Triton's C binder does (host µs per call 3.6x
flash-attn 2's with it, 3.8x without, docs/benchmarks.md).

Example:
    >>> launch = CachedLaunch(my_kernel)                                   # doctest: +SKIP
    >>> launch((blocks,), x, y, n, BLOCK=128, num_warps=4)                 # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .availability import interpreter_enabled

__all__ = ["CachedLaunch", "FAST_LAUNCH", "specialization_key"]

FAST_LAUNCH = os.environ.get("ATTN_TRITON_FAST_LAUNCH", "0") == "1"
_INT32 = (-(1 << 31), 1 << 31)


def _argument_key(value: Any) -> Any:
    """What Triton's binder looks at for one runtime argument (a superset: equal keys, same kernel)."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("u1", value)
    if isinstance(value, int):
        return ("int", _INT32[0] <= value < _INT32[1], value % 16 == 0, value == 1)
    if isinstance(value, float):
        return "fp32"
    return value  # None and other constants are part of the signature as they are


def specialization_key(args: tuple, constexprs: tuple, options: tuple) -> tuple:
    """The cache key of one launch: runtime-argument keys, constexpr values, launch options."""
    return (tuple(_argument_key(a) for a in args), constexprs, options)


class CachedLaunch:
    """A Triton JIT function launched through its compiled kernel once that kernel exists.

    Call it like ``fn[grid](...)``: runtime arguments positionally (all of them, in signature
    order), the constexpr parameters that follow them by name, ``num_warps``/``num_stages``/``maxnreg``/``launch_pdl``.
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._compiled: dict[tuple, Any] = {}

    def __call__(self, grid: tuple, *args: Any, num_warps: int | None = None, num_stages: int | None = None,
                 maxnreg: int | None = None, launch_pdl: bool | None = None, **constexprs: Any) -> None:
        options = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages), ("maxnreg", maxnreg),
                                     ("launch_pdl", launch_pdl)) if v is not None}
        if not FAST_LAUNCH or interpreter_enabled():
            self.fn[grid](*args, **constexprs, **options)
            return
        names = self.fn.arg_names[len(args):]
        ordered = tuple(constexprs[name] for name in names)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        key = specialization_key(args, ordered, (num_warps, num_stages, maxnreg, launch_pdl, device))
        kernel = self._compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, **constexprs, **options)
            if kernel is not None:
                self._compiled[key] = kernel
            return
        # CompiledKernel's launcher reads grid[0], grid[1], grid[2]: pad to three dimensions
        kernel[tuple(grid) + (1,) * (3 - len(grid))](*args, *ordered)
