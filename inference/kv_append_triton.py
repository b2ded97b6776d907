"""Triton kernels behind ``kv_append``: the cache append and the non-paged row re-index.

The kernels are jitted lazily, once per value of ``TRITON_INTERPRET``, so tests can run them on
CPU tensors through the interpreter (fp16/fp32 only there) in the same process as GPU code. So they call no
function of ``triton.language`` that Triton jits itself (``tl.sum``, ``tl.zeros``: jitted for the GPU where
Triton was imported without the interpreter, which then refuses to call them): builtins only, and ``_add``, a
reduction's combine function, which the interpreter calls as plain Python and the compiler takes as a JIT function
in either mode.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from attention.devices import current_device_index, on_device_of
from attention.kernels.availability import interpreter_enabled
from attention.kernels.launch import KernelLaunch, tensor_key

__all__ = ["append_triton", "reindex_triton"]


def _add_values(a, b):
    return a + b


_add = triton.runtime.JITFunction(_add_values)
"""``_add_values`` as the compiler's JIT function whatever TRITON_INTERPRET was at import: ``triton.jit`` there
would make it the interpreter's, which the compiler refuses to reference (a process that imported this module
under the interpreter, then compiled the append for the GPU, failed so on a CUDA host)."""


def _append_kernel(
    new_k_ptr, new_v_ptr, k_cache_ptr, v_cache_ptr, page_table_ptr, cu_q_ptr, cu_kv_ptr,
    stride_k_row, stride_k_pos, stride_k_h, stride_k_d,
    stride_v_row, stride_v_pos, stride_v_h, stride_v_d,
    stride_kc_slot, stride_kc_h, stride_kc_d,
    stride_vc_slot, stride_vc_h, stride_vc_d,
    stride_page_table_row,
    num_positions, num_rows, page_size, num_heads, head_dim_k, head_dim_v,
    IS_THD: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per token slot of the new K/V tensors; it copies that token's K and V
    # [h_kv, d] tiles to its cache slot (one launch per step). Slots past a row's new length copy nothing.
    slot_id = tl.program_id(0)
    if IS_THD:
        # The row of packed token `slot_id` = number of sequence ends at or before it.
        rows = tl.arange(0, BLOCK_ROWS)
        ends = tl.load(cu_q_ptr + 1 + rows, mask=rows < num_rows, other=2147483647)
        row = tl.reduce((ends <= slot_id).to(tl.int32), 0, _add)
        row_exists = row < num_rows
        row = tl.minimum(row, num_rows - 1)
        position = slot_id - tl.load(cu_q_ptr + row)
        source_row = slot_id * 0
        source_position = slot_id
    else:
        row = slot_id // num_positions
        position = slot_id % num_positions
        row_exists = row < num_rows
        source_row = row
        source_position = position
    new_len = tl.load(cu_q_ptr + row + 1) - tl.load(cu_q_ptr + row)
    total_len = tl.load(cu_kv_ptr + row + 1) - tl.load(cu_kv_ptr + row)
    valid = row_exists & (position < new_len)
    logical = tl.where(valid, total_len - new_len + position, 0)
    page = tl.load(page_table_ptr + row.to(tl.int64) * stride_page_table_row + logical // page_size)
    cache_slot = page.to(tl.int64) * page_size + logical % page_size
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    # `valid` is a scalar; widen it explicitly (the interpreter of triton 3.9 rejects a scalar-broadcast mask).
    valid_tile = (tl.full([BLOCK_H, BLOCK_D], 0, tl.int32) + valid.to(tl.int32)) != 0
    for which in tl.static_range(2):  # K, then V: the same copy with each tensor's pointers and strides
        if which == 0:
            new_ptr, cache_ptr, head_dim = new_k_ptr, k_cache_ptr, head_dim_k
            stride_row, stride_pos, stride_h, stride_d = stride_k_row, stride_k_pos, stride_k_h, stride_k_d
            stride_slot, stride_cache_h, stride_cache_d = stride_kc_slot, stride_kc_h, stride_kc_d
        else:
            new_ptr, cache_ptr, head_dim = new_v_ptr, v_cache_ptr, head_dim_v
            stride_row, stride_pos, stride_h, stride_d = stride_v_row, stride_v_pos, stride_v_h, stride_v_d
            stride_slot, stride_cache_h, stride_cache_d = stride_vc_slot, stride_vc_h, stride_vc_d
        mask = (heads < num_heads) & (dims < head_dim) & valid_tile
        source = source_row.to(tl.int64) * stride_row + source_position.to(tl.int64) * stride_pos
        tokens = tl.load(new_ptr + source + heads * stride_h + dims * stride_d, mask=mask)
        tl.store(cache_ptr + cache_slot * stride_slot + heads * stride_cache_h + dims * stride_cache_d, tokens,
                 mask=mask)


def _reindex_kernel(
    cache_ptr, destination_ptr, source_ptr, num_moves, num_tokens, stride_row, stride_position,
    elements_per_token, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):
    # Each program owns one (token, element) tile in every row and applies the moves in order,
    # so in-place compaction is safe as long as no source row is an earlier destination.
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    elements = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)[None, :]
    mask = (tokens < num_tokens) & (elements < elements_per_token)
    offsets = tokens.to(tl.int64) * stride_position + elements
    for move in range(num_moves):
        destination = tl.load(destination_ptr + move).to(tl.int64)
        source = tl.load(source_ptr + move).to(tl.int64)
        values = tl.load(cache_ptr + source * stride_row + offsets, mask=mask)
        tl.store(cache_ptr + destination * stride_row + offsets, values, mask=mask)


@functools.cache
def _jitted(interpret: bool) -> tuple:
    del interpret  # the cache key: triton.jit reads TRITON_INTERPRET when it wraps
    return triton.jit(_append_kernel), triton.jit(_reindex_kernel)


def _next_power_of_2(value: int) -> int:
    """triton.next_power_of_2 without its constexpr-function wrapper (~5 µs a call on the host)."""
    return 1 if value <= 1 else 1 << (int(value) - 1).bit_length()


def _kernels() -> tuple:
    return _jitted(interpreter_enabled())


_append_plans: dict[tuple, KernelLaunch | None] = {}
_MAX_PLANS = 256
_NO_PLAN = object()


def append_triton(
    new_k: Tensor,
    new_v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    qkv_format: str,
    cache_layout: int | None = None,
) -> None:
    """Triton version of ``kv_append.append_to_kv_cache`` (same arguments, no host sync). The launch is
    planned once per key of the tensors' metadata and the format (``attention.kernels.launch``).
    ``cache_layout``: as ``append_to_kv_cache``'s, the number that stands for the cache side's metadata."""
    interpret = interpreter_enabled()
    cache_side = cache_layout if cache_layout is not None else (
        tensor_key(k_cache), tensor_key(v_cache), tensor_key(page_table), tensor_key(cu_seqlens_q),
        tensor_key(cu_seqlens_kv))
    key = (tensor_key(new_k), tensor_key(new_v), cache_side, qkv_format, interpret,
           current_device_index() if k_cache.is_cuda else -1)
    launch = _append_plans.get(key, _NO_PLAN)
    if launch is _NO_PLAN:
        launch = _append_launch(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q, qkv_format, interpret)
        if len(_append_plans) >= _MAX_PLANS:
            _append_plans.clear()
        _append_plans[key] = launch
    if launch is not None:
        launch(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_kv)


def _append_launch(new_k: Tensor, new_v: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor,
                   cu_seqlens_q: Tensor, qkv_format: str, interpret: bool) -> KernelLaunch | None:
    """append_triton's launch for tensors of these shapes and strides (None: no token to append)."""
    append_kernel, _ = _jitted(interpret)
    num_rows = cu_seqlens_q.numel() - 1
    page_size = k_cache.shape[1]
    if qkv_format == "thd":
        num_slots, num_positions, row_dim, pos_dim = new_k.shape[0], 1, None, 0
    elif qkv_format == "bshd":
        num_slots, num_positions, row_dim, pos_dim = new_k.shape[0] * new_k.shape[1], new_k.shape[1], 0, 1
    else:
        num_slots, num_positions, row_dim, pos_dim = new_k.shape[0] * new_k.shape[1], new_k.shape[0], 1, 0
    if num_slots == 0:
        return None

    def token_strides(new: Tensor) -> tuple[int, int, int, int]:
        return (0 if row_dim is None else new.stride(row_dim), new.stride(pos_dim), new.stride(-2), new.stride(-1))

    return KernelLaunch(
        append_kernel, (num_slots,),
        scalars=(
            *token_strides(new_k), *token_strides(new_v),
            k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
            v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
            page_table.stride(0),
            num_positions, num_rows, page_size, k_cache.shape[2], k_cache.shape[3], v_cache.shape[3],
        ),
        constexprs={
            "IS_THD": qkv_format == "thd",
            "BLOCK_ROWS": _next_power_of_2(num_rows),
            "BLOCK_H": _next_power_of_2(k_cache.shape[2]),
            "BLOCK_D": _next_power_of_2(max(k_cache.shape[3], v_cache.shape[3])),
        },
    )


def reindex_triton(
    k_cache: Tensor,
    v_cache: Tensor,
    destination_rows: list[int],
    source_rows: list[int],
    num_tokens: int,
) -> None:
    """Triton version of ``kv_append.reindex_kv_cache`` for in-place-safe move lists."""
    _, reindex_kernel = _kernels()
    device = k_cache.device
    with on_device_of(k_cache):   # Triton launches on the current device's stream
        destination = torch.tensor(destination_rows, dtype=torch.int32, device=device)
        source = torch.tensor(source_rows, dtype=torch.int32, device=device)
        for cache in (k_cache, v_cache):
            elements_per_token = cache.shape[2] * cache.shape[3]
            block_e = min(_next_power_of_2(elements_per_token), 1024)
            block_t = max(1, 2048 // block_e)
            grid = (-(-num_tokens // block_t), -(-elements_per_token // block_e))
            # through KernelLaunch for its errors (CPU tensors outside the interpreter, the interpreter's numpy)
            KernelLaunch(
                reindex_kernel, grid,
                scalars=(len(destination_rows), num_tokens, cache.stride(0), cache.stride(1), elements_per_token),
                constexprs={"BLOCK_T": block_t, "BLOCK_E": block_e},
            )(cache, destination, source)
