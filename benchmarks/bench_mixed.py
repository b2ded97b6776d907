"""Mixed batches: prefill (or a prefill chunk) and decodes in ONE launch, against the parts run separately.

Cells (bf16, d=128, GQA 32/8, paged with 16-token pages, causal bottom-right):
  M1  one fresh 2k prefill + 128 decodes at 2k context
  M2  one 2k chunk of chunked prefill on a 14k prefix + 64 decodes at 4k context
and both again with the pages placed as InferenceParams' allocator places them ("served, page runs"; the others
through a random page table). ``tile_rule_cells`` adds eleven batches between the two ("MX ...", three of them
non-paged too) for env_ab to pick (not part of this suite's run).
Each cell is measured whole (providers that take a mixed batch in one call: fused, DotProductAttention,
flash-attn 2 varlen with a block table, flash-attn-4 varlen with a page table) and as its two parts,
each part with every provider that can run it (SDPA too). Derived rows: ``X (separately)`` = part 1 +
part 2 with provider X; ``best competitors (separately)`` = the fastest competitor for each part; ``best
separately`` = the fastest provider for each part, ours among them (the mixed target's denominator).
A last cell runs the whole call with its decodes given no query (our providers only): the prefill as it runs
inside the one launch, to set against the prefill part alone (the whole fused row's note gives both).
All mixed cells are timed as CUDA-graph replays (launch gaps count), settled and over the throughput window
like prefill (their prefill parts hold the H200 at its power cap; benchmarks/timing.py). The decode part is
settled too, so that both parts and the whole are timed alike.

    python -m benchmarks.bench_mixed --out DIR  [--smoke]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from benchmarks import harness
from benchmarks.cells import Cell, Problem
from benchmarks.config import BenchConfig, bench_dtype
from benchmarks.harness import COMPETITORS, Row

SUITE = "mixed"
DEFAULT_BUDGET_S = 120.0


@dataclass(frozen=True)
class MixedCell:
    whole: Cell
    parts: tuple[Cell, Cell]
    prefill_in_launch: Cell
    """The whole call with no decode queries (same cache, same lengths): what its prefill costs in one launch."""


def _mixed(name: str, prefill: tuple[int, int], decodes: int, context: int, dtype, heads=(32, 8),
           head_dim: int = 128, page: int = 16, page_order: str = "random", queries: int = 1) -> MixedCell:
    """The whole batch, its two parts and the probe; ``page_order`` places the pages of all four (cells.PAGE_ORDERS;
    the parts and probe of a served batch are named "M2 served part: ..."); ``queries``: each decode's query tokens
    (more than one: speculative verification steps, causal bottom-right)."""
    q_chunk, kv_chunk = prefill
    common = {"heads_q": heads[0], "heads_kv": heads[1], "head_dim": head_dim, "head_dim_v": head_dim, "dtype": dtype}
    whole = Problem(q_lens=(q_chunk,) + (queries,) * decodes, kv_lens=(kv_chunk,) + (context,) * decodes,
                    causal=True, **common)
    prefill_part = Problem(q_lens=(q_chunk,), kv_lens=(kv_chunk,), causal=True, **common)
    decode_part = Problem(q_lens=(queries,) * decodes, kv_lens=(context,) * decodes, causal=queries > 1, **common)
    idle_decodes = Problem(q_lens=(q_chunk,) + (0,) * decodes, kv_lens=whole.kv_lens, causal=True, **common)
    part = part_prefix(name, page_order)
    tag, probe = part.removesuffix(" part: "), part.replace(" part: ", " probe: ")
    placed = {"latency": True, "settle": True, "page_order": page_order}
    return MixedCell(
        whole=Cell(name, tag, whole, "paged", page, metric="bandwidth", **placed),
        parts=(Cell(f"{part}prefill {q_chunk}/{kv_chunk}", "part", prefill_part, "paged", page,
                    metric="flops", **placed),
               Cell(f"{part}{decodes} decodes @{context}", "part", decode_part, "paged", page,
                    metric="bandwidth", **placed)),
        prefill_in_launch=Cell(f"{probe}prefill {q_chunk}/{kv_chunk}, decodes without queries",
                               "part", idle_decodes, "paged", page, metric="flops",
                               providers=("unfused", "fused", "auto"), **placed),
    )


def part_prefix(whole_name: str, page_order: str | None = None) -> str:
    """The name prefix of a whole cell's two parts: ``"M2 part: "``, or ``"M2 served part: "`` for its pages placed
    as served (``page_order`` other than random; None: read off the whole cell's name, as ``benchmarks.targets``
    does)."""
    served = "served" in whole_name if page_order is None else page_order != "random"
    return whole_name.split()[0] + (" served" if served else "") + " part: "


def cells(cfg: BenchConfig) -> list[MixedCell]:
    dtype = bench_dtype(cfg)
    if cfg.smoke:
        return [_mixed("M1 32-token prefill + 4 decodes @48 p16", (32, 32), 4, 48, dtype, heads=(4, 2), head_dim=16),
                _mixed("M1 32-token prefill + 4 decodes @48 p16 served, page runs", (32, 32), 4, 48, dtype,
                       heads=(4, 2), head_dim=16, page_order="runs")]
    return [
        _mixed("M1 2k prefill + 128 decodes @2k p16", (2048, 2048), 128, 2048, dtype),
        _mixed("M2 2k chunk on 14k prefix + 64 decodes @4k p16", (2048, 16384), 64, 4096, dtype),
        # the same batches over pages as InferenceParams' allocator places them (runs, not a random permutation)
        _mixed("M1 2k prefill + 128 decodes @2k p16 served, page runs", (2048, 2048), 128, 2048, dtype,
               page_order="runs"),
        _mixed("M2 2k chunk on 14k prefix + 64 decodes @4k p16 served, page runs", (2048, 16384), 64, 4096, dtype,
               page_order="runs"),
    ]


TILE_RULE_BATCHES = (  # (chunk, its KV length), decodes, their context: M2's shape, one quantity moved at a time
    ((2048, 6144), 64, 4096), ((2048, 30720), 64, 4096), ((1024, 16384), 64, 4096), ((4096, 16384), 64, 4096),
    ((2048, 16384), 32, 4096), ((2048, 16384), 128, 4096), ((2048, 16384), 64, 8192), ((2048, 16384), 128, 2048),
    ((2048, 2048), 32, 2048), ((2048, 8192), 128, 2048), ((4096, 4096), 64, 2048),
)


TILE_RULE_NON_PAGED = ("MX 2k chunk on 14k prefix + 128 decodes @2k", "MX 2k prefill + 32 decodes @2k",
                       "MX 4k prefill + 64 decodes @2k")
"""tile_rule_cells' batches that run over a non-paged cache too: one on each side of the rule and one near it."""
TILE_RULE_OTHER_BATCHES = (((2048, 16384), 64, 4096), ((2048, 2048), 128, 2048), ((4096, 4096), 64, 2048))
"""M2's, M1's and a batch between them, for tile_rule_cells' cells of TILE_RULE_OTHER_SHAPES."""
TILE_RULE_OTHER_SHAPES = (("MXV ", {"queries": 4}), ("MXD d64 ", {"head_dim": 64}),
                          ("MXQ MQA 32/1 ", {"heads": (32, 1)}), ("MXDV d64 ", {"head_dim": 64, "queries": 4}))
"""(name prefix, _mixed's arguments) of the batches measured for MIXED_HOPPER_PREFILL_TILE's other entries:
verification steps of 4 queries (16-row decode tiles), head dim 64, MQA (32-row decode tiles), d64 verification
steps."""


def tile_rule_cells(cfg: BenchConfig) -> list[Cell]:
    """Whole mixed batches (page 16, bf16, d128, GQA 32/8) between M1 and M2, and three of them over a non-paged
    cache, for the rule that picks the mixed kernel's prefill tile per batch
    (hopper_mixed.prefill_outweighs_decodes); then TILE_RULE_OTHER_BATCHES with verification steps, at d64, with MQA
    and at d64 with verification steps.
    Cells for env_ab, not part of this suite's run; none under --smoke."""
    if cfg.smoke:
        return []
    paged = [_mixed(_batch_name(chunk, kv, decodes, context), (chunk, kv), decodes, context, bench_dtype(cfg)).whole
             for (chunk, kv), decodes, context in TILE_RULE_BATCHES]
    non_paged = [replace(cell, name=cell.name.replace(" p16", " non-paged"), kv_source="dense", page_size=None)
                 for cell in paged if cell.name.startswith(TILE_RULE_NON_PAGED)]
    others = [_mixed(_batch_name(chunk, kv, decodes, context, prefix, "verify q4" if "queries" in shape else "decodes"),
                     (chunk, kv), decodes, context, bench_dtype(cfg), **shape).whole
              for prefix, shape in TILE_RULE_OTHER_SHAPES
              for (chunk, kv), decodes, context in TILE_RULE_OTHER_BATCHES]
    return paged + non_paged + others


QUEUE_RULE_BATCHES = (((512, 16384), 64, 4096), ((1024, 32768), 64, 4096), ((1024, 16384), 128, 2048),
                      ((1536, 16384), 64, 4096), ((1024, 8192), 64, 4096))
"""Batches whose prefill items take one to three dealt rounds of 132 (GQA 32/8: 32 query heads x chunk / 128 items),
most past what L2 holds (MIXED_HOPPER_L2_DEALT_MIB), for a rule on the queue by rounds: the 1k chunk on 15k (two
rounds, 64 MiB) ran 0.977-0.989x the queue's time dealt (docs/benchmarks_log.md, fifty-ninth session)."""


def queue_rule_cells(cfg: BenchConfig) -> list[Cell]:
    """QUEUE_RULE_BATCHES as whole mixed batches (page 16, bf16, d128, GQA 32/8), named ``MXR ...``: cells for env_ab
    (``ATTN_FUSED_HOPPER_MIXED_QUEUE=0`` against the default), not part of this suite's run; none under --smoke."""
    if cfg.smoke:
        return []
    return [_mixed(_batch_name(chunk, kv, decodes, context, "MXR "), (chunk, kv), decodes, context,
                   bench_dtype(cfg)).whole for (chunk, kv), decodes, context in QUEUE_RULE_BATCHES]


def _batch_name(chunk: int, kv: int, decodes: int, context: int, prefix: str = "MX ", steps: str = "decodes") -> str:
    prefill = f"{_k(chunk)} chunk on {_k(kv - chunk)} prefix" if kv > chunk else f"{_k(chunk)} prefill"
    return f"{prefix}{prefill} + {decodes} {steps} @{_k(context)} p16"


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _ok(rows: Sequence[Row]) -> dict[str, Row]:
    return {r.provider: r for r in rows if r.status == "ok" and r.us}


def combine(mixed: MixedCell, whole: list[Row], first: list[Row], second: list[Row],
            probe: Sequence[Row] = ()) -> list[Row]:
    """Add the derived "separately" rows to the whole cell's rows and recompute the speedups; the whole fused
    row's note compares it with our two calls and, from ``probe`` (the prefill_in_launch cell's rows), says
    what its prefill costs inside the launch."""
    a, b = _ok(first), _ok(second)
    derived = []
    for provider in sorted((a.keys() & b.keys()) & {"fused", *COMPETITORS}):
        row = Row(SUITE, mixed.whole.group, mixed.whole.name, f"{provider} (separately)",
                  layout=f"{a[provider].layout} + {b[provider].layout}", us=a[provider].us + b[provider].us,
                  note=f"{a[provider].us:.1f} + {b[provider].us:.1f} µs, 2 calls")
        derived.append(row)
    # the fastest competitor per part; then the fastest provider per part, ours among them (what the one launch is
    # held to)
    best_of = {"best competitors (separately)": COMPETITORS, "best separately": ("fused", *COMPETITORS)}
    for name, providers in best_of.items():
        parts = [[r for r in part.values() if r.provider in providers] for part in (a, b)]
        if all(parts):
            best_a, best_b = (min(part, key=lambda r: r.us) for part in parts)
            derived.append(Row(SUITE, mixed.whole.group, mixed.whole.name, name,
                               layout=f"{best_a.layout} + {best_b.layout}", us=best_a.us + best_b.us,
                               note=f"{best_a.provider} {best_a.us:.1f} + {best_b.provider} {best_b.us:.1f} µs"))
    problem = mixed.whole.problem
    for row in derived:
        row.kv_mb, row.gflop = problem.kv_bytes / 1e6, problem.flops / 1e9
        row.gbps = problem.kv_bytes / (row.us * 1e-6) / 1e9
    rows = whole + derived
    for row in rows:
        row.speedup, row.best_competitor = None, ""
    competitors = tuple(COMPETITORS) + tuple(f"{c} (separately)" for c in COMPETITORS)
    harness.assign_speedups(rows, competitors)
    fused = _ok(whole).get("fused")
    split = next((r for r in derived if r.provider == "fused (separately)"), None)
    if fused and split:
        fused.note = "; ".join(x for x in (fused.note, f"one launch = {fused.us / split.us:.2f}x the two calls") if x)
    prefill_in_launch, prefill_alone = _ok(probe).get("fused"), a.get("fused")
    if fused and prefill_in_launch and prefill_alone:
        fused.note = "; ".join(x for x in (fused.note, f"its prefill {prefill_in_launch.us:.1f} µs in the launch "
                                                       f"(decodes without queries), {prefill_alone.us:.1f} alone") if x)
    return rows


def run(cfg: BenchConfig) -> list[Row]:
    from benchmarks.providers import FACTORIES

    rows: list[Row] = []
    every_part = replace(cfg, cells=None)   # a wanted whole cell runs its parts and probe, whatever their names
    for mixed in cells(cfg):
        if not cfg.wants_cell(mixed.whole.name):
            continue
        parts = [harness.run_cells(SUITE, [cell], every_part, FACTORIES)
                 for cell in (mixed.whole, *mixed.parts, mixed.prefill_in_launch)]
        rows += combine(mixed, *parts) + parts[1] + parts[2] + parts[3]
    return rows


def main(argv: Sequence[str] | None = None) -> list[Row]:
    return harness.suite_main(SUITE, __doc__, DEFAULT_BUDGET_S, run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
