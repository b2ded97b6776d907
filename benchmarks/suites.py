"""Every cell of the benchmark suites in one list, for the tools that take any of them by name (env_ab, run_cell)."""

from __future__ import annotations

from benchmarks import bench_decode, bench_mixed, bench_prefill
from benchmarks.cells import Cell
from benchmarks.config import BenchConfig


def every_cell(cfg: BenchConfig) -> list[Cell]:
    """The cells of every suite, each name once: decode, mixed (whole batch, parts, probe; the tile-rule and
    queue-rule batches), prefill."""
    cells = list(bench_decode.cells(cfg))
    for mixed in bench_mixed.cells(cfg):
        cells += [mixed.whole, *mixed.parts, mixed.prefill_in_launch]
    cells += bench_mixed.tile_rule_cells(cfg)
    cells += bench_mixed.queue_rule_cells(cfg)
    cells += bench_prefill.cells(cfg)
    return list({cell.name: cell for cell in cells}.values())


def wanted_cells(cfg: BenchConfig) -> list[Cell]:
    """every_cell's that ``--cells`` names (substrings, as the suites take them); exits naming the option if none."""
    cells = [cell for cell in every_cell(cfg) if cfg.wants_cell(cell.name)]
    if not cells:
        raise SystemExit(f"no cell of the suites matches --cells {','.join(cfg.cells or ())!r}")
    return cells
