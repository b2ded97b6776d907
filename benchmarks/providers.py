"""Benchmark providers: one factory per implementation, each computing the same attention.

A factory takes ``(cell, inputs)`` and returns ``(Runner, None)`` or ``(None, reason)`` when it
cannot run the cell (package missing, no CUDA, page size unsupported, ragged lengths, ...). Every
runner computes softmax(q kᵀ / sqrt(d)) v over the cell's sequences with the cell's mask, reading
the same numbers (``cells.Inputs``) through its own layout; ``Runner.to_thd`` brings its output
to ``[total_q, h_q, d_v]`` so the harness can compare it with the reference.

| provider     | call |
|--------------|------|
| fused        | ``attention.kernels.attention_forward`` on the cell's KV (paged / dense / thd), a step's ``total_kv`` |
| fused_dense  | the same on the non-paged cache (paged cells only: the "non-paged" row) |
| fused_dpa    | ``DotProductAttention(backend="fused")`` (selection cached after the first call) |
| auto         | ``DotProductAttention()``: the automatic choice, named in the row's note |
| flash2       | ``flash_attn.flash_attn_with_kvcache`` (decode, chunks) / ``flash_attn_varlen_func`` |
| flash4       | ``flash_attn.cute.interface.flash_attn_varlen_func`` (``page_table``, ``seqused_k``) |
| sdpa_cudnn   | ``F.scaled_dot_product_attention`` under ``sdpa_kernel(CUDNN_ATTENTION)`` on ``[b, h, s, d]`` |
| sdpa_flash   | the same under ``sdpa_kernel(FLASH_ATTENTION)`` |
| unfused      | ``DotProductAttention(backend="unfused")`` (small cells only) |
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from benchmarks.cells import Cell, Inputs
from benchmarks.harness import Runner

__all__ = ["FACTORIES", "StaticKVCache", "flash2_module", "flash4_function"]

Result = tuple[Runner | None, str | None]

FLASH2_PAGE_MULTIPLE = 256
"""flash-attn 2 reads paged caches only with page_size % 256 == 0."""
FLASH4_PAGE_SIZE = 128
"""flash-attn-4 reads paged caches fastest with 128-token pages (its sm90 TMA tile: 4206 vs 3791 GB/s at
page 16 on the H200, DEVICE.md), so it runs its best page size whatever the cell's; ``layout`` says so."""
UNFUSED_MAX_ELEMENTS = 1 << 28
"""The unfused backend materialises fp32 scores [b, h, s_q, s_kv] and K/V [b, h, s_kv, d]: cap each."""


def _is_cuda(inputs: Inputs) -> bool:
    return inputs.device.type == "cuda"


def _thd(out: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    p = inputs.problem
    return out.reshape(p.total_q, p.heads_q, p.head_dim_v)


# ------------------------------------------------------------------------------------------------
# Ours.


def _fused_reason(inputs: Inputs) -> str | None:
    from attention.kernels import triton_available

    return triton_available()


def _fused(cell: Cell, inputs: Inputs, kv_source: str, **overrides: Any) -> Result:
    """``attention_forward`` on the cell's KV; ``overrides`` (``num_splits``, ``config``) reach it as given."""
    reason = _fused_reason(inputs)
    if reason:
        return None, reason
    from attention.kernels import attention_forward

    p = inputs.problem
    batch = p.batch
    q4 = inputs.q.unsqueeze(0).expand(batch, -1, -1, -1)
    kwargs: dict[str, Any] = {
        "cu_seqlens_q": inputs.cu_q, "cu_seqlens_kv": inputs.cu_kv, "q_start": inputs.q_start,
        "max_seqlen_q": p.max_q, "max_seqlen_kv": p.max_kv, "total_q": p.total_q, "total_kv": p.total_kv,
        "softmax_scale": inputs.scale,
        "causal": p.causal, "bottom_right": True, **overrides}
    if kv_source == "paged":
        k, v, kwargs["page_table"] = inputs.paged(cell.page_size)
        layout = f"paged-{cell.page_size}"
    elif kv_source == "dense":
        k, v = inputs.k_dense, inputs.v_dense
        layout = "dense"
    else:
        k_packed, v_packed = inputs.packed_kv()
        k = k_packed.unsqueeze(0).expand(batch, -1, -1, -1)
        v = v_packed.unsqueeze(0).expand(batch, -1, -1, -1)
        kwargs["kv_start"] = inputs.kv_start
        layout = "thd"
    shape = (p.total_q, p.heads_q, p.head_dim_v)

    def run() -> torch.Tensor:
        out = torch.empty(shape, dtype=p.dtype, device=inputs.device)
        attention_forward(q4, k, v, out.unsqueeze(0).expand(batch, -1, -1, -1), **kwargs)
        return out

    return Runner(run, lambda out: out, layout), None


def make_fused(cell: Cell, inputs: Inputs) -> Result:
    return _fused(cell, inputs, cell.kv_source)


def make_fused_dense(cell: Cell, inputs: Inputs) -> Result:
    if cell.kv_source != "paged":
        return None, "the non-paged variant of a paged cell (this cell's own fused row is not paged)"
    return _fused(cell, inputs, "dense")


class StaticKVCache:
    """A read-only stand-in for ``inference.InferenceParams`` over an already filled cache.

    ``DotProductAttention(..., inference_params=cache)`` then attends over the cell's cache without
    appending (``step`` returns the cache as it is), so the timing holds what the module adds on
    top of the kernel (selection, argument plumbing) and nothing else. The real append is measured
    by ``bench_overhead``.
    """

    def __init__(self, inputs: Inputs, page_size: int | None) -> None:
        p = inputs.problem
        self.is_paged = page_size is not None
        self.page_size = page_size
        self.batch_size = self.max_batch_size = p.batch
        self.max_ctx_len = self.longest_step = p.max_q
        self.step_tokens = p.total_q
        self.max_sequence_length = self.longest_sequence = p.max_kv
        self.kv_tokens = p.total_kv
        self.cu_seqlens_q, self.cu_seqlens_kv = inputs.cu_q, inputs.cu_kv
        self.layout_memo: dict = {}   # as InferenceParams's: these buffers keep their metadata
        self._dense = (inputs.k_dense, inputs.v_dense)
        if self.is_paged:
            k, v, table = inputs.paged(page_size)
            self._cache = (k, v)
            self.cache_manager = SimpleNamespace(page_table=table)
        else:
            self._cache = self._dense
            self.cache_manager = SimpleNamespace(page_table=None)

    def step(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str) -> tuple:
        return (*self._cache, self.cu_seqlens_q, self.cu_seqlens_kv, self.max_sequence_length, "thd_2bshd")

    def convert_paged_to_nonpaged(self, layer_number: int,
                                  rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense copy, as InferenceParams's: ``rows`` sequences (the batch by default); the unfused backend asks
        for its batch's rows."""
        k, v = self._dense
        return (k, v) if rows is None else (k[:rows], v[:rows])


def _dpa(cell: Cell, inputs: Inputs, backend: str | None, kv_source: str | None = None) -> Result:
    from attention import DotProductAttention

    p = inputs.problem
    kv_source = kv_source or cell.kv_source
    module = DotProductAttention(
        p.heads_q, (p.head_dim, p.head_dim_v), num_gqa_groups=p.heads_kv, qkv_format="thd",
        attn_mask_type="padding_causal" if p.causal else "padding", layer_number=1,   # a model's layer, named
        backend=backend).to(inputs.device)
    common = {"cu_seqlens_q": inputs.cu_q, "cu_seqlens_kv": inputs.cu_kv, "max_seqlen_q": p.max_q}
    if kv_source == "packed":
        k, v = inputs.packed_kv()
        layout = "thd"

        def run() -> torch.Tensor:
            return module(inputs.q, k, v, max_seqlen_kv=p.max_kv, **common)
    else:
        page_size = cell.page_size if kv_source == "paged" else None
        cache = StaticKVCache(inputs, page_size)
        new_k, new_v = inputs.new_tokens()
        layout = f"paged-{page_size}" if page_size else "dense"

        def run() -> torch.Tensor:
            return module(inputs.q, new_k, new_v, inference_params=cache, **common)

    def chose() -> str:
        return f"→ {module.last_backend}" if backend is None else ""

    return Runner(run, lambda out: _thd(out, inputs), layout, describe=chose,
                  graphable=backend != "unfused"), None


def make_fused_dpa(cell: Cell, inputs: Inputs) -> Result:
    reason = _fused_reason(inputs)
    return (None, reason) if reason else _dpa(cell, inputs, "fused")


def make_auto(cell: Cell, inputs: Inputs) -> Result:
    return _dpa(cell, inputs, None)


def make_unfused(cell: Cell, inputs: Inputs) -> Result:
    p = inputs.problem
    scores = p.batch * p.heads_q * p.max_q * inputs.s_pad
    kv = p.batch * p.heads_q * inputs.s_pad * max(p.head_dim, p.head_dim_v)
    if max(scores, kv) > UNFUSED_MAX_ELEMENTS:
        return None, f"too large for the unfused reference ({max(scores, kv):.1e} fp32 elements > 2^28)"
    return _dpa(cell, inputs, "unfused", "packed" if cell.kv_source == "packed" else "dense")


# ------------------------------------------------------------------------------------------------
# flash-attn 2 and flash-attn-4.


@functools.cache
def flash2_module() -> tuple[Any, str | None]:
    """``flash_attn`` if flash-attn 2 is importable (flash-attn-4 alone also provides ``flash_attn``)."""
    if not torch.cuda.is_available():
        return None, "needs CUDA"
    try:
        module = importlib.import_module("flash_attn")
    except Exception as error:  # noqa: BLE001 - missing or broken build
        return None, f"flash-attn 2 is not importable ({type(error).__name__}: {error})"
    if not hasattr(module, "flash_attn_with_kvcache"):
        return None, "flash-attn 2 is not installed (only flash_attn.cute is present)"
    return module, None


@functools.cache
def flash4_function() -> tuple[Any, str | None]:
    """``flash_attn.cute.interface.flash_attn_varlen_func`` and its readiness."""
    if not torch.cuda.is_available():
        return None, "needs CUDA"
    from attention.backends.flash_probe import overwritten_reason

    overwritten = overwritten_reason(4)   # flash-attn 2 installed later replaces flash_attn/cute/interface.py
    if overwritten:
        return None, overwritten
    try:
        interface = importlib.import_module("flash_attn.cute.interface")
    except Exception as error:  # noqa: BLE001
        return None, f"flash-attn-4 is not importable ({type(error).__name__}: {error})"
    if torch.cuda.get_device_capability()[0] < 9:
        return None, "flash-attn-4 targets sm90+"
    return interface.flash_attn_varlen_func, None


def make_flash2(cell: Cell, inputs: Inputs) -> Result:
    module, reason = flash2_module()
    if module is None:
        return None, reason
    p = inputs.problem
    if p.head_dim != p.head_dim_v:
        return None, "flash-attn 2 needs d_qk == d_v"
    q, scale, causal = inputs.q, inputs.scale, p.causal
    if cell.kv_source == "packed":
        k, v = inputs.packed_kv()

        def run() -> torch.Tensor:
            return module.flash_attn_varlen_func(q, k, v, inputs.cu_q, inputs.cu_kv, p.max_q, p.max_kv,
                                                 softmax_scale=scale, causal=causal)
        return Runner(run, lambda out: out, "thd"), None
    page_size = FLASH2_PAGE_MULTIPLE if cell.page_size and cell.page_size % FLASH2_PAGE_MULTIPLE else cell.page_size
    k, v, table, layout = _cache_kv(cell, inputs, page_size)
    note = "" if table is None or page_size == cell.page_size else \
        f"page {cell.page_size} unsupported (needs a multiple of 256): page {page_size}"
    if p.uniform_q:
        q_batched = q.view(p.batch, p.max_q, p.heads_q, p.head_dim)

        def run() -> torch.Tensor:
            return module.flash_attn_with_kvcache(q_batched, k, v, cache_seqlens=inputs.kv_lens, block_table=table,
                                                 softmax_scale=scale, causal=causal)
        return Runner(run, lambda out: _thd(out, inputs), layout, note), None
    if table is None:
        return None, "mixed query lengths over a non-paged cache: no flash-attn 2 entry point"

    def run_varlen() -> torch.Tensor:
        return module.flash_attn_varlen_func(q, k, v, inputs.cu_q, inputs.cu_kv, p.max_q, p.max_kv,
                                             softmax_scale=scale, causal=causal, block_table=table)
    return Runner(run_varlen, lambda out: out, layout, note), None


def _cache_kv(cell: Cell, inputs: Inputs, page_size: int | None) -> tuple[Any, Any, Any, str]:
    """A competitor's KV cache for a paged or dense cell: ``(k, v, page_table or None, layout)``;
    paged cells are re-paged at ``page_size`` (the competitor's own)."""
    if cell.kv_source == "paged":
        k, v, table = inputs.paged(page_size)
        return k, v, table, f"paged-{page_size}"
    return inputs.k_dense, inputs.v_dense, None, "dense"


def _first(result: Any) -> torch.Tensor:
    return result[0] if isinstance(result, (tuple, list)) else result


def make_flash4(cell: Cell, inputs: Inputs) -> Result:
    function, reason = flash4_function()
    if function is None:
        return None, reason
    p = inputs.problem
    q, scale, causal = inputs.q, inputs.scale, p.causal
    if cell.kv_source == "packed":
        k, v = inputs.packed_kv()

        def run() -> torch.Tensor:
            return _first(function(q, k, v, cu_seqlens_q=inputs.cu_q, cu_seqlens_k=inputs.cu_kv, max_seqlen_q=p.max_q,
                                   max_seqlen_k=p.max_kv, softmax_scale=scale, causal=causal))
        return Runner(run, lambda out: out, "thd"), None
    k, v, table, layout = _cache_kv(cell, inputs, FLASH4_PAGE_SIZE)
    note = "" if table is None or FLASH4_PAGE_SIZE == cell.page_size else f"its fastest page size, {FLASH4_PAGE_SIZE}"
    kwargs = {"seqused_k": inputs.kv_lens, "page_table": table, "max_seqlen_k": p.max_kv, "softmax_scale": scale,
              "causal": causal}
    if p.uniform_q:
        q_batched = q.view(p.batch, p.max_q, p.heads_q, p.head_dim)

        def run_batched() -> torch.Tensor:
            return _first(function(q_batched, k, v, **kwargs))
        return Runner(run_batched, lambda out: _thd(out, inputs), layout, note), None

    def run_varlen() -> torch.Tensor:
        return _first(function(q, k, v, cu_seqlens_q=inputs.cu_q, max_seqlen_q=p.max_q, **kwargs))
    return Runner(run_varlen, lambda out: out, layout, note), None


# ------------------------------------------------------------------------------------------------
# torch SDPA (cuDNN, flash) on contiguous [b, h, s, d].


SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def _sdpa(cell: Cell, inputs: Inputs, which: str) -> Result:
    if not _is_cuda(inputs):
        return None, "needs CUDA"
    p = inputs.problem
    if not (p.uniform_q and p.uniform_kv):
        return None, "ragged lengths: SDPA's flash/cuDNN kernels take no per-sequence lengths"
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    backend = SDPA_BACKENDS[which]
    mask, is_causal = None, False
    if p.causal and p.max_q == p.max_kv:
        is_causal = True
    elif p.causal and p.max_q > 1 and which == "cudnn":
        # torch's lower-right causal bias dispatches to the flash and memory-efficient kernels only; under the cuDNN
        # backend alone it builds the whole boolean mask on every call and runs cuDNN with an arbitrary mask
        # (torch/nn/attention/bias.py, CausalBias._dispatch): not cuDNN's causal kernel
        return None, ("causal with fewer queries than keys (bottom-right): torch reaches cuDNN only through a "
                      "materialised mask")
    elif p.causal and p.max_q > 1:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(p.max_q, p.max_kv)
    scale = inputs.scale
    gqa = p.heads_q != p.heads_kv

    def runner_for(repeat: bool) -> Callable[[], torch.Tensor]:
        q, k, v = inputs.bhsd(repeat_kv=repeat)
        extra = {"enable_gqa": True} if gqa and not repeat else {}

        def run() -> torch.Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                                      **extra)
        return run

    def to_thd(out: torch.Tensor) -> torch.Tensor:
        return out.transpose(1, 2).reshape(p.total_q, p.heads_q, p.head_dim_v)

    run = runner_for(repeat=False)
    try:
        run()
    except RuntimeError as error:
        if not gqa:
            return None, f"{which} cannot run this cell: {' '.join(str(error).split())[:200]}"
        run = runner_for(repeat=True)  # native GQA refused: K/V heads repeated (reads h_q/h_kv x the bytes)
        try:
            run()
        except RuntimeError as error2:
            return None, f"{which} cannot run this cell: {' '.join(str(error2).split())[:200]}"
        return Runner(run, to_thd, "bhsd, kv heads repeated", "enable_gqa refused; K/V repeated"), None
    return Runner(run, to_thd, "bhsd"), None


def make_sdpa_cudnn(cell: Cell, inputs: Inputs) -> Result:
    return _sdpa(cell, inputs, "cudnn")


def make_sdpa_flash(cell: Cell, inputs: Inputs) -> Result:
    return _sdpa(cell, inputs, "flash")


FACTORIES: dict[str, Callable[[Cell, Inputs], Result]] = {
    "fused": make_fused,
    "fused_dense": make_fused_dense,
    "fused_dpa": make_fused_dpa,
    "auto": make_auto,
    "flash2": make_flash2,
    "flash4": make_flash4,
    "sdpa_cudnn": make_sdpa_cudnn,
    "sdpa_flash": make_sdpa_flash,
    "unfused": make_unfused,
}
"""Every provider, by name (``--providers`` takes these names)."""
