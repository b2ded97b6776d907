"""A/B on the H200: batches that mix a long prefill with many short sequences but average >= 64 queries per
sequence, which plan_hopper_forward sends to the Gluon kernel (its grid: every sequence x the longest one's q
tiles x query heads), against the general kernel (ATTN_FUSED_HOPPER=0). Settled, 300 ms windows, graph replays.

    python abtree/hopper_mixed_ab.py > hopper-mixed-ab.txt
"""

from __future__ import annotations

import os

import torch

from attention.kernels import attention_fwd
from benchmarks.cells import Cell, Inputs, Problem
from benchmarks.config import BenchConfig
from benchmarks.providers import _fused
from benchmarks.timing import time_fn


def main() -> None:
    device = torch.device("cuda")
    cfg = BenchConfig(device=device)
    cells = [
        ("2k chunk on 14k + 30 decodes @4k, p16", (2048,) + (1,) * 30, (16384,) + (4096,) * 30, "paged"),
        ("2k chunk on 14k + 30 decodes @4k, non-paged", (2048,) + (1,) * 30, (16384,) + (4096,) * 30, "dense"),
        ("4k prefill + 60 decodes @2k, p16", (4096,) + (1,) * 60, (4096,) + (2048,) * 60, "paged"),
        ("ragged prefill 8k + 63 x 128, thd", (8192,) + (128,) * 63, (8192,) + (128,) * 63, "packed"),
    ]
    print("| cell | Gluon (today's plan) µs | general kernel µs | general x Gluon | max diff | plans |")
    print("|---|---|---|---|---|---|")
    for name, q_lens, kv_lens, source in cells:
        problem = Problem(q_lens=q_lens, kv_lens=kv_lens, causal=True)
        cell = Cell(name, "ab", problem, source, 16 if source == "paged" else None, latency=True, settle=True)
        inputs = Inputs(problem, device)
        times, outs, plans = {}, {}, {}
        for setting in ("1", "0", "1", "0"):
            os.environ["ATTN_FUSED_HOPPER"] = setting
            attention_fwd._plans.clear()
            runner, _ = _fused(cell, inputs, source)
            outs[setting] = runner.fn().float()
            plans[setting] = "+".join(sorted({type(x).__name__ for x in attention_fwd._plans.values()}))
            times.setdefault(setting, []).append(time_fn(runner.fn, True, cfg, settled=True).us_graph)
        gluon, general = min(times["1"]), min(times["0"])
        diff = (outs["1"] - outs["0"]).abs().max().item()
        print(f"| {name} | {gluon:.1f} | {general:.1f} | {gluon / general:.2f}x | {diff:.1e} | "
              f"{plans['1']} / {plans['0']} |", flush=True)
        del inputs
        torch.cuda.empty_cache()
    os.environ.pop("ATTN_FUSED_HOPPER", None)


if __name__ == "__main__":
    main()
