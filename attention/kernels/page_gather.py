"""Contiguous copies of paged KV caches, for prefill calls that read every page many times.

A prefill tile over 16-token pages loads a page id per key and cannot take one tensor descriptor per
tile, so the fused kernel over such a cache runs 10-13 % below the same work on a contiguous cache
(a 2k chunk on a 6k / 30k prefix, H200, docs/benchmarks_log.md). A call whose sequences each bring
thousands of query rows reads every K/V tile once per query tile, so one copy of the pages into a
``[B, pages * page_size, H, D]`` buffer (a read and a write of the cache, memory-bound) costs less than
that penalty. ``attention_forward`` decides per call (``gathered_page_count``); the kernel then runs
as over a non-paged cache. On an sm90 GPU the Gluon kernel reads pages of 16 to 64 tokens in place
(hopper_forward.py, as fast as the copy or faster), so the copy serves what it does not: pages under 16
tokens, other GPUs, fp32, windows, ALiBi, sinks, and ``ATTN_FUSED_HOPPER_SMALL_PAGES=0``.
"""

from __future__ import annotations

import torch

from .configs import GATHER_MAX_BYTES, GATHER_MAX_PAGE_SIZE, GATHER_MIN_PACKED_ROWS

__all__ = ["gather_pages", "gathered_page_count"]


def gathered_page_count(*, page_size: int, table_pages: int, num_seqs: int, total_q: int, group_size: int,
                        max_seqlen_kv: int, kv_row_bytes: int, window_bounded: bool, forced: bool) -> int:
    """How many logical pages per sequence to copy before the call (0: run over the pages).

    ``kv_row_bytes`` is one token's K plus V bytes over the KV heads. The copy must fit GATHER_MAX_BYTES
    and a sliding window reads only part of each sequence (no copy then). Unless ``forced`` (an
    explicit configuration asks for it), the copy also needs pages smaller than GATHER_MAX_PAGE_SIZE
    and at least GATHER_MIN_PACKED_ROWS packed query rows (tokens x group size) per sequence on average.
    """
    num_pages = min(table_pages, -(-max_seqlen_kv // page_size))
    if window_bounded or num_pages == 0 or num_seqs * num_pages * page_size * kv_row_bytes > GATHER_MAX_BYTES:
        return 0
    if not forced and (page_size >= GATHER_MAX_PAGE_SIZE or total_q * group_size < GATHER_MIN_PACKED_ROWS * num_seqs):
        return 0
    return num_pages


def gather_pages(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                 num_pages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``num_pages`` logical pages of every sequence, contiguous.

    k_cache / v_cache: [num_cache_pages, page_size, H_kv, D]; page_table: int32 [B, >= num_pages].
    Returns k, v: [B, num_pages * page_size, H_kv, D], token t of sequence b at row (b, t). Table
    entries past a sequence's pages may hold anything (they are clamped into the cache, copied and
    never read).

    Example:
        >>> cache = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 2, 1, 1)
        >>> k, _ = gather_pages(cache, cache, torch.tensor([[3, 1], [0, -1]], dtype=torch.int32), 2)
        >>> k.flatten(1).tolist()
        [[3.0, 3.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    """
    ids = page_table[:, :num_pages].clamp(0, k_cache.shape[0] - 1).flatten()
    shape = (page_table.shape[0], num_pages * k_cache.shape[1])
    return (k_cache.index_select(0, ids).view(*shape, *k_cache.shape[2:]),
            v_cache.index_select(0, ids).view(*shape, *v_cache.shape[2:]))
