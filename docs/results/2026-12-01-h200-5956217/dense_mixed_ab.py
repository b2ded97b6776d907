"""A/B on the H200: mixed batches (bench_mixed's M1 / M2) over a NON-paged cache, one launch of the general
kernel, under several configurations: which tile serves decodes beside a prefill when the cache is contiguous.
CUDA-graph replays, settled, 300 ms windows; every output checked against the default's.

    python abtree/dense_mixed_ab.py > dense-mixed-ab.txt
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attention.kernels.configs import ForwardConfig, q_tile_count, select_forward_config
from benchmarks import bench_mixed
from benchmarks.config import BenchConfig
from benchmarks.cells import Inputs
from benchmarks.providers import _fused
from benchmarks.timing import time_fn


def tile(base: ForwardConfig, block_m: int, block_n: int, warps: int, stages: int, registers: int = 0,
         **variants) -> ForwardConfig:
    return replace(base, block_m=block_m, block_q=block_m // 4, block_n=block_n, num_warps=warps, num_stages=stages,
                   max_registers=registers, **variants)


def main() -> None:
    device = torch.device("cuda")
    cfg = BenchConfig(device=device)
    for mixed in bench_mixed.cells(cfg):
        cell = mixed.whole
        p = cell.problem
        inputs = Inputs(p, device)
        default = select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4, max_seqlen_q=p.max_q,
                                        interpret=False, paged=False, max_seqlen_kv=p.max_kv, causal=True,
                                        num_q_tiles=q_tile_count(p.total_q, 4, 8))
        small = {"small_block_m": 16}
        fast = {"tma": True, "int32_offsets": True, "heavy_tiles_first": True}
        configs = {
            "default": default,
            "default + small 16": replace(default, **small),
            "64x64 w4 s3 + small 16": tile(default, 64, 64, 4, 3, **small),
            "64x64 w4 s3 + small 16, no tma": tile(default, 64, 64, 4, 3, **small, tma=False),
            "64x32 w4 s3 + small 16": tile(default, 64, 32, 4, 3, **small),
            "64x64 w4 s2 + small 16": tile(default, 64, 64, 4, 2, **small),
            "128x64 w8 s3 + small 16": tile(default, 128, 64, 8, 3, **small),
            "128x128 w8 s3 + small 16": tile(default, 128, 128, 8, 3, **small),
            "128x64 w8 s2 r128 + small 16": tile(default, 128, 64, 8, 2, 128, **small),
        }
        configs = {name: replace(c, **{k: v for k, v in fast.items() if getattr(default, k)}) if "no tma" not in name
                   else c for name, c in configs.items()}
        print(f"## {cell.name} (non-paged), default {default}")
        print("| config | graph µs | × default | max err |")
        print("|---|---|---|---|")
        reference, base_us = None, None
        for name, config in configs.items():
            runner, reason = _fused(cell, inputs, "dense", config=config)
            try:
                out = runner.fn().float()
                if reference is None:
                    reference = out
                error = (out - reference).abs().max().item()
                us = time_fn(runner.fn, True, cfg, settled=True).us_graph
            except Exception as e:  # noqa: BLE001
                print(f"| {name} | failed: {str(e)[:120]} | | |", flush=True)
                continue
            base_us = base_us or us
            print(f"| {name} | {us:.1f} | {base_us / us:.3f}x | {error:.1e} |", flush=True)
        del inputs
        torch.cuda.empty_cache()


def paged_order() -> None:
    """The paged one launch (#6's target cells): the prefill sequence first (bench_mixed's order) or last in
    the batch (which programs the hardware dispatches first), and forced split counts."""
    from benchmarks.cells import Cell, Problem

    device = torch.device("cuda")
    cfg = BenchConfig(device=device)
    print("## paged page 16, one launch: batch order and splits")
    print("| cell | order | splits | graph µs | max err |")
    print("|---|---|---|---|---|")
    for name, (q_chunk, kv_chunk), decodes, context in (("M1", (2048, 2048), 128, 2048),
                                                        ("M2", (2048, 16384), 64, 4096)):
        for order in ("prefill first", "prefill last"):
            q_lens = (q_chunk,) + (1,) * decodes
            kv_lens = (kv_chunk,) + (context,) * decodes
            if order == "prefill last":
                q_lens, kv_lens = q_lens[::-1], kv_lens[::-1]
            problem = Problem(q_lens=q_lens, kv_lens=kv_lens, causal=True)
            cell = Cell(name, "ab", problem, "paged", 16, latency=True, settle=True)
            inputs = Inputs(problem, device)
            reference = None
            for splits in (None, 2, 4):
                runner, _ = _fused(cell, inputs, "paged", num_splits=splits)
                out = runner.fn().float()
                reference = out if reference is None else reference
                us = time_fn(runner.fn, True, cfg, settled=True).us_graph
                print(f"| {name} | {order} | {splits or 'auto'} | {us:.1f} | "
                      f"{(out - reference).abs().max().item():.1e} |", flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
    paged_order()
