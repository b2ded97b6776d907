"""Host-side cost of one eager decode call: what Python adds on top of the kernel.

A tiny cell (batch 1, context 256, GQA 32/8, d=128, bf16, paged with 16-token pages) makes the
kernel far shorter than the host work, so the wall time of N back-to-back calls (no synchronize in
the loop) divided by N is the host cost per call. Reported per call: ``host µs`` (the loop's wall
time / N in the fastest of 25 repeats of 100 calls: a shared host only adds noise), the median
repeat and the same with the final drain of the GPU queue (in the note), and ``kernel µs`` (GPU
time: CUDA-graph replay when the call can be captured, else eager ``do_bench``), for:

* ``fused``: ``attention.kernels.attention_forward`` (launcher only);
* ``fused_dpa`` / ``auto``: ``DotProductAttention`` over the cache, a planned call (checks and
  backend choice made once per call signature, ``attention.call_plans``; the cache is read only:
  no append);
* the same two with a real ``inference.InferenceParams`` (``step`` appends the token first), and
  ``InferenceParams.pre_step`` alone (host bookkeeping + the metadata copies, once per iteration)
  for one and for 64 decoding sequences;
* the competitors' Python entry points, for scale;
* ``fused`` / ``fused_dpa`` at 64x4k, where the kernel dominates (host hidden behind the GPU).

    python -m benchmarks.bench_overhead --out DIR  [--smoke]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks import harness
from benchmarks.cells import Cell, Inputs, Problem
from benchmarks.config import BenchConfig, bench_dtype
from benchmarks.harness import Row
from benchmarks.timing import recover, short_error, synchronize, time_fn

SUITE = "overhead"
DEFAULT_BUDGET_S = 40.0
CALLS = 100
REPEATS = 25
PROVIDERS = ("fused", "fused_dpa", "auto", "flash2", "flash4", "sdpa_cudnn", "sdpa_flash")


def host_cost_us(fn: Callable[[], Any], cfg: BenchConfig, calls: int, repeats: int) -> tuple[float, float, float]:
    """(fastest repeat's µs per call of the launch loop alone, the median repeat's, the median repeat's
    including the final drain). The fastest repeat is the figure: a shared host adds its noise on top
    (the same loop measured 22-34 µs per call in one H200 session), never below."""
    fn()
    synchronize(cfg.device)
    loop, drained = [], []
    for _ in range(repeats):
        synchronize(cfg.device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        launched = time.perf_counter()
        synchronize(cfg.device)
        end = time.perf_counter()
        loop.append((launched - start) / calls * 1e6)
        drained.append((end - start) / calls * 1e6)
    return min(loop), statistics.median(loop), statistics.median(drained)


def _measure(row: Row, fn: Callable[[], Any], cfg: BenchConfig, calls: int, repeats: int,
             kernel: bool = True) -> None:
    row.host_us, median, drained = host_cost_us(fn, cfg, calls, repeats)
    notes = [row.note, f"median repeat {median:.1f} µs/call, {drained:.1f} incl. drain"]
    if kernel:
        timing = time_fn(fn, cuda_graph=True, cfg=cfg)
        row.us_eager, row.us_graph = timing.us_eager, timing.us_graph
        row.us = timing.us
        notes.append("kernel = graph replay" if timing.us_graph is not None else "kernel = eager")
        notes.append(timing.note)
        if cfg.cuda and row.us and row.host_us < row.us:
            notes.append("GPU-bound: host cost hidden")
    row.note = "; ".join(x for x in notes if x)


def _cell(cfg: BenchConfig, batch: int, context: int) -> Cell:
    dtype = bench_dtype(cfg)
    heads, head_dim = ((4, 2), 16) if cfg.smoke else ((32, 8), 128)
    problem = Problem(q_lens=(1,) * batch, kv_lens=(context,) * batch, heads_q=heads[0], heads_kv=heads[1],
                      head_dim=head_dim, head_dim_v=head_dim, dtype=dtype)
    return Cell(f"{batch}x{context} p16", "overhead", problem, "paged", 16, latency=True)


def _guarded(rows: list[Row], row: Row, cfg: BenchConfig, action: Callable[[], None]) -> None:
    rows.append(row)
    stop = cfg.stop_reason()
    if stop:
        row.status, row.note = "skipped", stop
        return
    try:
        with torch.no_grad():
            action()
    except Exception as error:  # noqa: BLE001 - report and go on
        row.status, row.note = "error", short_error(error)
        recover(cfg, error)
    if cfg.verbose:
        print(f"  {row.cell:<14} {row.provider:<40} host {harness.fmt_us(row.host_us)} µs  kernel "
              f"{harness.fmt_us(row.us)} µs  {row.status}  {row.note}", flush=True)


def _provider_rows(cfg: BenchConfig, cell: Cell, names: Sequence[str], calls: int, repeats: int) -> list[Row]:
    from benchmarks.providers import FACTORIES

    rows: list[Row] = []
    inputs = Inputs(cell.problem, cfg.device, cfg.seed)
    for name in names:
        if not cfg.wants_provider(name):
            continue
        row = Row(SUITE, cell.group, cell.name, name)

        def action(name: str = name, row: Row = row) -> None:
            runner, reason = FACTORIES[name](cell, inputs)
            if runner is None:
                row.status, row.note = "n/a", reason or ""
                return
            row.layout = runner.layout
            runner.fn()
            if runner.describe is not None:
                row.note = runner.describe()
            _measure(row, runner.fn, cfg, calls, repeats)
        _guarded(rows, row, cfg, action)
    return rows


def _inference_rows(cfg: BenchConfig, cell: Cell, calls: int, repeats: int) -> list[Row]:
    """DotProductAttention + a real InferenceParams (append included), and pre_step alone."""
    rows: list[Row] = []
    try:
        from inference import InferenceParams
    except Exception as error:  # noqa: BLE001
        return [Row(SUITE, cell.group, cell.name, "InferenceParams", status="n/a",
                    note=f"inference is not importable: {short_error(error)}")]
    from attention import DotProductAttention

    p = cell.problem
    context = p.kv_lens[0]
    state: dict[str, Any] = {}

    def setup() -> None:
        params = InferenceParams(1, context + 1 + (calls * repeats + 8), p.heads_kv, p.head_dim, p.dtype,
                                 is_paged=True, page_size=cell.page_size, device=cfg.device)
        params.allocate_memory(1)
        params.pre_step(OrderedDict({0: context}))
        params.pre_step(OrderedDict({0: 1}))
        state["params"] = params
        state["q"] = torch.randn(1, 1, p.heads_q, p.head_dim, dtype=p.dtype, device=cfg.device)
        state["kv"] = torch.randn(2, 1, 1, p.heads_kv, p.head_dim, dtype=p.dtype, device=cfg.device)

    for backend, label in (("fused", "fused_dpa + InferenceParams.step (append)"),
                           (None, "auto + InferenceParams.step (append)")):
        row = Row(SUITE, cell.group, cell.name, label, layout=f"paged-{cell.page_size}")

        def action(backend: str | None = backend, row: Row = row) -> None:
            if "params" not in state:
                setup()
            module = DotProductAttention(p.heads_q, p.head_dim, num_gqa_groups=p.heads_kv, qkv_format="bshd",
                                         attn_mask_type="padding_causal", layer_number=1, backend=backend)
            params, q, kv = state["params"], state["q"], state["kv"]

            def call() -> torch.Tensor:
                return module(q, kv[0], kv[1], inference_params=params)
            call()
            row.note = f"→ {module.last_backend}"
            _measure(row, call, cfg, calls, repeats)
        _guarded(rows, row, cfg, action)

    row = Row(SUITE, cell.group, cell.name, "InferenceParams.pre_step (one decode step)")

    def pre_step() -> None:
        if "params" not in state:
            setup()
        params = state["params"]
        step = OrderedDict({0: 1})
        _measure(row, lambda: params.pre_step(step), cfg, calls, repeats, kernel=False)
    _guarded(rows, row, cfg, pre_step)

    batch = 64
    row = Row(SUITE, cell.group, cell.name, f"InferenceParams.pre_step ({batch} sequences decoding)")

    def pre_step_batch() -> None:
        params = InferenceParams(batch, context + 1 + (calls * repeats + 8), p.heads_kv, p.head_dim, p.dtype,
                                 is_paged=True, page_size=cell.page_size, device=cfg.device)
        params.pre_step(OrderedDict((seq, context) for seq in range(batch)))
        step = OrderedDict((seq, 1) for seq in range(batch))   # a new page every page_size steps
        _measure(row, lambda: params.pre_step(step), cfg, calls, repeats, kernel=False)
    _guarded(rows, row, cfg, pre_step_batch)
    return rows


def run(cfg: BenchConfig) -> list[Row]:
    calls, repeats = (3, 1) if not cfg.cuda else (CALLS, REPEATS)
    tiny = _cell(cfg, 1, 32 if cfg.smoke else 256)
    if cfg.verbose:
        print(f"[{SUITE}] {tiny.name}: {calls} calls x {repeats}", flush=True)
    rows = _provider_rows(cfg, tiny, PROVIDERS, calls, repeats)
    rows += _inference_rows(cfg, tiny, calls, repeats)
    if not cfg.smoke:
        big = _cell(cfg, 64, 4096)
        rows += _provider_rows(cfg, big, ("fused", "fused_dpa"), max(calls // 4, 10), repeats)
    if cfg.cuda and cfg.context_lost is None:
        torch.cuda.empty_cache()
    return rows


def main(argv: Sequence[str] | None = None) -> list[Row]:
    return harness.suite_main(SUITE, __doc__, DEFAULT_BUDGET_S, run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
