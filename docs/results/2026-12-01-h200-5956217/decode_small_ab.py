"""A/B on the H200: the small decode cells (1x8k, 1x32k, 8x4k, 32x2k at page 16) under split counts x tiles the
sweep has not combined (it varies one with the other at its default). Graph replays, L2 flushed, 30 ms windows
(as bench_decode). Reference: the default plan of the same process.

    python abtree/decode_small_ab.py > decode-small-ab.txt
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attention.kernels.configs import select_forward_config
from benchmarks import bench_decode
from benchmarks.cells import Inputs
from benchmarks.config import BenchConfig
from benchmarks.providers import _fused
from benchmarks.timing import time_fn

TILES = {  # (block_n, warps, stages, prefetch page ids, register cap)
    "n64 w4 s2": (64, 4, 2, False, 128),
    "n64 w4 s3 pf": (64, 4, 3, True, 128),
    "n128 w4 s3 pf": (128, 4, 3, True, 128),
    "n128 w8 s3 pf": (128, 8, 3, True, 128),
    "n32 w4 s4 pf": (32, 4, 4, True, 128),
}
SPLITS = (None, 8, 16, 32, 64)


def main() -> None:
    device = torch.device("cuda")
    cfg = BenchConfig(device=device)
    wanted = ("1x8k p16", "1x32k p16", "8x4k p16", "32x2k p16")
    print("| cell | tile | splits | graph µs | × default | max err |")
    print("|---|---|---|---|---|---|")
    for cell in bench_decode.cells(cfg):
        if cell.name not in wanted:
            continue
        p = cell.problem
        inputs = Inputs(p, device)
        base = select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4, max_seqlen_q=1, interpret=False,
                                     paged=True, max_seqlen_kv=p.max_kv)
        runner, _ = _fused(cell, inputs, "paged")
        reference = runner.fn().float()
        default_us = time_fn(runner.fn, True, cfg).us_graph
        print(f"| {cell.name} | default | auto | {default_us:.1f} | 1.000x | 0 |", flush=True)
        from benchmarks.providers import FACTORIES

        cudnn, reason = FACTORIES["sdpa_cudnn"](cell, inputs)
        if cudnn is not None:
            print(f"| {cell.name} | SDPA cuDNN | | {time_fn(cudnn.fn, True, cfg).us_graph:.1f} | | |", flush=True)
        best = (default_us, "default")
        for tile_name, (block_n, warps, stages, prefetch, registers) in TILES.items():
            config = replace(base, block_n=block_n, num_warps=warps, num_stages=stages, prefetch_page_ids=prefetch,
                             max_registers=registers)
            for splits in SPLITS:
                try:
                    runner, _ = _fused(cell, inputs, "paged", config=config, num_splits=splits)
                    error = (runner.fn().float() - reference).abs().max().item()
                    us = time_fn(runner.fn, True, cfg).us_graph
                except Exception as e:  # noqa: BLE001
                    print(f"| {cell.name} | {tile_name} | {splits} | failed: {str(e)[:100]} | | |", flush=True)
                    continue
                best = min(best, (us, f"{tile_name} splits {splits}"))
                print(f"| {cell.name} | {tile_name} | {splits or 'auto'} | {us:.1f} | {default_us / us:.3f}x | "
                      f"{error:.1e} |", flush=True)
        print(f"| {cell.name} | best: {best[1]} | | {best[0]:.1f} | {default_us / best[0]:.3f}x | |", flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
