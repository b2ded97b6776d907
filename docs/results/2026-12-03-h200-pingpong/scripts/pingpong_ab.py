"""The prefill consumers' ping-pong (ATTN_FUSED_HOPPER_PINGPONG=1: the two consumer warp groups take turns to issue
their wgmmas, on named barriers) against free issue (0), in one process, variants alternated each round: prefill
cells of bench_prefill (the prefill kernel), M2's prefill part (the prefill kernel over 16-token pages), M2 and M1
whole and M2's prefill in the mixed launch (the mixed kernel). Graph replays after a 200 ms settle, µs; the outputs
of the two variants compared (max abs difference).

    ROUNDS=3 PYTHONPATH=. python3 docs/results/2026-12-03-h200-pingpong/scripts/pingpong_ab.py
"""
import argparse
import os

import torch

from attention.kernels import attention_fwd as launcher
from benchmarks import bench_prefill, providers
from benchmarks.bench_mixed import _mixed
from benchmarks.cells import Inputs
from benchmarks.config import add_common_arguments, config_from_args
from benchmarks.timing import graph_replay_us, settle

PREFILL = ("MHA full 4x4k", "MHA causal 4x4k", "GQA 32/8 causal 1x16k", "GQA 32/8 full 16x1k", "chunk 2k on 30k p16",
           "chunk 2k on 6k non-paged", "d64 MHA 32 causal 4x4k", "d64 MHA 32 full 4x4k")
CELLS = os.environ.get("CELLS")  # comma list of cell names: time only these


def d64_cells(dtype) -> dict:
    """Head dim 64 beyond bench_prefill's two: GQA 32/8 and MHA, 1k to 16k, full and causal, a 2k chunk on 14k."""
    cells = {}
    for heads, causal, s in (((32, 8), True, 16384), ((32, 8), True, 4096), ((32, 8), False, 4096),
                             ((32, 32), True, 1024), ((32, 32), False, 16384)):
        name = f"d64 {bench_prefill._heads_name(heads)} {'causal' if causal else 'full'} {16384 // s}x{s // 1024}k"
        cells[name] = bench_prefill._varlen(name, "d64", (s,) * (16384 // s), heads, causal, dtype, head_dim=64)
    cells["d64 chunk 2k on 14k p16"] = bench_prefill._chunk("d64 chunk 2k on 14k p16", 2048, 14336, 16, dtype,
                                                            head_dim=64)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, 0)
    cfg = config_from_args(parser.parse_args())
    dtype = torch.bfloat16
    m1 = _mixed("M1", (2048, 2048), 128, 2048, dtype)
    m2 = _mixed("M2", (2048, 16384), 64, 4096, dtype)
    cells = {"M2 prefill (prefill kernel)": m2.parts[0], "M2 whole": m2.whole,
             "M2 prefill in launch": m2.prefill_in_launch, "M1 whole": m1.whole}
    cells.update({cell.name: cell for cell in bench_prefill.cells(cfg) if cell.name in PREFILL})
    cells.update(d64_cells(dtype))
    if CELLS:
        cells = {name: cell for name, cell in cells.items() if name in CELLS.split(",")}
    runners = {}
    for name, cell in cells.items():
        inputs = Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order)
        runner, reason = providers.make_fused(cell, inputs)
        assert runner is not None, reason
        runners[name] = runner
    outputs = {}
    wait = torch.cuda.synchronize
    for round_ in range(int(os.environ.get("ROUNDS", "2"))):
        for variant in ("0", "1") if round_ % 2 == 0 else ("1", "0"):
            os.environ["ATTN_FUSED_HOPPER_PINGPONG"] = variant
            launcher._plans.clear()
            for name, runner in runners.items():
                with torch.no_grad():
                    out = runner.fn()
                    torch.cuda.synchronize()
                    if round_ == 0:
                        outputs[variant, name] = out.float().clone()
                    settle(runner.fn, 200, wait)
                    us = graph_replay_us(runner.fn, cfg, settled=True)
                print(f"round {round_} pingpong={variant} {name:34} {us:9.1f}", flush=True)
    for name in runners:
        diff = (outputs["1", name] - outputs["0", name]).abs().max().item()
        print(f"max |pingpong - free| {name:34} {diff:.4g}")


if __name__ == "__main__":
    main()
