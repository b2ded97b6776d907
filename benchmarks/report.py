"""Reporting for the benchmark harness: run header, console tables, CSV, PNG plots, markdown.

Everything here works from ``Row`` records alone, so results read back from CSV (``run_all
--isolate`` merges per-suite processes that way) render exactly like results made in-process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import torch

from benchmarks.harness import COMPETITORS, ROW_FIELDS, Row, append_csv

__all__ = [
    "environment_header", "git_commit", "header_table", "markdown_report", "plot_suite", "print_suite", "read_csv",
    "summary_table", "write_csv", "write_suite_outputs",
]


# ------------------------------------------------------------------------------------------------
# Run header: what ran where.


def _dist_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _command_output(command: list[str], cwd: str | None = None) -> str | None:
    import subprocess

    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def git_commit() -> str:
    """$BENCH_COMMIT when set (a copied tree may carry a stale ``.git``), else ``git rev-parse --short
    HEAD`` (+ ``-dirty``), else ``unknown``."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = _command_output(["git", "rev-parse", "--short", "HEAD"], cwd=root)
    if commit is None:
        return "unknown"
    dirty = _command_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return commit + ("-dirty" if dirty else "")


def environment_header(device: torch.device, l2_flush: str = "read") -> dict[str, str]:
    """The run's date, commit, GPU and versions, and ``l2_flush``: how graph replays flushed L2
    (``benchmarks.timing``)."""
    import datetime
    import platform

    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = f"{props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)"
        driver = _command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        info["driver / CUDA / cuDNN"] = f"{(driver or '?').splitlines()[0]} / {torch.version.cuda} / " \
                                         f"{torch.backends.cudnn.version()}"
    else:
        info["gpu"] = "none: CPU smoke run (fused kernels in the Triton interpreter); timings mean nothing"
    info["torch"] = torch.__version__
    info["triton"] = _dist_version("triton") or "not installed"
    info["flash-attn 2"] = _dist_version("flash-attn") or "not installed"
    info["flash-attn-4"] = _dist_version("flash-attn-4") or "not installed"
    info["python"] = platform.python_version()
    info["L2 flush"] = l2_flush
    for name in ("ATTN_FUSED_VARIANTS", "ATTN_TRITON_FAST_LAUNCH"):  # the fused kernels' tuning, when set
        if os.environ.get(name):
            info[name] = os.environ[name]
    return info


# ------------------------------------------------------------------------------------------------
# Console tables, CSV, plots, markdown.

DISPLAY_ORDER = ("fused", "fused (separately)", "fused_dense", "fused_dpa", "auto", "flash2", "flash2 (separately)",
                 "flash4", "flash4 (separately)", "sdpa_cudnn", "sdpa_cudnn (separately)", "sdpa_flash",
                 "sdpa_flash (separately)", "unfused", "unfused (separately)", "best competitors (separately)")
_METRIC = {"decode": ("gbps", "GB/s"), "prefill": ("tflops", "TFLOP/s"), "mixed": ("us", "µs"),
           "overhead": ("host_us", "host µs")}


def _order(provider: str) -> int:
    return DISPLAY_ORDER.index(provider) if provider in DISPLAY_ORDER else len(DISPLAY_ORDER)


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}" if abs(value) < 1e5 else f"{value:,.0f}"


def _cells(rows: Sequence[Row]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.setdefault(row.cell, None)
    return list(seen)


def _by_cell(rows: Sequence[Row]) -> dict[str, dict[str, Row]]:
    table: dict[str, dict[str, Row]] = {}
    for row in rows:
        table.setdefault(row.cell, {})[row.provider] = row
    return table


def _value(row: Row | None, key: str) -> float | None:
    if row is None or row.status != "ok":
        return None
    return getattr(row, key)


def summary_table(suite: str, rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """One line per cell: each provider's headline metric, the best competitor and our speedups."""
    if suite == "overhead":
        header = ["call", "host µs/call", "kernel µs", "note"]
        body = [[f"{r.cell}: {r.provider}", _fmt(r.host_us), _fmt(r.us), r.note if r.status == "ok" else
                 f"{r.status}: {r.note}"] for r in rows]
        return header, body
    key, unit = _METRIC.get(suite, ("us", "µs"))
    providers = sorted({r.provider for r in rows if r.status == "ok"}, key=_order)
    own_time = [] if key == "us" else ["fused µs"]
    header = ["cell", "GFLOP" if key == "tflops" else "KV MB", *own_time] + [f"{p} {unit}" for p in providers] + [
        "best competitor (µs)", "fused × best", "auto"]
    ratio_to = [p for p in providers if p in COMPETITORS] if suite == "prefill" else []
    header += [f"fused × {p}" for p in ratio_to]
    body = []
    for cell, by_provider in _by_cell(rows).items():
        any_row = next(iter(by_provider.values()))
        size = any_row.gflop if key == "tflops" else any_row.kv_mb
        fused = by_provider.get("fused")
        line = [cell, _fmt(size, 0)] + ([_fmt(_value(fused, "us"))] if own_time else [])
        line += [_fmt(_value(by_provider.get(p), key)) for p in providers]
        best = by_provider.get(fused.best_competitor) if fused and fused.best_competitor else None
        line.append(f"{best.provider} ({_fmt(best.us)})" if best else "–")
        line.append(f"{fused.speedup:.2f}x" if fused and fused.status == "ok" and fused.speedup else "–")
        auto = by_provider.get("auto")
        line.append(auto.note.split(";")[0] if auto and auto.status == "ok" else (auto.status if auto else "–"))
        for p in ratio_to:
            other, mine = _value(by_provider.get(p), "us"), _value(fused, "us")
            line.append(f"{other / mine:.2f}x" if other and mine else "–")
        body.append(line)
    return header, body


def detail_table(suite: str, rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    header = ["cell", "provider", "layout", "status", "µs", "eager µs (p20–p80)", "graph µs", "GB/s", "TFLOP/s",
              "× best", "max err", "1st call s", "note"]
    body = []
    for cell, by_provider in _by_cell(rows).items():
        for provider in sorted(by_provider, key=_order):
            r = by_provider[provider]
            eager = _fmt(r.us_eager)
            if r.us_eager is not None and r.p20 is not None and r.p80 is not None:
                eager += f" ({_fmt(r.p20)}–{_fmt(r.p80)})"
            body.append([cell, provider, r.layout or "–", r.status, _fmt(r.us), eager, _fmt(r.us_graph),
                         _fmt(r.gbps, 0), _fmt(r.tflops), f"{r.speedup:.2f}x" if r.speedup else "–",
                         f"{r.max_err:.1e}" if r.max_err is not None else "–",
                         _fmt(r.first_call_s, 2), r.note.replace("|", "/")])
    return header, body


def print_suite(suite: str, rows: Sequence[Row]) -> None:
    """The suite's summary table on stdout (rich when importable, else plain text)."""
    header, body = summary_table(suite, rows)
    title = f"{suite}: " + ("host cost per call" if suite == "overhead" else
                            f"{_METRIC.get(suite, ('us', 'µs'))[1]} per provider; fused × best = best "
                            "competitor time / fused time (> 1: fused faster)")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(x)) for x in column) for column in zip(header, *body)]
        print(f"\n{title}")
        for line in [header] + body:
            print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))
    else:
        from rich import box

        table = Table(title=title, box=box.SIMPLE_HEAD, show_lines=False)
        for index, name in enumerate(header):
            table.add_column(name, overflow="fold", no_wrap=index == 0)
        for line in body:
            table.add_row(*line)
        Console(width=max(200, 15 * len(header))).print(table)
    for r in rows:
        if r.status in ("error", "mismatch"):
            print(f"  {r.status.upper()} {r.cell} / {r.provider}: {r.note}")


def write_csv(rows: Sequence[Row], path: str) -> None:
    if os.path.exists(path):
        os.remove(path)
    append_csv(rows, path)


def read_csv(path: str) -> list[Row]:
    import csv

    numeric = {f.name for f in dataclasses.fields(Row) if "float" in str(f.type)}
    rows = []
    with open(path, newline="") as handle:
        for record in csv.DictReader(handle):
            values = {k: (float(v) if v != "" else None) if k in numeric else v for k, v in record.items()
                      if k in ROW_FIELDS}
            rows.append(Row(**values))
    return rows


def plot_suite(suite: str, rows: Sequence[Row], path: str, title: str = "") -> str | None:
    """Grouped horizontal bars per cell and provider (PNG); returns a reason when it cannot plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    key, unit = _METRIC.get(suite, ("us", "µs"))
    ok = [r for r in rows if r.status == "ok" and _value(r, key) is not None]
    if not ok:
        return "nothing to plot"
    cells = _cells(ok)
    providers = sorted({r.provider for r in ok}, key=_order)
    by_cell = _by_cell(ok)
    bar = 0.8 / len(providers)
    fig_height = max(3.0, 0.18 * len(cells) * len(providers) + 1.5)
    fig, ax = plt.subplots(figsize=(11, fig_height))
    colors = plt.get_cmap("tab20")
    for j, provider in enumerate(providers):
        ys = [i + j * bar for i, cell in enumerate(cells) if provider in by_cell[cell]]
        xs = [getattr(by_cell[cell][provider], key) for cell in cells if provider in by_cell[cell]]
        ax.barh(ys, xs, height=bar, label=provider, color=colors(j % 20))
    ax.set_yticks([i + 0.4 - bar / 2 for i in range(len(cells))])
    ax.set_yticklabels(cells, fontsize=8)
    ax.invert_yaxis()
    better = "lower is better" if key in ("us", "host_us") else "higher is better"
    ax.set_xlabel(f"{unit} ({better})")
    ax.set_title(title or suite, fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(x) for x in line) + " |" for line in body]
    return "\n".join(lines)


def header_table(header: dict[str, str]) -> str:
    """``environment_header``'s dict as a two-column markdown table (the top of every report)."""
    return _markdown_table(["", ""], [[key, value] for key, value in header.items()])


METHOD = (
    "Method: every timed call starts with L2 flushed. *eager* = `triton.testing.do_bench` median (p20–p80) of "
    "the plain call (do_bench zeroes a 256 MB buffer before each); *graph* = median of one CUDA-graph replay "
    "of the call (latency cells; mixed cells), CUDA events around the replay only, after reading a 256 MB "
    "buffer (L2 cold and clean; the header's `L2 flush` says `zero` when it was zeroed instead, which leaves "
    "dirty lines that the timed call writes back). "
    "Prefill and mixed cells are timed after the call has run back to back for `--settle-ms` (default 250 ms), "
    "at the GPU's steady clock under its power cap, and over `--throughput-rep-ms` (default 300 ms), long enough "
    "to average the clock's swings there. "
    "`µs` is the graph time when measured, else eager. Decode GB/s = bytes of K+V the call must read / time; "
    "prefill TFLOP/s = 4·h·s_q·s_k·d per sequence, causal counts the visible trapezoid (halved for self-attention). "
    "`fused × best` = best competitor's time / fused time (> 1: fused is faster). Every output is compared with "
    "a reference provider (unfused when it runs, else SDPA, flash-attn, fused in that order): `max err`; a "
    "provider that computes something else is flagged `mismatch`. Providers: `fused` = "
    "`attention.kernels.attention_forward` on the cell's paged cache, `fused_dense` = the same on a non-paged "
    "cache, `fused_dpa` = `DotProductAttention(backend='fused')`, `auto` = `DotProductAttention()` (its choice "
    "in the note), `flash2`/`flash4` = flash-attn 2 / flash-attn-4 (their own page size where they need one: "
    "see `layout`), `sdpa_cudnn`/`sdpa_flash` = torch SDPA on contiguous [b, h, s, d], `unfused` = our PyTorch "
    "backend (small cells).")


def markdown_report(header: dict[str, str], suites: dict[str, Sequence[Row]], extra: str = "") -> str:
    """The combined results file (paste into docs/benchmarks.md)."""
    parts = ["# Benchmark results", "", header_table(header), "", METHOD]
    if extra:
        parts += ["", extra]
    for suite, rows in suites.items():
        parts += ["", f"## {suite}", ""]
        header_row, body = summary_table(suite, rows)
        parts += [_markdown_table(header_row, body)]
        if suite != "overhead":
            parts += ["", "<details><summary>all rows</summary>", ""]
            detail_header, detail_body = detail_table(suite, rows)
            parts += [_markdown_table(detail_header, detail_body), "", "</details>"]
    from benchmarks import targets

    checked = targets.report({"this run": targets.group_rows(r for rows in suites.values() for r in rows)},
                             only_readable=True)
    if checked:
        intro = ("The performance targets of issues #6 and #7 (`benchmarks/targets.py`): the worst cell of each "
                 "target this run can be checked against.")
        parts += ["", "## Against the project's targets", "", intro, "", checked]
    problems = [r for rows in suites.values() for r in rows if r.status in ("error", "mismatch")]
    if problems:
        parts += ["", "## Errors and mismatches", ""]
        parts += [f"- {r.suite} / {r.cell} / {r.provider}: **{r.status}** {r.note}" for r in problems]
    return "\n".join(parts) + "\n"


def write_suite_outputs(suite: str, rows: Sequence[Row], out_dir: str, header: dict[str, str]) -> list[str]:
    """A single suite run alone: ``<suite>.csv``, ``<suite>.png``, ``<suite>.md`` in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    written = [os.path.join(out_dir, f"{suite}.csv"), os.path.join(out_dir, f"{suite}.md")]
    write_csv(rows, written[0])
    with open(written[1], "w") as handle:
        handle.write(markdown_report(header, {suite: rows}))
    png = os.path.join(out_dir, f"{suite}.png")
    if suite != "overhead" and plot_suite(suite, rows, png, f"{suite} - {header.get('gpu', '')}") is None:
        written.append(png)
    return written
