"""``InferenceParams``: TransformerEngine's KV-cache bookkeeping object, with per-sequence steps.

One iteration of a serving loop::

    inference_params.pre_step(OrderedDict({seq_id: step_len, ...}))   # host side, once
    out = model(..., inference_params=inference_params)               # every attention layer
                                                                      # calls step(layer, k, v, fmt)

``pre_step`` writes ``cu_seqlens_q``, ``cu_seqlens_kv``, the pre-step lengths and the page table
into device buffers allocated once (so a captured CUDA graph replays with fresh metadata), with
copies the host does not wait for (``inference.device_upload``; the page table only where it
changed); ``step`` appends the layer's new K/V to its cache and returns what the attention backend
needs.
"""

from __future__ import annotations

import inspect
import operator
import warnings
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from itertools import accumulate, repeat

import torch
from torch import Tensor

from attention.integers import integer_argument
from inference.cache_manager import QKV_FORMATS, KVCacheManager, validate_step_dict
from inference.device_upload import upload
from inference.non_paged_cache_manager import NonPagedKVCacheManager
from inference.page_allocator import check_page_allocation
from inference.paged_cache_manager import PagedKVCacheManager, pages_for

__all__ = ["InferenceParams"]


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _accepts_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn(...)`` (a class: its constructor) takes the keyword ``name`` (or any keyword)."""
    parameters = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class InferenceParams:
    """KV caches and per-step metadata for incremental decoding (TransformerEngine API).

    Args:
        max_batch_size: most sequences in one step; sizes every metadata buffer.
        max_sequence_length: most tokens (context + generated) per sequence.
        num_heads_kv, head_dim_k, dtype: the cache's KV heads, K head dim and dtype.
        head_dim_v: V head dim (default ``head_dim_k``).
        is_paged: paged caches ``[total_num_pages, page_size, h_kv, d]`` instead of
            ``[max_batch_size, max_sequence_length, h_kv, d]``.
        total_num_pages: paged only; default ``max_batch_size * ceil(max_sequence_length /
            page_size)``; may be smaller (pages are allocated on demand).
        page_size: required when ``is_paged``; ignored, with ``total_num_pages``, otherwise (a warning, as TE
            ignores them).
        page_allocation: paged only; ``"runs"`` (default: a sequence's pages in 2 MiB runs where
            free space allows, which a decode reads as fast as a contiguous cache) or ``"fifo"``
            (TransformerEngine's free list and page ids).
        max_ctx_len: most new tokens one sequence may bring in one step (TE requires it for
            thd; default ``max_sequence_length``).
        qkv_format: format of the new tokens, ``"bshd"``, ``"sbhd"`` or ``"thd"`` (TE's argument): the initial
            value only, as every ``step`` sets it to its caller's (a module's ``qkv_format``).
        custom_cache_manager: a ``KVCacheManager`` subclass, built with the default manager's
            keyword arguments (without ``device`` when its constructor takes none, as TE's do: it is then
            built with ``device`` as torch's default device). Its ``pre_step`` gets the step's validated lengths
            as ``lengths_after=`` when it takes that keyword, as ours do.
        device: where caches and metadata live; ``None`` = current CUDA device, else CPU.

    Example::

        >>> import torch
        >>> from collections import OrderedDict
        >>> ip = InferenceParams(4, 128, num_heads_kv=2, head_dim_k=64, dtype=torch.float16,
        ...                      is_paged=True, page_size=16, total_num_pages=16, device="cpu")
        >>> ip.allocate_memory(layer_number=1)
        >>> ip.pre_step(OrderedDict({"prompt-a": 12, "prompt-b": 30}))   # two prefills
        >>> ip.cu_seqlens_q[:3], ip.cu_seqlens_kv[:3]
        (tensor([ 0, 12, 42], dtype=torch.int32), tensor([ 0, 12, 42], dtype=torch.int32))
        >>> ip.pre_step(OrderedDict({"prompt-a": 1, "prompt-b": 4}))     # decode + verify 4
    """

    cache_qkv_format = "bshd"
    """The caches' layout (TE's attribute). A class attribute: CPython 3.11 keeps the attributes of an instance with
    fewer than 30 of them inline, and reads them ~15 % faster than from a dict (tests/test_inference_params.py)."""

    step_tokens_packed = True
    """A promise to the fused backend: ``cu_seqlens_q`` starts at 0, every sequence of a step brings at least one
    token (``pre_step`` checks it), and rows past ``batch_size`` repeat its last value. So a bshd / sbhd step of one
    query row a sequence holds the step's tokens back to back, and the backend may run it as thd
    (attention/backends/fused.py). A cache object without this attribute keeps its own format."""

    def __init__(
        self,
        max_batch_size: int,
        max_sequence_length: int,
        num_heads_kv: int,
        head_dim_k: int,
        dtype: torch.dtype,
        head_dim_v: int | None = None,
        is_paged: bool = False,
        total_num_pages: int | None = None,
        page_size: int | None = None,
        max_ctx_len: int | None = None,
        qkv_format: str = "bshd",
        custom_cache_manager: type[KVCacheManager] | None = None,
        device: torch.device | str | None = None,
        page_allocation: str | None = None,
    ) -> None:
        max_batch_size = integer_argument("max_batch_size", max_batch_size, 1)
        max_sequence_length = integer_argument("max_sequence_length", max_sequence_length, 1)
        num_heads_kv = integer_argument("num_heads_kv", num_heads_kv, 1)
        head_dim_k = integer_argument("head_dim_k", head_dim_k, 1)
        if head_dim_v is not None:
            head_dim_v = integer_argument("head_dim_v", head_dim_v, 1)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(
                f"dtype must be a floating-point torch.dtype (the K/V caches' element type), got {dtype!r}")
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
        if max_ctx_len is not None:
            max_ctx_len = integer_argument("max_ctx_len", max_ctx_len, 1)
        self.max_batch_size = max_batch_size
        self.max_sequence_length = max_sequence_length
        self.num_heads_kv = num_heads_kv
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_k if head_dim_v is None else head_dim_v
        self.dtype = dtype
        self.is_paged = bool(is_paged)
        self.max_ctx_len = max_sequence_length if max_ctx_len is None else min(max_ctx_len, max_sequence_length)
        try:
            self.device = _default_device() if device is None else torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"device must be a torch.device or its name ('cuda', 'cuda:1', 'cpu'); got {device!r}: "
                             f"{error}") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, and torch.cuda.is_available() is False here")
        manager_kwargs = dict(
            num_heads=num_heads_kv, head_dim_k=head_dim_k, dtype=dtype, head_dim_v=self.head_dim_v,
            max_batch_size=max_batch_size, max_seqlen=max_sequence_length, device=self.device,
        )
        if self.is_paged:
            if page_size is None:
                raise ValueError("page_size is required when is_paged=True")
            page_size = integer_argument("page_size", page_size, 1)
            if total_num_pages is None:
                total_num_pages = max_batch_size * pages_for(max_sequence_length, page_size)
            total_num_pages = integer_argument("total_num_pages", total_num_pages, 1)
            manager_kwargs.update(total_num_pages=total_num_pages, page_size=page_size)
            if page_allocation is not None:  # (a custom manager that takes no such argument still builds)
                check_page_allocation(page_allocation)
                manager_kwargs.update(page_allocation=page_allocation)
        else:
            if page_allocation is not None:
                raise ValueError("page_allocation is for is_paged=True only")
            if total_num_pages is not None or page_size is not None:   # TE ignores them (a config's paging off)
                warnings.warn("total_num_pages and page_size are ignored with is_paged=False (as in TE)",
                              UserWarning, stacklevel=2)
                total_num_pages = page_size = None
        self.page_size = page_size
        self.total_num_pages = total_num_pages
        default_manager = PagedKVCacheManager if self.is_paged else NonPagedKVCacheManager
        manager_class = custom_cache_manager or default_manager
        if not (isinstance(manager_class, type) and issubclass(manager_class, KVCacheManager)):
            raise ValueError(
                f"custom_cache_manager must be a KVCacheManager subclass, got {custom_cache_manager!r}"
            )
        if _accepts_keyword(manager_class, "device"):
            self.cache_manager: KVCacheManager = manager_class(**manager_kwargs)
        else:   # TE's managers take no device: the default device, KVCacheManager's when none is given, is ours
            del manager_kwargs["device"]
            with self.device:
                self.cache_manager = manager_class(**manager_kwargs)

        # a manager that takes the step's validated lengths (ours do) is spared validating the step again
        self._manager_takes_lengths = _accepts_keyword(type(self.cache_manager).pre_step, "lengths_after")
        self._set_input_format(qkv_format)
        # cu_seqlens_q, cu_seqlens_kv and the pre-step lengths are views of one device buffer, each
        # starting 16-byte aligned, so pre_step writes all three with one copy.
        stride = -(-(max_batch_size + 1) // 4) * 4
        self._step_metadata = torch.zeros(3 * stride, dtype=torch.int32, device=self.device)
        self.cu_seqlens_q = self._step_metadata[: max_batch_size + 1]
        self.cu_seqlens_kv = self._step_metadata[stride : stride + max_batch_size + 1]
        self.pre_step_seqlens = self._step_metadata[2 * stride : 2 * stride + max_batch_size]
        self.sequences: OrderedDict[Hashable, int] = OrderedDict()
        self._sequences_pre_step: OrderedDict[Hashable, int] | None = None
        self.step_dict: OrderedDict[Hashable, int] = OrderedDict()
        self.batch_size = 0
        self.has_step = False
        """Whether pre_step has set up a step since construction or the last reset (a cache step is refused before
        it). A flag, not a count: torch.compile guards on it, and a count would recompile every step."""
        self.longest_sequence = 0
        """Host int: the longest sequence's length after this step's tokens (``max_sequence_length``
        bounds it; the fused backend sizes split-KV on it in eager calls)."""
        self.longest_step = 0
        """Host int: the most new tokens one sequence brings this step (``max_ctx_len`` bounds it;
        an eager thd call takes it as ``max_seqlen_q`` instead of reading ``cu_seqlens_q``)."""
        self.step_tokens = 0
        """Host int: the new tokens of this step, all sequences (a thd query of exactly this many
        rows has no padding rows)."""
        self.kv_tokens = 0
        """Host int: the tokens of every sequence after this step's, summed (the fused backend sizes
        split-KV on their mean in eager calls)."""
        self.layout_memo: dict = {}
        """Attention backends' memo of what depends only on the metadata (sizes, strides, dtypes,
        devices, alignment) of the buffers ``step`` returns and of the page table, by their own keys.
        Those buffers keep their metadata for this object's lifetime (only their contents change), so
        a backend keys them once per layer (``attention.backends.fused_launches``)."""

    def _set_input_format(self, qkv_format: str) -> None:
        self.input_qkv_format = qkv_format
        self.output_qkv_format = "bshd" if qkv_format == "bshd" else f"{qkv_format}_2bshd"

    def __repr__(self) -> str:
        paging = "non-paged"
        if self.is_paged:
            allocation = getattr(self.cache_manager, "page_allocation", None)
            paging = (f"paged, page_size={self.page_size}, total_num_pages={self.total_num_pages}"
                      + (f", page_allocation={allocation!r}" if allocation else ""))
        return (
            f"InferenceParams(max_batch_size={self.max_batch_size}, max_sequence_length="
            f"{self.max_sequence_length}, num_heads_kv={self.num_heads_kv}, head_dim_k={self.head_dim_k}, "
            f"head_dim_v={self.head_dim_v}, dtype={self.dtype}, {paging}, device={self.device}, "
            f"batch_size={self.batch_size}, sequences={dict(self.sequences)})"
        )

    def allocate_memory(self, layer_number: int) -> None:
        """Allocate ``layer_number``'s K and V caches (idempotent); call once per layer. ``layer_number``: an int >= 0,
        the ``layer_number`` of the DotProductAttention that uses them."""
        self.cache_manager.allocate_memory(integer_argument("layer_number", layer_number, 0))

    _manager_takes_lengths = False   # (a class default for InferenceParams pickled before it existed)

    def pre_step(self, step_dict: Mapping[Hashable, int]) -> None:
        """Start an iteration: ``step_dict`` lists, in batch order, every sequence of this step
        and how many new tokens it brings (prefill chunk, 1 for decode, k for verification).
        Sequences not listed are finished and their cache space is released; new ids are
        admitted in ``step_dict`` order.

        Raises ``ValueError`` (bad step) or ``KVCacheFullError`` (not enough pages) and then
        changes nothing.
        """
        lengths_after = validate_step_dict(
            step_dict, self.sequences, self.max_batch_size, self.max_sequence_length, self.max_ctx_len
        )
        step_tokens = sum(step_dict.values())
        if type(step_tokens) is not int:   # a numpy (or tensor) length among them, whose type the sum took
            step_dict = OrderedDict((seq_id, operator.index(length)) for seq_id, length in step_dict.items())
            step_tokens = sum(step_dict.values())
        if self._manager_takes_lengths:   # (validated against self.sequences, the manager's own lengths)
            self.sequences = OrderedDict(self.cache_manager.pre_step(step_dict, lengths_after=lengths_after))
        else:
            self.sequences = OrderedDict(self.cache_manager.pre_step(step_dict))
        self.step_dict = OrderedDict(step_dict)
        self.batch_size = len(step_dict)
        self.has_step = True
        self.longest_sequence = max(self.sequences.values(), default=0)
        self.longest_step = max(self.step_dict.values(), default=0)
        self.step_tokens = step_tokens
        pre_step = self._lengths_before_step()
        self._sequences_pre_step = None   # (sequences_pre_step builds its OrderedDict when first read)
        stride = self._step_metadata.shape[0] // 3
        cu_q = [0, *accumulate(self.step_dict.values())]
        cu_kv = [0, *accumulate(self.sequences.values())]
        self.kv_tokens = cu_kv[-1]
        host = array("i", cu_q)   # int32 (64 sequences: torch.tensor of the list cost 13 µs, this 4)
        host.extend(repeat(cu_q[-1], stride - len(cu_q)))
        host.extend(cu_kv)
        host.extend(repeat(cu_kv[-1], stride - len(cu_kv)))
        host.extend(pre_step)
        host.extend(repeat(0, stride - len(pre_step)))
        upload(self._step_metadata, torch.frombuffer(host, dtype=torch.int32))

    @property
    def sequences_pre_step(self) -> OrderedDict[Hashable, int]:
        """``{seq_id: cached length before this step}`` in batch order (built from the step's lengths on first read:
        a serving loop that does not read it does not pay for it)."""
        if self._sequences_pre_step is None:
            self._sequences_pre_step = OrderedDict(zip(self.sequences, self._lengths_before_step()))
        return self._sequences_pre_step

    def _lengths_before_step(self) -> list[int]:
        """Each sequence's cached length before this step, in the order of ``sequences``."""
        return list(map(operator.sub, self.sequences.values(), map(self.step_dict.__getitem__, self.sequences)))

    def step(
        self, layer_number: int, new_k: Tensor, new_v: Tensor, qkv_format: str
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, int, str]:
        """Append this step's new K/V to ``layer_number``'s cache (called by the attention module).

        Args:
            new_k, new_v: ``[b, s, h_kv, d]`` / ``[s, b, h_kv, d]`` / ``[t, h_kv, d]``; new tokens
                left-aligned per row (bshd/sbhd) or packed by ``cu_seqlens_q`` (thd).

        Returns:
            ``(k_cache, v_cache, cu_seqlens_q, cu_seqlens_kv, max_sequence_length,
            output_qkv_format)``: non-paged caches ``[b, max_sequence_length, h_kv, d]`` (all
            ``max_batch_size`` rows for thd), paged caches ``[total_num_pages, page_size, h_kv, d]``;
            int32 ``[max_batch_size + 1]`` cu_seqlens; format ``"bshd"``, ``"sbhd_2bshd"`` or
            ``"thd_2bshd"``.
        """
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
        if not self.has_step:
            self.check_stepped()
        k_cache, v_cache = self.cache_manager.step(
            layer_number, new_k, new_v, self.cu_seqlens_q, self.cu_seqlens_kv, qkv_format
        )
        self._set_input_format(qkv_format)
        return (
            k_cache, v_cache, self.cu_seqlens_q, self.cu_seqlens_kv, self.max_sequence_length,
            self.output_qkv_format,
        )

    def check_stepped(self) -> None:
        """Raise a ValueError unless pre_step has set up a step since construction or the last reset (a thd
        cache step of padding rows before it would append nothing and attend to no key, silently)."""
        if not self.has_step:
            raise ValueError("inference_params has no step: call inference_params.pre_step({sequence id: new tokens, "
                             "...}) before the attention layers (after construction and after reset())")

    def get_seqlens_pre_step(self) -> Tensor:
        """int32 ``[max_batch_size]``: each sequence's cached length before this step (RoPE offsets)."""
        return self.pre_step_seqlens

    def convert_paged_to_nonpaged(self, layer_number: int, rows: int | None = None) -> tuple[Tensor, Tensor]:
        """``layer_number``'s caches as ``[rows, max_sequence_length, h_kv, d]`` (a gather through the page table
        for paged caches, a view for non-paged ones). ``rows``: the step's ``batch_size`` by default; more, up to
        ``max_batch_size``, for a batch padded as TE's CUDA-graph recipe does (a traced call passes its own batch,
        so that torch.compile does not guard on ``batch_size``)."""
        if rows is None:
            rows = self.batch_size
        elif not isinstance(rows, torch.SymInt):   # (a traced batch is checked where it was made)
            rows = integer_argument("rows", rows, 0)
            if rows > self.max_batch_size:
                raise ValueError(f"rows={rows} exceeds max_batch_size={self.max_batch_size}: the caches hold no more")
        k_cache, v_cache = self.cache_manager.layer_cache(layer_number)
        if not self.is_paged:
            return k_cache[:rows], v_cache[:rows]
        page_table = self.cache_manager.page_table[:rows].long()
        converted = []
        for cache in (k_cache, v_cache):
            gathered = cache[page_table]  # [b, pages_per_seq, page_size, h_kv, d]
            gathered = gathered.reshape(rows, page_table.shape[1] * cache.shape[1], *cache.shape[2:])
            converted.append(gathered[:, : self.max_sequence_length].contiguous())
        return converted[0], converted[1]

    def reset(self) -> None:
        """Forget every sequence (buffers keep their addresses; cache contents stay)."""
        self.cache_manager.reset()
        self.sequences = OrderedDict()
        self._sequences_pre_step = None
        self.step_dict = OrderedDict()
        self.batch_size = 0
        self.has_step = False
        self.longest_sequence = 0
        self.longest_step = 0
        self.step_tokens = 0
        self.kv_tokens = 0
        self._step_metadata.zero_()   # cu_seqlens_q, cu_seqlens_kv, pre_step_seqlens
