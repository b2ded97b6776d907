"""``PageAllocator``: the free list of KV-cache pages and which sequence owns which page."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from inference.errors import KVCacheFullError

__all__ = ["PageAllocator"]


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
        self.free_pages: deque[int] = deque(range(total_num_pages))
        self.allocated_pages: dict[Hashable, list[int]] = {}

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
        self.free_pages = deque(range(self.total_num_pages))
        self.allocated_pages = {}
