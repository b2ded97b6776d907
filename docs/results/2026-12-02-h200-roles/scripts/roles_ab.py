"""On the H200: the mixed kernel with one role a program (attention_mixed_roles_hopper.py) at 1-4 prefill key splits
against main's mixed kernel, in one process: M1 / M2 whole, their prefill alone in the launch (decodes without
queries) and the prefill part alone (the prefill kernel), graph replays, settled, the variants alternated for
--rounds rounds, each with its max |difference| from main's output.

    timeout 400 python3 docs/results/2026-12-02-h200-roles/scripts/roles_ab.py --rounds 2 --variants main,r1,r2,r3,r4
"""
from __future__ import annotations

import argparse
import os

import torch

from attention.kernels import attention_fwd as launcher
from attention.kernels.hopper_mixed_roles import MIXED_ROLES_ENV, MIXED_ROLES_SPLITS_ENV


def use(name: str) -> None:
    """main: hopper_mixed's kernel; rN: the one-role-a-program kernel at N prefill splits."""
    os.environ[MIXED_ROLES_ENV] = "0" if name == "main" else "1"
    if name != "main":
        os.environ[MIXED_ROLES_SPLITS_ENV] = name[1:]
    launcher._plans.clear()


def timing(rounds: int, names: list[str], with_parts: bool, only: str) -> None:
    from benchmarks import bench_mixed
    from benchmarks.cells import Inputs
    from benchmarks.config import BenchConfig
    from benchmarks.providers import make_fused
    from benchmarks.timing import time_fn

    cfg = BenchConfig(device=torch.device("cuda"))
    cells = [c for mixed in bench_mixed.cells(cfg) for c in (mixed.whole, mixed.prefill_in_launch)]
    if with_parts:
        cells += [mixed.parts[0] for mixed in bench_mixed.cells(cfg)]
    cells = sorted((c for c in cells if only in c.name), key=lambda c: not c.name.startswith("M2"))
    for _ in range(rounds):
        for cell in cells:
            inputs = Inputs(cell.problem, cfg.device)
            outs = {}
            for name in (["main"] if " part: " in cell.name else names):  # a part alone: the prefill kernel
                use(name)
                fn = make_fused(cell, inputs)[0].fn
                outs[name] = fn().float().clone()
                plans = {type(plan).__name__ for plan in launcher._plans.values()}
                us = [time_fn(fn, True, cfg, settled=True).us_graph for _ in range(2)]
                diff = "" if name == "main" or "main" not in outs else \
                    f"  max |{name} - main| {(outs[name] - outs['main']).abs().max().item():.1e}"
                print(f"{name:<5} {cell.name[:48]:<48} " + " / ".join(f"{u:.1f}" for u in us) + f" us {plans}"
                      + diff, flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="main,r1,r2,r3,r4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parts", action="store_true", help="also the prefill part alone (the prefill kernel)")
    parser.add_argument("--only", default="", help="cells whose name holds this (M2 first)")
    parser.add_argument("--kernel-variant", default="", help="rN runs decode_bisect.py's variant of the kernel")
    args = parser.parse_args()
    if args.kernel_variant:
        import sys

        from attention.kernels import hopper_mixed_roles
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from decode_bisect import load
        hopper_mixed_roles.attention_mixed_roles_hopper_kernel = load(args.kernel_variant)
    timing(args.rounds, args.variants.split(","), args.parts, args.only)
