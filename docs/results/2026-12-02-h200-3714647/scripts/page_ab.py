"""Where the page-16 decode's gap comes from: graph replays (read flush) of the fused provider on the cell's
random page table, on an identity page table (--identity: the same pages in order, so a sequence's pages are
contiguous as a non-paged cache's rows), and the non-paged cache (dense); fastest of 3 interleaved rounds. The
variant under test comes from the environment (ATTN_DECODE_PREFETCH, ATTN_FUSED_HOPPER_DECODE_TILE); --mixed adds
bench_mixed's M1 through the fused provider (settled).

    python abtree/page_ab.py --label pf1 --only "64x4k p16,128x2k"
"""
from __future__ import annotations

import argparse

import torch

from benchmarks import bench_decode, bench_mixed
from benchmarks.cells import Inputs
from benchmarks.config import BenchConfig
from benchmarks.providers import make_fused, make_fused_dense
from benchmarks.timing import _graph_replay_us, time_fn


_RANDPERM = torch.randperm


def within_blocks(n, generator=None, block=64):
    """A permutation that keeps each block of ``block`` pages (2 MB of 16-token GQA 8 x d128 pages) in place and
    shuffles the pages inside it: address translation as the identity's, DRAM order as random."""
    order = torch.arange(n)
    for first in range(0, n, block):
        last = min(n, first + block)
        order[first:last] = first + _RANDPERM(last - first, generator=generator)
    return order


def identity_inputs(problem, dev, blocks=False):
    """Inputs whose page tables are the identity (pages of sequence 0 first, in order), or with ``blocks``
    shuffled within 2 MB blocks."""
    randperm = torch.randperm
    torch.randperm = (lambda n, generator=None: within_blocks(n, generator)) if blocks else (
        lambda n, generator=None: torch.arange(n))
    try:
        inputs = Inputs(problem, dev)
        for size in (16, 64, 256):
            try:
                inputs.paged(size)
            except ValueError:
                pass
    finally:
        torch.randperm = randperm
    return inputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--identity", action="store_true")
    parser.add_argument("--dense", action="store_true")
    parser.add_argument("--blocks", action="store_true")
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--mixed-cells", type=int, default=1)
    parser.add_argument("--only", default="")
    parser.add_argument("--window-ms", type=float, default=60.0)
    args = parser.parse_args()
    dev = torch.device("cuda")
    cfg = BenchConfig(device=dev)
    for cell in bench_decode.cells(cfg):
        if args.only and not any(cell.name.startswith(o.replace("_", " ")) for o in args.only.split(",")):
            continue
        inputs = Inputs(cell.problem, dev)
        fns = {"fused": make_fused(cell, inputs)[0].fn}
        if args.identity and cell.kv_source == "paged":
            fns["ident"] = make_fused(cell, identity_inputs(cell.problem, dev))[0].fn
        if args.blocks and cell.kv_source == "paged":
            fns["block"] = make_fused(cell, identity_inputs(cell.problem, dev, blocks=True))[0].fn
        if args.dense and cell.kv_source == "paged":
            fns["dense"] = make_fused_dense(cell, inputs)[0].fn
        ref = fns["fused"]().float()
        err = max([(fn().float() - ref).abs().max().item() for fn in fns.values()])
        times: dict[str, float] = {}
        for _ in range(3):
            for name, fn in fns.items():
                times[name] = min(times.get(name, 1e9), _graph_replay_us(fn, dev, args.window_ms))
        mb = cell.problem.kv_bytes / 1e6
        print(f"{args.label:<6} {cell.name[:22]:<22} " + " ".join(
            f"{n} {t:7.1f} us {mb / t:5.2f}" for n, t in times.items()) + f"  err {err:.1e}", flush=True)
        del inputs, fns
        torch.cuda.empty_cache()
    if args.mixed:
        for mixed in bench_mixed.cells(cfg)[:args.mixed_cells]:
            cell = mixed.whole
            inputs = Inputs(cell.problem, dev)
            fn = make_fused(cell, inputs)[0].fn
            fn()
            us = [time_fn(fn, True, cfg, settled=True).us_graph for _ in range(2)]
            print(f"{args.label:<6} {cell.name[:22]:<22} fused " + " / ".join(f"{u:.1f}" for u in us) + " us",
                  flush=True)
            del inputs, fn
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
