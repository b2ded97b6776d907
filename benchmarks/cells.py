"""Benchmark cells: the attention problem, where its KV lives, and its input tensors.

A *cell* is one attention problem (sequence lengths, heads, dims, mask) plus where its KV lives
(a paged cache, a non-paged cache or packed ``thd`` tensors). ``Inputs`` builds the tensors of a
problem once, in every layout a provider may want.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Problem:
    """One attention computation: per-sequence query and KV lengths, heads, dims, mask.

    ``causal`` is bottom-right aligned (query i of a sequence with q_len queries and kv_len keys sees
    keys up to kv_len - q_len + i), which equals top-left causal when q_len == kv_len.
    """

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128
    head_dim_v: int = 128
    causal: bool = False
    dtype: torch.dtype = torch.bfloat16

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @property
    def max_q(self) -> int:
        return max(self.q_lens)

    @property
    def max_kv(self) -> int:
        return max(self.kv_lens)

    @property
    def uniform_q(self) -> bool:
        return len(set(self.q_lens)) == 1

    @property
    def uniform_kv(self) -> bool:
        return len(set(self.kv_lens)) == 1

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V the kernel must read: sum_i L_i * H_kv * (d + d_v) * elem."""
        return self.total_kv * self.heads_kv * (self.head_dim + self.head_dim_v) * self.element_size

    @property
    def flops(self) -> float:
        """Forward FLOPs, FlashAttention convention: 2 * h * s_q * s_k * (d + d_v) per sequence; with a
        (bottom-right) causal mask s_k becomes the mean visible keys (max(0, s_k - s_q) + s_k) / 2, the
        trapezoid of a chunk over a prefix, i.e. halved for causal self-attention."""
        total = 0.0
        for s_q, s_k in zip(self.q_lens, self.kv_lens):
            visible = (max(0, s_k - s_q) + s_k) / 2 if self.causal else s_k
            total += 2.0 * self.heads_q * s_q * visible * (self.head_dim + self.head_dim_v)
        return total


@dataclass(frozen=True)
class Cell:
    """One benchmark cell: a problem and where its KV lives.

    kv_source: ``paged`` (cache ``[pages, page_size, h_kv, d]`` through a random page table),
    ``dense`` (non-paged cache ``[b, s_max, h_kv, d]`` + lengths) or ``packed`` (``thd`` tensors,
    prefill). Competitors that need another page size use their own (the row's ``layout`` says).
    latency: also time CUDA-graph replay (launch-bound cells). metric: ``bandwidth`` (GB/s of K+V)
    or ``flops`` (TFLOP/s). settle: compute-bound work, which holds the H200 at its power cap: run it
    back to back before timing it, and time it over the throughput window (benchmarks/timing.py).
    providers: restrict the providers for this cell (None = all). page_order: where a paged cache's pages
    lie (``Inputs``'s ``page_order``), every paged provider's alike.
    """

    name: str
    group: str
    problem: Problem
    kv_source: str = "paged"
    page_size: int | None = 16
    latency: bool = False
    metric: str = "bandwidth"
    settle: bool = False
    providers: tuple[str, ...] | None = None
    note: str = ""
    page_order: str = "random"


PAGE_ORDERS = ("random", "fifo", "runs")
"""Where a paged cache's pages lie: ``random`` (a random permutation of the pages the sequences use) or as a
serving run allots them after a history of earlier requests (served_page_table), through TransformerEngine's FIFO
free list (``fifo``) or inference.RunPageAllocator (``runs``, InferenceParams' default)."""
SERVED_PROMPT_TOKENS = 512
"""served_page_table's shortest prompt: sequence s's prompt has 512 + (997 s mod 512) tokens (or all of a shorter
sequence), so that the decodes cross page boundaries at different steps, as a continuous batch's do."""


def served_prompt_tokens(seq: int) -> int:
    """The prompt of served_page_table's sequence ``seq`` (SERVED_PROMPT_TOKENS)."""
    return SERVED_PROMPT_TOKENS + (seq * 997) % SERVED_PROMPT_TOKENS


def served_page_table(kv_lens: Sequence[int], page_size: int, page_bytes: int, order: str,
                      seed: int = 0) -> tuple[list[list[int]], int]:
    """(each sequence's pages, the pool's pages) as a serving run allots them, through TransformerEngine's FIFO free
    list (``fifo``) or inference.RunPageAllocator (``runs``, of ``page_bytes`` pages).

    First a history that cycles the pool three times, a continuous batch of as many earlier requests as there are
    sequences: prompts of 1 to the longest sequence's pages, each request then growing a page a step to a random
    end (up to that many pages more), finishing early when the pages in use reach the sequences' share; those live
    at the end stay. That leaves a FIFO list in the order pages came back, as a server's is after a while. Then
    the sequences: admitted in turn with prompts of different lengths (SERVED_PROMPT_TOKENS), decoded a token at a
    time side by side (a page for each sequence that crosses a page boundary, in batch order) to their lengths. The
    pool holds twice the sequences' pages and a run (RunPageAllocator's) for each sequence."""
    import random

    from inference.page_allocator import make_page_allocator, run_pages_for

    rng = random.Random(seed)
    pages = [-(-length // page_size) for length in kv_lens]
    pool = 2 * sum(pages) + len(pages) * (run_pages_for(page_bytes) if order == "runs" else 1)  # a run each
    allocator = make_page_allocator(pool, order, page_bytes)
    live: dict[str, list[int]] = {}   # an earlier request: [pages held, pages at its end]
    share, longest, allotted = sum(pages), max(pages), 0
    while allotted < 3 * pool:   # one step: admissions, then a page more for every live request
        while len(live) < len(pages):
            prompt = rng.randint(1, longest)
            if allocator.total_num_pages - allocator.num_free + prompt > share:
                break
            name = f"earlier {allotted}"
            allocator.allocate(name, prompt)
            live[name] = [prompt, prompt + rng.randint(0, longest)]
            allotted += prompt
        for name, (held, end) in list(live.items()):
            if held == end or allocator.total_num_pages - allocator.num_free >= share:
                allocator.free(name)
                del live[name]
            else:
                allocator.allocate(name, 1)
                live[name][0] += 1
                allotted += 1
    held = [-(-min(length, served_prompt_tokens(seq)) // page_size) for seq, length in enumerate(kv_lens)]
    for seq, count in enumerate(held):
        allocator.allocate(seq, count)
    while held != pages:
        for seq, count in enumerate(held):
            if count < pages[seq]:
                allocator.allocate(seq, 1)
                held[seq] += 1
    return [allocator.pages_of(seq) for seq in range(len(kv_lens))], pool


class Inputs:
    """The tensors of one problem, in every layout a provider may want (built lazily, cached).

    The source of truth is a dense K/V ``[b, s_pad, h_kv, d]`` (s_pad = max KV length rounded up to
    256, so every page size up to 256 divides it); paged caches are copies of it in pages placed by
    ``page_order`` (one of PAGE_ORDERS), packed ``thd`` K/V and SDPA's ``[b, h, s, d]`` are gathers of it.
    """

    def __init__(self, problem: Problem, device: torch.device, seed: int = 0, page_order: str = "random") -> None:
        if page_order not in PAGE_ORDERS:
            raise ValueError(f"page_order must be one of {PAGE_ORDERS}, got {page_order!r}")
        p = problem
        self.problem = p
        self.device = device
        self.seed = seed
        self.page_order = page_order
        torch.manual_seed(seed)
        self.s_pad = round_up(p.max_kv, 256)
        self.q = torch.randn(p.total_q, p.heads_q, p.head_dim, device=device, dtype=p.dtype)
        self.k_dense = torch.randn(p.batch, self.s_pad, p.heads_kv, p.head_dim, device=device, dtype=p.dtype)
        self.v_dense = torch.randn(p.batch, self.s_pad, p.heads_kv, p.head_dim_v, device=device, dtype=p.dtype)
        self.cu_q = self._cumulative(p.q_lens)
        self.cu_kv = self._cumulative(p.kv_lens)
        self.q_start = self.cu_q[:-1]
        self.kv_start = self.cu_kv[:-1]
        self.kv_lens = torch.tensor(p.kv_lens, dtype=torch.int32, device=device)
        self.scale = 1.0 / math.sqrt(p.head_dim)
        self._cache: dict[Any, Any] = {}

    def _cumulative(self, lengths: Sequence[int]) -> torch.Tensor:
        values = [0]
        for length in lengths:
            values.append(values[-1] + int(length))
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def paged(self, page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache, page_table)``: the pages the sequences use, placed by ``page_order``."""
        key = ("paged", page_size)
        if key not in self._cache:
            p = self.problem
            if self.s_pad % page_size:
                raise ValueError(f"page_size {page_size} must divide {self.s_pad}")
            pages = [-(-length // page_size) for length in p.kv_lens]
            seq_index = torch.repeat_interleave(torch.arange(p.batch), torch.tensor(pages))
            page_index = torch.cat([torch.arange(n) for n in pages])
            if self.page_order == "random":
                generator = torch.Generator().manual_seed(self.seed + page_size)
                permutation, pool = torch.randperm(len(seq_index), generator=generator), len(seq_index)
            else:
                from inference.page_allocator import cache_page_bytes

                page_bytes = cache_page_bytes(page_size, p.heads_kv, p.head_dim, p.head_dim_v, p.element_size)
                served, pool = served_page_table(p.kv_lens, page_size, page_bytes, self.page_order)
                permutation = torch.tensor([page for seq_pages in served for page in seq_pages])
            seq_d, page_d, perm_d = (t.to(self.device) for t in (seq_index, page_index, permutation))
            caches = []
            for dense in (self.k_dense, self.v_dense):
                by_page = dense.view(p.batch, self.s_pad // page_size, page_size, *dense.shape[2:])
                cache = torch.zeros((pool, page_size) + tuple(dense.shape[2:]), dtype=dense.dtype,
                                    device=self.device)
                cache[perm_d] = by_page[seq_d, page_d]
                caches.append(cache)
            table = torch.zeros(p.batch, max(pages), dtype=torch.int32, device=self.device)
            table[seq_d, page_d] = perm_d.to(torch.int32)
            self._cache[key] = (caches[0], caches[1], table)
        return self._cache[key]

    def packed_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V as ``thd`` ``[total_kv, h_kv, d]``: sequence b's first kv_len_b rows, back to back."""
        if "packed" not in self._cache:
            p = self.problem
            lengths = torch.tensor(p.kv_lens)
            seq = torch.repeat_interleave(torch.arange(p.batch), lengths)
            starts = torch.cumsum(lengths, 0) - lengths
            pos = torch.arange(p.total_kv) - starts[seq]
            seq, pos = seq.to(self.device), pos.to(self.device)
            self._cache["packed"] = (self.k_dense[seq, pos].contiguous(), self.v_dense[seq, pos].contiguous())
        return self._cache["packed"]

    def bhsd(self, repeat_kv: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SDPA's contiguous ``[b, h, s, d]`` q/k/v (uniform lengths only); ``repeat_kv`` expands GQA."""
        key = ("bhsd", repeat_kv)
        if key not in self._cache:
            p = self.problem
            if not (p.uniform_q and p.uniform_kv):
                raise ValueError("bhsd needs equal lengths")
            q = self.q.view(p.batch, p.max_q, p.heads_q, p.head_dim).transpose(1, 2).contiguous()
            k = self.k_dense[:, : p.max_kv].transpose(1, 2).contiguous()
            v = self.v_dense[:, : p.max_kv].transpose(1, 2).contiguous()
            if repeat_kv:
                group = p.heads_q // p.heads_kv
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            self._cache[key] = (q, k, v)
        return self._cache[key]

    def new_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Placeholder new K/V ``[total_q, h_kv, d]`` for DotProductAttention calls over a cache."""
        if "new" not in self._cache:
            p = self.problem
            k = torch.zeros(p.total_q, p.heads_kv, p.head_dim, dtype=p.dtype, device=self.device)
            v = torch.zeros(p.total_q, p.heads_kv, p.head_dim_v, dtype=p.dtype, device=self.device)
            self._cache["new"] = (k, v)
        return self._cache["new"]
