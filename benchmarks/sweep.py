"""Launch-configuration sweep of the fused kernel: what to record in ``attention/kernels/configs.py``.

Decode cells try split-KV counts (the heuristic's, then fixed ones) and a few decode tiles; prefill
cells try tile shapes, warps and pipeline stages; paged cells (decode, chunks, mixed batches) also
try the page-table variants (one page id per tile, page ids prefetched a tile ahead), mixed or
ragged batches a small second tile for their short sequences, decode cells a rotated KV walk and
the split merge done by the last split (no combine launch), tensor-descriptor (TMA) loads (paged
caches: when a page holds whole tiles, or with one page per tile). Every variant
computes the same attention on the same inputs as the default (every variant off) and is checked
against it. Writes a markdown table (µs, GB/s or TFLOP/s, ratio to the default) per cell, and with
``--variants-out`` the ``ATTN_FUSED_VARIANTS`` string the measurements favour (``pick_variants``).
Prefill and mixed cells are timed as in the suites, settled and over a 300 ms window (benchmarks/timing.py
says why); decode cells over 20 ms.

    python -m benchmarks.sweep --out sweep.md [--budget-s 200] [--only mixed,decode,prefill] [--cells a,b]
                                              [--layout-only | --tiles-only] [--variants-out variants.txt]
                                              [--names "tuned,tma"]  (variants named so, and the default)
                                              [--compile-workers 12]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from attention.kernels.configs import (
    VARIANT_FIELDS,
    mixed_batch,
    q_tile_count,
    select_forward_config,
    shape_class,
    tma_pays,
)
from benchmarks import bench_decode, bench_mixed, bench_prefill
from benchmarks.argtypes import non_negative_float, non_negative_int
from benchmarks.cells import Cell, Inputs
from benchmarks.config import BenchConfig
from benchmarks.providers import _fused
from benchmarks.timing import short_error, time_fn

DECODE_CELLS = ("1x8k p16", "8x4k p16", "32x2k p16", "64x4k p16", "32x32k p16", "ragged", "MQA", "verify",
                "64x4k p1", "64x4k p64", "64x4k p256", "64x4k non-paged")
SPLITS = (1, 2, 3, 4, 8, 16, 32, 64)
DECODE_TILES = ((64, 4, 2, 0), (64, 4, 3, 0), (32, 4, 2, 0), (128, 4, 2, 0), (64, 2, 2, 0), (64, 8, 2, 0),
                (32, 4, 3, 1), (32, 4, 4, 1), (64, 4, 3, 1), (16, 4, 4, 1), (16, 4, 6, 1))
"""(block_n, num_warps, num_stages, prefetch_page_ids) around the recorded decode tile (64, 4, 2). Over a
paged cache the K/V loads of a tile hang off its page ids: only with the ids loaded a tile ahead
(prefetch_page_ids) and 3+ stages does Triton 3.6 give K/V more than one shared-memory buffer
(sm90 compile, page 16: 64-key tiles 38 KiB at 2 or 3 stages, 70 KiB at 3 with prefetched ids)."""
DECODE_TILE_CELLS = ("1x8k p16", "1x32k p16", "8x4k p16", "32x2k p16", "64x4k", "128x2k p16", "32x32k p16", "MQA",
                     "verify")
PREFILL_CELLS = ("GQA 32/8 causal 4x4k", "MHA full 4x4k", "MHA causal 16x1k", "d64 MHA 32 causal",
                 "d256 MHA 16 causal", "chunk 2k on 30k p16", "chunk 2k on 6k p256", "chunk 2k on 30k non-paged",
                 "MHA causal 1x16k")
PREFILL_TILES = ((128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 4, 3),
                 (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 4, 3))
"""(block_m, block_n, num_warps, num_stages)."""
MIXED_TILES = ((64, 32, 4, 3, 0), (64, 32, 4, 2, 0), (64, 64, 4, 2, 0), (64, 64, 4, 3, 168), (64, 64, 4, 2, 168),
               (128, 64, 8, 2, 0), (32, 64, 4, 2, 0))
"""(block_m, block_n, num_warps, num_stages, max_registers) for mixed batches over a paged cache: one
kernel holds both tiles, so the prefill tile's registers and shared memory set how many decode programs
share an SM (the 64x64 3-stage tile: 233 registers, 112 KiB, two per SM; 64x32: 168, 64 KiB, three)."""


Variant = tuple[str, dict]

PICK_MIN_GAIN = 1.02
"""A variant set is picked for a shape class only if its geometric-mean speedup reaches this ..."""
PICK_MAX_LOSS = 0.98
"""... and no cell of the class runs slower than this ratio to the default (timing noise is ~1 %)."""
PICK_MAX_ERROR = 2e-2
"""A variant whose output differs from the default's by more than this counts as a loss (speedup 0)."""


@dataclass(frozen=True)
class Measured:
    """One variant's speedup over the default on one cell; ``variants`` is its ATTN_FUSED_VARIANTS form
    (empty when the variant also changes tile sizes or split counts: those go to configs.py by hand)."""

    shape_class: str
    cell: str
    variants: str
    speedup: float


def _base_config(cell: Cell, tuned: bool):
    """The cell's table configuration (tuned or every variant off), over its pages: no page copy."""
    p = cell.problem
    config = select_forward_config(head_dim_qk=p.head_dim, head_dim_v=p.head_dim_v, group_size=p.heads_q // p.heads_kv,
                                   max_seqlen_q=p.max_q, interpret=False, paged=cell.kv_source == "paged",
                                   tuned=tuned, max_seqlen_kv=p.max_kv, causal=p.causal,
                                   num_q_tiles=q_tile_count(p.total_q, p.heads_q // p.heads_kv, p.heads_kv),
                                   mixed=mixed_batch(p.batch, p.total_q, p.max_q))
    return replace(config, gather_pages=False) if cell.kv_source == "paged" else config


def _shape_class(cell: Cell) -> str:
    p = cell.problem
    return shape_class(p.heads_q // p.heads_kv, p.max_q, cell.kv_source == "paged")


def _variant_string(base, config) -> str:
    """``paged_scalar_ids+small_block_m:16`` for a config that differs from ``base`` in variant fields
    only; "" otherwise."""
    if config is None or replace(config, **{f: getattr(base, f) for f in VARIANT_FIELDS}) != base:
        return ""
    flags = []
    for name in VARIANT_FIELDS:
        value = getattr(config, name)
        if value != getattr(base, name):
            flags.append(name if value is True else f"{name}:{int(value)}")
    return "+".join(flags)


def pick_variants(measured: Sequence[Measured]) -> str:
    """The ATTN_FUSED_VARIANTS string: per shape class, the variant set with the best geometric-mean
    speedup over the class's cells, if that reaches PICK_MIN_GAIN and no cell fell below
    PICK_MAX_LOSS (a wrong or failing variant counts as speedup 0); classes with no such set are
    written as ``none``.

    The sweep runs a variant only on the cells it applies to (``tma`` needs pages holding whole
    tiles, the small tile a batch of mixed lengths), and elsewhere the kernel runs without it. So
    on a cell where a set was not measured it counts as its largest measured subset there (the
    default, speedup 1, if none): a variant that won on one cell does not outrank one that won on
    all of them.

    Example:
        >>> pick_variants([Measured("decode/paged", "a", "tma", 1.05), Measured("decode/paged", "b", "tma", 1.01)])
        'decode/paged=tma'
    """
    by_class: dict[str, dict[str, dict[frozenset[str], float]]] = {}  # class -> cell -> variant set -> speedup
    for m in measured:
        if m.variants:
            runs = by_class.setdefault(m.shape_class, {}).setdefault(m.cell, {})
            fields = frozenset(m.variants.split("+"))
            runs[fields] = min(m.speedup, runs.get(fields, math.inf))
    entries = []
    for class_name, cells in sorted(by_class.items()):
        candidates = sorted({fields for runs in cells.values() for fields in runs}, key=lambda f: (len(f), sorted(f)))
        best, best_gain = "none", PICK_MIN_GAIN
        for fields in candidates:
            speedups = [_speedup_of(fields, runs) for runs in cells.values()]
            if min(speedups) < PICK_MAX_LOSS:  # slower somewhere, wrong (0) or failed (0)
                continue
            gain = math.exp(sum(map(math.log, speedups)) / len(speedups))
            if gain > best_gain:
                best, best_gain = "+".join(sorted(fields, key=_field_order)), gain
        entries.append(f"{class_name}={best}")
    return ";".join(entries)


def _field_order(flag: str) -> int:
    """Variant flags in ``VARIANT_FIELDS`` order (``small_block_m:16`` sorts as ``small_block_m``)."""
    return VARIANT_FIELDS.index(flag.partition(":")[0])


def _speedup_of(fields: frozenset[str], runs: dict[frozenset[str], float]) -> float:
    """A variant set's speedup on one cell: measured, else its largest measured subset's (the worst
    of equally large ones), else 1 (none of it applies: the default runs)."""
    subsets = [measured for measured in runs if measured <= fields]
    if not subsets:
        return 1.0
    largest = max(map(len, subsets))
    return min(runs[measured] for measured in subsets if len(measured) == largest)


def _named(variants: list[Variant], names: Sequence[str] | None) -> list[Variant]:
    """The default and the variants whose names contain one of ``names`` (all of them without ``names``)."""
    return [v for i, v in enumerate(variants) if not names or i == 0 or any(n in v[0] for n in names)]


def _variants(cell: Cell, layout_only: bool = False, tiles_only: bool = False) -> list[Variant]:
    """The default (every variant off), the tuned table's choice if it differs (and with page-granular
    tiles where pages are smaller than a tile, or with the pages of a prefill-class cell copied first),
    then the layout variants (small tile, page-table addressing, rotated walk, K^T loads, runtime page
    size, register cap, split merges, TMA, heavy tiles first; each layout variant also with 32-bit
    offsets) unless ``tiles_only``, then tiles and split counts unless ``layout_only``."""
    base = _base_config(cell, tuned=False)
    tuned = _base_config(cell, tuned=True)
    decode_class = _shape_class(cell).startswith("decode")
    out: list[Variant] = [("default", {"config": base})]
    if tuned != base:
        out.append((f"tuned ({_variant_string(base, tuned)})", {"config": tuned}))
    if cell.kv_source == "paged" and cell.page_size < tuned.block_n and not tuned.page_granular_tiles:
        out.append(("tuned + page-granular tiles", {"config": replace(tuned, page_granular_tiles=True)}))
    if cell.kv_source == "paged" and not decode_class:  # the pages copied first, then the non-paged tables' config
        out.append(("tuned pages copied (gather_pages)", {"config": replace(tuned, gather_pages=True)}))
    if tiles_only:
        return out + (_decode_variants(cell, base) if decode_class else _prefill_variants(cell, base, tuned))
    out += _small_tile_variants(cell, base) + _paged_variants(cell, base, decode_class)
    if (not decode_class and cell.kv_source == "paged" and cell.page_size % base.block_n == 0
            and tuned != base and not tuned.paged_scalar_ids):  # pages holding whole tiles: the table + scalar ids
        out.append((f"scalar ids + {_variant_string(base, tuned)}", {"config": replace(tuned, paged_scalar_ids=True)}))
    if decode_class:
        out.append(("rotated kv walk", {"config": replace(base, rotate_kv_tiles=True)}))
        out.append(("transposed k", {"config": replace(base, transposed_k_loads=True)}))
        if base.max_registers:
            out.append(("no register cap", {"config": replace(base, max_registers=0)}))
        if cell.kv_source == "paged":
            out.append(("runtime page size", {"config": replace(base, runtime_page_size=True)}))
            out.append(("runtime page size + transposed k",
                        {"config": replace(base, runtime_page_size=True, transposed_k_loads=True)}))
        out.append(("fused combine", {"config": replace(base, fused_combine=True)}))
        out.append(("dependent combine", {"config": replace(base, dependent_combine=True)}))
        if cell.kv_source == "paged":  # a combination for pick_variants to weigh against each alone
            out.append(("fused combine + prefetch ids",
                        {"config": replace(base, fused_combine=True, prefetch_page_ids=True)}))
    if tma_pays(base, cell.problem.max_kv):  # only where the tables would use tma
        if cell.kv_source != "paged" or cell.page_size % base.block_n == 0:
            out.append(("tma", {"config": replace(base, tma=True)}))
            if not decode_class:
                out.append(("tma s4", {"config": replace(base, tma=True, num_stages=4)}))
        elif cell.page_size >= 16:  # pages smaller than the tile: a tile per page (a tile change: not picked)
            out.append((f"tma n{cell.page_size}", {"config": replace(base, tma=True, block_n=cell.page_size)}))
    if not decode_class and cell.problem.causal:
        out.append(("heavy tiles first", {"config": replace(base, heavy_tiles_first=True)}))
        if tuned != base:
            out.append((f"heavy tiles first + {_variant_string(base, tuned)}",
                        {"config": replace(tuned, heavy_tiles_first=True)}))
    # 32-bit offsets with each layout variant (not the fused combine): for pick_variants to weigh the pairs
    out += [(f"{name} + int32 offsets", {"config": replace(overrides["config"], int32_offsets=True)})
            for name, overrides in out[1:] if _variant_string(base, overrides["config"])
            and not name.startswith("tuned") and not overrides["config"].int32_offsets
            and not overrides["config"].fused_combine and not overrides["config"].dependent_combine
            and overrides["config"].max_registers == base.max_registers]
    out.append(("int32 offsets", {"config": replace(base, int32_offsets=True)}))
    if not layout_only:
        out += _decode_variants(cell, base) if decode_class else _prefill_variants(cell, base, tuned)
    return out


def _small_tile_variants(cell: Cell, base) -> list[Variant]:
    """Mixed / ragged prefill-class batches: a small second tile for their short sequences."""
    if base.block_m < 64 or cell.problem.uniform_q:
        return []
    small = max(16, base.block_m // 8)
    out = [(f"small tile {small}", {"config": replace(base, small_block_m=small)})]
    if cell.kv_source == "paged":
        out.append((f"small tile {small} + prefetch ids",
                    {"config": replace(base, small_block_m=small, prefetch_page_ids=True)}))
    return out


def _paged_variants(cell: Cell, base, decode_class: bool) -> list[Variant]:
    """One page id per tile (pages holding whole tiles) and page ids prefetched a tile ahead."""
    if cell.kv_source != "paged":
        return []
    other_tile = (replace(base, block_n=64, num_stages=3) if base.block_n == 128
                  else replace(base, block_n=128, num_stages=3))
    tiles = [("", base)] + ([] if decode_class else [(f"n{other_tile.block_n} s3 ", other_tile)])
    out: list[Variant] = []
    for prefix, tile in tiles:
        if cell.page_size % tile.block_n == 0:
            out.append((f"{prefix}scalar ids", {"config": replace(tile, paged_scalar_ids=True)}))
        out.append((f"{prefix}prefetch ids", {"config": replace(tile, prefetch_page_ids=True)}))
    return out


def _decode_variants(cell: Cell, base) -> list[Variant]:
    """Split counts, and decode tiles on a few cells."""
    kv_tiles = -(-cell.problem.max_kv // base.block_n)
    out: list[Variant] = [(f"splits={n}", {"num_splits": n, "config": base})
                          for n in SPLITS if n <= max(1, kv_tiles // 2)]
    if any(name in cell.name for name in DECODE_TILE_CELLS):
        for block_n, warps, stages, prefetch in DECODE_TILES[1:]:
            if prefetch and cell.kv_source != "paged":
                continue
            out.append((f"n{block_n} w{warps} s{stages}" + (" prefetch ids" if prefetch else ""),
                        {"config": replace(base, block_n=block_n, num_warps=warps, num_stages=stages,
                                           prefetch_page_ids=bool(prefetch))}))
    return out


def _prefill_variants(cell: Cell, base, tuned) -> list[Variant]:
    """Prefill tile shapes, warps and stages, with the tuned table's variants (those a tile of that
    shape can take: the small second tile only below block_m)."""
    group = cell.problem.heads_q // cell.problem.heads_kv
    out: list[Variant] = []
    prefix = f"{_variant_string(base, tuned)} " if tuned != base else ""
    mixed = not cell.problem.uniform_q and cell.kv_source == "paged"
    tiles = [(*tile, 0) for tile in PREFILL_TILES] + (list(MIXED_TILES) if mixed else [])
    for block_m, block_n, warps, stages, registers in tiles:
        if (block_m, block_n, warps, stages, registers) == (base.block_m, base.block_n, base.num_warps,
                                                            base.num_stages, base.max_registers):
            continue
        config = replace(tuned, block_m=block_m, block_q=max(1, block_m // group), block_n=block_n,
                         num_warps=warps, num_stages=stages, max_registers=registers)
        if config.small_block_m >= block_m:
            config = replace(config, small_block_m=0)
        cap = f" r{registers}" if registers else ""
        out.append((f"{prefix}m{block_m} n{block_n} w{warps} s{stages}{cap}", {"config": config}))
    return out


_SUITE_CELLS = {
    "decode": bench_decode.cells,
    "prefill": bench_prefill.cells,
    "mixed": lambda cfg: [mixed.whole for mixed in bench_mixed.cells(cfg)],
}
_DEFAULT_CELLS = {"decode": DECODE_CELLS, "prefill": PREFILL_CELLS, "mixed": ("",)}


def _selected_cells(only: str, wanted: list[str] | None, cfg: BenchConfig) -> list[Cell]:
    """Suite by suite in the order asked for: the cells whose names contain one of ``wanted``, or
    without it the sweep's default cells (DECODE_CELLS, PREFILL_CELLS, every mixed cell)."""
    return [cell for suite in only.split(",") for cell in _SUITE_CELLS[suite](cfg)
            if any(part in cell.name for part in (wanted or _DEFAULT_CELLS[suite]))]


def _compile_share(only: str, wanted: list[str] | None, layout_only: bool, worker: int, workers: int,
                   deadline: float, device: str = "cuda", smoke: bool = False, tiles_only: bool = False,
                   names: list[str] | None = None) -> int:
    """Worker process: run once every (cell, variant) pair whose index is ``worker`` modulo ``workers``,
    so Triton compiles them in parallel into its on-disk cache; the timed pass then only loads them."""
    cfg = BenchConfig(device=torch.device(device), deadline=deadline, smoke=smoke)
    done, pair = 0, 0
    for cell in _selected_cells(only, wanted, cfg):
        inputs = None
        for _, overrides in _named(_variants(cell, layout_only, tiles_only), names):
            pair += 1
            if (pair - 1) % workers != worker or cfg.stop_reason():
                continue
            try:
                inputs = inputs or Inputs(cell.problem, cfg.device)
                runner, _ = _fused(cell, inputs, cell.kv_source, **overrides)
                if runner is not None:
                    runner.fn()
                    done += 1
            except Exception:  # noqa: BLE001 - the timed pass reports it
                pass
        del inputs
        if cfg.cuda:
            torch.cuda.empty_cache()
    if cfg.cuda:
        torch.cuda.synchronize()
    return done


def compile_in_parallel(only: str, wanted: list[str] | None, layout_only: bool, workers: int, deadline: float,
                        device: str = "cuda", smoke: bool = False, tiles_only: bool = False,
                        names: list[str] | None = None) -> int:
    """Every variant of the selected cells run once, spread over ``workers`` spawned processes; returns
    how many ran."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    started = time.monotonic()
    shares = [(only, wanted, layout_only, w, workers, deadline, device, smoke, tiles_only, names)
              for w in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        done = sum(pool.map(_compile_share, *zip(*shares)))
    print(f"compiled {done} variants in {workers} processes in {time.monotonic() - started:.0f} s", flush=True)
    return done


def sweep_cell(cell: Cell, cfg: BenchConfig, layout_only: bool = False,
               measured: list[Measured] | None = None, tiles_only: bool = False,
               names: list[str] | None = None) -> list[str]:
    """Markdown rows for one cell: every variant's time, rate and error against the default; each
    variant's speedup is appended to ``measured``."""
    inputs = Inputs(cell.problem, cfg.device)
    p = cell.problem
    base, shape_class = _base_config(cell, tuned=False), _shape_class(cell)
    rows, reference, default_us = [], None, None
    for index, (name, overrides) in enumerate(_named(_variants(cell, layout_only, tiles_only), names)):
        if cfg.stop_reason():
            rows.append(f"| {cell.name} | {name} | skipped: budget | | | |")
            continue
        if index > 0 and default_us is None:  # nothing to compare with: the default failed
            rows.append(f"| {cell.name} | {name} | skipped: the default failed | | | |")
            continue
        try:
            runner, reason = _fused(cell, inputs, cell.kv_source, **overrides)
            if runner is None:
                raise RuntimeError(reason)
            output = runner.fn().float()
            if reference is None:
                reference = output
            error = (output - reference).abs().max().item()
            timing = time_fn(runner.fn, cell.latency, cfg, settled=cell.settle)
            us = timing.us_graph or timing.us_eager
            default_us = default_us or us
            rate = (f"{p.kv_bytes / us / 1e3:.0f} GB/s" if cell.metric == "bandwidth"
                    else f"{p.flops / us / 1e6:.0f} TFLOP/s")
            rows.append(f"| {cell.name} | {name} | {us:.1f} | {rate} | {default_us / us:.2f}x | {error:.1e} |")
            if measured is not None and "num_splits" not in overrides:  # the table's own set competes too
                speedup = default_us / us if error <= PICK_MAX_ERROR else 0.0  # fast and wrong never wins
                measured.append(Measured(shape_class, cell.name, _variant_string(base, overrides.get("config")),
                                         speedup))
        except Exception as error:  # noqa: BLE001 - a variant that fails to compile is a result too
            rows.append(f"| {cell.name} | {name} | error: {short_error(error, 160)} | | | |")
            if measured is not None and index > 0:  # a variant that fails loses its class
                measured.append(Measured(shape_class, cell.name, _variant_string(base, overrides.get("config")), 0.0))
        print(rows[-1], flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="sweep.md")
    parser.add_argument("--budget-s", type=non_negative_float, default=200.0)
    parser.add_argument("--only", default="mixed,decode,prefill")
    parser.add_argument("--cells", default=None, help="comma list of substrings of cell names")
    parser.add_argument("--layout-only", action="store_true",
                        help="only the layout variants (small tile, page ids, rotated walk, TMA), no tile/split sweep")
    parser.add_argument("--tiles-only", action="store_true",
                        help="only tiles and split counts (with the tuned variants), no layout variants")
    parser.add_argument("--variants-out", default=None,
                        help="write the ATTN_FUSED_VARIANTS string the measurements favour to this file")
    parser.add_argument("--names", default=None, help="comma list of substrings of variant names (and the default)")
    parser.add_argument("--compile-workers", type=non_negative_int, default=0,
                        help="first compile every variant in this many processes (Triton's compiles are CPU-bound)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the sweep measures the GPU kernels: no CUDA device is visible")
    deadline = time.monotonic() + args.budget_s
    wanted = [s.strip() for s in args.cells.split(",")] if args.cells else None
    names = [s.strip() for s in args.names.split(",")] if args.names else None
    if args.compile_workers > 1:
        compile_in_parallel(args.only, wanted, args.layout_only, args.compile_workers, deadline,
                            tiles_only=args.tiles_only, names=names)
    cfg = BenchConfig(device=torch.device("cuda"), deadline=deadline, rep_ms=20.0)
    lines = [f"# Fused kernel sweep ({torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')})", "",
             "| cell | variant | µs | rate | vs default | max err vs default |", "|---|---|---|---|---|---|"]
    measured: list[Measured] = []
    for cell in _selected_cells(args.only, wanted, cfg):
        lines += sweep_cell(cell, cfg, args.layout_only, measured, args.tiles_only, names)
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")
    if args.variants_out:
        picked = pick_variants(measured)
        print(f"ATTN_FUSED_VARIANTS={picked}")
        with open(args.variants_out, "w") as handle:
            handle.write(picked + "\n")
        with open(args.out, "a") as handle:
            handle.write(f"\nPicked (benchmarks.sweep.pick_variants): `ATTN_FUSED_VARIANTS={picked}`\n")


if __name__ == "__main__":
    main()
