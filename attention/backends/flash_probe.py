"""Finding the installed flash-attn generations, lazily, without ever crashing our import.

Three packages, three module names:

============  ======================  =====================================  ==============================
generation    distribution (pip)      module we call                          install
============  ======================  =====================================  ==============================
2             ``flash-attn``          ``flash_attn.flash_attn_interface``     ``pip install flash-attn``
3             built from source       ``flash_attn_interface``                ``flash-attention/hopper``
4             ``flash-attn-4``        ``flash_attn.cute.interface``           ``pip install flash-attn-4``
============  ======================  =====================================  ==============================

``probe(generation)`` imports the package on first use only (cached) and reports the version
found. On a machine without CUDA nothing is imported: the reason is "needs CUDA", with the install
hint appended when the package is missing too. Before importing flash-attn-4 the probe checks that
``flash_attn/cute/interface.py`` is still the file its distribution installed (flash-attn 2.8.x
ships an old ``flash_attn/cute`` that overwrites it when installed later). Version checks elsewhere
are lower bounds or feature probes, never upper caps.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import mmap
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from attention.versions import installed_version, parse_version

INSTALL_HINTS = {
    2: "flash-attn 2 is not installed (pip install flash-attn --no-build-isolation)",
    3: "flash-attn 3 (module flash_attn_interface) is not installed (build it from flash-attention/hopper)",
    4: "flash-attn-4 is not installed (pip install flash-attn-4)",
}
_MODULES = {2: "flash_attn.flash_attn_interface", 3: "flash_attn_interface", 4: "flash_attn.cute.interface"}
_TOP_LEVEL = {2: "flash_attn", 3: "flash_attn_interface", 4: "flash_attn"}
_DISTRIBUTIONS = {2: ("flash-attn",), 3: ("flash-attn-3", "flash_attn_3", "flashattn-hopper"), 4: ("flash-attn-4",)}
_LABELS = {2: "flash-attn 2", 3: "flash-attn 3", 4: "flash-attn-4"}
#: The interface file each pip distribution owns, checked against its RECORD hash before importing:
#: flash-attn 2 (2.8.x) ships an old ``flash_attn/cute`` of its own, so installing it after
#: flash-attn-4 overwrites flash-attn-4's ``flash_attn/cute/interface.py`` (same path, other code).
_OWNED_FILES = {4: "flash_attn/cute/interface.py"}


@dataclass(frozen=True)
class FlashPackage:
    """What the probe found for one generation.

    ``module`` is the interface module (None when unusable), ``version`` the parsed release numbers
    (None when unknown), ``reason`` why the generation cannot run here (None when it can).
    """

    generation: int
    module: Any = None
    version: tuple[int, ...] | None = None
    version_text: str | None = None
    reason: str | None = None


def format_version(version: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in version)


@functools.cache
def cuda_available() -> bool:
    return torch.cuda.is_available()


def _distribution_version(generation: int) -> str | None:
    return installed_version(*_DISTRIBUTIONS[generation])


def _looks_installed(generation: int) -> bool:
    """Cheap check that imports nothing: a distribution record, or (v3, built in place) the module."""
    if _distribution_version(generation) is not None:
        return True
    if generation == 3:
        return importlib.util.find_spec(_TOP_LEVEL[3]) is not None
    return False


def overwritten_reason(generation: int) -> str | None:
    """Feature probe on the files themselves: is the interface file on disk the one the distribution
    installed (its RECORD sha256)? None when it is, or when there is nothing to compare."""
    owned = _OWNED_FILES.get(generation)
    if owned is None:
        return None
    for name in _DISTRIBUTIONS[generation]:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for entry in files:
            if str(entry).replace("\\", "/") != owned or entry.hash is None or entry.hash.mode != "sha256":
                continue
            try:
                with open(entry.locate(), "rb") as file:
                    data = file.read()
            except OSError:
                return None
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if digest != entry.hash.value:
                return (f"{_LABELS[generation]}'s {owned} was overwritten by another package (flash-attn 2 ships an "
                        f"old flash_attn/cute): reinstall it last (pip install --force-reinstall "
                        f"--no-deps flash-attn-4)")
            return None
    return None


def _import_interface(generation: int) -> tuple[ModuleType | None, str | None]:
    try:
        return importlib.import_module(_MODULES[generation]), None
    except ModuleNotFoundError as error:
        if error.name is not None and _MODULES[generation].startswith(error.name):
            return None, INSTALL_HINTS[generation]
        return None, f"{_LABELS[generation]} is installed but fails to import: {error}"
    except Exception as error:  # a broken build raises ImportError/OSError/RuntimeError
        return None, f"{_LABELS[generation]} is installed but fails to import: {type(error).__name__}: {error}"


@functools.cache
def probe(generation: int) -> FlashPackage:
    """Import generation 2, 3 or 4 once and report what is there (see :class:`FlashPackage`)."""
    if generation not in _MODULES:
        raise ValueError(f"generation must be 2, 3 or 4; got {generation!r}")
    if not cuda_available():
        reason = "needs CUDA (torch.cuda.is_available() is False)"
        if not _looks_installed(generation):
            reason += "; also " + INSTALL_HINTS[generation]
        return FlashPackage(generation, reason=reason)
    if not _looks_installed(generation) and importlib.util.find_spec(_TOP_LEVEL[generation]) is None:
        return FlashPackage(generation, reason=INSTALL_HINTS[generation])
    overwritten = overwritten_reason(generation)
    if overwritten is not None:
        return FlashPackage(generation, version_text=_distribution_version(generation),
                            version=parse_version(_distribution_version(generation)), reason=overwritten)
    module, reason = _import_interface(generation)
    if module is None:
        return FlashPackage(generation, reason=reason)
    text = _distribution_version(generation)
    if text is None:
        top = importlib.import_module(_TOP_LEVEL[generation])
        text = getattr(module, "__version__", None) or getattr(top, "__version__", None)
    return FlashPackage(generation, module=module, version=parse_version(text), version_text=text)


def accepts_keyword(function: Any, keyword: str) -> bool:
    """Feature probe: does ``function`` take ``keyword``? (False when it cannot be inspected.)"""
    try:
        return keyword in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


#: What ``flash_api.cpp``'s ``mha_bwd`` raises in a flash-attn 2 built with ``FLASHATTENTION_DISABLE_BACKWARD``
#: (forward only, as ``scripts/build_flash_attn2.sh`` builds it for the benchmarks); in no other build's binary.
V2_NO_BACKWARD_MESSAGE = b"This flash attention build does not support backward."
#: Kernel names every flash-attn 2 build since 2.0 registers: a forward one, and the prefix of its backward's two
#: dq / dk / dv loops, which a build given the macro through nvcc's flags alone has not compiled.
V2_FORWARD_KERNEL = b"flash_fwd_kernel"
V2_BACKWARD_KERNEL = b"flash_bwd_dq_dk_dv_loop"


@functools.cache
def binary_mentions(path: str | None, text: bytes) -> bool:
    """Feature probe on a compiled extension's bytes (False when there is no file to read); read once per path."""
    if path is None:
        return False
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(text) >= 0
    except (OSError, ValueError):
        return False


def v2_without_backward(extension: str | None = None) -> bool:
    """Was the installed flash-attn 2 (or the extension file given) built forward only? Read in the extension's
    bytes, no kernel launched (so it answers inside a CUDA graph capture too): the refusal its backward raises, or,
    where the macro reached nvcc's files alone (a backward that returns gradients it never wrote), forward kernels
    named and no backward kernel. An extension that names no kernel (stripped) counts as whole."""
    if extension is None:
        spec = importlib.util.find_spec("flash_attn_2_cuda")
        extension = spec.origin if spec is not None else None
    if binary_mentions(extension, V2_NO_BACKWARD_MESSAGE):
        return True
    return binary_mentions(extension, V2_FORWARD_KERNEL) and not binary_mentions(extension, V2_BACKWARD_KERNEL)


@functools.cache
def source_mentions(function: Any, text: str) -> bool:
    """Feature probe on a pure-Python function's source (False when the source is unavailable); read once per
    function and text, since the selection and the call-time probes ask again."""
    try:
        return text in inspect.getsource(function)
    except (OSError, TypeError):
        return False
