"""Backend registry, priority, environment variables and the cached choice.

Precedence, highest first: the module's ``backend=`` argument, then ``use_backends(...)`` around a
block of code, then the environment (``NVTE_*``), then the automatic priority. A backend named by
the user never falls back: if it cannot run the call, the error says why.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import operator
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from typing import Any

from attention.backends.base import Backend
from attention.environment import getenv_many
from attention.params import AttentionParams

logger = logging.getLogger("attention")

#: Automatic priority. Within the flash family, TE prefers v3 on Hopper, then v4, then v2.
PRIORITY = ("fused", "flash3", "flash4", "flash2", "unfused")
FAMILIES = {"flash": ("flash3", "flash4", "flash2")}
BACKEND_NAMES = PRIORITY + tuple(FAMILIES)

#: Environment switches (TE's names): "0" disables, "1" allows.
ENV_SWITCHES = {
    "NVTE_FUSED_ATTN": ("fused",),
    "NVTE_FLASH_ATTN": FAMILIES["flash"],
    "NVTE_FLASH_ATTN_V2": ("flash2",),
    "NVTE_FLASH_ATTN_V3": ("flash3",),
    "NVTE_FLASH_ATTN_V4": ("flash4",),
    "NVTE_UNFUSED_ATTN": ("unfused",),
}

NO_BACKEND = "No dot product attention backend is available for the provided inputs."

_context_backends: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "attention_backends", default=None
)


#: The registry's backends; a plain dict so that code torch.compile traces reads it without a cache wrapper.
_BACKENDS: dict[str, Backend] = {}


@functools.cache
def registry() -> dict[str, Backend]:
    """Name -> backend instance. Backends import their optional packages lazily, never here."""
    from attention.backends.flash import Flash2Backend, Flash3Backend, Flash4Backend
    from attention.backends.fused import FusedBackend
    from attention.backends.unfused import UnfusedBackend

    backends = [FusedBackend(), Flash2Backend(), Flash3Backend(), Flash4Backend(), UnfusedBackend()]
    _BACKENDS.update({b.name: b for b in backends})
    return _BACKENDS


def expand_names(names: str | Sequence[str], argument: str = "backend") -> tuple[str, ...]:
    """``"flash"`` -> its generations; validates every name. Keeps the given order."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    elif not isinstance(names, Iterable):
        raise ValueError(f"{argument} must be a backend name or a sequence of them; got {names!r}")
    if not names:
        raise ValueError(f"{argument} must name at least one backend of {BACKEND_NAMES}")
    out: list[str] = []
    for name in names:
        if name not in BACKEND_NAMES:
            raise ValueError(f"{argument}: unknown backend {name!r}; valid names are {BACKEND_NAMES}")
        for member in FAMILIES.get(name, (name,)):
            if member not in out:
                out.append(member)
    return tuple(out)


@contextlib.contextmanager
def use_backends(*names: str | Sequence[str]) -> Iterator[None]:
    """Restrict and order the backends for a block of code (below a module's own ``backend=``). The names as
    separate arguments, or as one sequence or comma-separated string, as ``backend=`` takes them.

    >>> import torch
    >>> from attention import DotProductAttention, use_backends
    >>> attn = DotProductAttention(num_attention_heads=4, kv_channels=16, qkv_format="bshd")
    >>> q = k = v = torch.randn(2, 8, 4, 16)   # bshd
    >>> with use_backends("flash", "unfused"):   # flash needs CUDA tensors: these CPU ones get unfused
    ...     out = attn(q, k, v)
    >>> out.shape, attn.last_backend
    (torch.Size([2, 8, 64]), 'unfused')
    """
    chosen = names[0] if len(names) == 1 else list(names)   # one name, string or sequence: backend='s forms
    token = _context_backends.set(expand_names(chosen, "use_backends"))
    try:
        yield
    finally:
        _context_backends.reset(token)


_ENV_NAMES = (*ENV_SWITCHES, "NVTE_DEBUG", "NVTE_DEBUG_LEVEL")


def env_snapshot() -> tuple[str | None, ...]:
    """The values of every ``NVTE_*`` variable selection reads, read afresh (one pass per call)."""
    return getenv_many(_ENV_NAMES)


def context_backends() -> tuple[str, ...] | None:
    """The backends ``use_backends()`` restricts the current context to (None outside it)."""
    return _context_backends.get()


def env_flag(name: str, value: str | None = None) -> bool:
    value = os.environ.get(name, "1") if value is None else value
    if value not in ("0", "1"):
        raise ValueError(f"environment variable {name} must be 0 or 1; got {value!r}")
    return value == "1"


def env_disabled(env: tuple[str | None, ...] | None = None) -> tuple[str, ...]:
    """Backends the ``NVTE_*`` switches turn off, in priority order."""
    if env is None:   # the form torch.compile traces (select_compiled): one guarded read per switch
        off = {member for var, members in ENV_SWITCHES.items() if not env_flag(var) for member in members}
    else:
        off = {
            member
            for (var, members), value in zip(ENV_SWITCHES.items(), env)
            if not env_flag(var, "1" if value is None else value)
            for member in members
        }
    return tuple(n for n in PRIORITY if n in off)


@functools.lru_cache(maxsize=64)
def _candidates(
    env: tuple[str | None, ...], requested: tuple[str, ...] | None, from_context: tuple[str, ...] | None
) -> tuple[tuple[str, ...], str]:
    disabled = env_disabled(env)          # validates the switches even when a backend is named
    if requested:
        return requested, "backend= argument"
    if from_context:
        return from_context, "use_backends()"
    return tuple(n for n in PRIORITY if n not in disabled), "automatic priority" + (
        f" (disabled by environment: {', '.join(disabled)})" if disabled else ""
    )


def candidates(requested: tuple[str, ...] | None) -> tuple[tuple[str, ...], str]:
    """The ordered backends to try and where that list came from (for messages). The logger is set for
    ``NVTE_DEBUG*`` as they are now, before the choice that may log (outside the cache, so that going back to an
    earlier level takes effect too; a call whose choice is kept logs nothing and sets nothing)."""
    env = env_snapshot()
    configure_logging(env[-2], env[-1])
    return _candidates(env, requested, context_backends())


def all_reasons(params: AttentionParams, names: Sequence[str]) -> dict[str, list[str]]:
    backends = registry()
    return {name: backends[name].support_reasons(params) for name in names}


def format_reasons(params: AttentionParams, reasons: dict[str, list[str]], source: str) -> str:
    lines = [f"Inputs:\n{params.describe()}", f"Backends tried ({source}):"]
    for name, why in reasons.items():
        if why:
            lines.append(f"  {name} is not supported because:")
            lines.extend(f"    - {r}" for r in why)
        else:
            lines.append(f"  {name}: can run these inputs")
    return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def _select(params: AttentionParams, names: tuple[str, ...], source: str, explicit: bool) -> str:
    reasons: dict[str, list[str]] = {}
    for name in names:
        reasons[name] = registry()[name].support_reasons(params)
        if not reasons[name]:
            logger.info("Running with %s backend (%s) for %s", name, source, _short(params))
            logger.debug("%s", format_reasons(params, reasons, source))
            return name
    raise ValueError(f"{_refusal(names, source, explicit)}\n{format_reasons(params, reasons, source)}")


def _refusal(names: Sequence[str], source: str, explicit: bool) -> str:
    """The first line of the error when no backend of ``names`` can run a call."""
    if explicit:
        return (f"Backend {', '.join(names)} was requested ({source}) but cannot run these inputs; "
                "it never falls back to another backend.")
    if not names:   # the NVTE_* switches left nothing to try: the inputs are not the problem
        return ("No dot product attention backend is available: the environment turns every backend off "
                f"({', '.join(f'{var}=0' for var in ENV_SWITCHES if not env_flag(var))}).")
    return f"{NO_BACKEND} Set NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 to log every choice."


def select(params: AttentionParams, requested: tuple[str, ...] | None = None) -> Backend:
    """The backend for ``params`` (cached per params and candidate list). Raises ``ValueError``."""
    names, source = candidates(requested)
    explicit = not source.startswith("automatic")
    return registry()[_select(params, names, source, explicit)]


# --- under torch.compile ---------------------------------------------------------------------------

_PARAM_FIELDS = tuple(f.name for f in fields(AttentionParams))


def select_compiled(params: AttentionParams, requested: tuple[str, ...] | None = None) -> Backend:
    """``select`` for code that ``torch.compile`` traces (the module calls it when
    ``torch.compiler.is_compiling()``): the choice becomes a constant of the graph.

    Dynamo runs ``_select_name_at_trace`` as plain Python once per compilation, so the LRU, the
    logging and ``use_backends``' context variable stay out of the trace. Guarded (a change
    recompiles): dtype, device, the module's attributes, the integer fields (``_static`` specialises
    them: each new batch size / max_seqlen / window / num_splits is a recompilation, so pad the shapes
    to a few sizes), whether dropout is on, and the ``NVTE_*`` switches read here with
    ``os.environ.get`` -- but torch 2.13 guards only the variables that were set when the graph was
    traced. Not guarded: a switch set later, ``use_backends()`` entered after compiling,
    ``clear_cache()``; call ``torch.compiler.reset()``.
    """
    key = tuple(_static(name, getattr(params, name)) for name in _PARAM_FIELDS)
    disabled = env_disabled()   # compared with "0"/"1" here, so Dynamo guards each NVTE_* switch
    name = _select_name_at_trace(key, requested, disabled)
    return _BACKENDS[name]


def _static(name: str, value: Any) -> Any:
    """A field of the selection key as a plain Python value: Dynamo may trace an int or float it has seen change
    (a batch size, max_seqlen, num_splits, window bound, the dropout) as symbolic, and ``_select_name_at_trace``
    takes constants only. ``operator.index`` specialises an int (each new value is a recompilation); the dropout,
    which selection reads only as "any or none", becomes 0.0 or 1.0 (Dynamo cannot specialise a float)."""
    if name == "attention_dropout":
        return 1.0 if value > 0 else 0.0
    if isinstance(value, tuple):
        return tuple(_static(name, item) for item in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return operator.index(value)
    return value


def _select_name_at_trace(key: tuple, requested: tuple[str, ...] | None, disabled: tuple[str, ...]) -> str:
    """The selected backend's name for ``AttentionParams(*key)`` (``select`` reads the environment
    again; ``disabled`` only makes the traced caller compare, and so guard, the switches)."""
    return select(AttentionParams(*key), requested).name


# What torch._dynamo.assume_constant_result(fn) does, without importing torch._dynamo (~1.4 s) here:
# Dynamo calls the function at trace time and puts its result into the graph as a constant.
# tests/test_compile.py fails (ContextVar.get is untraceable) if this stops working.
_select_name_at_trace._dynamo_marked_constant = True  # type: ignore[attr-defined]


def explain_params(params: AttentionParams, requested: tuple[str, ...] | None = None) -> str:
    """The text selection would log or raise for ``params``, plus the choice; runs nothing."""
    names, source = candidates(requested)
    reasons = all_reasons(params, names)
    chosen = next((n for n in names if not reasons[n]), None)
    head = f"Selected backend: {chosen}" if chosen else _refusal(names, source, not source.startswith("automatic"))
    return f"{head}\n{format_reasons(params, reasons, source)}"


_generation = 0


def cache_generation() -> int:
    """How often ``clear_cache`` ran: choices recorded elsewhere (the modules' call plans) are valid
    only within one generation."""
    return _generation


def clear_cache() -> None:
    """Forget cached choices, the modules' call plans included (after installing a package, say).
    Env changes need no clearing."""
    global _generation
    _select.cache_clear()
    _candidates.cache_clear()
    _generation += 1


def _short(p: AttentionParams) -> str:
    return (
        f"{p.qkv_format}/{p.kv_format} {str(p.dtype).replace('torch.', '')} b={p.batch_size} "
        f"h={p.num_heads}/{p.num_gqa_groups} d={p.head_dim_qk}/{p.head_dim_v} "
        f"s={p.max_seqlen_q}/{p.max_seqlen_kv} mask={p.attn_mask_type} kv_cache={p.kv_cache}"
    )


_LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
_FROM_ENV = "read from the environment"   # configure_logging's default (None is an unset variable)
_handler: logging.Handler | None = None
_applied: tuple[str | None, str | None] | None = None   # the (NVTE_DEBUG, NVTE_DEBUG_LEVEL) last applied
_level_set: int | None = None   # the level configure_logging gave the logger (undone when NVTE_DEBUG goes off)
_level_before: int = logging.NOTSET   # the logger's level before that (given back then)
_logging_lock = threading.Lock()   # (threads choosing at once would add a handler each)


def configure_logging(debug: str | None = _FROM_ENV, debug_level: str | None = _FROM_ENV) -> None:
    """Honour ``NVTE_DEBUG``/``NVTE_DEBUG_LEVEL`` (values as the variables hold them, None when unset; read from the
    environment when not given): level = warning/info/debug for 0/1/2. A set ``NVTE_DEBUG_LEVEL`` must be an
    integer, whatever ``NVTE_DEBUG``. The values last applied are kept: the same ones again change nothing.

    Without NVTE_DEBUG=1 the library installs no handler and leaves the logger to the app: turned off again, it
    takes back its handler and gives the logger its earlier level back (unless the app set another since).
    """
    debug = os.environ.get("NVTE_DEBUG") if debug is _FROM_ENV else debug
    debug_level = os.environ.get("NVTE_DEBUG_LEVEL") if debug_level is _FROM_ENV else debug_level
    if (debug, debug_level) == _applied:
        return
    with _logging_lock:
        _apply_logging(debug, debug_level)


def _apply_logging(debug: str | None, debug_level: str | None) -> None:
    global _handler, _applied, _level_set, _level_before
    on = debug is not None and env_flag("NVTE_DEBUG", debug)   # 0 / 1 as the switches: "true" would log nothing
    try:
        level = 0 if debug_level is None else int(debug_level)
    except ValueError:
        raise ValueError("environment variable NVTE_DEBUG_LEVEL must be an integer: 0 (warnings), 1 (info) or 2 "
                         f"(debug; larger counts as 2, below 0 as 0); got {debug_level!r}") from None
    _applied = (debug, debug_level)
    if not on:
        if _handler is not None:
            logger.removeHandler(_handler)
            _handler = None
            if logger.level == _level_set:
                logger.setLevel(_level_before)
            _level_set = None
        return
    if _handler is None:
        _level_before = logger.level
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[%(levelname)s | %(name)s]: %(message)s"))
        logger.addHandler(_handler)
    _level_set = _LOG_LEVELS[min(max(level, 0), 2)]
    logger.setLevel(_level_set)
