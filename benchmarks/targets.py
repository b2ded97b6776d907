"""The issues' performance targets, read off benchmark CSVs: one column per run, the worst cell of each target.

    python -m benchmarks.targets RUN.csv [RUN.csv ...]          # a suite's CSV or run_all's results.csv
    python -m benchmarks.targets b=runs/b/prefill.csv c=runs/c/prefill.csv   # label=path names a column
    python -m benchmarks.targets runs/a/decode.csv runs/a/mixed.csv runs/b/decode.csv   # one column per label

CSVs with one label (their folder's name, or label=) are one run: their suites' rows go in one column.
Prints a markdown table (a target per row, a run per column: the worst value, its cell, and whether every
cell of the target holds; with two runs or more, a last column of each cell's median over the runs) and then
each miss. A target reads the cells of a run it applies to; one it cannot read there (our row failed or was
skipped, no competitor ran, a part of a mixed cell is missing) is counted as not read and named with the reason,
and the target does not hold in that run. A cell that ran but that a target does not judge (a decode cell no
competitor can run, as the ragged batch without flash-attn-4) is named as left out. A run without the target's
cells shows ``–``. The targets (figures, never asserted in tests):

* prefill (#7): fused >= 1.1x flash-attn 2 on every cell; fused >= 0.8x flash-attn-4 on the d=128 cells
  whose longest sequence has >= 4k keys (the ragged batch, up to 4096, counts); fused on a paged chunk
  >= 0.9x fused on the same chunk over a non-paged cache.
* decode (#6): fused at least as fast as the best competitor on every cell; 1x8k <= 20 µs; 64x4k,
  128x2k and 32x32k >= 3.9 TB/s; 64x4k at pages 1/16/64/256 within 5 % of the non-paged time.
* mixed (#6): the one launch <= 0.9x the best separate calls: for each part the fastest provider, ours among
  them, the two summed (read off the part cells, ``bench_mixed.part_prefix``).
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.harness import COMPETITORS, Row

Cells = dict[str, dict[str, dict]]
"""cell name -> provider -> {"us", "gbps", "tflops"} of a row that ran (status ok), or {"status": ...} of one that did
not (n/a, error, mismatch, skipped): a target says which of its cells it could not read, and why."""

EXTERNAL = tuple(provider for provider in COMPETITORS if provider != "unfused")
"""The competitors proper: a cell is judged against the best competitor only where one of these ran (our ``unfused``
counts among the rivals where it ran, but alone it does not make a cell checked)."""


def _own_row(name: str) -> dict[str, str]:
    """A cell's own fused row: the only row most targets read."""
    return {"fused": name}


def _no_value(cells: Cells, name: str) -> str:
    return "no value"


def _none_left_out(cells: Cells) -> dict[str, str]:
    return {}


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
    applies: Callable[[Cells, str], bool]
    """Whether the target reads this cell of a run: a cell it applies to without a value is reported as not read."""
    needs: Callable[[str], dict[str, str]] = _own_row
    """The rows a cell's value reads, label -> cell (a label's first word is the provider): the first of them that
    did not run is why the cell was not read."""
    why_no_value: Callable[[Cells, str], str] = _no_value
    """Why a cell was not read whose needed rows all ran (a competitor failed, a mixed part is missing)."""
    left_out: Callable[[Cells], dict[str, str]] = _none_left_out
    """Cells of the suite that ran but that the target does not judge, each with the reason: the report names them,
    so that a run where a competitor is absent does not drop a cell silently."""

    def holds(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    def worst(self, values: dict[str, float]) -> tuple[str, float]:
        pick = min if self.at_least else max
        cell = pick(values, key=values.__getitem__)
        return cell, values[cell]

    def format(self, value: float) -> str:
        return f"{value:.3f}x" if self.unit == "x" else f"{value:,.2f} {self.unit}"

    def unread(self, cells: Cells, values: dict[str, float]) -> dict[str, str]:
        """The cells the target applies to but could not read, each with the reason."""
        return {name: _why_unread(self, cells, name) for name in cells
                if name not in values and self.applies(cells, name)}


def _problems(suite: str) -> dict[str, object]:
    """Cell name -> Problem of the full-size (GPU) cells of a suite."""
    import importlib

    from benchmarks.config import BenchConfig

    module = importlib.import_module(f"benchmarks.bench_{suite}")
    return {cell.name: cell.problem for cell in module.cells(BenchConfig(device=torch.device("cpu")))}


def _ran(rows: dict[str, dict]) -> dict[str, dict]:
    """The rows of a cell that ran (status ok)."""
    return {provider: values for provider, values in rows.items() if "us" in values}


def _us(cells: Cells, cell: str, provider: str) -> float | None:
    return cells.get(cell, {}).get(provider, {}).get("us")


def _status(cells: Cells, cell: str, provider: str) -> str | None:
    """``ok``, the status of a row that did not run, or None where the provider has no row."""
    row = cells.get(cell, {}).get(provider)
    return None if row is None else row.get("status", "ok")


def _speedups(cells: Cells, rival: str, names: Sequence[str]) -> dict[str, float]:
    """rival µs / fused µs on each named cell where both ran (> 1: fused is faster)."""
    pairs = {name: (_us(cells, name, "fused"), _us(cells, name, rival)) for name in names}
    return {name: theirs / ours for name, (ours, theirs) in pairs.items() if ours and theirs}


def _and_rival(rival: str) -> Callable[[str], dict[str, str]]:
    """A cell's fused row and the rival's row of the same cell."""
    return lambda name: {"fused": name, rival: name}


def _runnable(rival: str) -> Callable[[Cells, str], bool]:
    """The cells where ``rival`` has a row that is not n/a (it can run the cell: installed, shapes supported)."""
    return lambda cells, name: _status(cells, name, rival) not in (None, "n/a")


def _prefill_flash2(cells: Cells) -> dict[str, float]:
    return _speedups(cells, "flash2", list(cells))


def _prefill_flash4_cell(name: str) -> bool:
    problem = _problems("prefill").get(name)
    return problem is not None and problem.head_dim == 128 and problem.max_kv >= 4096


def _prefill_flash4(cells: Cells) -> dict[str, float]:
    return _speedups(cells, "flash4", [name for name in cells if _prefill_flash4_cell(name)])


def _paged_chunk_cell(cells: Cells, name: str) -> bool:
    return name.startswith("chunk") and not name.endswith("non-paged")


def _non_paged_chunk(name: str) -> str:
    """The non-paged cell of a paged chunk cell ("chunk 2k on 6k p16 served, page runs": "chunk 2k on 6k non-paged")."""
    return re.sub(r" p\d+( served.*)?$", " non-paged", name)


def _prefill_paged_chunk(cells: Cells) -> dict[str, float]:
    """Non-paged fused µs / paged fused µs of each paged chunk cell."""
    out = {}
    for name in cells:
        if _paged_chunk_cell(cells, name):
            paged, contiguous = _us(cells, name, "fused"), _us(cells, _non_paged_chunk(name), "fused")
            if paged and contiguous:
                out[name] = contiguous / paged
    return out


def _failed_competitors(rows: dict[str, dict]) -> list[str]:
    """The competitors of a cell that could run it but did not (error, mismatch, skipped): without them the best
    competitor is not known."""
    return [f"{provider} {values['status']}" for provider, values in rows.items()
            if provider in COMPETITORS and values.get("status", "n/a") != "n/a"]


def _why_no_best_competitor(cells: Cells, name: str) -> str:
    return ", ".join(_failed_competitors(cells[name])) or "no competitor ran"


def _decode_best(cells: Cells) -> dict[str, float]:
    """Best competitor µs / fused µs on each cell where fused and a competitor proper (EXTERNAL) ran, and every
    competitor that could run the cell did."""
    out = {}
    for name, rows in cells.items():
        ran = _ran(rows)
        rivals = [values["us"] for provider, values in ran.items() if provider in COMPETITORS]
        if "fused" in ran and any(provider in EXTERNAL for provider in ran) and not _failed_competitors(rows):
            out[name] = min(rivals) / ran["fused"]["us"]
    return out


DECODE_1X8K = ("1x8k p16",)
DECODE_LARGE = ("64x4k p16", "128x2k p16", "32x32k p16")
DECODE_PAGES = ("64x4k p1", "64x4k p16", "64x4k p64", "64x4k p256")


def _decode_1x8k(cells: Cells) -> dict[str, float]:
    us = _us(cells, "1x8k p16", "fused")
    return {"1x8k p16": us} if us else {}


def _decode_large(cells: Cells) -> dict[str, float]:
    rows = {name: cells.get(name, {}).get("fused") for name in DECODE_LARGE}
    return {name: row["gbps"] / 1e3 for name, row in rows.items() if row and "gbps" in row}


def _decode_pages(cells: Cells) -> dict[str, float]:
    """Paged fused µs / non-paged fused µs at 64x4k."""
    contiguous = _us(cells, "64x4k non-paged", "fused")
    paged = {name: _us(cells, name, "fused") for name in DECODE_PAGES}
    return {name: us / contiguous for name, us in paged.items() if us and contiguous}


def _parts(cells: Cells, name: str) -> list[str]:
    """The part cells (``bench_mixed.part_prefix``) of a whole mixed cell in this run."""
    from benchmarks.bench_mixed import part_prefix

    prefix = part_prefix(name)
    return [other for other in cells if other.startswith(prefix)]


def _whole_mixed_cell(cells: Cells, name: str) -> bool:
    return " part: " not in name and " probe: " not in name


def _best_part(rows: dict[str, dict]) -> float | None:
    """The fastest of ours (``fused``) and the competitors on one part; None where none ran, or where a competitor
    that could run it did not (the best is not known then)."""
    times = [values["us"] for provider, values in _ran(rows).items() if provider in ("fused", *COMPETITORS)]
    return min(times) if times and not _failed_competitors(rows) else None


def _why_no_best_parts(cells: Cells, name: str) -> str:
    """Why a whole mixed cell has no best separate calls: not two part cells, or a part without a known best."""
    parts = _parts(cells, name)
    if len(parts) != 2:
        return f"{len(parts)} part cells, not 2"
    return next(f"{part}: " + (", ".join(_failed_competitors(cells[part])) or "nothing ran")
                for part in parts if not _best_part(cells[part]))


def _mixed_launch(cells: Cells) -> dict[str, float]:
    """Fused one-launch µs / the best separate calls: for each of the two parts the fastest provider, ours among
    them, the two summed (the best prefill and the best decodes may come from different providers)."""
    out = {}
    for name in cells:
        if not _whole_mixed_cell(cells, name):
            continue
        parts = [_best_part(cells[part]) for part in _parts(cells, name)]
        fused = _us(cells, name, "fused")
        if fused and len(parts) == 2 and all(parts):
            out[name] = fused / sum(parts)
    return out


def _named(names: Sequence[str]) -> Callable[[Cells, str], bool]:
    return lambda cells, name: name in names


def _decode_rivalled(cells: Cells, name: str) -> bool:
    """A cell some competitor proper can run (its row is not n/a), or whose fused row failed: a cell no competitor
    can run has nothing to be held to ("the best competitor that can run that cell")."""
    fused = _status(cells, name, "fused")
    return fused not in (None, "ok", "n/a") or any(_status(cells, name, p) not in (None, "n/a") for p in EXTERNAL)


def _decode_unrivalled(cells: Cells) -> dict[str, str]:
    """Cells our fused row ran that no competitor proper can run (the ragged batch without flash-attn-4)."""
    return {name: "no competitor can run it" for name in cells
            if _status(cells, name, "fused") == "ok" and not _decode_rivalled(cells, name)}


TARGETS = (
    Target("prefill", 7, "fused >= 1.1x flash2, every cell", "x", 1.1, True, _prefill_flash2, _runnable("flash2"),
           needs=_and_rival("flash2")),
    Target("prefill", 7, "fused >= 0.8x flash4, d128 with >= 4k keys", "x", 0.8, True, _prefill_flash4,
           lambda cells, name: _prefill_flash4_cell(name) and _runnable("flash4")(cells, name),
           needs=_and_rival("flash4")),
    Target("prefill", 7, "paged chunk >= 0.9x non-paged (fused)", "x", 0.9, True, _prefill_paged_chunk,
           _paged_chunk_cell, needs=lambda name: {"fused": name, "fused (non-paged)": _non_paged_chunk(name)}),
    Target("decode", 6, "fused >= 1.0x best competitor, every cell", "x", 1.0, True, _decode_best, _decode_rivalled,
           why_no_value=_why_no_best_competitor, left_out=_decode_unrivalled),
    Target("decode", 6, "1x8k p16 <= 20 µs", "µs", 20.0, False, _decode_1x8k, _named(DECODE_1X8K)),
    Target("decode", 6, "64x4k, 128x2k, 32x32k >= 3.9 TB/s", "TB/s", 3.9, True, _decode_large, _named(DECODE_LARGE)),
    Target("decode", 6, "64x4k paged <= 1.05x non-paged time", "x", 1.05, False, _decode_pages, _named(DECODE_PAGES),
           needs=lambda name: {"fused": name, "fused (64x4k non-paged)": "64x4k non-paged"}),
    Target("mixed", 6, "one launch <= 0.9x the best separate calls", "x", 0.9, False, _mixed_launch,
           _whole_mixed_cell, why_no_value=_why_no_best_parts),
)


def _why_unread(target: Target, cells: Cells, name: str) -> str:
    """Why a cell the target applies to gave no value: the first row it needs that did not run, else the target's
    own reason."""
    for label, cell in target.needs(name).items():
        status = _status(cells, cell, label.split()[0])
        if status != "ok":
            return f"{label} {status or 'absent'}"
    return target.why_no_value(cells, name)


def group_rows(rows: Iterable[Row]) -> dict[str, Cells]:
    """suite -> Cells: every row, the values of those that ran (status ok) and the status of the others."""
    suites: dict[str, Cells] = {}
    for row in rows:
        if row.status == "ok" and row.us:
            values = {key: getattr(row, key) for key in ("us", "gbps", "tflops") if getattr(row, key) is not None}
        else:
            values = {"status": row.status if row.status != "ok" else "no time"}
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


def _column(target: Target, values: dict[str, float], unread: dict[str, str],
            left_out: dict[str, str]) -> tuple[str, list[str]]:
    """A table entry (the worst cell, whether every cell holds, how many it could not read or left out) and the
    lines for the misses, the cells not read and those left out."""
    lines = [f"{cell} {target.format(v)}" for cell, v in values.items() if not target.holds(v)]
    misses = len(lines)
    lines += [f"{cell} not read ({why})" for cell, why in unread.items()]
    lines += [f"{cell} left out ({why})" for cell, why in left_out.items()]
    not_read = f"**{len(unread)} not read**" if unread else ""
    outside = f"{len(left_out)} left out" if left_out else ""
    if not values:
        return "; ".join(x for x in (not_read, outside) if x) or "–", lines
    cell, value = target.worst(values)
    verdict = "holds" if not misses else f"**{misses} of {len(values)} miss**"
    if unread and not misses:
        verdict = f"holds on {len(values)}"
    return f"{target.format(value)} ({cell}); " + "; ".join(x for x in (verdict, not_read, outside) if x), lines


def _in_every_run(reasons: dict[str, dict[str, str]], judged: Iterable[str]) -> dict[str, str]:
    """The median column's share of ``reasons`` (run label -> cell -> why): the cells every run names and none
    judged, with the first run's reason."""
    first, *rest = reasons.values()
    return {cell: why for cell, why in first.items() if cell not in judged and all(cell in other for other in rest)}


def report(runs: dict[str, dict[str, Cells]], only_readable: bool = False) -> str:
    """The markdown table and the misses for these runs (label -> suite -> Cells). With two runs or more, a
    last column takes each cell's median over the runs that have it. A cell a target applies to but cannot
    read (our row failed, or no competitor ran) is counted and named: such a target does not hold. A cell a
    target leaves out (``Target.left_out``) is counted and named too, without counting against it. The median
    column names as not read (or left out) only the cells that every run could not read (or left out).
    ``only_readable`` leaves out the targets no run can be checked against ("" when none can), among them one
    whose every cell was left out (a smoke run's decode cells, which no competitor proper runs)."""
    with_median = len(runs) > 1
    header = list(runs) + (["median of runs"] if with_median else [])
    lines = ["| target | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    missed = []
    for target in TARGETS:
        cells = {label: suites.get(target.suite, {}) for label, suites in runs.items()}
        per_run = {label: target.values(cells[label]) for label in runs}
        unread = {label: target.unread(cells[label], per_run[label]) for label in runs}
        left_out = {label: target.left_out(cells[label]) for label in runs}
        if only_readable and not any(per_run.values()) and not any(unread.values()):
            continue
        if with_median:
            names = dict.fromkeys(cell for values in per_run.values() for cell in values)
            per_run["median of runs"] = {
                cell: statistics.median(values[cell] for values in per_run.values() if cell in values)
                for cell in names}
            unread["median of runs"] = _in_every_run(unread, names)
            left_out["median of runs"] = _in_every_run(left_out, names)
        columns = []
        for label, values in per_run.items():
            entry, misses = _column(target, values, unread[label], left_out[label])
            columns.append(entry)
            missed += [f"- {label}: {target.text}: {miss}" for miss in misses]
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
