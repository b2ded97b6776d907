"""On the H200: what the decodes cost inside the one-role-a-program mixed kernel (r1) and main's mixed kernel, one
process, graph replays settled (us):

  * M2's prefill (a 2k chunk on a 14k prefix) with 64 decodes at 0 (no queries) / 1k / 2k / 4k / 8k keys: whether
    the decodes' cost follows their bytes, and at what rate;
  * lone walks: a 256-query prefill with N decodes at 32k keys (8N walks of 16.8 MB on 132 SMs): one SM's decode
    rate (the roles kernel's deal gives some programs two walks at N = 8 or 16: the README counts them); with more,
    HBM's.

    timeout 300 python3 docs/results/2026-12-02-h200-dephase/scripts/decode_cost.py [--lone 2,4,16,64] [--no-m2]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../2026-12-02-h200-roles/scripts"))
from roles_ab import use

from attention.kernels import attention_fwd as launcher
from benchmarks.cells import Cell, Inputs, Problem
from benchmarks.config import BenchConfig
from benchmarks.providers import make_fused
from benchmarks.timing import time_fn


def problem(prefill: tuple[int, int], decodes: int, context: int) -> Problem:
    q_lens = (prefill[0],) + ((1,) if context else (0,)) * decodes
    return Problem(q_lens=q_lens, kv_lens=(prefill[1],) + (context or 4096,) * decodes, causal=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lone", default="16,64", help="decode counts of the lone-walk cells")
    parser.add_argument("--no-m2", action="store_true")
    args = parser.parse_args()
    cfg = BenchConfig(device=torch.device("cuda"))
    cases = [] if args.no_m2 else [(f"M2 prefill + 64 decodes @{c}", problem((2048, 16384), 64, c))
                                   for c in (0, 1024, 2048, 4096, 8192)]
    cases += [(f"256-query prefill + {n} decodes @32k", problem((256, 256), int(n), 32768))
              for n in args.lone.split(",")]
    for name, prob in cases:
        cell = Cell(name, "probe", prob, "paged", 16, latency=True, settle=True)
        inputs = Inputs(prob, cfg.device)
        walk_bytes = sum(k for q, k in zip(prob.q_lens[1:], prob.kv_lens[1:]) if q) * 8 * 128 * 2 * 2
        for variant in ("main", "r1"):
            use(variant)
            fn = make_fused(cell, inputs)[0].fn
            fn()
            plans = {type(plan).__name__ for plan in launcher._plans.values()}
            us = [time_fn(fn, True, cfg, settled=True).us_graph for _ in range(2)]
            print(f"{variant:<5} {name:<36} " + " / ".join(f"{u:.1f}" for u in us)
                  + f" us  decode K+V {walk_bytes / 1e9:.2f} GB {plans}", flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
