"""``PagedKVCacheManager``: fixed-size pages allocated on demand, addressed through a page table."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Hashable, Mapping

import torch
from torch import Tensor

from inference.cache_manager import KVCacheManager, validate_step_dict
from inference.device_upload import upload
from inference.errors import KVCacheFullError
from inference.page_allocator import cache_page_bytes, check_page_allocation, make_page_allocator

__all__ = ["WALK_ALLOCATIONS", "WALK_KEEPERS", "WALK_MIN_PAGE_SIZE", "WALK_TAIL_FRACTION", "PagedKVCacheManager",
           "SequenceWalk", "walk_after_growth"]

WALK_MIN_PAGE_SIZE = 16
"""The smallest page size that keeps a ``walk_table``: below it a decode step adds pages so often that re-sorting the
rows would cost the host more than the walk saves the GPU."""
WALK_ALLOCATIONS = ("fifo",)
"""The page allocations that keep a ``walk_table``: those that scatter a sequence's pages over the pool. ``runs``
places them in 2 MiB runs, which a decode reads about as fast (a walk over them gained nothing on an H100,
docs/results/2026-12-05-h100-3b21fc4), and skips the walk's host cost (docs/kv_cache.md)."""
WALK_KEEPERS = ("pre_step", "_write_page_table")
"""The methods that keep ``walk_table`` in step with the pages: a subclass that overrides one keeps no walk table."""
WALK_TAIL_FRACTION = 16
"""A walk re-sorts the pages its sequence gained since the last sort once they outnumber 1/16 of the sorted ones; until
then they follow the sorted pages in logical order, so a decode step that adds a page rewrites two entries of the row,
not half of it (at most 1/17 of a walk's pages lie out of order)."""


class SequenceWalk:
    """One decoding sequence's row of ``walk_table``: its pages sorted (``head``), the pages it gained since they were
    sorted (``tail``, in logical order, at most ``len(head) // WALK_TAIL_FRACTION`` of them), then its last page.

    Example:
        >>> walk = SequenceWalk([7, 2, 9, 4])
        >>> walk.row([7, 2, 9, 4])
        [2, 7, 9, 4]
        >>> walk.grow([7, 2, 9, 4, 1])   # page 4 stops being last and is sorted in: the row changes from column 1
        1
        >>> walk.row([7, 2, 9, 4, 1])
        [2, 4, 7, 9, 1]
    """

    __slots__ = ("head", "tail")

    def __init__(self, pages: list[int]) -> None:
        self.head = sorted(pages[:-1])
        self.tail: list[int] = []

    def grow(self, pages: list[int]) -> int:
        """Take in the sequence's ``pages`` (those it held, then more); return the first column of its row that
        changed."""
        held = len(self.head) + len(self.tail)
        first_changed = held   # where the previous last page stood
        self.tail += pages[held:-1]
        if len(self.tail) > len(self.head) // WALK_TAIL_FRACTION:
            for page in self.tail:
                position = bisect.bisect_left(self.head, page)
                self.head.insert(position, page)
                first_changed = min(first_changed, position)
            self.tail = []
        return first_changed

    def row(self, pages: list[int], start: int = 0) -> list[int]:
        """The row for ``pages`` (those taken in), from column ``start``."""
        sorted_count = len(self.head)
        if start >= sorted_count:
            return [*self.tail[start - sorted_count:], *pages[-1:]]
        return [*self.head[start:], *self.tail, *pages[-1:]]


def walk_after_growth(pages: list[int], first_held: int) -> list[int]:
    """The row of a sequence first seen decoding with ``first_held`` of its ``pages``, then grown a page a step.

    Example:
        >>> walk_after_growth([7, 2, 9, 4, 1], first_held=4)
        [2, 4, 7, 9, 1]
    """
    walk = SequenceWalk(pages[:first_held])
    for count in range(first_held + 1, len(pages) + 1):
        walk.grow(pages[:count])
    return walk.row(pages)


class _TableEntries:
    """A table's changed entries, (row, column) -> page (0: cleared), gathered row by row and written at once."""

    __slots__ = ("rows", "columns", "pages")

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.columns: list[int] = []
        self.pages: list[int] = []

    def put(self, row: int, start: int, end: int, pages: list[int]) -> None:
        """Columns ``start`` to ``end`` of ``row``: ``pages``, then zeros up to ``end`` (a shorter row's tail)."""
        self.rows += [row] * (end - start)
        self.columns += range(start, end)
        self.pages += pages
        self.pages += [0] * (end - start - len(pages))

    def clear_past(self, first_row: int, held: list[tuple]) -> None:
        """Clear the rows from ``first_row`` on, each of the ``held[row][1]`` entries it held (rows past the batch)."""
        for row in range(first_row, len(held)):
            self.put(row, 0, held[row][1], [])

    def write(self, host: Tensor, device_table: Tensor) -> None:
        """Write the entries into the table's host mirror in one indexed assignment, then upload the box of changed
        entries only (a page-boundary decode step: one column, not whole rows of max_pages_per_seq entries). No
        entries: nothing is copied (a decode step that adds no page)."""
        if not self.rows:
            return
        host[torch.tensor(self.rows, device="cpu"), torch.tensor(self.columns, device="cpu")] = \
            torch.tensor(self.pages, dtype=torch.int32, device="cpu")
        rows_changed = slice(min(self.rows), max(self.rows) + 1)
        columns_changed = slice(min(self.columns), max(self.columns) + 1)
        upload(device_table[rows_changed, columns_changed], host[rows_changed, columns_changed])


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

    ``walk_table`` (a WALK_ALLOCATIONS allocation of pages of at least WALK_MIN_PAGE_SIZE tokens, else None; the
    same shape, kept beside ``page_table``) is the order a decode may read its keys in: for a sequence whose step
    brings one token, its pages but the last in ascending page id (but for the few it gained since they were sorted:
    SequenceWalk), then the last (the one it may fill in part); for the other sequences their pages as in
    ``page_table``. A decode's softmax does not depend on the order of its
    keys, and over pages placed anywhere in the pool, programs that all sweep it upward read it faster (0.4-2.3 % on
    an H100, 2026-12-05, docs/results/2026-12-05-h100-44f1237): the fused backend reads it for steps whose keys
    carry no position (no window, no ALiBi), mixed ones included. Appends and every other reader use ``page_table``.
    A subclass that overrides ``pre_step`` or ``_write_page_table`` (WALK_KEEPERS) keeps no walk table.

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
        self._rows_written: list[int] = []   # the rows the last table write changed
        self.walk_table: Tensor | None = None
        if page_size >= WALK_MIN_PAGE_SIZE and page_allocation in WALK_ALLOCATIONS \
                and all(getattr(type(self), name) is getattr(PagedKVCacheManager, name) for name in WALK_KEEPERS):
            self.walk_table = torch.zeros_like(self.page_table)
            self._host_walk = torch.zeros_like(self._host_table)
        # per row, the (sequence, page count, walked) its walk_table row holds; per decoding sequence, its walk (kept
        # while it lives: a row's walk grows, it is not sorted again)
        self._walk_rows: list[tuple[Hashable, int, bool]] = []
        self._walks: dict[Hashable, SequenceWalk] = {}
        self._all_walked = True

    def pre_step(self, step_dict: Mapping[Hashable, int]) -> OrderedDict[Hashable, int]:
        """Free finished sequences' pages, allocate the pages this step needs, rebuild the table."""
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
            self._walks.pop(seq_id, None)
        for seq_id, num_pages in new_pages.items():
            if num_pages:   # a decode step usually needs no new page (every sequence holds >= 1 already)
                self.allocator.allocate(seq_id, num_pages)
        # no page moved and the batch in the same order (finished sequences change it): every row stays as it is
        rows_change = pages_needed or list(lengths_after) != list(self.sequences)
        step_lens = list(step_dict.values())
        walks_flip = self.walk_table is not None and self._walks_flip(step_lens)
        self.sequences = lengths_after
        self.step_lens = step_lens
        if rows_change:
            self._write_page_table()
        if walks_flip or (rows_change and self.walk_table is not None):
            self._write_walk_table(None if walks_flip else self._rows_written)
        return self.sequences

    def _write_page_table(self) -> None:
        """Row r of the table = the pages of the r-th sequence in batch order, zeros after them. Only what changed
        is written, in one indexed assignment (a decode step that crosses a page boundary changes every row: one
        slice assignment a row cost 64 sequences ~0.4 ms), and only the box of changed entries is uploaded."""
        allocated, previous = self.allocator.allocated_pages, self._rows
        rows: list[tuple[Hashable, int]] = []
        entries = _TableEntries()
        written: list[int] = []
        for row, seq_id in enumerate(self.sequences):
            pages = allocated[seq_id]
            held, count = previous[row] if row < len(previous) else (None, 0)
            if held == seq_id and count == len(pages):   # unchanged (most rows of a decode step)
                rows.append((seq_id, count))
                continue
            written.append(row)
            start = count if held == seq_id and count <= len(pages) else 0  # the same sequence only grows
            # a shorter sequence in the row: its tail cleared
            entries.put(row, start, max(count, len(pages)), pages[start:])
            rows.append((seq_id, len(pages)))
        entries.clear_past(len(rows), previous)
        self._rows = rows
        self._rows_written = written
        entries.write(self._host_table, self.page_table)

    def _walks_flip(self, step_lens: list[int]) -> bool:
        """Whether a row's step goes from one token to more or back (or rows come or go, one not a decode)."""
        if self._all_walked and (not step_lens or max(step_lens) == 1):   # a decode step after one (the usual)
            return False
        return [n == 1 for n in step_lens] != [n == 1 for n in self.step_lens]

    def _write_walk_table(self, visit: list[int] | None) -> None:
        """walk_table's rows for this step's batch (see the class), written as _write_page_table writes its table:
        the changed entries only, uploaded as their box. ``visit``: the rows that may have changed (the page table's
        rewritten rows, when no row's step flipped between one token and more), None: every row. A decoding sequence
        that gained a page changes its row from where its SequenceWalk says."""
        allocated, states, step_lens = self.allocator.allocated_pages, self._walk_rows, self.step_lens
        seq_ids = list(self.sequences)
        entries = _TableEntries()
        entries.clear_past(len(seq_ids), states)
        del states[len(seq_ids):]
        states += [(None, 0, False)] * (len(seq_ids) - len(states))
        for row in range(len(seq_ids)) if visit is None else visit:
            seq_id = seq_ids[row]
            pages = allocated[seq_id]
            walked = step_lens[row] == 1
            held, count, held_walked = states[row]
            if held == seq_id and count == len(pages) and held_walked == walked:
                continue
            same = held == seq_id and held_walked == walked and count <= len(pages)
            if walked:
                walk = self._walks.get(seq_id)
                if walk is None:
                    walk = self._walks[seq_id] = SequenceWalk(pages)
                    first_changed = 0
                else:
                    first_changed = walk.grow(pages)
                start = first_changed if same else 0
                new_pages = walk.row(pages, start)
            else:
                start = count if same else 0
                new_pages = pages[start:]
            entries.put(row, start, max(count, len(pages)), new_pages)   # a shorter sequence's tail cleared
            states[row] = (seq_id, len(pages), walked)
        if visit is None:
            self._all_walked = all(walked for _, _, walked in states)
        entries.write(self._host_walk, self.walk_table)

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
        if self.walk_table is not None:
            self.walk_table.zero_()
            self._host_walk.zero_()
        self._walk_rows = []
        self._walks = {}
        self._all_walked = True

    def get_page_list(self, seq_id: Hashable) -> list[int]:
        """The pages of ``seq_id`` in logical order."""
        return self.allocator.pages_of(seq_id)

    def get_page_count(self, seq_id: Hashable) -> int:
        """How many pages ``seq_id`` owns."""
        return len(self.allocator.allocated_pages.get(seq_id, ()))

    def has_free_page(self) -> bool:
        """True while at least one page is free."""
        return self.allocator.num_free > 0
