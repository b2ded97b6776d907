"""Launching Triton kernels without Triton's per-call argument binding.

``kernel[grid](*args, **constexprs)`` binds and specializes every argument in Python on each call.
On the H200's host a batch-1 decode ``attention_forward`` (attention grid + split combine, two
launches) cost 59.1 µs per call that way and 24.5 µs with the direct launches below (2026-11-30,
commit 9814ca0, docs/results/2026-11-30-h200-9814ca0/overhead.md); an eager decode step launches a
third kernel, the KV append.

A caller that can name everything a launch depends on with a cheap key of its own (the tensors'
metadata and the host scalars: see ``tensor_key``) builds one ``KernelLaunch`` per key: the grid,
the scalar arguments and the constexprs fixed, only the leading tensor arguments passed per call.
Equal keys mean equal scalar arguments and equally aligned tensors, hence the specialization
Triton would pick. The first call goes through Triton (compiling if needed) and keeps the compiled
kernel; later calls hand the arguments straight to its launcher.

``ATTN_TRITON_FAST_LAUNCH=0`` (read at import) sends every call through Triton's path; the
interpreter and launch hooks (profilers such as proton) always take it.

Example:
    >>> launch = KernelLaunch(my_kernel, (blocks, 1, 1), scalars=(n,), constexprs={"BLOCK": 128},
    ...                       options={"num_warps": 4})                    # doctest: +SKIP
    >>> launch(x, y)                                                      # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

import torch
from triton import knobs

__all__ = ["DIRECT_LAUNCH", "KernelLaunch", "tensor_key"]

DIRECT_LAUNCH = os.environ.get("ATTN_TRITON_FAST_LAUNCH", "1") != "0"


def tensor_key(x: torch.Tensor | None) -> tuple | None:
    """What a launch plan depends on in one tensor argument: sizes, strides, dtype, device and whether
    its address is 16-byte aligned (Triton specializes pointers on that). None stays None."""
    if x is None:
        return None
    return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0)


class KernelLaunch:
    """One launch of a Triton JIT function with its grid, scalar arguments and constexprs fixed.

    ``launch(*tensors)`` runs ``fn[grid](*tensors, *scalars, **constexprs, **options)``: the first
    call through Triton, later ones through the compiled kernel's launcher (``DIRECT_LAUNCH``). The
    tensors must keep the dtypes and 16-byte alignment of the first call's (the caller's key).
    """

    __slots__ = ("_direct", "constexprs", "fn", "grid", "options", "scalars")

    def __init__(self, fn: Any, grid: tuple[int, ...], scalars: tuple = (), constexprs: dict | None = None,
                 options: dict | None = None) -> None:
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.scalars = tuple(scalars)
        self.constexprs = dict(constexprs or {})
        self.options = {name: value for name, value in (options or {}).items() if value is not None}
        self._direct: tuple | None = None

    def __call__(self, *tensors: Any) -> None:
        direct = self._direct
        if direct is not None and _no_launch_hooks():
            run, function, metadata, tail = direct
            run(self.grid[0], self.grid[1], self.grid[2], _current_stream(), function, metadata, None, None, None,
                *tensors, *tail)
            return
        kernel = self.fn[self.grid](*tensors, *self.scalars, **self.constexprs, **self.options)
        if DIRECT_LAUNCH and direct is None and _is_compiled_kernel(kernel):
            names = self.fn.arg_names[len(tensors) + len(self.scalars):]
            tail = self.scalars + tuple(self.constexprs[name] for name in names)
            self._direct = (kernel.run, kernel.function, kernel.packed_metadata, tail)


def _is_compiled_kernel(kernel: Any) -> bool:
    """Triton returns the CompiledKernel it launched; the interpreter returns None."""
    return kernel is not None and hasattr(kernel, "packed_metadata") and hasattr(kernel, "function")


def _no_launch_hooks() -> bool:
    """No launch hook is registered (Triton 3.6 keeps them in always-present, usually empty chains)."""
    return not (_hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook))


def _hook_set(hook: Any) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def _current_stream() -> int:
    """The raw CUDA stream Triton itself would launch on: the current device's current stream."""
    return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
