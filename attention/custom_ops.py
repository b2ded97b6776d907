"""``torch.library`` custom ops around the Triton and flash-attn launches, for ``torch.compile``.

Dynamo cannot trace a Triton launch in the interpreter or a flash-attn extension call; as custom
ops with fake (meta) implementations they become single opaque nodes of the graph, so a compiled
forward has no graph break (the pattern of FlashInfer and xFormers):

==================================  ======================================================  ===========
op                                  wraps                                                   result
==================================  ======================================================  ===========
``dpa::fused_attention_forward``    ``attention_fwd.packed_attention_forward`` (kernels)     mutates out
``dpa::flash_attn_func``            ``flash_attn_func`` of flash-attn 2/3/4                 new tensor
``dpa::flash_attn_varlen_func``     ``flash_attn_varlen_func`` (block/page table, seqused)  new tensor
``dpa::flash_attn_with_kvcache``    flash-attn 3's ``flash_attn_with_kvcache``              new tensor
==================================  ======================================================  ===========

The backends call the plain functions below in eager mode (a custom-op dispatch costs ~13 us of
CPU per call) and the ops only while ``torch.compiler.is_compiling()``; both run the same body.
The flash ops import their package only when they run (``flash_probe.probe``), and they have no
autograd formula: the flash backends call flash-attn directly when a backward pass will follow.

Shapes: ``q``/``out`` keep the caller's format (``q_format``: bshd ``[b, s, h, d]``, sbhd
``[s, b, h, d]``, thd ``[t, h, d]``); ``k``/``v`` are in ``kv_format`` (the same three, or
``"cache"``: a non-paged cache ``[b, s_max, h_kv, d]`` or, with ``page_table``, a paged cache
``[pages, page_size, h_kv, d]``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch import Tensor

from attention import devices

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "fused_attention_forward",
           "launcher_views", "on_query_device"]


# ------------------------------------------------------------------------------------------------
# fused: our Triton kernel
# ------------------------------------------------------------------------------------------------

@functools.cache
def _attention_forward() -> Any:
    """The kernel launcher, imported on first use (Triton stays unimported until a fused call)."""
    from attention.kernels.attention_fwd import packed_attention_forward

    return packed_attention_forward


def fused_attention_forward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor,
    cu_seqlens_q: Tensor, cu_seqlens_kv: Tensor,
    q_start: Tensor | None, kv_start: Tensor | None, page_table: Tensor | None,
    q_format: str, kv_format: str, batch: int,
    max_seqlen_q: int, max_seqlen_kv: int, total_q: int, softmax_scale: float,
    causal: bool, window_left: int, window_right: int, bottom_right: bool,
    alibi_slopes: Tensor | None, softmax_offset: Tensor | None, num_splits: int | None = None,
    zero_tail: bool = False,
) -> None:
    """Run the fused kernel, writing the rows of real query tokens of ``out`` (in place; ``[..., h, d_v]``
    in q's format, or with heads flattened ``[..., h * d_v]``); with ``zero_tail`` (thd) also zeros in its
    rows past the last sequence (``cu_seqlens_q[batch]`` on).

    ``q_start`` / ``kv_start``: thd offsets, cu_seqlens-style int32 ``[batch + 1]`` (the last entry is not
    read). ``num_splits``: the split-KV count, or None for the kernel's heuristic. The launcher sees sbhd
    as ``[b, s, h, d]`` (a transposed view) and takes thd ``[t, h, d]`` as it is (``packed_attention_forward``)."""
    q, k, v, out = launcher_views(q, k, v, out, q_format, kv_format)
    _attention_forward()(
        q, k, v, out, batch, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, max_seqlen_q,
        max_seqlen_kv, total_q, softmax_scale, causal, window_left, window_right, bottom_right, alibi_slopes,
        softmax_offset, num_splits, zero_tail,
    )


def launcher_views(q: Tensor, k: Tensor, v: Tensor, out: Tensor, q_format: str,
                   kv_format: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v, out as the launcher reads them: sbhd as ``[b, s, h, d]`` (transposed views), the rest as given."""
    if q_format == "sbhd":
        q, out = q.transpose(0, 1), out.transpose(0, 1)
    if kv_format == "sbhd":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    return q, k, v, out


_fused_op = torch.library.custom_op("dpa::fused_attention_forward", mutates_args=("out",))(fused_attention_forward)


@_fused_op.register_fake
def _fused_fake(q, k, v, out, *args: Any) -> None:
    return None


# ------------------------------------------------------------------------------------------------
# flash-attn 2 / 3 / 4
# ------------------------------------------------------------------------------------------------

def _flash_module(generation: int) -> Any:
    from attention.backends import flash_probe

    package = flash_probe.probe(generation)
    if package.module is None:
        raise RuntimeError(f"flash{generation} cannot run: {package.reason}")
    return package.module


def on_query_device(q: Tensor) -> contextlib.AbstractContextManager:
    """The query's GPU made current when it is not: flash-attn-4 launches on the current device's stream. The flash
    adapter's eager calls enter it, and so does each flash op's body, which a compiled graph runs as called (skipped
    while Dynamo traces, where the device read would break the graph)."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return devices.on_device_of(q)


def _options(generation: int, window_size: list[int] | None, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for the package, minus the ``None`` ones (older releases lack some).

    ``window_size`` arrives with -1 for an unbounded side; flash-attn-4 spells that ``None``.
    """
    options = {key: value for key, value in kwargs.items() if value is not None}
    if window_size is not None:
        left, right = window_size
        options["window_size"] = (
            (None if left < 0 else left, None if right < 0 else right) if generation == 4 else (left, right)
        )
    return options


def _first(result: Any) -> Tensor:
    """flash functions return ``out`` or ``(out, lse, ...)`` depending on generation and release."""
    return result[0] if isinstance(result, (tuple, list)) else result


def flash_attn_func(
    q: Tensor, k: Tensor, v: Tensor, generation: int, softmax_scale: float, causal: bool,
    window_size: list[int] | None = None, dropout_p: float | None = None, alibi_slopes: Tensor | None = None,
    deterministic: bool | None = None, learnable_sink: Tensor | None = None, num_splits: int | None = None,
) -> Tensor:
    """``flash_attn_func`` of flash-attn ``generation`` on bshd tensors: ``[b, s_q, h, d_v]``.

    flash-attn 2 returns ``out``; flash-attn-4 returns ``(out, lse)`` (``lse`` None unless needed)."""
    fa = _flash_module(generation)
    with on_query_device(q):
        out = fa.flash_attn_func(q, k, v, **_options(generation, window_size, softmax_scale=softmax_scale,
                                                     causal=causal, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                                                     deterministic=deterministic, learnable_sink=learnable_sink,
                                                     num_splits=num_splits))
    return _first(out)


def flash_attn_varlen_func(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor | None, max_seqlen_q: int,
    max_seqlen_k: int, generation: int, softmax_scale: float, causal: bool, window_size: list[int] | None = None,
    dropout_p: float | None = None, alibi_slopes: Tensor | None = None, deterministic: bool | None = None,
    seqused_q: Tensor | None = None, seqused_k: Tensor | None = None, block_table: Tensor | None = None,
    page_table: Tensor | None = None, learnable_sink: Tensor | None = None, num_splits: int | None = None,
) -> Tensor:
    """``flash_attn_varlen_func`` on packed ``[t, h, d]`` queries: ``[t_q, h, d_v]``.

    ``block_table`` is flash-attn 2's paged cache, ``page_table``/``seqused_*``/``learnable_sink``
    flash-attn 3/4's (flash-attn 2's varlen function has none of them)."""
    fa = _flash_module(generation)
    with on_query_device(q):
        out = fa.flash_attn_varlen_func(
            q, k, v, **_options(generation, window_size, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale,
                                causal=causal, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                                deterministic=deterministic, seqused_q=seqused_q, seqused_k=seqused_k,
                                block_table=block_table, page_table=page_table, learnable_sink=learnable_sink,
                                num_splits=num_splits))
    return _first(out)


def flash_attn_with_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, page_table: Tensor | None,
    cu_seqlens_q: Tensor, max_seqlen_q: int, generation: int, softmax_scale: float, causal: bool,
    window_size: list[int] | None = None, num_splits: int | None = None,
) -> Tensor:
    """flash-attn 3's ``flash_attn_with_kvcache`` with varlen queries ``[t, h, d]``: ``[t, h, d_v]``."""
    fa = _flash_module(generation)
    with on_query_device(q):
        out = fa.flash_attn_with_kvcache(
            q, k_cache, v_cache, **_options(generation, window_size, cache_seqlens=cache_seqlens,
                                            page_table=page_table, cu_seqlens_q=cu_seqlens_q,
                                            max_seqlen_q=max_seqlen_q, num_splits=num_splits,
                                            softmax_scale=softmax_scale, causal=causal))
    return _first(out)


def _like_query(q: Tensor, v: Tensor) -> Tensor:
    """Every flash entry point returns the query's shape with v's head dim, in q's dtype."""
    return q.new_empty(q.shape[:-1] + (v.shape[-1],))


_flash_func_op = torch.library.custom_op("dpa::flash_attn_func", mutates_args=())(flash_attn_func)
_flash_varlen_op = torch.library.custom_op("dpa::flash_attn_varlen_func", mutates_args=())(flash_attn_varlen_func)
_flash_kvcache_op = torch.library.custom_op("dpa::flash_attn_with_kvcache", mutates_args=())(flash_attn_with_kvcache)


@_flash_func_op.register_fake
def _flash_func_fake(q, k, v, *args: Any, **kwargs: Any) -> Tensor:
    return _like_query(q, v)


@_flash_varlen_op.register_fake
def _flash_varlen_fake(q, k, v, *args: Any, **kwargs: Any) -> Tensor:
    return _like_query(q, v)


@_flash_kvcache_op.register_fake
def _flash_kvcache_fake(q, k_cache, v_cache, *args: Any, **kwargs: Any) -> Tensor:
    return _like_query(q, v_cache)


#: What the backends call: the op under ``torch.compile``, the plain function otherwise.
OPS = {
    "fused_attention_forward": (fused_attention_forward, _fused_op),
    "flash_attn_func": (flash_attn_func, _flash_func_op),
    "flash_attn_varlen_func": (flash_attn_varlen_func, _flash_varlen_op),
    "flash_attn_with_kvcache": (flash_attn_with_kvcache, _flash_kvcache_op),
}


def dispatch(name: str, differentiable: bool = False, eager: bool | None = None) -> Any:
    """The callable for ``name``: its custom op while Dynamo traces, the plain function in eager.

    ``differentiable=True`` (a backward pass will follow) always gets the plain function: the ops
    have no autograd formula, flash-attn's own functions do. ``eager=True``: the caller knows the call
    is not traced (``AttentionCall.eager``), so Dynamo is not asked.
    """
    function, op = OPS[name]
    return op if not (differentiable or eager) and torch.compiler.is_compiling() else function
