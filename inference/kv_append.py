"""Cache append and row re-index: a torch implementation (any device) and Triton on CUDA.

Both caches are seen as pages: a paged cache is ``[total_num_pages, page_size, h_kv, d]`` with
``page_table[row, p // page_size]`` naming the page of logical position ``p``; a non-paged cache
``[max_batch_size, max_sequence_length, h_kv, d]`` is the same thing with one page per row
(``page_size = max_sequence_length``, ``page_table = [[0], [1], ...]``). For batch row ``i`` with
``new_len = cu_seqlens_q[i+1] - cu_seqlens_q[i]`` and ``total = cu_seqlens_kv[i+1] -
cu_seqlens_kv[i]`` (lengths after this step), new token ``j`` goes to position
``total - new_len + j``.

``append_to_kv_cache`` is registered as the custom op ``torch.ops.inference.append_to_kv_cache``
(mutating ``k_cache`` and ``v_cache``), so it traces under ``torch.compile``; on CUDA it launches
one Triton kernel that reads all metadata from device buffers, so a decode step can be captured
in a CUDA graph.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["append_to_kv_cache", "reindex_kv_cache", "triton_is_available"]

IMPLEMENTATIONS = ("auto", "torch", "triton")


@functools.cache
def triton_is_available() -> bool:
    """True when ``triton`` imports (the kernels also need a CUDA device or TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _use_triton(cache: Tensor, implementation: str) -> bool:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "auto":
        return cache.is_cuda and triton_is_available()
    return implementation == "triton"


def cache_layout(k_cache: Tensor, v_cache: Tensor, page_table: Tensor, cu_seqlens_q: Tensor,
                 cu_seqlens_kv: Tensor) -> int | None:
    """``append_to_kv_cache``'s ``cache_layout`` for these cache-side tensors: the number of their metadata, or
    None when the append runs in torch (no launch to key)."""
    if not _use_triton(k_cache, "auto"):
        return None
    from attention.kernels.launch import layout_number, tensor_key

    return layout_number(tuple(map(tensor_key, (k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_kv))))


def _token_coordinates(
    new_k: Tensor, cu_seqlens_q: Tensor, qkv_format: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Batch row, position within the step and validity of every token slot of ``new_k``.

    Token slots are in ``new_k.reshape(-1, h, d)`` order.
    """
    device = new_k.device
    cu_q = cu_seqlens_q.to(device=device, dtype=torch.long)
    num_rows = cu_q.numel() - 1
    if qkv_format == "thd":
        token = torch.arange(new_k.shape[0], device=device)
        row = torch.searchsorted(cu_q[1:], token, right=True)
        valid = row < num_rows
        row = row.clamp(max=num_rows - 1)
        return row, token - cu_q[row], valid
    rows, positions = (new_k.shape[0], new_k.shape[1])
    if qkv_format == "sbhd":
        positions, rows = rows, positions
    row = torch.arange(rows, device=device)
    position = torch.arange(positions, device=device)
    if qkv_format == "bshd":
        row, position = row.repeat_interleave(positions), position.repeat(rows)
    else:
        row, position = row.repeat(positions), position.repeat_interleave(rows)
    new_len = cu_q[row + 1] - cu_q[row]
    return row, position, position < new_len


def _append_torch(
    new_k: Tensor,
    new_v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    qkv_format: str,
) -> None:
    page_size = k_cache.shape[1]
    row, position, valid = _token_coordinates(new_k, cu_seqlens_q, qkv_format)
    cu_q = cu_seqlens_q.to(device=new_k.device, dtype=torch.long)
    cu_kv = cu_seqlens_kv.to(device=new_k.device, dtype=torch.long)
    new_len = cu_q[row + 1] - cu_q[row]
    total_len = cu_kv[row + 1] - cu_kv[row]
    logical = torch.where(valid, total_len - new_len + position, 0)
    page = page_table.to(device=new_k.device, dtype=torch.long)[row, logical // page_size]
    slot = (page * page_size + logical % page_size)[valid]
    for new, cache in ((new_k, k_cache), (new_v, v_cache)):
        tokens = new.reshape(-1, new.shape[-2], new.shape[-1])[valid]
        cache.view(-1, cache.shape[-2], cache.shape[-1])[slot] = tokens


@functools.cache
def _append_triton():
    """inference.kv_append_triton.append_triton, imported on first use (it imports Triton)."""
    from inference.kv_append_triton import append_triton

    return append_triton


def _append_impl(
    new_k: Tensor,
    new_v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    qkv_format: str,
    implementation: str,
    cache_layout: int | None = None,
) -> None:
    if _use_triton(k_cache, implementation):
        _append_triton()(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_kv, qkv_format,
                         cache_layout)
    else:
        _append_torch(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_kv, qkv_format)


def _append_op_impl(new_k: Tensor, new_v: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor,
                    cu_seqlens_q: Tensor, cu_seqlens_kv: Tensor, qkv_format: str, implementation: str) -> None:
    _append_impl(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_kv, qkv_format, implementation)


# Eager calls run _append_impl directly (a custom-op dispatch costs ~85 µs of CPU per call here);
# torch.compile traces the op, an opaque node with a fake implementation.
_append_op = torch.library.custom_op("inference::append_to_kv_cache", mutates_args=("k_cache", "v_cache"))(
    _append_op_impl)


@_append_op.register_fake
def _append_op_fake(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_kv, qkv_format,
                    implementation) -> None:
    return None


def append_to_kv_cache(
    new_k: Tensor,
    new_v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    qkv_format: str,
    implementation: str = "auto",
    cache_layout: int | None = None,
) -> None:
    """Write this step's new tokens into the (paged or one-page-per-row) caches, in place.

    Args:
        new_k, new_v: ``[b, s, h_kv, d]`` (bshd), ``[s, b, h_kv, d]`` (sbhd) or ``[t, h_kv, d]``
            (thd); the tokens of row ``i`` are left-aligned (bshd/sbhd) or packed by
            ``cu_seqlens_q`` (thd); slots past a row's length are ignored. K and V may differ in d.
        k_cache, v_cache: ``[num_pages, page_size, h_kv, d_k|d_v]``, same dtype as the new tokens.
        page_table: int32 ``[max_batch_size, max_pages_per_seq]``.
        cu_seqlens_q: int32 ``[max_batch_size + 1]`` cumulative new-token counts.
        cu_seqlens_kv: int32 ``[max_batch_size + 1]`` cumulative lengths *after* this step.
        qkv_format: ``"bshd"``, ``"sbhd"`` or ``"thd"``.
        implementation: ``"auto"`` (Triton on CUDA, torch elsewhere), ``"torch"`` or ``"triton"``
            (on CPU only under ``TRITON_INTERPRET=1``).
        cache_layout: for a caller whose cache-side tensors keep their metadata from call to call (a cache
            manager's own buffers): ``attention.kernels.launch.layout_number`` of the ``tensor_key``s of
            ``k_cache``, ``v_cache``, ``page_table``, ``cu_seqlens_q`` and ``cu_seqlens_kv``. The Triton path
            keys its launch by it instead of reading their metadata again. Eager calls only.

    Example::

        >>> k_cache = torch.zeros(8, 4, 2, 16); v_cache = torch.zeros(8, 4, 2, 16)
        >>> page_table = torch.tensor([[3, 5]], dtype=torch.int32)
        >>> cu_q = torch.tensor([0, 2], dtype=torch.int32); cu_kv = torch.tensor([0, 6], dtype=torch.int32)
        >>> append_to_kv_cache(torch.ones(1, 2, 2, 16), torch.ones(1, 2, 2, 16), k_cache, v_cache,
        ...                    page_table, cu_q, cu_kv, "bshd")   # positions 4, 5 -> page 5 slots 0, 1
    """
    if torch.compiler.is_compiling():
        torch.ops.inference.append_to_kv_cache(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q,
                                               cu_seqlens_kv, qkv_format, implementation)
    else:
        _append_impl(new_k, new_v, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_kv, qkv_format,
                     implementation, cache_layout)


def reindex_kv_cache(
    k_cache: Tensor,
    v_cache: Tensor,
    destination_rows: list[int],
    source_rows: list[int],
    num_tokens: int,
    implementation: str = "auto",
) -> None:
    """Move the first ``num_tokens`` positions of non-paged cache rows, in place.

    Row ``source_rows[n]`` is copied to row ``destination_rows[n]`` for every ``n``, as if all
    sources were read before any destination was written. Caches are
    ``[max_batch_size, max_sequence_length, h_kv, d]``. The Triton kernel moves rows in place
    when no source is an earlier destination (compaction after sequences finish); any other
    permutation is gathered through a temporary copy.

    Example::

        >>> import torch
        >>> from inference import reindex_kv_cache
        >>> k_cache = torch.arange(4.0).view(4, 1, 1, 1).repeat(1, 64, 2, 16)   # row i holds i
        >>> v_cache = k_cache.clone()
        >>> reindex_kv_cache(k_cache, v_cache, destination_rows=[1, 2], source_rows=[2, 3], num_tokens=40)
        >>> k_cache[:, 0, 0, 0], k_cache[:, 40, 0, 0]   # rows 2, 3 moved up; positions >= 40 untouched
        (tensor([0., 2., 3., 3.]), tensor([0., 1., 2., 3.]))
    """
    if len(destination_rows) != len(source_rows):
        raise ValueError(
            f"destination_rows ({len(destination_rows)}) and source_rows ({len(source_rows)}) "
            f"must have the same length"
        )
    if not destination_rows or num_tokens <= 0:
        return
    written: set[int] = set()
    in_place_safe = True
    for destination_row, source_row in zip(destination_rows, source_rows):
        in_place_safe = in_place_safe and source_row not in written
        written.add(destination_row)
    if _use_triton(k_cache, implementation) and in_place_safe:
        from inference.kv_append_triton import reindex_triton

        reindex_triton(k_cache, v_cache, destination_rows, source_rows, num_tokens)
        return
    device = k_cache.device
    destination = torch.tensor(destination_rows, dtype=torch.long, device=device)
    source = torch.tensor(source_rows, dtype=torch.long, device=device)
    for cache in (k_cache, v_cache):
        cache[destination, :num_tokens] = cache[source, :num_tokens]
