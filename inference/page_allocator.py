"""Page allocators: the free KV-cache pages and which sequence owns which page.

``PageAllocator`` is TransformerEngine's FIFO free list. ``RunPageAllocator`` hands a sequence its pages in runs
of neighbouring page ids, so that a decode reads each sequence's KV from a few 2 MiB stretches of the cache
instead of one per page: the GPU translates addresses 2 MiB at a time. After a while of continuous batching a FIFO
list deals out pages in the order they came back, and a decode over them runs as over pages in random order.
H200, 2026-12-02, the Gluon decode kernel at page 16, GQA 32/8 d128 (docs/benchmarks_log.md, twenty-sixth session):
bench_decode at 3714647, 64 x 4k / 128 x 2k: pages from a FIFO list after a continuous batch 246.1 / 247.5 us, from
this allocator 243.9 / 244.7, in random order 246.3 / 247.7, no pages (64 x 4k) 244.0. Pages shuffled only within
2 MiB blocks read as fast as pages in order (page-order-ab.txt there: 248.7 and 247.8 against 251.3 in random order).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable

from inference.errors import KVCacheFullError

__all__ = ["PAGE_ALLOCATIONS", "TRANSLATION_BYTES", "PageAllocator", "RunPageAllocator", "cache_page_bytes",
           "check_page_allocation", "make_page_allocator", "run_pages_for"]

TRANSLATION_BYTES = 2 << 20
"""The span of one GPU address translation of a large allocation (2 MiB pages)."""

PAGE_ALLOCATIONS = ("runs", "fifo")
"""How a paged cache hands out pages: ``runs`` (RunPageAllocator: a sequence's pages in 2 MiB runs where free space
allows, read by a decode as fast as a contiguous cache) or ``fifo`` (PageAllocator: TransformerEngine's free list,
its page ids exactly)."""


def cache_page_bytes(page_size: int, heads_kv: int, head_dim_k: int, head_dim_v: int, element_size: int) -> int:
    """Bytes of one page of a paged cache's larger tensor (K or V): the unit run_pages_for counts in.

    Example:
        >>> cache_page_bytes(16, heads_kv=8, head_dim_k=128, head_dim_v=128, element_size=2)   # 32 KiB
        32768
    """
    return page_size * heads_kv * max(head_dim_k, head_dim_v) * element_size


def run_pages_for(page_bytes: int) -> int:
    """Pages of ``page_bytes`` bytes (one cache tensor's page) in one TRANSLATION_BYTES run, at least 1.

    Example:
        >>> run_pages_for(16 * 8 * 128 * 2)   # 16 tokens x 8 KV heads x d128, bf16: 32 KiB pages
        64
    """
    return max(1, TRANSLATION_BYTES // page_bytes)


def check_page_allocation(page_allocation: str) -> None:
    """ValueError unless ``page_allocation`` is one of PAGE_ALLOCATIONS."""
    if page_allocation not in PAGE_ALLOCATIONS:
        raise ValueError(f"page_allocation must be one of {PAGE_ALLOCATIONS}, got {page_allocation!r}")


def make_page_allocator(total_num_pages: int, page_allocation: str, page_bytes: int) -> PageAllocator:
    """The allocator of ``page_allocation`` (one of PAGE_ALLOCATIONS) over pages of ``page_bytes`` bytes: runs of
    run_pages_for(page_bytes) pages, or TE's FIFO list (``fifo``, or pages of 2 MiB and more, one a run).

    Example:
        >>> [type(make_page_allocator(128, allocation, 32 << 10)).__name__ for allocation in ("runs", "fifo")]
        ['RunPageAllocator', 'PageAllocator']
    """
    check_page_allocation(page_allocation)
    run_pages = run_pages_for(page_bytes) if page_allocation == "runs" else 1
    return RunPageAllocator(total_num_pages, run_pages) if run_pages > 1 else PageAllocator(total_num_pages)


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
    failing that, of the run with the most free pages (the lowest of equals), so that sequences pushed out of
    their runs at once spread over different runs. Nothing is reserved: every free page can be handed out, so the
    cache fills (and ``KVCacheFullError`` is raised) exactly when the FIFO allocator's would.

    Sequences that grow a page at a time side by side (a batch of decodes) each fill a run of their own, where
    the FIFO list deals them whatever pages came back last, one here, one there.

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
            # the run's rank only worsens: its entry in the heap stays as it was (see _next_run)
            pages.append(heapq.heappop(self._free_in_run[run]))
        self._num_free -= num_pages

    def _key(self, run: int) -> tuple[int, int, int]:
        """A run's rank (lowest first): wholly free ones, then by free pages, most first; the lowest id of equals."""
        free = len(self._free_in_run[run])
        return (free < self._run_size(run), -free, run)

    def _rank(self, run: int) -> None:
        """Enter ``run``'s current key after ``free`` raised it (its older keys go stale; rebuilt when stale ones
        crowd the heap). Allocation, which only lowers a run's rank, enters nothing: every run with a free page
        keeps an entry in the heap ranked at or above its current key, which _next_run corrects when it surfaces."""
        if self._free_in_run[run]:
            heapq.heappush(self._ranked, self._key(run))
        if len(self._ranked) > 4 * len(self._free_in_run) + 64:
            self._ranked = [self._key(r) for r, free in enumerate(self._free_in_run) if free]
            heapq.heapify(self._ranked)

    def _next_run(self) -> int:
        """The best-ranked run with a free page (the caller checked there is one). The top entry is the best when
        it is its run's current key (every run's entries rank at or above its current key); a stale top entry
        is replaced by its run's current key, or dropped when the run has no free page left."""
        ranked = self._ranked
        while True:
            run = ranked[0][2]
            current = self._key(run)
            if ranked[0] == current:
                return run
            if self._free_in_run[run]:
                heapq.heapreplace(ranked, current)
            else:
                heapq.heappop(ranked)

    def free(self, seq_id: Hashable) -> None:
        """Return every page of ``seq_id`` to its run."""
        pages = self.allocated_pages.pop(seq_id, ())
        for page in pages:
            heapq.heappush(self._free_in_run[page // self.run_pages], page)
        for run in {page // self.run_pages for page in pages}:
            self._rank(run)
        self._num_free += len(pages)

    def reset(self) -> None:
        """Free every page."""
        runs = -(-self.total_num_pages // self.run_pages)
        self.allocated_pages = {}
        self._free_in_run = [list(range(run * self.run_pages, run * self.run_pages + self._run_size(run)))
                             for run in range(runs)]   # (ascending lists are heaps)
        self._ranked = [self._key(run) for run in range(runs)]
        heapq.heapify(self._ranked)
        self._num_free = self.total_num_pages
