"""The fused backend's eager launches, remembered under the module's call plans.

``packed_attention_forward`` finds its kernel plan by a key of every tensor's metadata (sizes, strides,
dtype, device, 16-byte alignment) and the host arguments: about 6 µs of a decode call's host time. Under
one choice of a ``DotProductAttention`` call plan (``attention.call_plans``) most of that key is fixed:
the call signature holds q's sizes, dtype and device, the choice the batch, the query length, the mask,
the window and the split count, and the output is one the backend allocates itself. So the backend keeps
the plans it launched in the choice's dict (``AttentionCall.launches``), by a key of the rest only:

* q's strides and alignment;
* the KV side: with a KV cache, the layout of the cache object's buffers (the layer's K and V caches, the
  page table, the cu_seqlens), keyed once per layer in its ``layout_memo`` when it has one (``InferenceParams``
  does: its buffers keep their metadata for its lifetime); without a cache, k, v and the cu_seqlens;
* ALiBi slopes and sink logits, the KV lengths the split count is sized on (``kv_length_bucket`` of the
  longest, ``mean_kv_length`` of the cache step's ``kv_tokens`` when it has them), the softmax scale,
  whether padding rows are zeroed, the environment the kernels read, the current device.

A hit launches the plan directly (``launch_plan``); a miss takes ``packed_attention_forward`` (which plans,
or finds the plan by its full key) and remembers what it launched.

Example (what a repeated decode call runs)::

    attn = DotProductAttention(32, 128, num_gqa_groups=8, qkv_format="thd", attn_mask_type="padding")
    out = attn(q, k, v, inference_params=params)   # planned; the plan kept under the call's choice
    out = attn(q, k, v, inference_params=params)   # the kept plan, launched
"""

from __future__ import annotations

import torch

from attention.backends.base import AttentionCall
from attention.custom_ops import launcher_views
from attention.devices import current_device_index
from attention.kernels.attention_fwd import (
    kv_length_buckets,
    launch_plan,
    packed_attention_forward,
    plan_environment,
)
from attention.kernels.launch import layout_number, tensor_key

__all__ = ["MAX_LAUNCHES", "run"]

MAX_LAUNCHES = 32
"""Plans kept per choice (all dropped when full: a growing decode's KV length moves to a new key per
``kv_length_bucket``)."""


def run(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, q_starts: torch.Tensor | None,
        kv_starts: torch.Tensor | None, page_table: torch.Tensor | None, q_format: str, kv_format: str, batch: int,
        kv_length: int, total_kv: int | None, total_q: int, causal: bool, window_left: int, window_right: int,
        num_splits: int | None, zero_tail: bool) -> None:
    """Launch the fused kernel for an eager call (arguments as ``custom_ops.fused_attention_forward``'s, the
    call's own ``AttentionCall`` first, and ``total_kv``, the cache step's KV tokens when it has them), through the
    plan kept under the call's choice when there is one."""
    q, k, v, out = launcher_views(q, k, v, out, q_format, kv_format)
    launches = call.launches
    key = None
    if launches is not None:
        key = (q.stride(), q.data_ptr() % 16 == 0, _kv_layout(call, k, v, cu_seqlens_q, cu_seqlens_kv, q_starts,
                                                              kv_starts),
               None if call.alibi_slopes is None else tensor_key(call.alibi_slopes),
               None if call.softmax_offset is None else tensor_key(call.softmax_offset),
               kv_length_buckets(kv_length, total_kv, batch), call.softmax_scale, zero_tail, plan_environment(),
               current_device_index() if q.is_cuda else -1)
        plan = launches.get(key)
        if plan is not None:
            launch_plan(plan, q, k, v, out, cu_seqlens_q, cu_seqlens_kv, q_starts, kv_starts, page_table,
                        call.alibi_slopes, call.softmax_offset, zero_tail)
            return
    plan = packed_attention_forward(
        q, k, v, out, batch, cu_seqlens_q, cu_seqlens_kv, q_starts, kv_starts, page_table, call.max_seqlen_q,
        kv_length, total_q, call.softmax_scale, causal, window_left, window_right, call.params.bottom_right_diagonal,
        call.alibi_slopes, call.softmax_offset, num_splits, zero_tail, total_kv)
    if key is not None and plan is not None:
        if len(launches) >= MAX_LAUNCHES:
            launches.clear()
        launches[key] = plan


def _kv_layout(call: AttentionCall, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_kv: torch.Tensor, q_starts: torch.Tensor | None, kv_starts: torch.Tensor | None) -> object:
    """The key of the KV side's tensors. With a KV cache, of the cache object's own buffers (the views the
    backend takes of them follow from the batch, which the choice fixes): its ``layout_number``, kept in the
    cache's ``layout_memo``."""
    cache = call.inference_params
    if cache is None:
        return (tensor_key(k), tensor_key(v), tensor_key(cu_seqlens_q), tensor_key(cu_seqlens_kv),
                q_starts is cu_seqlens_q or tensor_key(q_starts), kv_starts is cu_seqlens_kv or tensor_key(kv_starts))
    memo = getattr(cache, "layout_memo", None)
    name = ("fused", call.layer_number)
    layout = None if memo is None else memo.get(name)
    if layout is None:
        layout = (tensor_key(call.key), tensor_key(call.value), tensor_key(call.page_table),
                  tensor_key(call.cu_seqlens_q), tensor_key(call.cu_seqlens_kv))
        if memo is not None:
            layout = memo[name] = layout_number(layout)
    return layout
