"""The shared benchmark harness: cells, inputs, timing, the per-cell loop and the run header.

A *cell* is one attention problem (sequence lengths, heads, dims, mask) plus where its KV lives
(a paged cache, a non-paged cache or packed ``thd`` tensors). For each cell the harness builds the
inputs once (``Inputs``), asks every provider (``benchmarks.providers``) for a runner, checks each
runner's output against a reference provider, and times it:

* eager: ``triton.testing.do_bench`` (median, p20/p80), which zeroes a 256 MB buffer before every
  call, so L2 is cold;
* CUDA graph (latency cells): one call captured in a graph, replayed with the same L2 flush before
  each replay and CUDA events around the replay only (``do_bench_cudagraph`` keeps L2 warm, which
  flatters cells whose KV fits the H200's 50 MB L2).

A provider that cannot run a cell says why (status ``n/a``); one that raises is reported as an
``error`` row with the message and the suite goes on. A CUDA error that poisons the context stops
the process's remaining cells (``run_all --isolate`` runs each suite in its own process).
Reporting (run header, console tables, CSV, PNG plots, markdown) lives in ``benchmarks.report``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "COMPETITORS",
    "OURS",
    "BenchConfig",
    "Cell",
    "Inputs",
    "Problem",
    "Row",
    "Runner",
    "Timing",
    "add_common_arguments",
    "bench_dtype",
    "config_from_args",
    "round_up",
    "run_cells",
    "suite_main",
    "time_fn",
]

OURS = ("fused", "fused_dense", "fused_dpa", "auto")
"""Our providers: the kernels direct (paged / non-paged), through DotProductAttention, automatic."""
COMPETITORS = ("flash2", "flash4", "sdpa_cudnn", "sdpa_flash", "unfused")
"""Everything the fused backend is measured against (unfused only runs small cells)."""
REFERENCE_ORDER = ("unfused", "sdpa_flash", "sdpa_cudnn", "flash2", "flash4", "fused", "fused_dense", "fused_dpa", "auto")
"""Execution order inside a cell: the first provider that runs gives the reference output."""
ERROR_TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 3e-2}
"""Largest |out - reference| accepted before a row is flagged MISMATCH (it computed something else)."""
FLUSH_BYTES = 256 * 1024 * 1024
CELL_GRACE_S = 30.0
"""A cell started before the deadline runs its remaining providers until this long past it."""


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
    or ``flops`` (TFLOP/s). providers: restrict the providers for this cell (None = all).
    """

    name: str
    group: str
    problem: Problem
    kv_source: str = "paged"
    page_size: int | None = 16
    latency: bool = False
    metric: str = "bandwidth"
    providers: tuple[str, ...] | None = None
    note: str = ""


@dataclass
class Runner:
    """What a provider hands the harness for one cell.

    fn: the timed call (returns the output). to_thd: output -> ``[total_q, h_q, d_v]`` for the
    check. layout: where the KV is read from (``paged-16``, ``dense``, ``thd``, ``bhsd``, ...).
    describe: called after the first call, its text goes into the row's note (e.g. which backend
    ``auto`` chose).
    """

    fn: Callable[[], Any]
    to_thd: Callable[[Any], torch.Tensor]
    layout: str
    note: str = ""
    graphable: bool = True
    describe: Callable[[], str] | None = None


@dataclass
class Timing:
    us_eager: float | None = None
    p20: float | None = None
    p80: float | None = None
    us_graph: float | None = None
    note: str = ""


ROW_FIELDS = (
    "suite", "group", "cell", "provider", "layout", "status", "us", "us_eager", "us_graph", "p20", "p80",
    "gbps", "tflops", "speedup", "best_competitor", "max_err", "first_call_s", "host_us", "kv_mb", "gflop", "note",
)


@dataclass
class Row:
    """One (cell, provider) result; ``us`` is the headline time (graph replay when measured, else eager).

    status: ok | n/a (cannot run, note says why) | error | skipped | mismatch (ran, wrong numbers).
    speedup: best competitor's us / this row's us (> 1: faster than the best competitor).
    """

    suite: str
    group: str
    cell: str
    provider: str
    layout: str = ""
    status: str = "ok"
    us: float | None = None
    us_eager: float | None = None
    us_graph: float | None = None
    p20: float | None = None
    p80: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    speedup: float | None = None
    best_competitor: str = ""
    max_err: float | None = None
    first_call_s: float | None = None
    host_us: float | None = None
    kv_mb: float | None = None
    gflop: float | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BenchConfig:
    """Run-wide settings. ``deadline`` (time.monotonic) and a lost CUDA context stop new cells."""

    device: torch.device
    smoke: bool = False
    warmup_ms: float = 5.0
    rep_ms: float = 30.0
    cpu_reps: int = 1
    graphs: bool = True
    check: bool = True
    providers: tuple[str, ...] | None = None
    cells: tuple[str, ...] | None = None
    deadline: float | None = None
    seed: int = 0
    verbose: bool = True
    context_lost: str | None = None
    progress_csv: str | None = None
    memo: dict[Any, tuple[Timing, str]] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def stop_reason(self, grace_s: float = 0.0) -> str | None:
        """Why new work must not start: a lost CUDA context, or the deadline (+ ``grace_s``) passed."""
        if self.context_lost:
            return f"CUDA context lost earlier ({self.context_lost}); rerun this suite alone"
        if self.deadline is not None and time.monotonic() > self.deadline + grace_s:
            return "time budget exhausted (raise --budget-s, or run this suite alone)"
        return None

    def wants_cell(self, name: str) -> bool:
        return not self.cells or any(part in name for part in self.cells)

    def wants_provider(self, name: str) -> bool:
        return not self.providers or name in self.providers


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------------
# Inputs: built once per cell, every provider reads the same numbers through its own layout.


class Inputs:
    """The tensors of one problem, in every layout a provider may want (built lazily, cached).

    The source of truth is a dense K/V ``[b, s_pad, h_kv, d]`` (s_pad = max KV length rounded up to
    256, so every page size up to 256 divides it); paged caches are copies of it scattered through
    a random page permutation, packed ``thd`` K/V and SDPA's ``[b, h, s, d]`` are gathers of it.
    """

    def __init__(self, problem: Problem, device: torch.device, seed: int = 0) -> None:
        p = problem
        self.problem = p
        self.device = device
        self.seed = seed
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
        """``(k_cache, v_cache, page_table)``: only the pages the sequences use, in random order."""
        key = ("paged", page_size)
        if key not in self._cache:
            p = self.problem
            if self.s_pad % page_size:
                raise ValueError(f"page_size {page_size} must divide {self.s_pad}")
            pages = [-(-length // page_size) for length in p.kv_lens]
            seq_index = torch.repeat_interleave(torch.arange(p.batch), torch.tensor(pages))
            page_index = torch.cat([torch.arange(n) for n in pages])
            generator = torch.Generator().manual_seed(self.seed + page_size)
            permutation = torch.randperm(len(seq_index), generator=generator)
            seq_d, page_d, perm_d = (t.to(self.device) for t in (seq_index, page_index, permutation))
            caches = []
            for dense in (self.k_dense, self.v_dense):
                by_page = dense.view(p.batch, self.s_pad // page_size, page_size, *dense.shape[2:])
                cache = torch.empty((len(seq_index), page_size) + tuple(dense.shape[2:]), dtype=dense.dtype,
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


# ------------------------------------------------------------------------------------------------
# Timing.

_FLUSH: dict[torch.device, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    if device not in _FLUSH:
        _FLUSH[device] = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
    return _FLUSH[device]


def _graph_replay_us(fn: Callable[[], Any], device: torch.device, rep_ms: float) -> float:
    """Median µs of one CUDA-graph replay of ``fn`` with L2 flushed before each replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    try:
        flush = _flush_buffer(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        torch.cuda.synchronize(device)
        estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
        count = int(min(max(rep_ms / (estimate_ms + 0.1), 10), 500))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            flush.zero_()
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize(device)
        return 1000.0 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    finally:
        del graph


def time_fn(fn: Callable[[], Any], cuda_graph: bool, cfg: BenchConfig) -> Timing:
    """Time ``fn``: eager median (p20, p80) with cold L2, plus CUDA-graph replay when asked.

    On CPU (smoke runs) a wall-clock median of ``cfg.cpu_reps`` calls; no graphs.
    """
    if not cfg.cuda:
        times = []
        for _ in range(max(1, cfg.cpu_reps)):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return Timing(us_eager=statistics.median(times), p20=min(times), p80=max(times))
    import triton.testing

    median, p20, p80 = triton.testing.do_bench(
        fn, warmup=cfg.warmup_ms, rep=cfg.rep_ms, quantiles=[0.5, 0.2, 0.8], return_mode="median")
    timing = Timing(us_eager=median * 1000, p20=p20 * 1000, p80=p80 * 1000)
    if cuda_graph and cfg.graphs:
        try:
            timing.us_graph = _graph_replay_us(fn, cfg.device, cfg.rep_ms)
        except Exception as error:  # noqa: BLE001 - a provider that cannot be captured still has eager numbers
            timing.note = f"graph capture failed: {short_error(error)}"
            recover(cfg, error)
    return timing


# ------------------------------------------------------------------------------------------------
# The per-cell loop.

_FATAL = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
          "an illegal instruction", "CUDA error: unknown error", "uncorrectable ECC")


def short_error(error: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def recover(cfg: BenchConfig, error: BaseException) -> None:
    """After an exception: is the CUDA context still usable? If not, stop the remaining cells."""
    if not cfg.cuda:
        return
    message = str(error)
    try:
        torch.cuda.synchronize(cfg.device)
    except Exception as sync_error:  # noqa: BLE001
        cfg.context_lost = short_error(sync_error, 160)
        return
    if any(marker in message for marker in _FATAL):
        cfg.context_lost = short_error(error, 160)


def fmt_us(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _log(cfg: BenchConfig, row: Row) -> None:
    if not cfg.verbose:
        return
    if row.status in ("ok", "mismatch"):
        metric = f"{row.gbps:8.0f} GB/s" if row.gbps is not None and row.tflops is None else (
            f"{row.tflops:7.1f} TFLOP/s" if row.tflops is not None else "")
        graph = f" graph {row.us_graph:9.1f}" if row.us_graph is not None else ""
        text = f"{row.us_eager:10.1f} us{graph} {metric}"
    else:
        text = row.status
    note = f"  [{row.note}]" if row.note else ""
    print(f"  {row.cell:<28} {row.provider:<12} {row.layout:<14} {text}{note}", flush=True)


def _metrics(row: Row, cell: Cell) -> None:
    p = cell.problem
    row.kv_mb = p.kv_bytes / 1e6
    row.gflop = p.flops / 1e9
    if row.us:
        if cell.metric == "bandwidth":
            row.gbps = p.kv_bytes / (row.us * 1e-6) / 1e9
        else:
            row.tflops = p.flops / (row.us * 1e-6) / 1e12


def assign_speedups(rows: list[Row], competitors: Sequence[str] = COMPETITORS) -> None:
    """Fill ``speedup`` (best competitor us / row us) and ``best_competitor`` for one cell's rows."""
    timed = [r for r in rows if r.status == "ok" and r.us]
    rivals = [r for r in timed if r.provider in competitors or r.provider.startswith("best competitors")]
    if not rivals:
        return
    best = min(rivals, key=lambda r: r.us)
    for row in timed:
        row.speedup = best.us / row.us
        row.best_competitor = best.provider


def _check(cell: Cell, name: str, runner: Runner, out: Any, row: Row, reference: list) -> None:
    """Compare the output with the cell's reference (the first provider that ran becomes it)."""
    result = runner.to_thd(out).float()
    if not reference:
        reference.append((name, result))
        row.max_err = 0.0
        row.note = "; ".join(x for x in (row.note, "reference") if x)
        return
    ref_name, ref = reference[0]
    row.max_err = float((result - ref).abs().max()) if result.numel() else 0.0
    if not math.isfinite(row.max_err) or row.max_err > ERROR_TOLERANCE[cell.problem.dtype]:
        row.status = "mismatch"
        row.note = "; ".join(x for x in (row.note, f"MISMATCH vs {ref_name}") if x)


def _measure(cell: Cell, name: str, runner: Runner, row: Row, cfg: BenchConfig, reference: list) -> None:
    """First call (timed: compile + run), output check, then the timing (or a memoised one: the same
    provider, problem and layout were measured in an earlier cell)."""
    key = (name, cell.problem, runner.layout, cell.latency)
    synchronize(cfg.device)
    start = time.perf_counter()
    out = runner.fn()
    synchronize(cfg.device)
    row.first_call_s = time.perf_counter() - start
    if runner.describe is not None:
        row.note = "; ".join(x for x in (row.note, runner.describe()) if x)
    if cfg.check:
        _check(cell, name, runner, out, row, reference)
    del out
    if key in cfg.memo:
        timing, origin = cfg.memo[key]
        row.note = "; ".join(x for x in (row.note, f"timing shared with {origin}") if x)
    elif cfg.smoke and not cfg.cuda:  # the interpreter: the first call is timing enough
        timing = Timing(us_eager=row.first_call_s * 1e6)
    else:
        timing = time_fn(runner.fn, cell.latency and runner.graphable, cfg)
        cfg.memo[key] = (timing, cell.name)
    row.us_eager, row.p20, row.p80, row.us_graph = timing.us_eager, timing.p20, timing.p80, timing.us_graph
    row.us = timing.us_graph if timing.us_graph is not None else timing.us_eager
    if timing.note:
        row.note = "; ".join(x for x in (row.note, timing.note) if x)


def run_cell(suite: str, cell: Cell, cfg: BenchConfig, factories: dict[str, Callable]) -> list[Row]:
    """Every wanted provider on one cell; never raises for a provider's failure."""
    names = [n for n in REFERENCE_ORDER if n in factories and cfg.wants_provider(n)
             and (cell.providers is None or n in cell.providers)]
    stop = cfg.stop_reason()
    if stop:
        return [Row(suite, cell.group, cell.name, name, status="skipped", note=stop) for name in names]
    try:
        inputs = Inputs(cell.problem, cfg.device, cfg.seed)
    except Exception as error:  # noqa: BLE001 - out of memory and the like: report and go on
        recover(cfg, error)
        return [Row(suite, cell.group, cell.name, "(inputs)", status="error", note=short_error(error))]
    rows: list[Row] = []
    reference: list = []
    try:
        for name in names:
            row = Row(suite, cell.group, cell.name, name)
            rows.append(row)
            stop = cfg.stop_reason(grace_s=CELL_GRACE_S)  # a started cell finishes unless far over time
            if stop:
                row.status, row.note = "skipped", stop
                continue
            try:
                runner, reason = factories[name](cell, inputs)
                if runner is None:
                    row.status, row.note = "n/a", reason or ""
                else:
                    row.layout, row.note = runner.layout, runner.note
                    with torch.no_grad():
                        _measure(cell, name, runner, row, cfg, reference)
                    if row.status == "ok" and row.us is None:
                        row.status = "error"
            except Exception as error:  # noqa: BLE001 - report in the row, keep going
                row.status = "error"
                row.note = "; ".join(x for x in (row.note, short_error(error)) if x)
                recover(cfg, error)
            _metrics(row, cell)
            _log(cfg, row)
    finally:
        del inputs, reference
        if cfg.cuda and cfg.context_lost is None:
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
    assign_speedups(rows)
    return rows


def run_cells(suite: str, cells: Sequence[Cell], cfg: BenchConfig, factories: dict[str, Callable]) -> list[Row]:
    rows: list[Row] = []
    for cell in cells:
        if not cfg.wants_cell(cell.name):
            continue
        if cfg.verbose:
            p = cell.problem
            print(f"[{suite}] {cell.name}: b={p.batch} q={p.max_q} kv<={p.max_kv} h={p.heads_q}/{p.heads_kv} "
                  f"d={p.head_dim} causal={p.causal} kv={cell.kv_source}"
                  + (f"/{cell.page_size}" if cell.kv_source == "paged" else ""), flush=True)
        cell_rows = run_cell(suite, cell, cfg, factories)
        rows.extend(cell_rows)
        if cfg.progress_csv:
            append_csv(cell_rows, cfg.progress_csv)
    return rows


def append_csv(rows: Sequence[Row], path: str) -> None:
    """Append rows to a CSV (header when new): survives a crash later in the run."""
    import csv

    new = not os.path.exists(path)
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=ROW_FIELDS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.as_dict().items()})


def suite_main(suite: str, doc: str | None, default_budget_s: float, run: Callable[[BenchConfig], list[Row]],
               argv: Sequence[str] | None) -> list[Row]:
    """The command line of one suite run alone: run it, print its table, write CSV, PNG and markdown."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, default_budget_s)
    args = parser.parse_args(argv)
    if args.smoke:
        environment_smoke_default()
    from benchmarks import report

    cfg = config_from_args(args)
    rows = run(cfg)
    report.print_suite(suite, rows)
    written = report.write_suite_outputs(suite, rows, args.out, report.environment_header(cfg.device))
    print("wrote " + ", ".join(written))
    return rows


def environment_smoke_default() -> None:
    """Smoke runs without a GPU execute the fused kernels in Triton's interpreter (before any import)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


# ------------------------------------------------------------------------------------------------
# Command line and configuration (shared by every script).


def add_common_arguments(parser: Any, default_budget_s: float) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="output directory (CSV, PNG, markdown)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, a few calls: checks the scripts (CPU: fused kernels in the interpreter)")
    parser.add_argument("--providers", default=None, help="comma list of providers to run (default: all)")
    parser.add_argument("--cells", default=None, help="comma list of substrings: run only cells whose name matches")
    parser.add_argument("--budget-s", type=float, default=default_budget_s,
                        help="wall-clock budget; cells left when it runs out are reported as skipped (0 = none)")
    parser.add_argument("--warmup-ms", type=float, default=5.0, help="do_bench warmup per measurement")
    parser.add_argument("--rep-ms", type=float, default=30.0, help="do_bench / graph-replay time per measurement")
    parser.add_argument("--no-graphs", action="store_true", help="skip CUDA-graph replay timings")
    parser.add_argument("--no-check", action="store_true", help="skip comparing outputs across providers")
    parser.add_argument("--quiet", action="store_true", help="no per-measurement progress lines")


def _split(text: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None


def config_from_args(args: Any, budget_s: float | None = None) -> BenchConfig:
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    budget = args.budget_s if budget_s is None else budget_s
    return BenchConfig(
        device=device, smoke=args.smoke, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
        graphs=not args.no_graphs, check=not args.no_check, providers=_split(args.providers),
        cells=_split(args.cells), deadline=time.monotonic() + budget if budget and budget > 0 else None,
        verbose=not args.quiet,
    )


def bench_dtype(cfg: BenchConfig) -> torch.dtype:
    """bf16 on the GPU; fp16 in the CPU interpreter (its bf16 ``tl.dot`` gives wrong numbers)."""
    return torch.bfloat16 if cfg.cuda else torch.float16
