"""``NonPagedKVCacheManager``: one cache row per batch slot, compacted when sequences finish."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping

import torch
from torch import Tensor

from inference.cache_manager import KVCacheManager, validate_step_dict
from inference.kv_append import reindex_kv_cache

__all__ = ["NonPagedKVCacheManager"]


class NonPagedKVCacheManager(KVCacheManager):
    """Caches ``[max_batch_size, max_seqlen, h_kv, d]``; the i-th sequence of a step owns row i.

    When sequences finish or the batch order changes, ``pre_step`` moves the surviving rows of
    every allocated layer so that row ``i`` again holds the ``i``-th sequence of ``step_dict``
    (TransformerEngine does the same move lazily inside each layer's step).

    Example::

        >>> import torch
        >>> from collections import OrderedDict
        >>> from inference import NonPagedKVCacheManager
        >>> manager = NonPagedKVCacheManager(max_batch_size=4, max_seqlen=64, num_heads=2,
        ...                                  head_dim_k=16, dtype=torch.float32)
        >>> k_cache, v_cache = manager.allocate_memory(layer_number=1)
        >>> k_cache.shape
        torch.Size([4, 64, 2, 16])
        >>> dict(manager.pre_step(OrderedDict({"a": 5, "b": 3})))   # lengths after the step
        {'a': 5, 'b': 3}
        >>> dict(manager.pre_step(OrderedDict({"b": 1})))   # "a" finished: b's row 1 moves to row 0
        {'b': 4}
    """

    def __init__(
        self,
        max_batch_size: int,
        max_seqlen: int,
        num_heads: int,
        head_dim_k: int,
        dtype: torch.dtype,
        head_dim_v: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v, device)
        self.cache_rows = (max_batch_size, max_seqlen)
        # Row i of the cache is "page" i of size max_seqlen; TE's FA2 path reads the same table.
        self.batch_indices_post_step = torch.arange(max_batch_size, dtype=torch.int32, device=self.device)
        self.row_table = self.batch_indices_post_step.view(max_batch_size, 1)

    def pre_step(self, step_dict: Mapping[Hashable, int],
                 lengths_after: OrderedDict[Hashable, int] | None = None) -> OrderedDict[Hashable, int]:
        """Drop finished sequences, move surviving rows into ``step_dict`` order, grow lengths."""
        if lengths_after is None:   # (InferenceParams passes the lengths it validated)
            lengths_after = validate_step_dict(step_dict, self.sequences, self.max_batch_size, self.max_seqlen)
        previous_rows = {seq_id: row for row, seq_id in enumerate(self.sequences)}
        destination_rows, source_rows, moved_length = [], [], 0
        for new_row, seq_id in enumerate(step_dict):
            old_row = previous_rows.get(seq_id)
            if old_row is not None and old_row != new_row:
                destination_rows.append(new_row)
                source_rows.append(old_row)
                moved_length = max(moved_length, self.sequences[seq_id])
        for k_cache, v_cache in self.cache.values():
            reindex_kv_cache(k_cache, v_cache, destination_rows, source_rows, moved_length)
        self.sequences = lengths_after
        self.step_lens = list(step_dict.values())
        return self.sequences

    def step(
        self,
        layer_number: int,
        new_k: Tensor,
        new_v: Tensor,
        cu_new_seqlens: Tensor,
        cu_cached_seqlens: Tensor,
        qkv_format: str,
    ) -> tuple[Tensor, Tensor]:
        """Append the new tokens; return ``cache[:b]`` for bshd/sbhd (b = batch dim), all rows for thd."""
        k_cache, v_cache = self._append(
            layer_number, new_k, new_v, self.row_table, cu_new_seqlens, cu_cached_seqlens, qkv_format
        )
        if qkv_format == "thd":
            return k_cache, v_cache
        rows = new_k.shape[0] if qkv_format == "bshd" else new_k.shape[1]
        return k_cache[:rows], v_cache[:rows]
