"""TMA descriptors re-encoded with another L2 promotion (an A/B switch; unset, Triton's own encoding is used).

Triton 3.6 encodes every tensor map with ``CU_TENSOR_MAP_L2_PROMOTION_L2_128B`` (its driver.c, fillTMADescriptor):
on a miss L2 fetches 128 bytes around what a TMA load asked for. ``ATTN_FUSED_HOPPER_PREFILL_L2_PROMOTION`` and
``ATTN_FUSED_HOPPER_DECODE_L2_PROMOTION`` (``none``, ``64``, ``128``, ``256``) set it for the K / V descriptors of
the Hopper prefill and decode kernels, and of the mixed kernel's two parts: a plan wraps those makers in
``Promoted``, and KernelLaunch re-encodes the descriptors it makes from them. Not covered: the mixed-roles kernel,
and decodes over pages of 1-8 tokens (cp.async, no descriptors). The forty-third session measured 256 B on every
descriptor on an H200: decodes 6-10 % slower, M2's prefill part 0.988 (within its rounds' spread).

The map is rewritten in place, in Triton's ``PyCUtensorMap`` object: where its ``tma_desc_cpu_ptr()`` says, else at
offset 128 (where the driver was built with CUDA 13's ``cuda.h``, whose ``CUtensorMap`` is aligned to 128 bytes),
after the object's type and size are checked. Before writing, the map is encoded once more with Triton's own
arguments and compared with the object's bytes; on any difference the descriptor is left as Triton made it, with a
warning. Only direct launches (attention.kernels.launch: a launch's calls after its first) carry re-encoded maps;
where a launch cannot go direct (a Triton whose launcher it does not know, such as 3.9; ``ATTN_TRITON_FAST_LAUNCH=0``;
launch hooks) a warning says the setting is not applied.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any

from attention.environment import getenv

__all__ = ["DECODE_PROMOTION_ENV", "PREFILL_PROMOTION_ENV", "Promoted", "check_environment", "l2_promotion", "promoted",
           "reencode", "warn_not_applied"]

PREFILL_PROMOTION_ENV = "ATTN_FUSED_HOPPER_PREFILL_L2_PROMOTION"
"""The prefill K / V descriptors' L2 promotion (the prefill kernel's, the mixed kernel's prefill part's)."""
DECODE_PROMOTION_ENV = "ATTN_FUSED_HOPPER_DECODE_L2_PROMOTION"
"""The decode K / V descriptors' L2 promotion (the decode kernel's, the mixed kernel's decode part's)."""
_PROMOTIONS = {"none": 0, "64": 1, "128": 2, "256": 3}
"""CUtensorMapL2promotion by the bytes named."""
_TRITON_PROMOTION = 2
_MAP_OFFSET = 128
_MAP_BYTES = 128
_encode_tiled: Any = None
reencoded = 0
"""Tensor maps re-encoded so far (a check that the setting took effect)."""


def l2_promotion(name: str) -> int | None:
    """The CUtensorMapL2promotion that environment variable ``name`` asks for; None when unset (Triton's)."""
    value = (getenv(name) or "").strip().lower()
    if not value:
        return None
    if value not in _PROMOTIONS:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(_PROMOTIONS)} (bytes L2 fetches "
                         "on a TMA load's miss), or unset for Triton's 128")
    return _PROMOTIONS[value]


def check_environment() -> None:
    """Read both promotion variables: a bad value is a ValueError naming it, on any device (the plans read them on
    sm90 GPUs only)."""
    for name in (PREFILL_PROMOTION_ENV, DECODE_PROMOTION_ENV):
        l2_promotion(name)


def promoted(maker: Any, name: str) -> Any:
    """``maker`` with the promotion environment variable ``name`` asks for (itself when unset)."""
    promotion = l2_promotion(name)
    return maker if promotion is None else Promoted(maker, promotion)


def _encoder() -> Any:
    global _encode_tiled
    if _encode_tiled is None:
        function = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                             ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                             ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _encode_tiled = function
    return _encode_tiled


def _encode(target: int, descriptor: Any, meta: dict, promotion: int) -> int:
    """cuTensorMapEncodeTiled into ``target`` with make_tensordesc_arg's arguments and ``promotion``; its CUresult."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    shape = list(descriptor.shape)
    if meta["fp4_padded"]:
        shape[-1] *= 2
    rank = len(shape)
    elem_size = meta["elem_size"]
    dims = (ctypes.c_uint64 * rank)(*reversed(shape))
    strides = (ctypes.c_uint64 * rank)(*[elem_size * s for s in reversed(list(descriptor.strides)[:-1])], 0)
    box = (ctypes.c_uint32 * rank)(*reversed(list(meta["block_size"])))
    element_strides = (ctypes.c_uint32 * rank)(*([1] * rank))
    fill = 1 if descriptor.padding == "nan" else 0  # NAN_REQUEST_ZERO_FMA, as Triton's
    return _encoder()(target, TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], rank, descriptor.base.data_ptr(), dims,
                      strides, box, element_strides, 0, meta["swizzle"], promotion, fill)


def _map_address(tensor_map: Any) -> int | None:
    """The address of the ``CUtensorMap`` inside Triton's ``PyCUtensorMap`` object: its ``tma_desc_cpu_ptr()`` where
    the release has it, else offset 128 of an object of at least 256 bytes aligned to 128; None for anything else."""
    kind = type(tensor_map)
    if kind.__name__ != "PyCUtensorMap":
        return None
    if hasattr(kind, "tma_desc_cpu_ptr"):
        return tensor_map.tma_desc_cpu_ptr()
    if kind.__basicsize__ < _MAP_OFFSET + _MAP_BYTES or id(tensor_map) % 128:
        return None
    return id(tensor_map) + _MAP_OFFSET


def reencode(encoded: list, descriptor: Any, meta: dict, promotion: int) -> None:
    """Re-encode, in place, the tensor map of ``encoded`` (make_tensordesc_arg's: the map object, then shape and
    strides) with ``promotion``; leave it unchanged, with a warning, where the object is not laid out as expected."""
    tensor_map = encoded[0]
    address = _map_address(tensor_map)
    check = ctypes.create_string_buffer(_MAP_BYTES + 128)
    aligned = (ctypes.addressof(check) + 127) // 128 * 128
    if (address is None or _encode(aligned, descriptor, meta, _TRITON_PROMOTION) != 0
            or ctypes.string_at(aligned, _MAP_BYTES) != ctypes.string_at(address, _MAP_BYTES)):
        warnings.warn("L2 promotion: this Triton's tensor map objects are not laid out as expected; "
                      "its descriptors are left as it made them", RuntimeWarning, stacklevel=2)
        return
    global reencoded
    result = _encode(address, descriptor, meta, promotion)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({result}) re-encoding a descriptor with "
                           f"L2 promotion {promotion}")
    reencoded += 1


def warn_not_applied() -> None:
    """Say that a promotion was asked for a launch that Triton's own launcher runs (it encodes the descriptors)."""
    warnings.warn(f"{PREFILL_PROMOTION_ENV} / {DECODE_PROMOTION_ENV}: not applied to a launch that Triton's own "
                  "launcher runs (a Triton release the direct launcher does not know, ATTN_TRITON_FAST_LAUNCH=0, or "
                  "launch hooks): it encodes the descriptors with its own promotion", RuntimeWarning, stacklevel=3)


class Promoted:
    """A descriptor maker whose descriptors KernelLaunch re-encodes with ``l2_promotion``."""

    def __init__(self, maker: Any, l2_promotion: int) -> None:
        self.maker, self.l2_promotion = maker, l2_promotion

    def __call__(self, x: Any) -> Any:
        return self.maker(x)

    def __getattr__(self, name: str) -> Any:   # the maker's geometry (block, rows, ...)
        if name == "maker":   # (not set yet: a copy under construction)
            raise AttributeError(name)
        return getattr(self.maker, name)
