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
kernel; later calls hand the tensors' addresses and the fixed arguments straight to its launcher.

Kernels that take TMA descriptors get tensors from the caller and makers of their descriptors
(``descriptors``); the direct path encodes a descriptor once per tensor address.

``ATTN_TRITON_FAST_LAUNCH=0`` (read at import) sends every call through Triton's path; the
interpreter and launch hooks (profilers such as proton) always take it.

Example:
    >>> launch = KernelLaunch(my_kernel, (blocks, 1, 1), scalars=(n,), constexprs={"BLOCK": 128},
    ...                       options={"num_warps": 4})                    # doctest: +SKIP
    >>> launch(x, y)                                                      # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from triton import knobs

from attention.devices import current_device_index
from attention.environment import switch
from attention.kernels.availability import interpreter_numpy_conflict

__all__ = ["DIRECT_LAUNCH", "KernelLaunch", "layout_number", "tensor_key"]

DIRECT_LAUNCH = switch("ATTN_TRITON_FAST_LAUNCH", True)
MAX_ENCODED_ADDRESSES = 8
"""Encoded descriptors kept per descriptor argument (a decode loop's q alternates between a few addresses)."""


_data_ptr = torch.Tensor.data_ptr
_current_device = current_device_index   # (None on CPU builds: no direct launch there)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
"""``_raw_stream(device)``: the raw CUDA stream Triton itself would launch on, the current device's current stream."""


def tensor_key(x: torch.Tensor | None) -> tuple | None:
    """What a launch plan depends on in one tensor argument: sizes, strides, dtype, device and whether
    its address is 16-byte aligned (Triton specializes pointers on that). None stays None."""
    if x is None:
        return None
    return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0)


MAX_LAYOUT_NUMBERS = 2048
"""Layouts numbered at once (the table is dropped when full; numbers given out are never reused)."""
_LAYOUT_NUMBERS: dict[tuple, int] = {}
_next_layout_number = itertools.count()


def layout_number(layout: tuple) -> int:
    """A number for a tuple of ``tensor_key``s, the same for equal tuples and never given to another (numbers are
    not reused when the table is dropped, so no plan kept under a number can match a layout it was not made for).
    A caller whose buffers keep their metadata numbers them once and keys its plans by the number: an int hashes
    in one step, a tuple of five ``tensor_key``s in ~0.4 µs.

    Example:
        >>> a, b = torch.zeros(4, 2), torch.zeros(4, 2)
        >>> layout_number((tensor_key(a),)) == layout_number((tensor_key(b),))
        True
    """
    number = _LAYOUT_NUMBERS.get(layout)
    if number is None:
        if len(_LAYOUT_NUMBERS) >= MAX_LAYOUT_NUMBERS:
            _LAYOUT_NUMBERS.clear()
        number = _LAYOUT_NUMBERS[layout] = next(_next_layout_number)
    return number


class KernelLaunch:
    """One launch of a Triton JIT function with its grid, scalar arguments and constexprs fixed.

    ``launch(*tensors)`` runs ``fn[grid](*tensors, *scalars, **constexprs, **options)``: the first
    call through Triton, later ones through the compiled kernel's launcher (``DIRECT_LAUNCH``). The
    tensors must keep the dtypes and 16-byte alignment of the first call's (the caller's key).

    ``descriptors``: makers of the TMA descriptors that the kernel's first ``len(descriptors)``
    arguments are. The caller passes tensors there and the kernel gets ``maker(tensor)``, a
    ``TensorDescriptor`` of a geometry that the caller's key fixes. Only a tensor's address can vary,
    so the direct path encodes each address's descriptor once (a KV cache's address is the same every
    decode step; Triton's path makes and encodes every descriptor at every launch).
    """

    __slots__ = ("_device", "_direct", "_encode_descriptor", "_encoded", "constexprs", "descriptors", "fn", "grid",
                 "options", "scalars")

    def __init__(self, fn: Any, grid: tuple[int, ...], scalars: tuple = (), constexprs: dict | None = None,
                 options: dict | None = None, descriptors: Sequence[Callable[[torch.Tensor], Any]] = ()) -> None:
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.scalars = tuple(scalars)
        self.constexprs = dict(constexprs or {})
        self.options = {name: value for name, value in (options or {}).items() if value is not None}
        self.descriptors = tuple(descriptors)
        self._direct: tuple | bool | None = None
        """(launch function, its leading arguments, tail) once the first call compiled; False: Triton's path always."""
        self._encoded: tuple[tuple[Any, dict[int, list]], ...] = ()
        """Per descriptor argument: (Triton's metadata of it, its encoded launch arguments by tensor address)."""
        self._encode_descriptor: Callable[[Any, Any], list] | None = None
        self._device: int | None = None
        """The CUDA device of the first call's tensors (the caller's key fixes it for later calls); None on CPU (no
        direct launch there: the interpreter)."""

    def __call__(self, *tensors: Any) -> None:
        direct = self._direct
        if direct and _no_launch_hooks():
            device = _current_device()
            if device != self._device:
                # tensors on a GPU other than the current one (a model spread over GPUs in one process): Triton,
                # and the launcher below, run on the current device's stream
                with torch.cuda.device(self._device):
                    return self(*tensors)
            run, head, tail = direct
            # addresses, not tensors: the launcher would call data_ptr() and ask the driver about each one
            # (cuPointerGetAttribute); the first call's checks hold for every tensor of the caller's key
            if self._encoded:
                addresses = self._encode(tensors) + list(map(_data_ptr, tensors[len(self._encoded):]))
            else:
                addresses = map(_data_ptr, tensors)   # (map: about half a list comprehension's time)
            run(self.grid[0], self.grid[1], self.grid[2], _raw_stream(device), *head, *addresses, *tail)
            return
        if self._device is None and tensors[0].is_cuda:
            self._device = tensors[0].device.index
        if self._device is not None and _current_device() != self._device:
            with torch.cuda.device(self._device):
                return self(*tensors)
        if self._device is None and _compiles_for_a_gpu(self.fn):
            # CPU tensors: Triton's own error names neither the kernel nor the cause
            raise ValueError(f"{_name(self.fn)} got CPU tensors, which the Triton kernels take only in Triton's "
                             "interpreter (TRITON_INTERPRET=1, set before they are first used); move the tensors to "
                             "CUDA")
        made = [maker(x) for maker, x in zip(self.descriptors, tensors)]
        try:
            kernel = self.fn[self.grid](*made, *tensors[len(made):], *self.scalars, **self.constexprs, **self.options)
        except Exception as error:
            # the interpreter of Triton < 3.7 with numpy >= 2.4 fails in the kernels that take a loop bound from a
            # tensor, with "only 0-dimensional arrays can be converted to Python scalars" (a TypeError, or Triton's
            # InterpreterError around it); the others run
            conflict = self._device is None and "0-dimensional arrays" in str(error) and interpreter_numpy_conflict()
            if conflict:
                raise RuntimeError(f"{_name(self.fn)} cannot run: {conflict}") from error
            raise
        if DIRECT_LAUNCH and direct is None and _is_compiled_kernel(kernel):
            names = self.fn.arg_names[len(tensors) + len(self.scalars):]
            tail = self.scalars + tuple(self.constexprs[name] for name in names)
            self._direct = self._direct_launch(kernel, tail) or False
        if not self._direct and any(getattr(maker, "l2_promotion", None) is not None for maker in self.descriptors):
            from . import tma_promotion

            tma_promotion.warn_not_applied()

    def _direct_launch(self, kernel: Any, tail: tuple) -> tuple | None:
        """(launch function, its arguments between the stream and the tensors, the tail) for later calls; None
        leaves them to Triton (descriptors and a launcher this module cannot hand them to encoded)."""
        raw = _raw_launcher(kernel.run)
        if raw is None:
            if self.descriptors:
                return None
            return kernel.run, (kernel.function, kernel.packed_metadata, None, None, None), tail
        launch, cooperative, pdl, encode = raw
        if self.descriptors:
            metas = tuple(getattr(kernel.metadata, "tensordesc_meta", None) or ())
            if encode is None or len(metas) != len(self.descriptors) or None in metas:
                return None
            self._encoded = tuple((meta, {}) for meta in metas)
            self._encode_descriptor = encode
        # the launcher's own arguments: cooperative, PDL, two scratch buffers (none), metadata, three hook slots
        return launch, (kernel.function, cooperative, pdl, None, None, kernel.packed_metadata, None, None, None), tail

    def _encode(self, tensors: tuple) -> list:
        """The encoded arguments of the descriptors made from the leading tensors."""
        arguments: list = []
        for maker, (meta, by_address), x in zip(self.descriptors, self._encoded, tensors):
            address = x.data_ptr()
            encoded = by_address.get(address)
            if encoded is None:
                if len(by_address) >= MAX_ENCODED_ADDRESSES:
                    by_address.clear()
                descriptor = maker(x)
                encoded = self._encode_descriptor(descriptor, meta)
                promotion = getattr(maker, "l2_promotion", None)
                if promotion is not None:   # (tma_promotion.Promoted)
                    from . import tma_promotion

                    tma_promotion.reencode(encoded, descriptor, meta, promotion)
                by_address[address] = encoded
            arguments += encoded
        return arguments


def _raw_launcher(run: Any) -> tuple[Any, bool, bool, Callable | None] | None:
    """Triton 3.6's CudaLauncher ``run`` taken apart: (its C launch function, cooperative, PDL, the function that
    encodes a descriptor argument, or None when the kernel has none), or None where its layout is not that one
    or the kernel needs scratch buffers (``run`` allocates them per launch)."""
    launch = getattr(run, "launch", None)
    if launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    try:
        from triton.backends.nvidia import driver
    except ImportError:
        return None
    if getattr(driver, "_BASE_ARGS_FORMAT_LEN", None) != 13:
        return None
    code = getattr(launch, "__code__", None)
    if code is None:  # the C function itself: no descriptor arguments
        return launch, run.launch_cooperative_grid, run.launch_pdl, None
    cells = dict(zip(code.co_freevars, launch.__closure__ or ()))  # wrap_handle_tensordesc's wrapper
    encode = getattr(driver, "make_tensordesc_arg", None)
    if "launcher" not in cells or encode is None or len(inspect.signature(encode).parameters) != 2:
        return None
    return cells["launcher"].cell_contents, run.launch_cooperative_grid, run.launch_pdl, encode


def _name(fn: Any) -> str:
    """The kernel's name for an error (tests' stand-ins have none)."""
    return getattr(fn, "__name__", "a Triton kernel")


def _compiles_for_a_gpu(fn: Any) -> bool:
    """Is ``fn`` a Triton function jitted to compile (not for the interpreter, the one mode that takes CPU tensors)?
    ``triton.jit`` reads TRITON_INTERPRET as it wraps a function: the attention kernels at their first import, the KV
    append's per mode. (Tests' recording stand-ins are neither.)"""
    from triton.runtime.jit import JITFunction

    return isinstance(fn, JITFunction)


def _is_compiled_kernel(kernel: Any) -> bool:
    """Triton returns the CompiledKernel it launched; the interpreter returns None."""
    return kernel is not None and hasattr(kernel, "packed_metadata") and hasattr(kernel, "function")


def _no_launch_hooks() -> bool:
    """No launch hook is registered (Triton 3.6 keeps them in always-present, usually empty chains)."""
    return not (_hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook))


def _hook_set(hook: Any) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))

