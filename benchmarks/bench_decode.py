"""Decode benchmark: one (or a few) query tokens per sequence over a long KV cache.

Cells (bf16, d=128, GQA 32/8 unless named, paged with 16-token pages unless named):
batch x context 1x8k, 1x32k, 8x4k, 32x2k, 64x4k, 128x2k, 32x32k; MHA 32/32 and MQA 32/1 at
64x4k; a ragged batch of 64 heavy-tailed lengths (mean ~4k, max 32k); speculative verification
(4 query tokens per sequence, causal inside the draft) at 32x4k; a page-size sweep 1/64/256 and
non-paged at 64x4k (page 16 is the 64x4k cell itself); small pages on latency-bound cells (1x8k and 32x2k at page
1, 1x8k at page 4); page order: 64x4k and 128x2k with their pages where a
serving run puts them (``cells.served_page_table``: TransformerEngine's FIFO free list, or InferenceParams' page
runs), and 8x4k, 32x2k, 32x32k and MHA 32/32 at 64x4k through the page runs; every other paged cell's pages lie in
random order. Every paged cell also has a ``fused_dense`` row: the same call on a non-paged cache. Every cell is
also timed as a CUDA-graph replay, and the replay is the reported time: an eager decode call shorter than its host
work (Triton's launcher alone costs ~160 µs on the H200's host) would otherwise measure the host, which the overhead
suite reports on its own.

    python -m benchmarks.bench_decode --out DIR        # on the GPU
    python -m benchmarks.bench_decode --smoke --out DIR  # tiny shapes, CPU: checks the script
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from benchmarks import harness
from benchmarks.cells import Cell, Problem
from benchmarks.config import BenchConfig, bench_dtype
from benchmarks.harness import Row

SUITE = "decode"
DEFAULT_BUDGET_S = 300.0
"""Seconds for the whole suite (H200: ~195 s for the cells before the page-order ones, ~170 s for those; the
page-order cells come last, so a shorter budget, such as run_all's share, reports them as skipped)."""


def ragged_lengths(count: int = 64, mean: int = 4096, longest: int = 32768, shortest: int = 64,
                   alpha: float = 1.1, seed: int = 0) -> tuple[int, ...]:
    """Deterministic heavy-tailed (Pareto) context lengths with the given mean and maximum.

    Lengths are the Pareto quantiles at evenly spaced probabilities, scaled so that after clipping to
    [shortest, longest] the mean is ``mean``; the longest is set to ``longest``; the order is a seeded
    shuffle.
    """
    import random

    quantiles = [(1.0 - (i + 0.5) / count) ** (-1.0 / alpha) for i in range(count)]
    low, high = 1.0, float(longest)
    for _ in range(60):  # bisect the scale so the clipped mean hits `mean`
        scale = (low + high) / 2
        lengths = [min(longest, max(shortest, round(scale * x))) for x in quantiles]
        low, high = (scale, high) if sum(lengths) / count < mean else (low, scale)
    lengths[lengths.index(max(lengths))] = longest
    random.Random(seed).shuffle(lengths)
    return tuple(lengths)


def _decode(name: str, group: str, batch: int, context: int, dtype, heads=(32, 8), head_dim: int = 128,
            page: int | None = 16, q_len: int = 1, lengths: Sequence[int] | None = None,
            latency: bool = True, page_order: str = "random") -> Cell:
    kv_lens = tuple(lengths) if lengths is not None else (context,) * batch
    problem = Problem(q_lens=(q_len,) * len(kv_lens), kv_lens=kv_lens, heads_q=heads[0], heads_kv=heads[1],
                      head_dim=head_dim, head_dim_v=head_dim, causal=q_len > 1, dtype=dtype)
    return Cell(name, group, problem, "paged" if page else "dense", page, latency, "bandwidth",
                page_order=page_order)


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def cells(cfg: BenchConfig) -> list[Cell]:
    dtype = bench_dtype(cfg)
    if cfg.smoke:
        small = {"heads": (4, 2), "head_dim": 16}
        return [
            _decode("2x96 p16", "decode", 2, 96, dtype, **small),
            _decode("1x256 MQA p16 (split-KV)", "heads", 1, 256, dtype, heads=(4, 1), head_dim=16),
            _decode("3 ragged p8", "ragged", 3, 0, dtype, page=8, lengths=(5, 40, 200), **small),
            _decode("2x64 verify q4 p16", "verify", 2, 64, dtype, q_len=4, **small),
            _decode("2x96 non-paged", "page-sweep", 2, 96, dtype, page=None, **small),
            _decode("2x96 p16 served, page runs", "page-order", 2, 96, dtype, page_order="runs", **small),
            _decode("2x96 p16 served, FIFO pages", "page-order", 2, 96, dtype, page_order="fifo", **small),
        ]
    base = [(1, 8192), (1, 32768), (8, 4096), (32, 2048), (64, 4096), (128, 2048), (32, 32768)]
    result = [_decode(f"{b}x{_k(s)} p16", "decode", b, s, dtype) for b, s in base]
    result += [
        _decode("64x4k MHA 32/32 p16", "heads", 64, 4096, dtype, heads=(32, 32)),
        _decode("64x4k MQA 32/1 p16", "heads", 64, 4096, dtype, heads=(32, 1)),
    ]
    lengths = ragged_lengths()
    result.append(_decode(f"ragged 64 (mean {_k(round(sum(lengths) / 64 / 1024) * 1024)}, max 32k) p16", "ragged",
                          64, 0, dtype, lengths=lengths))
    result.append(_decode("32x4k verify q4 p16", "verify", 32, 4096, dtype, q_len=4))
    result += [_decode(f"64x4k p{page}", "page-sweep", 64, 4096, dtype, page=page) for page in (1, 64, 256)]
    result.append(_decode("64x4k non-paged", "page-sweep", 64, 4096, dtype, page=None))
    # pages under 16 tokens on the latency-bound cells, where the Hopper decode kernel gathers them by cp.async
    result += [_decode(f"{b}x{_k(s)} p{page}", "small-pages", b, s, dtype, page=page)
               for b, s, page in ((1, 8192, 1), (32, 2048, 1), (1, 8192, 4))]
    result += [_decode(f"{b}x{_k(s)} p16 served, {'FIFO pages' if order == 'fifo' else 'page runs'}", "page-order", b,
                       s, dtype, page_order=order)
               for b, s in ((64, 4096), (128, 2048)) for order in ("fifo", "runs")]
    result += [_decode(f"{b}x{_k(s)} p16 served, page runs", "page-order", b, s, dtype, page_order="runs")
               for b, s in ((8, 4096), (32, 2048), (32, 32768))]
    result.append(_decode("64x4k MHA 32/32 p16 served, page runs", "page-order", 64, 4096, dtype, heads=(32, 32),
                          page_order="runs"))
    return result


def run(cfg: BenchConfig) -> list[Row]:
    from benchmarks.providers import FACTORIES

    return harness.run_cells(SUITE, cells(cfg), cfg, FACTORIES)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    return harness.suite_main(SUITE, __doc__, DEFAULT_BUDGET_S, run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
