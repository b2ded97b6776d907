"""The issues' performance targets, read off benchmark CSVs: one column per run, the worst cell of each target.

    python -m benchmarks.targets RUN.csv [RUN.csv ...]          # a suite's CSV or run_all's results.csv
    python -m benchmarks.targets b=runs/b/prefill.csv c=runs/c/prefill.csv   # label=path names a column
    python -m benchmarks.targets runs/a/decode.csv runs/a/mixed.csv runs/b/decode.csv   # one column per label

CSVs with one label (their folder's name, or label=) are one run: their suites' rows go in one column.
Prints a markdown table (a target per row, a run per column: the worst value, its cell, and whether every
cell of the target holds; with two runs or more, a last column of each cell's median over the runs) and then
each miss. A target is checked in a run only on cells where the
providers it compares both ran; a run without them shows ``–``. The targets (figures, never asserted in
tests):

* prefill (#7): fused >= 1.1x flash-attn 2 on every cell; fused >= 0.8x flash-attn-4 on the d=128 cells
  whose longest sequence has >= 4k keys (the ragged batch, up to 4096, counts); fused on a paged chunk
  >= 0.9x fused on the same chunk over a non-paged cache.
* decode (#6): fused at least as fast as the best competitor on every cell; 1x8k <= 20 µs; 64x4k,
  128x2k and 32x32k >= 3.9 TB/s; 64x4k at pages 1/16/64/256 within 5 % of the non-paged time.
* mixed (#6): the one launch <= 0.9x the best separate calls (the faster of ours and the best
  competitors' per part).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.harness import COMPETITORS, Row

Cells = dict[str, dict[str, dict[str, float]]]
"""cell name -> provider -> {"us", "gbps", "tflops"} of the rows that ran (status ok)."""


@dataclass(frozen=True)
class Target:
    suite: str
    issue: int
    text: str
    unit: str
    """``x`` (a ratio), ``µs`` or ``TB/s``: how values print."""
    bound: float
    at_least: bool
    """True: a value must be >= ``bound``; False: <= ``bound``."""
    values: Callable[[Cells], dict[str, float]]
    """The target's value on each cell of a run where it can be read."""

    def holds(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    def worst(self, values: dict[str, float]) -> tuple[str, float]:
        pick = min if self.at_least else max
        cell = pick(values, key=values.__getitem__)
        return cell, values[cell]

    def format(self, value: float) -> str:
        return f"{value:.3f}x" if self.unit == "x" else f"{value:,.2f} {self.unit}"


def _problems(suite: str) -> dict[str, object]:
    """Cell name -> Problem of the full-size (GPU) cells of a suite."""
    import importlib

    from benchmarks.config import BenchConfig

    module = importlib.import_module(f"benchmarks.bench_{suite}")
    return {cell.name: cell.problem for cell in module.cells(BenchConfig(device=torch.device("cpu")))}


def _us(cells: Cells, cell: str, provider: str) -> float | None:
    row = cells.get(cell, {}).get(provider)
    return row["us"] if row else None


def _speedups(cells: Cells, rival: str, names: Sequence[str]) -> dict[str, float]:
    """rival µs / fused µs on each named cell where both ran (> 1: fused is faster)."""
    pairs = {name: (_us(cells, name, "fused"), _us(cells, name, rival)) for name in names}
    return {name: theirs / ours for name, (ours, theirs) in pairs.items() if ours and theirs}


def _prefill_flash2(cells: Cells) -> dict[str, float]:
    return _speedups(cells, "flash2", list(cells))


def _prefill_flash4(cells: Cells) -> dict[str, float]:
    problems = _problems("prefill")
    return _speedups(cells, "flash4", [name for name in cells if name in problems
                                       and problems[name].head_dim == 128 and problems[name].max_kv >= 4096])


def _prefill_paged_chunk(cells: Cells) -> dict[str, float]:
    """Non-paged fused µs / paged fused µs of each paged chunk cell."""
    out = {}
    for name in cells:
        if name.startswith("chunk") and not name.endswith("non-paged"):
            paged, contiguous = _us(cells, name, "fused"), _us(cells, name.rsplit(" ", 1)[0] + " non-paged", "fused")
            if paged and contiguous:
                out[name] = contiguous / paged
    return out


def _decode_best(cells: Cells) -> dict[str, float]:
    out = {}
    for name, rows in cells.items():
        rivals = [row["us"] for provider, row in rows.items() if provider in COMPETITORS]
        if "fused" in rows and rivals:
            out[name] = min(rivals) / rows["fused"]["us"]
    return out


def _decode_1x8k(cells: Cells) -> dict[str, float]:
    us = _us(cells, "1x8k p16", "fused")
    return {"1x8k p16": us} if us else {}


def _decode_large(cells: Cells) -> dict[str, float]:
    rows = {name: cells.get(name, {}).get("fused") for name in ("64x4k p16", "128x2k p16", "32x32k p16")}
    return {name: row["gbps"] / 1e3 for name, row in rows.items() if row and "gbps" in row}


def _decode_pages(cells: Cells) -> dict[str, float]:
    """Paged fused µs / non-paged fused µs at 64x4k."""
    contiguous = _us(cells, "64x4k non-paged", "fused")
    paged = {name: _us(cells, name, "fused") for name in ("64x4k p1", "64x4k p16", "64x4k p64", "64x4k p256")}
    return {name: us / contiguous for name, us in paged.items() if us and contiguous}


def _mixed_launch(cells: Cells) -> dict[str, float]:
    """Fused one-launch µs / the faster of the separate calls (ours, the best competitors')."""
    out = {}
    for name, rows in cells.items():
        separate = [rows[p]["us"] for p in ("fused (separately)", "best competitors (separately)") if p in rows]
        if "fused" in rows and separate:
            out[name] = rows["fused"]["us"] / min(separate)
    return out


TARGETS = (
    Target("prefill", 7, "fused >= 1.1x flash2, every cell", "x", 1.1, True, _prefill_flash2),
    Target("prefill", 7, "fused >= 0.8x flash4, d128 with >= 4k keys", "x", 0.8, True, _prefill_flash4),
    Target("prefill", 7, "paged chunk >= 0.9x non-paged (fused)", "x", 0.9, True, _prefill_paged_chunk),
    Target("decode", 6, "fused >= 1.0x best competitor, every cell", "x", 1.0, True, _decode_best),
    Target("decode", 6, "1x8k p16 <= 20 µs", "µs", 20.0, False, _decode_1x8k),
    Target("decode", 6, "64x4k, 128x2k, 32x32k >= 3.9 TB/s", "TB/s", 3.9, True, _decode_large),
    Target("decode", 6, "64x4k paged <= 1.05x non-paged time", "x", 1.05, False, _decode_pages),
    Target("mixed", 6, "one launch <= 0.9x the best separate calls", "x", 0.9, False, _mixed_launch),
)


def group_rows(rows: Iterable[Row]) -> dict[str, Cells]:
    """suite -> Cells of the rows that ran (status ok)."""
    suites: dict[str, Cells] = {}
    for row in rows:
        if row.status == "ok" and row.us:
            values = {key: getattr(row, key) for key in ("us", "gbps", "tflops") if getattr(row, key) is not None}
            suites.setdefault(row.suite, {}).setdefault(row.cell, {})[row.provider] = values
    return suites


def load(path: str | Path) -> dict[str, Cells]:
    """suite -> Cells from one run's CSV (rows of every suite in it)."""
    from benchmarks.report import read_csv

    return group_rows(read_csv(str(path)))


def _label(argument: str) -> tuple[str, str]:
    if "=" in argument:
        label, path = argument.split("=", 1)
        return label, path
    path = Path(argument)
    return (path.parent.name if path.stem in ("prefill", "decode", "mixed", "results") else path.stem), argument


def _column(target: Target, values: dict[str, float]) -> tuple[str, list[tuple[str, float]]]:
    """A table entry (the worst cell, and whether every cell holds) and the misses."""
    if not values:
        return "–", []
    cell, value = target.worst(values)
    misses = [(name, v) for name, v in values.items() if not target.holds(v)]
    verdict = "holds" if not misses else f"**{len(misses)} of {len(values)} miss**"
    return f"{target.format(value)} ({cell}); {verdict}", misses


def report(runs: dict[str, dict[str, Cells]], only_readable: bool = False) -> str:
    """The markdown table and the misses for these runs (label -> suite -> Cells). With two runs or more, a
    last column takes each cell's median over the runs that have it. ``only_readable`` leaves out the
    targets no run can be checked against ("" when none can)."""
    with_median = len(runs) > 1
    header = list(runs) + (["median of runs"] if with_median else [])
    lines = ["| target | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    missed = []
    for target in TARGETS:
        per_run = {label: target.values(suites.get(target.suite, {})) for label, suites in runs.items()}
        if only_readable and not any(per_run.values()):
            continue
        if with_median:
            cells = dict.fromkeys(cell for values in per_run.values() for cell in values)
            per_run["median of runs"] = {
                cell: statistics.median(values[cell] for values in per_run.values() if cell in values)
                for cell in cells}
        columns = []
        for label, values in per_run.items():
            entry, misses = _column(target, values)
            columns.append(entry)
            missed += [f"- {label}: {target.text}: {cell} {target.format(v)}" for cell, v in misses]
        lines.append(f"| {target.text} (#{target.issue}) | " + " | ".join(columns) + " |")
    if len(lines) == 2:
        return ""
    return "\n".join(lines + ([""] + missed if missed else []))


def load_runs(arguments: Iterable[str]) -> dict[str, dict[str, Cells]]:
    """label -> suite -> Cells: the CSVs of one label (a run's per-suite files) merged into one run."""
    runs: dict[str, dict[str, Cells]] = {}
    for label, path in map(_label, arguments):
        for suite, cells in load(path).items():
            runs.setdefault(label, {}).setdefault(suite, {}).update(cells)
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="CSV files, each optionally as label=path")
    args = parser.parse_args(argv)
    print(report(load_runs(args.runs)))


if __name__ == "__main__":
    main()
