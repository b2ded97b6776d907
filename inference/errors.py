"""Errors raised by the KV-cache machinery."""

from __future__ import annotations

__all__ = ["KVCacheFullError"]


class KVCacheFullError(RuntimeError):
    """A step needs more KV-cache pages than are free; nothing was changed.

    Attributes:
        pages_needed: pages the refused step would have had to allocate.
        pages_free: pages free (counting those that the step's finished sequences would free).

    Example::

        >>> import torch
        >>> from collections import OrderedDict
        >>> from inference import InferenceParams, KVCacheFullError
        >>> inference_params = InferenceParams(2, 64, num_heads_kv=2, head_dim_k=16, dtype=torch.float32,
        ...                                    is_paged=True, page_size=16, total_num_pages=2)
        >>> try:
        ...     inference_params.pre_step(OrderedDict({"a": 20, "b": 20}))   # 2 pages each
        ... except KVCacheFullError as error:
        ...     print(error.pages_needed, error.pages_free)   # retry with fewer new sequences
        4 2
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
