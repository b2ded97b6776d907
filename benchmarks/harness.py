"""The shared benchmark harness: the per-cell loop, its rows, and one suite's command line.

For each cell (``benchmarks.cells``) the harness builds the inputs once (``Inputs``), asks every
provider (``benchmarks.providers``) for a runner, checks each runner's output against a reference
provider, and times it (``benchmarks.timing``: eager with a cold L2, plus CUDA-graph replay for
latency cells). Run-wide settings and the shared command-line options live in ``benchmarks.config``.

A provider that cannot run a cell says why (status ``n/a``); one that raises is reported as an
``error`` row with the message and the suite goes on. A CUDA error that poisons the context stops
the process's remaining cells (``run_all --isolate`` runs each suite in its own process).
Reporting (run header, console tables, CSV, PNG plots, markdown) lives in ``benchmarks.report``.

``Problem``, ``Cell``, ``Inputs``, ``BenchConfig``, ``Timing`` and the helpers around them are
re-exported here under their old names (``harness.time_fn``, ``harness.bench_dtype``, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.cells import Cell, Inputs, Problem, round_up
from benchmarks.config import (
    BenchConfig,
    add_common_arguments,
    bench_dtype,
    check_providers,
    config_from_args,
    environment_smoke_default,
)
from benchmarks.timing import (  # noqa: F401
    FLUSH_BYTES,
    Timing,
    graph_replay_us,
    recover,
    short_error,
    synchronize,
    time_fn,
)

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
REFERENCE_ORDER = ("unfused", "sdpa_flash", "sdpa_cudnn", "flash2", "flash4", "fused", "fused_dense", "fused_dpa",
                   "auto")
"""Execution order inside a cell: the first provider that runs gives the reference output."""
ERROR_TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 3e-2}
"""Largest |out - reference| accepted before a row is flagged MISMATCH (it computed something else)."""
RELATIVE_TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
"""Largest ||out - reference|| / ||reference|| accepted. Outputs averaged over many keys are small (~0.05 on a 2k
chunk over 30k keys), where the absolute bound alone passed a result that ignored the causal mask or skipped a
page of keys (relative 0.04-0.3); correct rows read ~5e-3 in bf16."""
CELL_GRACE_S = 30.0
"""A cell started before the deadline runs its remaining providers until this long past it."""


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
    ref_norm = float(ref.norm()) if result.numel() else 0.0
    relative = float((result - ref).norm()) / ref_norm if ref_norm > 0 else 0.0
    dtype = cell.problem.dtype
    if (not math.isfinite(row.max_err) or row.max_err > ERROR_TOLERANCE[dtype]
            or not math.isfinite(relative) or relative > RELATIVE_TOLERANCE[dtype]):
        row.status = "mismatch"
        row.note = "; ".join(x for x in (row.note, f"MISMATCH vs {ref_name} (relative {relative:.1e})") if x)


def _measure(cell: Cell, name: str, runner: Runner, row: Row, cfg: BenchConfig, reference: list) -> Timing | None:
    """First call (timed: compile + run), output check, then the timing (or a memoised one: the same
    provider, problem and layout were measured in an earlier cell). Returns the timing when it was taken here
    (memoised for later cells) and has a graph replay, which ``run_cell`` times a second time. A paged layout's
    timing is shared only between cells of the same page order."""
    order = cell.page_order if runner.layout.startswith("paged") else None
    key = (name, cell.problem, runner.layout, order, cell.latency, cell.settle)
    fresh = None
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
        timing = time_fn(runner.fn, cell.latency and runner.graphable, cfg, settled=cell.settle)
        cfg.memo[key] = (timing, cell.name)
        fresh = timing
    row.us_eager, row.p20, row.p80, row.us_graph = timing.us_eager, timing.p20, timing.p80, timing.us_graph
    row.us = timing.us
    if timing.note:
        row.note = "; ".join(x for x in (row.note, timing.note) if x)
    return fresh if fresh is not None and fresh.us_graph is not None else None


def _second_graph_round(cell: Cell, timed: list[tuple[Row, Runner, Timing]], cfg: BenchConfig) -> None:
    """Each row's graph replay timed again, in the first round's order; a row keeps its faster round (the
    memoised timing too). See benchmarks.timing's note on the two rounds."""
    for row, runner, timing in timed:
        if cfg.stop_reason(grace_s=CELL_GRACE_S):
            return
        try:
            with torch.no_grad():
                us = graph_replay_us(runner.fn, cfg, cell.settle)
        except Exception as error:  # noqa: BLE001 - the first round stands
            recover(cfg, error)
            continue
        if us < timing.us_graph:
            timing.us_graph = row.us_graph = row.us = us
            _metrics(row, cell)


def run_cell(suite: str, cell: Cell, cfg: BenchConfig, factories: dict[str, Callable]) -> list[Row]:
    """Every wanted provider on one cell; never raises for a provider's failure."""
    names = [n for n in REFERENCE_ORDER if n in factories and cfg.wants_provider(n)
             and (cell.providers is None or n in cell.providers)]
    stop = cfg.stop_reason()
    if stop:
        return [Row(suite, cell.group, cell.name, name, status="skipped", note=stop) for name in names]
    try:
        inputs = Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order)
    except Exception as error:  # noqa: BLE001 - out of memory and the like: report and go on
        recover(cfg, error)
        return [Row(suite, cell.group, cell.name, "(inputs)", status="error", note=short_error(error))]
    rows: list[Row] = []
    reference: list = []
    timed: list[tuple[Row, Runner, Timing]] = []
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
                        timing = _measure(cell, name, runner, row, cfg, reference)
                    if timing is not None and row.status == "ok":
                        timed.append((row, runner, timing))
                    if row.status == "ok" and row.us is None:
                        row.status = "error"
            except Exception as error:  # noqa: BLE001 - report in the row, keep going
                row.status = "error"
                row.note = "; ".join(x for x in (row.note, short_error(error)) if x)
                recover(cfg, error)
            _metrics(row, cell)
            _log(cfg, row)
        _second_graph_round(cell, timed, cfg)
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
    check_providers(parser, args.providers)
    from benchmarks import report

    cfg = config_from_args(args)
    rows = run(cfg)
    if not rows and cfg.cells:
        parser.error(f"--cells: no {suite} cell matches {', '.join(cfg.cells)}")
    report.print_suite(suite, rows)
    written = report.write_suite_outputs(suite, rows, args.out, report.environment_header(cfg.device, cfg.l2_flush))
    print("wrote " + ", ".join(written))
    return rows
