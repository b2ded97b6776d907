"""A/B on the H200: paged chunks with pages of 16-64 keys read in place by the Gluon kernel, against the
pages copied first (ATTN_FUSED_HOPPER_SMALL_PAGES=0), and against the non-paged cache. One process, the two
settings alternating per cell over three rounds; settled, 300 ms windows (benchmarks.timing).

    python abtree/pages_ab.py  > pages-ab.txt
"""

from __future__ import annotations

import os
import statistics

import torch

from attention.kernels import attention_fwd
from benchmarks.cells import Cell, Inputs, Problem
from benchmarks.config import BenchConfig
from benchmarks.providers import _fused
from benchmarks.timing import time_fn

ENV = "ATTN_FUSED_HOPPER_SMALL_PAGES"


def problem(chunks: int, chunk: int, prefix: int) -> Problem:
    return Problem(q_lens=(chunk,) * chunks, kv_lens=(chunk + prefix,) * chunks, causal=True, heads_q=32, heads_kv=8,
                   head_dim=128, head_dim_v=128, dtype=torch.bfloat16)


def main() -> None:
    device = torch.device("cuda")
    cfg = BenchConfig(device=device)
    cells = [(f"{n}x chunk 2k on {prefix // 1024}k", problem(n, 2048, prefix))
             for n, prefix in ((1, 6144), (1, 14336), (1, 30720), (8, 63488))]
    print("| cell | page | in place µs | copied first µs | in place x copied | non-paged µs | plans in place / copied |")
    print("|---|---|---|---|---|---|---|")
    for name, p in cells:
        inputs = Inputs(p, device)
        dense_cell = Cell(name, "ab", p, "dense", None, settle=True)
        dense_runner, _ = _fused(dense_cell, inputs, "dense")
        dense_us = time_fn(dense_runner.fn, False, cfg, settled=True).us_eager
        for page in (16, 32, 64):
            cell = Cell(name, "ab", p, "paged", page, settle=True)
            runner, reason = _fused(cell, inputs, "paged")
            times = {"1": [], "0": []}
            plans = {}
            reference = None
            for _ in range(3):
                for setting in ("1", "0"):
                    os.environ[ENV] = setting
                    attention_fwd._plans.clear()
                    out = runner.fn()
                    plans[setting] = "+".join(sorted({type(x).__name__ for x in attention_fwd._plans.values()}))
                    if reference is None:
                        reference = out.float()
                    else:
                        assert (out.float() - reference).abs().max().item() < 2e-2, (name, page, setting)
                    times[setting].append(time_fn(runner.fn, False, cfg, settled=True).us_eager)
            in_place, copied = statistics.median(times["1"]), statistics.median(times["0"])
            print(f"| {name} | {page} | {in_place:.1f} | {copied:.1f} | {copied / in_place:.3f} | {dense_us:.1f} | "
                  f"{plans['1']} / {plans['0']} |", flush=True)
        del inputs
        torch.cuda.empty_cache()
    os.environ.pop(ENV, None)


if __name__ == "__main__":
    main()
