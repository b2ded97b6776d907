"""Errors raised by the KV-cache machinery."""

from __future__ import annotations

__all__ = ["KVCacheFullError"]


class KVCacheFullError(RuntimeError):
    """A step needs more KV-cache pages than are free; nothing was changed.

    Attributes:
        pages_needed: pages the refused step would have had to allocate.
        pages_free: pages free (counting those that the step's finished sequences would free).

    Example::

        >>> try:
        ...     inference_params.pre_step(step_dict)
        ... except KVCacheFullError as error:
        ...     print(error.pages_needed, error.pages_free)   # retry with fewer new sequences
    """

    def __init__(self, pages_needed: int, pages_free: int, detail: str = "") -> None:
        self.pages_needed = pages_needed
        self.pages_free = pages_free
        message = (
            f"KV cache is full: this step needs {pages_needed} new page(s) but only {pages_free} "
            f"are free; the cache, the page table and the sequences were left unchanged"
        )
        if detail:
            message += f" ({detail})"
        super().__init__(message)
