"""A/B on the H200: bench_mixed's M1 / M2 over 16-token pages, one launch, with KV tiles of one page read through
tensor descriptors (block_n 16, one page id per tile, TMA) against the table's tile (per-key page ids).
Graph replays, settled, 300 ms windows.

    python abtree/paged_mixed_tiles.py > paged-mixed-tiles.txt
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attention.kernels.configs import q_tile_count, select_forward_config
from benchmarks import bench_mixed
from benchmarks.cells import Inputs
from benchmarks.config import BenchConfig
from benchmarks.providers import _fused
from benchmarks.timing import time_fn


def main() -> None:
    device = torch.device("cuda")
    cfg = BenchConfig(device=device)
    for mixed in bench_mixed.cells(cfg):
        cell = mixed.whole
        p = cell.problem
        inputs = Inputs(p, device)
        default = select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4, max_seqlen_q=p.max_q,
                                        interpret=False, paged=True, max_seqlen_kv=p.max_kv, causal=True,
                                        num_q_tiles=q_tile_count(p.total_q, 4, 8))
        one_page = {"block_n": 16, "paged_scalar_ids": True, "tma": True, "prefetch_page_ids": False}
        configs = {"default": default}
        for block_m, warps in ((64, 4), (128, 8)):
            for stages in (3, 4, 6):
                configs[f"{block_m}x16 w{warps} s{stages} tma"] = replace(
                    default, block_m=block_m, block_q=block_m // 4, num_warps=warps, num_stages=stages,
                    max_registers=0, **one_page)
        configs["64x16 w4 s4 no tma"] = replace(configs["64x16 w4 s4 tma"], tma=False)
        print(f"## {cell.name}, default {default}")
        print("| config | graph µs | × default | max err |")
        print("|---|---|---|---|")
        reference, base_us = None, None
        for name, config in configs.items():
            try:
                runner, _ = _fused(cell, inputs, "paged", config=config)
                out = runner.fn().float()
                reference = out if reference is None else reference
                error = (out - reference).abs().max().item()
                us = time_fn(runner.fn, True, cfg, settled=True).us_graph
            except Exception as e:  # noqa: BLE001
                print(f"| {name} | failed: {str(e)[:160]} | | |", flush=True)
                continue
            base_us = base_us or us
            print(f"| {name} | {us:.1f} | {base_us / us:.3f}x | {error:.1e} |", flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
