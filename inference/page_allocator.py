"""Page allocators: the free KV-cache pages and which sequence owns which page.

``PageAllocator`` is TransformerEngine's FIFO free list. ``RunPageAllocator`` hands a sequence its pages in runs
of neighbouring page ids, so that a decode reads each sequence's KV from a few 2 MiB stretches of the cache instead
of one per page: the GPU translates addresses 2 MiB at a time, and a decode over pages scattered through the whole
cache pays for it (H200, 2026-12-02, the Gluon decode kernel at page 16, one run: 64 x 4k 251.3 us with pages in
random order, 247.8 in order and 248.7 shuffled only within 2 MiB blocks, against 248.6 without pages;
docs/benchmarks.md, twenty-sixth session).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable

from inference.errors import KVCacheFullError

__all__ = ["TRANSLATION_BYTES", "PageAllocator", "RunPageAllocator", "run_pages_for"]

TRANSLATION_BYTES = 2 << 20
"""The span of one GPU address translation of a large allocation (2 MiB pages)."""


def run_pages_for(page_bytes: int) -> int:
    """Pages of ``page_bytes`` bytes (one cache tensor's page) in one TRANSLATION_BYTES run, at least 1.

    Example:
        >>> run_pages_for(16 * 8 * 128 * 2)   # 16 tokens x 8 KV heads x d128, bf16: 32 KiB pages
        64
    """
    return max(1, TRANSLATION_BYTES // page_bytes)


class PageAllocator:
    """FIFO free list of page ids ``0..total_num_pages-1``; pages are handed out from the front
    and returned to the back (as in TransformerEngine), so a freed page is reused last.

    Example::

        >>> allocator = PageAllocator(total_num_pages=4)
        >>> allocator.allocate("a", 3); allocator.pages_of("a")
        [0, 1, 2]
        >>> allocator.free("a"); allocator.num_free
        4
    """

    def __init__(self, total_num_pages: int) -> None:
        self.total_num_pages = total_num_pages
        self.allocated_pages: dict[Hashable, list[int]] = {}
        self.reset()

    @property
    def num_free(self) -> int:
        """Pages not owned by any sequence."""
        return len(self.free_pages)

    def pages_of(self, seq_id: Hashable) -> list[int]:
        """The pages of ``seq_id`` in logical order (empty if it owns none)."""
        return list(self.allocated_pages.get(seq_id, ()))

    def allocate(self, seq_id: Hashable, num_pages: int) -> None:
        """Give ``num_pages`` more pages to ``seq_id``; ``KVCacheFullError`` (and no change) if short."""
        if num_pages > self.num_free:
            raise KVCacheFullError(num_pages, self.num_free, f"sequence {seq_id!r}")
        pages = self.allocated_pages.setdefault(seq_id, [])
        pages.extend(self.free_pages.popleft() for _ in range(num_pages))

    def free(self, seq_id: Hashable) -> None:
        """Return every page of ``seq_id`` to the back of the free list."""
        self.free_pages.extend(self.allocated_pages.pop(seq_id, ()))

    def reset(self) -> None:
        """Free every page; the free list is ``0..total_num_pages-1`` again."""
        self.free_pages: deque[int] = deque(range(self.total_num_pages))
        self.allocated_pages = {}


class RunPageAllocator(PageAllocator):
    """Pages in runs: the page ids ``r * run_pages .. (r + 1) * run_pages - 1`` form run ``r``. A sequence's next
    page is the lowest free page of the run its last page is in; failing that, of the lowest wholly free run;
    failing that, of the lowest run with a free page. Nothing is reserved: every free page can be handed out, so
    the cache fills (and ``KVCacheFullError`` is raised) exactly when the FIFO allocator's would.

    Sequences that grow a page at a time side by side (a batch of decodes) each fill a run of their own, where
    the FIFO list deals them consecutive pages in turn.

    Example::

        >>> allocator = RunPageAllocator(total_num_pages=8, run_pages=4)
        >>> allocator.allocate("a", 1); allocator.allocate("b", 1)
        >>> allocator.allocate("a", 1); allocator.allocate("b", 1)
        >>> allocator.pages_of("a"), allocator.pages_of("b")
        ([0, 1], [4, 5])
    """

    def __init__(self, total_num_pages: int, run_pages: int) -> None:
        if run_pages < 1:
            raise ValueError(f"run_pages must be >= 1, got {run_pages!r}")
        self.run_pages = run_pages
        super().__init__(total_num_pages)

    def _run_size(self, run: int) -> int:
        return min(self.run_pages, self.total_num_pages - run * self.run_pages)

    @property
    def num_free(self) -> int:
        """Pages not owned by any sequence."""
        return self._num_free

    @property
    def free_pages(self) -> list[int]:  # type: ignore[override]
        """Every free page id, ascending (for inspection: O(total_num_pages))."""
        return sorted(page for run in self._free_in_run for page in run)

    def allocate(self, seq_id: Hashable, num_pages: int) -> None:
        """Give ``num_pages`` more pages to ``seq_id``; ``KVCacheFullError`` (and no change) if short."""
        if num_pages > self._num_free:
            raise KVCacheFullError(num_pages, self._num_free, f"sequence {seq_id!r}")
        pages = self.allocated_pages.setdefault(seq_id, [])
        for _ in range(num_pages):
            run = pages[-1] // self.run_pages if pages else -1
            if run < 0 or not self._free_in_run[run]:
                run = self._next_run()
            pages.append(heapq.heappop(self._free_in_run[run]))
        self._num_free -= num_pages

    def _next_run(self) -> int:
        """The lowest wholly free run, else the lowest run with a free page (the caller checked there is one)."""
        for heap, listed, usable in ((self._whole_runs, self._listed_whole, self._is_whole),
                                     (self._some_free_runs, self._listed_some, self._has_free)):
            while heap and not usable(heap[0]):  # drop entries that no longer hold
                listed[heapq.heappop(heap)] = False
            if heap:
                return heap[0]
        raise AssertionError("no free page although num_free > 0")

    def _is_whole(self, run: int) -> bool:
        return len(self._free_in_run[run]) == self._run_size(run)

    def _has_free(self, run: int) -> bool:
        return bool(self._free_in_run[run])

    def free(self, seq_id: Hashable) -> None:
        """Return every page of ``seq_id`` to its run."""
        pages = self.allocated_pages.pop(seq_id, ())
        for page in pages:
            run = page // self.run_pages
            heapq.heappush(self._free_in_run[run], page)
            self._list(run)
        self._num_free += len(pages)

    def _list(self, run: int) -> None:
        """Enter ``run`` in the heaps whose condition it now meets (each run is in each heap at most once)."""
        if not self._listed_some[run]:
            self._listed_some[run] = True
            heapq.heappush(self._some_free_runs, run)
        if not self._listed_whole[run] and self._is_whole(run):
            self._listed_whole[run] = True
            heapq.heappush(self._whole_runs, run)

    def reset(self) -> None:
        """Free every page."""
        runs = -(-self.total_num_pages // self.run_pages)
        self.allocated_pages = {}
        self._free_in_run = [list(range(run * self.run_pages, run * self.run_pages + self._run_size(run)))
                             for run in range(runs)]   # (ascending lists are heaps)
        self._whole_runs = list(range(runs))
        self._some_free_runs = list(range(runs))
        self._listed_whole = [True] * runs
        self._listed_some = [True] * runs
        self._num_free = self.total_num_pages
