"""The ``KVCacheManager`` contract and the validation every manager shares.

A manager owns the per-layer K/V cache tensors and the per-sequence bookkeeping. It is driven by
``InferenceParams``: ``pre_step(step_dict)`` once per iteration on the host, then
``step(layer_number, new_k, new_v, cu_seqlens_q, cu_seqlens_kv, qkv_format)`` once per layer
inside the model's forward. Every method validates all of its input before it mutates anything,
so a refused call (``ValueError``, ``KVCacheFullError``) leaves the manager exactly as it was.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping

import torch
from torch import Tensor

from attention.integers import as_int
from inference.kv_append import append_to_kv_cache, cache_layout

__all__ = ["QKV_FORMATS", "KVCacheManager", "validate_new_kv", "validate_step_dict"]

QKV_FORMATS = ("bshd", "sbhd", "thd")


def validate_step_dict(
    step_dict: Mapping[Hashable, int],
    sequences: Mapping[Hashable, int],
    max_batch_size: int,
    max_sequence_length: int,
    max_ctx_len: int | None = None,
) -> OrderedDict[Hashable, int]:
    """Check one iteration's ``{seq_id: step_len}`` and return the lengths after the step.

    Args:
        step_dict: the sequences of this iteration in batch order and the number of new tokens
            each one brings (an int; numpy integers too). Ids absent from it but present in ``sequences`` are
            finished.
        sequences: ``{seq_id: cached length}`` before this step.
        max_batch_size, max_sequence_length: the cache's capacity.
        max_ctx_len: if given, the most new tokens one sequence may bring in one step.

    Returns:
        ``OrderedDict{seq_id: total length after the step}`` in ``step_dict`` order.

    Raises:
        ValueError: naming the offending sequence and the limit it breaks.

    Example::

        >>> from inference.cache_manager import validate_step_dict
        >>> lengths = validate_step_dict({0: 1, 7: 12}, {0: 30}, max_batch_size=4, max_sequence_length=64)
        >>> dict(lengths)   # an OrderedDict in step_dict order: sequence 0 grew by 1, sequence 7 is new
        {0: 31, 7: 12}
        >>> validate_step_dict({0: 40}, {0: 30}, max_batch_size=4, max_sequence_length=64)
        Traceback (most recent call last):
            ...
        ValueError: step_dict[0] = 40 would grow sequence 0 from 30 to 70 tokens, past max_sequence_length = 64
    """
    if not isinstance(step_dict, Mapping):
        raise ValueError(f"step_dict must be a mapping {{seq_id: step_len}}, got {type(step_dict).__name__}")
    if len(step_dict) > max_batch_size:
        raise ValueError(
            f"step_dict has {len(step_dict)} sequences but max_batch_size is {max_batch_size}"
        )
    lengths_after: OrderedDict[Hashable, int] = OrderedDict()
    cached = sequences.get
    for seq_id, step_len in step_dict.items():
        if type(step_len) is not int:   # (one check for the usual step length; numpy integers are ints too)
            step_len = as_int(step_len)
            if step_len is None:
                raise ValueError(
                    f"step_dict[{seq_id!r}] must be an int number of new tokens, got {step_dict[seq_id]!r}"
                )
        if step_len < 1:
            raise ValueError(f"step_dict[{seq_id!r}] = {step_len}: a step length must be >= 1")
        total = cached(seq_id, 0) + step_len
        if total > max_sequence_length:
            raise ValueError(
                f"step_dict[{seq_id!r}] = {step_len} would grow sequence {seq_id!r} from "
                f"{sequences.get(seq_id, 0)} to {total} tokens, past max_sequence_length = "
                f"{max_sequence_length}"
            )
        if max_ctx_len is not None and step_len > max_ctx_len:
            raise ValueError(
                f"step_dict[{seq_id!r}] = {step_len} exceeds max_ctx_len = {max_ctx_len} "
                f"(the most new tokens one sequence may bring in one step)"
            )
        lengths_after[seq_id] = total
    if len(lengths_after) != len(step_dict):   # a Mapping whose keys repeat (a dict's cannot)
        raise ValueError(f"step_dict lists a sequence id more than once: {list(step_dict)}")
    return lengths_after


def _fits(new_k: Tensor, new_v: Tensor, k_cache: Tensor, v_cache: Tensor, expected_ndim: int) -> bool:
    """validate_new_kv's checks of the new K/V against the cache, in one expression (the common case: all hold)."""
    k_shape, v_shape, k_cache_shape, v_cache_shape = new_k.shape, new_v.shape, k_cache.shape, v_cache.shape
    # sizes compared one by one: a slice of a torch.Size costs ~0.15 µs
    return (len(k_shape) == expected_ndim and (k_shape == v_shape or k_shape[:-1] == v_shape[:-1])
            and k_shape[-1] == k_cache_shape[-1] and k_shape[-2] == k_cache_shape[-2]
            and v_shape[-1] == v_cache_shape[-1] and v_shape[-2] == v_cache_shape[-2]
            and new_k.dtype == k_cache.dtype and new_v.dtype == v_cache.dtype
            and new_k.device == k_cache.device and new_v.device == v_cache.device)


def _explain_misfit(new_k: Tensor, new_v: Tensor, k_cache: Tensor, v_cache: Tensor, qkv_format: str,
                    expected_ndim: int) -> None:
    """Raise the ValueError that names the first of those checks to fail."""
    for name, new, cache in (("new_k", new_k, k_cache), ("new_v", new_v, v_cache)):
        if not isinstance(new, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(new).__name__}")
        if new.dim() != expected_ndim:
            raise ValueError(
                f"{name} must be {expected_ndim}-D for qkv_format={qkv_format!r}, got shape "
                f"{tuple(new.shape)}"
            )
        if new.dtype != cache.dtype:
            raise ValueError(f"{name}.dtype is {new.dtype} but the cache holds {cache.dtype}")
        if new.device != cache.device:
            raise ValueError(f"{name} is on {new.device} but the cache is on {cache.device}")
        if new.shape[-2] != cache.shape[-2]:
            raise ValueError(
                f"{name} has {new.shape[-2]} heads but the cache holds {cache.shape[-2]} KV heads"
            )
        if new.shape[-1] != cache.shape[-1]:
            raise ValueError(
                f"{name} has head dim {new.shape[-1]} but the cache holds head dim {cache.shape[-1]}"
            )
    if new_k.shape[:-1] != new_v.shape[:-1]:
        raise ValueError(
            f"new_k {tuple(new_k.shape)} and new_v {tuple(new_v.shape)} must agree on all dims but "
            f"the last"
        )


def validate_new_kv(
    new_k: Tensor,
    new_v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qkv_format: str,
    step_lens: list[int],
    max_batch_size: int,
) -> None:
    """Check that a step's new K/V fit the cache and hold every new token of ``step_lens``.

    ``new_k``/``new_v`` are ``[b, s, h_kv, d]`` (bshd), ``[s, b, h_kv, d]`` (sbhd) or
    ``[t, h_kv, d]`` (thd); new tokens are left-aligned in each bshd/sbhd row and packed in thd.
    ``b`` may exceed ``len(step_lens)`` (rows past the batch carry no tokens, as when a CUDA graph
    is replayed at ``max_batch_size``) but not ``max_batch_size``.

    Raises:
        ValueError: naming the argument and the expectation.
    """
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    expected_ndim = 3 if qkv_format == "thd" else 4
    if not (isinstance(new_k, Tensor) and isinstance(new_v, Tensor)
            and _fits(new_k, new_v, k_cache, v_cache, expected_ndim)):
        _explain_misfit(new_k, new_v, k_cache, v_cache, qkv_format, expected_ndim)
    if torch.compiler.is_compiling():
        # the step lengths are this step's host values: reading them would tie the graph to them (a recompile per
        # step), where the append reads lengths from the device buffers so that one graph serves every step
        return
    if qkv_format == "thd":
        if new_k.shape[0] < sum(step_lens):
            raise ValueError(
                f"new_k holds {new_k.shape[0]} tokens but this step brings {sum(step_lens)} "
                f"(sum of the step lengths given to pre_step)"
            )
        return
    batch_dim, seq_dim = (0, 1) if qkv_format == "bshd" else (1, 0)
    rows, positions = new_k.shape[batch_dim], new_k.shape[seq_dim]
    if not len(step_lens) <= rows <= max_batch_size:
        raise ValueError(
            f"new_k has batch size {rows} (dim {batch_dim} for {qkv_format}) but pre_step set "
            f"batch_size = {len(step_lens)} (allowed: batch_size..max_batch_size = {max_batch_size})"
        )
    if step_lens and positions < max(step_lens):
        raise ValueError(
            f"new_k has {positions} token positions (dim {seq_dim} for {qkv_format}) but a sequence "
            f"of this step brings {max(step_lens)} new tokens"
        )


class KVCacheManager:
    """Base class of the KV-cache managers (subclass it for ``custom_cache_manager``).

    Attributes:
        cache: ``{layer_number: (k_cache, v_cache)}``.
        sequences: ``OrderedDict{seq_id: cached length after the last pre_step}`` in batch order.
        step_lens: the step lengths of the last ``pre_step``, in batch order.

    Subclasses set ``cache_rows`` (the two leading dims of each layer's K and V; or override
    ``allocate_memory``) and implement ``pre_step`` and ``step``; ``reset`` forgets every sequence
    (cache contents are left as they are). ``InferenceParams`` builds one with keyword arguments (TE's, plus
    ``device`` when the subclass takes it). A subclass written for TE, whose ``__init__`` calls
    ``super().__init__()`` without arguments, builds too; it keeps its sizes itself and overrides
    ``allocate_memory``, ``pre_step`` and ``step`` (the base's helpers read the sizes the full call sets).
    A layer's caches, and a paged manager's ``page_table``, are allocated once: ``step`` returns the same
    tensors every call (``InferenceParams.layout_memo`` relies on their metadata staying as it is).
    """

    cache_rows: tuple[int, int] | None = None

    def __init__(
        self,
        max_batch_size: int | None = None,
        max_seqlen: int | None = None,
        num_heads: int | None = None,
        head_dim_k: int | None = None,
        dtype: torch.dtype | None = None,
        head_dim_v: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.cache: dict[int, tuple[Tensor, Tensor]] = {}
        self.sequences: OrderedDict[Hashable, int] = OrderedDict()
        self.step_lens: list[int] = []
        self._cache_layouts: dict[int, tuple] = {}   # layer -> its append's cache-side tensors and their number
        if max_batch_size is None:   # TE's ``KVCacheManager()``: a subclass that keeps its sizes itself
            return
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.num_heads = num_heads
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_k if head_dim_v is None else head_dim_v
        self.dtype = dtype
        self.device = torch.get_default_device() if device is None else torch.device(device)

    def reset(self) -> None:
        """Forget every sequence; the cache tensors keep their addresses (CUDA graphs)."""
        self.sequences = OrderedDict()
        self.step_lens = []

    def allocate_memory(self, layer_number: int) -> tuple[Tensor, Tensor]:
        """Allocate (once) and return ``layer_number``'s zeroed ``[*cache_rows, h_kv, d_k | d_v]`` K and V."""
        if self.cache_rows is None:
            raise NotImplementedError(f"{type(self).__name__} sets no cache_rows and does not override allocate_memory")
        if layer_number not in self.cache:
            self.cache[layer_number] = self._allocate_pair(self.cache_rows)
        return self.cache[layer_number]

    def pre_step(self, step_dict: Mapping[Hashable, int],
                 lengths_after: OrderedDict[Hashable, int] | None = None) -> OrderedDict[Hashable, int]:
        """Advance the bookkeeping by one iteration; return ``{seq_id: length after the step}``.
        ``lengths_after``: ``validate_step_dict``'s answer for this step against this manager's ``sequences``, when
        the caller has it (``InferenceParams`` validates each step itself): the step is not validated again."""
        raise NotImplementedError

    def step(
        self,
        layer_number: int,
        new_k: Tensor,
        new_v: Tensor,
        cu_new_seqlens: Tensor,
        cu_cached_seqlens: Tensor,
        qkv_format: str,
    ) -> tuple[Tensor, Tensor]:
        """Append this step's tokens to ``layer_number``'s cache; return the cache views."""
        raise NotImplementedError

    def _append(
        self, layer_number: int, new_k: Tensor, new_v: Tensor, slot_table: Tensor,
        cu_new_seqlens: Tensor, cu_cached_seqlens: Tensor, qkv_format: str,
    ) -> tuple[Tensor, Tensor]:
        """Validate, then write this step's tokens through ``slot_table`` (page table, or one row per
        sequence); return the layer's ``(k_cache, v_cache)``. Nothing is written when validation fails."""
        k_cache, v_cache = self.layer_cache(layer_number)
        validate_new_kv(new_k, new_v, k_cache, v_cache, qkv_format, self.step_lens, self.max_batch_size)
        layout = None
        if not torch.compiler.is_compiling():
            # the number of the cache side's metadata, kept while the same tensor objects come back (this manager's
            # caches and slot table, the caller's cu_seqlens: buffers whose metadata stays as it is)
            kept = self._cache_layouts.get(layer_number)
            if (kept is not None and kept[0] is k_cache and kept[1] is v_cache and kept[2] is slot_table
                    and kept[3] is cu_new_seqlens and kept[4] is cu_cached_seqlens):
                layout = kept[5]
            else:
                layout = cache_layout(k_cache, v_cache, slot_table, cu_new_seqlens, cu_cached_seqlens)
                self._cache_layouts[layer_number] = (k_cache, v_cache, slot_table, cu_new_seqlens, cu_cached_seqlens,
                                                     layout)
        append_to_kv_cache(new_k, new_v, k_cache, v_cache, slot_table, cu_new_seqlens, cu_cached_seqlens, qkv_format,
                           cache_layout=layout)
        return k_cache, v_cache

    def layer_cache(self, layer_number: int) -> tuple[Tensor, Tensor]:
        """Return ``cache[layer_number]`` or raise a ValueError that lists the allocated layers."""
        try:
            return self.cache[layer_number]
        except (KeyError, TypeError):   # (TypeError: an unhashable layer_number)
            raise ValueError(
                f"layer_number={layer_number!r} has no KV cache; allocated layers: "
                f"{sorted(self.cache)} (call allocate_memory(layer_number) first)"
            ) from None

    def _allocate_pair(self, leading_shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
        k_cache = torch.zeros(
            *leading_shape, self.num_heads, self.head_dim_k, dtype=self.dtype, device=self.device
        )
        v_cache = torch.zeros(
            *leading_shape, self.num_heads, self.head_dim_v, dtype=self.dtype, device=self.device
        )
        if self.device.type == "cuda":  # fixed addresses let torch.compile/CUDA graphs reuse them
            for tensor in (k_cache, v_cache):
                torch._dynamo.mark_static_address(tensor)
        return k_cache, v_cache
