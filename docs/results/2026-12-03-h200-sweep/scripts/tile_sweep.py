"""On the H200: decode cells through the fused backend under environment variants (the decode kernel's tile, KV
heads an item, gather tile), SDPA cuDNN beside them, same process, graph replays, settled, --rounds interleaved
rounds; each variant's output checked against the default's. Each cell's cache has its pages in the cell's order
(until the thirty-ninth session this script built every cache in random order, whatever the cell's name said).

    python tile_sweep.py --cells "32x2k p16|64x4k p1 runs" --variants "t4=ATTN_FUSED_HOPPER_DECODE_TILE=64,4,1,168" ...

A variant is NAME=VAR=VALUE[;VAR=VALUE...]; ``default`` (no variables) always runs first. A cell bench_decode lacks
may be named ``BxSk [MHA] pP [runs|fifo]`` or ``BxSk [MHA] non-paged`` (GQA 32/8 or MHA 32/32, d128, page P, pages
in random order unless named).
"""
from __future__ import annotations

import argparse
import os
import re

import torch

from attention.kernels import attention_fwd
from benchmarks import bench_decode
from benchmarks.cells import Cell, Inputs
from benchmarks.config import BenchConfig, bench_dtype
from benchmarks.providers import make_fused, make_sdpa_cudnn
from benchmarks.timing import time_fn


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition("=")
    env = dict(item.split("=", 1) for item in rest.split(";") if item)
    return name, env


def _plain_cell(name: str, cfg: BenchConfig) -> Cell:
    """A GQA 32/8 decode cell that bench_decode lacks, named as its cells are: ``BxSk pP`` (e.g. ``8x4k p1``)."""
    match = re.fullmatch(r"(\d+)x(\d+)k( MHA)? (?:p(\d+)|non-paged)(?: (runs|fifo))?", name)
    if not match:
        raise SystemExit(f"no decode cell {name!r}, and not of the form BxSk [MHA] pP [runs|fifo]")
    batch, context, mha, page, order = match.groups()
    return bench_decode._decode(name, "probe", int(batch), int(context) * 1024, bench_dtype(cfg),
                                heads=(32, 32) if mha else (32, 8), page=int(page) if page else None,
                                page_order=order or "random")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", required=True, help="cell names (exact), separated by |")
    parser.add_argument("--variants", nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cfg = BenchConfig(device=torch.device("cuda"))
    variants = [("default", {})] + [_variant(v) for v in args.variants]
    names = [c for c in args.cells.split("|") if c]
    cells = {c.name: c for c in bench_decode.cells(cfg)}
    for name in names:
        cell = cells.get(name) or _plain_cell(name, cfg)
        inputs = Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order)
        sdpa = make_sdpa_cudnn(cell, inputs)[0]
        times: dict[str, list[float]] = {v: [] for v, _ in [("cudnn", {})] + variants}
        notes: dict[str, str] = {}
        reference = None
        for _ in range(args.rounds):
            if sdpa is not None:
                times["cudnn"].append(time_fn(sdpa.fn, True, cfg, settled=True).us_graph)
            for variant, env in variants:
                saved = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                attention_fwd._plans.clear()
                try:
                    runner = make_fused(cell, inputs)[0]
                    out = runner.fn().float()
                    torch.cuda.synchronize()
                    plan = next(iter(attention_fwd._plans.values()), None)
                    if reference is None:
                        reference = out.clone()
                    err = (out - reference).abs().max().item()
                    notes[variant] = (f"{type(plan).__name__} splits {getattr(plan, 'num_splits', '-')} programs "
                                      f"{getattr(plan, 'programs', '-')} err {err:.1e}")
                    times[variant].append(time_fn(runner.fn, True, cfg, settled=True).us_graph)
                except Exception as error:  # noqa: BLE001 - a variant that does not compile or fit: say so
                    notes[variant] = f"failed: {type(error).__name__}: {str(error)[:120]}"
                finally:
                    for k, value in saved.items():
                        if value is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = value
        for variant, us in times.items():
            print(f"{name:<22} {variant:<12} " + " / ".join(f"{u:7.1f}" for u in us) + f" us  {notes.get(variant, '')}",
                  flush=True)
        del inputs, sdpa
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
