"""Prefill benchmark: varlen (``thd``) self-attention and chunked prefill over a cached prefix.

Cells (bf16): d=128, MHA 32 heads and GQA 32/8, non-causal and causal, sequence lengths 1k, 2k, 4k,
8k, 16k at 16k total tokens (batch = 16k / s), as ``thd`` varlen; a ragged varlen batch of 16
sequences with lengths 128..4096 (GQA, causal); chunked prefill of a 2k chunk over a 6k and a 30k
prefix in a paged cache (page 16 and 256; pages in random order, and at page 16 also as InferenceParams'
page runs place them, ``served, page runs``) and the same work on a non-paged cache; d=64 (MHA 32) and
d=256 (MHA 16) at 4k (batch 4), non-causal and causal.

TFLOP/s counts 4*h*s_q*s_k*d per sequence, halved for causal self-attention; a chunk over a prefix
counts its visible trapezoid (s_k -> (prefix + s_k) / 2). SDPA runs the equal-length cells as padded
batches [b, h, s, d] (no padding exists there) and the chunks with a bottom-right causal mask.

    python -m benchmarks.bench_prefill --out DIR  [--smoke]
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence

from benchmarks import harness
from benchmarks.cells import Cell, Problem
from benchmarks.config import BenchConfig, bench_dtype
from benchmarks.harness import Row

SUITE = "prefill"
DEFAULT_BUDGET_S = 300.0
TOTAL_TOKENS = 16384


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _heads_name(heads: tuple[int, int]) -> str:
    return "MHA" if heads[0] == heads[1] else f"GQA {heads[0]}/{heads[1]}"


def _varlen(name: str, group: str, lengths: Sequence[int], heads: tuple[int, int], causal: bool, dtype,
            head_dim: int = 128) -> Cell:
    problem = Problem(q_lens=tuple(lengths), kv_lens=tuple(lengths), heads_q=heads[0], heads_kv=heads[1],
                      head_dim=head_dim, head_dim_v=head_dim, causal=causal, dtype=dtype)
    return Cell(name, group, problem, "packed", None, latency=False, metric="flops", settle=True)


def _chunk(name: str, chunk: int, prefix: int, page: int | None, dtype, heads=(32, 8), head_dim: int = 128,
           page_order: str = "random") -> Cell:
    problem = Problem(q_lens=(chunk,), kv_lens=(prefix + chunk,), heads_q=heads[0], heads_kv=heads[1],
                      head_dim=head_dim, head_dim_v=head_dim, causal=True, dtype=dtype)
    return Cell(name, "chunked", problem, "paged" if page else "dense", page, latency=False, metric="flops",
                settle=True, page_order=page_order)


def ragged_prefill_lengths(count: int = 16, shortest: int = 128, longest: int = 4096, seed: int = 0) -> tuple[int, ...]:
    """Seeded uniform lengths in [shortest, longest], including both ends."""
    rng = random.Random(seed)
    lengths = [shortest, longest] + [rng.randint(shortest, longest) for _ in range(count - 2)]
    rng.shuffle(lengths)
    return tuple(lengths)


def cells(cfg: BenchConfig) -> list[Cell]:
    dtype = bench_dtype(cfg)
    if cfg.smoke:
        small = {"heads": (4, 2), "head_dim": 16}
        return [
            _varlen("GQA causal ragged [40, 64, 17]", "ragged", (40, 64, 17), (4, 2), True, dtype, head_dim=16),
            _varlen("MHA full 2x48", "MHA", (48, 48), (4, 4), False, dtype, head_dim=16),
            _chunk("chunk 16 on 64 prefix p16", 16, 64, 16, dtype, **small),
            _chunk("chunk 16 on 64 prefix non-paged", 16, 64, None, dtype, **small),
        ]

    def grid(heads: tuple[int, int], causal: bool) -> list[Cell]:
        mask = "causal" if causal else "full"
        return [_varlen(f"{_heads_name(heads)} {mask} {TOTAL_TOKENS // s}x{_k(s)}", _heads_name(heads),
                        (s,) * (TOTAL_TOKENS // s), heads, causal, dtype) for s in (1024, 2048, 4096, 8192, 16384)]

    lengths = ragged_prefill_lengths()
    ragged = [_varlen(f"GQA 32/8 causal ragged 16 ({sum(lengths)} tok)", "ragged", lengths, (32, 8), True, dtype)]
    chunks = [_chunk(f"chunk 2k on {_k(prefix)} " + (f"p{page}" if page else "non-paged"), 2048, prefix, page, dtype)
              for prefix in (6144, 30720) for page in (16, 256, None)]
    chunks += [_chunk(f"chunk 2k on {_k(prefix)} p16 served, page runs", 2048, prefix, 16, dtype, page_order="runs")
               for prefix in (6144, 30720)]
    head_dims = [_varlen(f"d{d} MHA {heads[0]} {'causal' if causal else 'full'} 4x4k", f"d{d}", (4096,) * 4, heads,
                         causal, dtype, head_dim=d)
                 for d, heads in ((64, (32, 32)), (256, (16, 16))) for causal in (False, True)]
    # Most telling first: a run that hits its time budget drops the tail.
    return (grid((32, 32), False) + grid((32, 32), True) + grid((32, 8), True) + ragged + chunks + head_dims
            + grid((32, 8), False))


def run(cfg: BenchConfig) -> list[Row]:
    from benchmarks.providers import FACTORIES

    return harness.run_cells(SUITE, cells(cfg), cfg, FACTORIES)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    return harness.suite_main(SUITE, __doc__, DEFAULT_BUDGET_S, run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
