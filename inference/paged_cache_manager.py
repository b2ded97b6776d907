"""``PagedKVCacheManager``: fixed-size pages allocated on demand, addressed through a page table."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping

import torch
from torch import Tensor

from inference.cache_manager import KVCacheManager, validate_step_dict
from inference.device_upload import upload
from inference.errors import KVCacheFullError
from inference.page_allocator import cache_page_bytes, check_page_allocation, make_page_allocator

__all__ = ["PagedKVCacheManager"]


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // page_size)


class PagedKVCacheManager(KVCacheManager):
    """Caches ``[total_num_pages, page_size, h_kv, d]`` shared by all sequences.

    A sequence owns ``ceil(length / page_size)`` pages, allocated when a step needs them and
    returned when it finishes. ``total_num_pages`` may be smaller than
    ``max_batch_size * max_pages_per_seq`` (over-subscription): a step that needs more pages
    than are free raises ``KVCacheFullError`` and changes nothing, so the caller can retry with
    fewer new sequences. ``page_table`` (int32 ``[max_batch_size, max_pages_per_seq]``, a
    device buffer updated in place) row ``i`` lists the pages of the ``i``-th sequence of the
    step, padded with 0; rows past the batch are 0. ``page_allocation``: one of
    ``page_allocator.PAGE_ALLOCATIONS`` (default ``runs``).

    Example::

        >>> import torch
        >>> from collections import OrderedDict
        >>> from inference import PagedKVCacheManager
        >>> manager = PagedKVCacheManager(total_num_pages=8, page_size=16, num_heads=2, head_dim_k=64,
        ...                               dtype=torch.float16, max_batch_size=4, max_seqlen=128)
        >>> manager.allocate_memory(layer_number=1)[0].shape
        torch.Size([8, 16, 2, 64])
        >>> lengths = manager.pre_step(OrderedDict({"a": 20}))   # 20 tokens: 2 pages
        >>> manager.page_table[0, :3]
        tensor([0, 1, 0], dtype=torch.int32)
    """

    def __init__(
        self,
        total_num_pages: int,
        page_size: int,
        num_heads: int,
        head_dim_k: int,
        dtype: torch.dtype,
        max_batch_size: int,
        max_seqlen: int,
        head_dim_v: int | None = None,
        device: torch.device | str | None = None,
        page_allocation: str = "runs",
    ) -> None:
        check_page_allocation(page_allocation)
        super().__init__(max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v, device)
        self.total_num_pages = total_num_pages
        self.page_size = page_size
        self.cache_rows = (total_num_pages, page_size)
        self.max_pages_per_seq = pages_for(max_seqlen, page_size)
        self.page_allocation = page_allocation
        page_bytes = cache_page_bytes(page_size, num_heads, head_dim_k, self.head_dim_v, self.dtype.itemsize)
        self.allocator = make_page_allocator(total_num_pages, page_allocation, page_bytes)
        self.page_table = torch.zeros(
            max_batch_size, self.max_pages_per_seq, dtype=torch.int32, device=self.device
        )
        # Host mirror of page_table and, per row, the (sequence, page count) it holds: a step
        # rewrites only what changed (a decode step usually adds no page at all).
        # host copies stay on the CPU whatever torch's default device (a TE-style manager is built under ours)
        self._host_table = torch.zeros(max_batch_size, self.max_pages_per_seq, dtype=torch.int32, device="cpu")
        self._rows: list[tuple[Hashable, int]] = []

    def pre_step(self, step_dict: Mapping[Hashable, int],
                 lengths_after: OrderedDict[Hashable, int] | None = None) -> OrderedDict[Hashable, int]:
        """Free finished sequences' pages, allocate the pages this step needs, rebuild the table."""
        if lengths_after is None:   # (InferenceParams passes the lengths it validated)
            lengths_after = validate_step_dict(step_dict, self.sequences, self.max_batch_size, self.max_seqlen)
        finished = [seq_id for seq_id in self.sequences if seq_id not in step_dict]
        owned, page_size = self.allocator.allocated_pages, self.page_size
        pages_freed = sum(len(owned.get(seq_id, ())) for seq_id in finished)
        new_pages = {seq_id: -(-total // page_size) - len(owned.get(seq_id, ()))   # pages_for, inlined
                     for seq_id, total in lengths_after.items()}
        pages_needed = sum(new_pages.values())
        if pages_needed > self.allocator.num_free + pages_freed:
            raise KVCacheFullError(
                pages_needed,
                self.allocator.num_free + pages_freed,
                f"page_size={self.page_size}, total_num_pages={self.total_num_pages}",
            )
        for seq_id in finished:
            self.allocator.free(seq_id)
        for seq_id, num_pages in new_pages.items():
            if num_pages:   # a decode step usually needs no new page (every sequence holds >= 1 already)
                self.allocator.allocate(seq_id, num_pages)
        # no page moved and the batch in the same order (finished sequences change it): every row stays as it is
        rows_change = pages_needed or list(lengths_after) != list(self.sequences)
        self.sequences = lengths_after
        self.step_lens = list(step_dict.values())
        if rows_change:
            self._write_page_table()
        return self.sequences

    def _write_page_table(self) -> None:
        """Row r of the table = the pages of the r-th sequence in batch order, zeros after them. Only what changed
        is written, in one indexed assignment (a decode step that crosses a page boundary changes every row: one
        slice assignment a row cost 64 sequences ~0.4 ms), and only the box of changed entries is uploaded."""
        allocated, previous = self.allocator.allocated_pages, self._rows
        rows: list[tuple[Hashable, int]] = []
        entry_rows: list[int] = []   # the table entries to write: (row, column) -> page (0: cleared)
        entry_columns: list[int] = []
        entry_pages: list[int] = []
        for row, seq_id in enumerate(self.sequences):
            pages = allocated[seq_id]
            held, count = previous[row] if row < len(previous) else (None, 0)
            if held == seq_id and count == len(pages):   # unchanged (most rows of a decode step)
                rows.append((seq_id, count))
                continue
            start = count if held == seq_id and count <= len(pages) else 0  # the same sequence only grows
            end = max(count, len(pages))   # a shorter sequence in the row: its tail cleared
            entry_rows += [row] * (end - start)
            entry_columns += range(start, end)
            entry_pages += pages[start:]
            entry_pages += [0] * (end - max(start, len(pages)))
            rows.append((seq_id, len(pages)))
        for row in range(len(rows), len(previous)):   # rows past the batch: cleared
            count = previous[row][1]
            entry_rows += [row] * count
            entry_columns += range(count)
            entry_pages += [0] * count
        self._rows = rows
        if entry_rows:   # a decode step that adds no page copies nothing
            self._host_table[torch.tensor(entry_rows, device="cpu"), torch.tensor(entry_columns, device="cpu")] = \
                torch.tensor(entry_pages, dtype=torch.int32, device="cpu")
            # the box of changed entries only (a page-boundary decode step: one column, not whole rows of
            # max_pages_per_seq entries)
            rows_changed = slice(min(entry_rows), max(entry_rows) + 1)
            columns_changed = slice(min(entry_columns), max(entry_columns) + 1)
            upload(self.page_table[rows_changed, columns_changed], self._host_table[rows_changed, columns_changed])

    def step(
        self,
        layer_number: int,
        new_k: Tensor,
        new_v: Tensor,
        cu_new_seqlens: Tensor,
        cu_cached_seqlens: Tensor,
        qkv_format: str,
    ) -> tuple[Tensor, Tensor]:
        """Append the new tokens through the page table; return the whole paged caches."""
        return self._append(layer_number, new_k, new_v, self.page_table, cu_new_seqlens, cu_cached_seqlens, qkv_format)

    def reset(self) -> None:
        """Forget every sequence, free every page and zero the page table (in place)."""
        super().reset()
        self.allocator.reset()
        self.page_table.zero_()
        self._host_table.zero_()
        self._rows = []

    def get_page_list(self, seq_id: Hashable) -> list[int]:
        """The pages of ``seq_id`` in logical order."""
        return self.allocator.pages_of(seq_id)

    def get_page_count(self, seq_id: Hashable) -> int:
        """How many pages ``seq_id`` owns."""
        return len(self.allocator.allocated_pages.get(seq_id, ()))

    def has_free_page(self) -> bool:
        """True while at least one page is free."""
        return self.allocator.num_free > 0
