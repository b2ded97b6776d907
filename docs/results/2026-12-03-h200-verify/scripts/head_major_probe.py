"""Does the decode kernel read a head-major KV cache faster? (thirty-seventh session, a probe; no kernel change)

cuDNN, the competitor that the missed decode cells lose to, reads SDPA's contiguous [b, h, s, d] K/V: a head's keys
are one run of memory. Our caches are token-major ([pages, page_size, h_kv, d], bshd): a head's key is 256 bytes
every h_kv x 256. The fused decode kernel can read a head-major cache without a change: a sequence x KV head is
then a sequence of its own with one KV head, its G query heads packed as before (batch' = b x h_kv, heads_kv' = 1);
over pages, page p of head h is pool page p x h_kv + h of a [pages x h_kv, page_size, 1, d] pool ("HND" pages, 4 KB
a head at page 16). The kernel's items are the same (sequence, KV head) walks in the same order; only the
addresses differ.

Rows per cell (graph replays, settled, µs, two interleaved rounds): cudnn; nhd / hnd (paged, the cell's page
order), nhd-dense / hnd-dense (non-paged). Each head-major output is checked against its token-major twin.
Every row is built here (``_call``), not through benchmarks.providers.make_fused: causal=True, which with one query
a sequence masks nothing but runs the kernel's causal specialization, where bench_decode's decode cells run the
non-causal one (64x4k p16: 240.3 µs here, 240.2 in bench_decode's run a).

    python head_major_probe.py --cells "64x4k p16|64x4k MHA 32/32 p16"      # on the H200
    TRITON_INTERPRET=1 python head_major_probe.py --check                    # CPU: the reshapes give equal outputs
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from attention.kernels import attention_forward
from benchmarks import bench_decode
from benchmarks.cells import Inputs, Problem
from benchmarks.config import BenchConfig
from benchmarks.providers import make_sdpa_cudnn
from benchmarks.timing import time_fn


def _call(q, k, v, kv_lens, page_table, max_kv, scale):
    """attention_forward over a decode batch (one query token a sequence): q [n, H_q, d]; k / v dense [n, S, H_kv, d]
    or a pool with page_table [n, pages]. Returns a function that runs it and returns out [n, H_q, d]."""
    n = q.shape[0]
    cu_q = torch.arange(n + 1, dtype=torch.int32, device=q.device)
    cu_kv = torch.zeros(n + 1, dtype=torch.int32, device=q.device)
    cu_kv[1:] = torch.cumsum(kv_lens, 0)
    total_kv = int(cu_kv[-1])
    q4 = q.unsqueeze(0).expand(n, -1, -1, -1)

    def run() -> torch.Tensor:
        out = torch.empty_like(q)
        attention_forward(q4, k, v, out.unsqueeze(0).expand(n, -1, -1, -1), cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                          q_start=cu_q[:-1], page_table=page_table, max_seqlen_q=1, max_seqlen_kv=max_kv, total_q=n,
                          total_kv=total_kv, softmax_scale=scale, causal=True, bottom_right=True)
        return out

    return run


def variants(inputs: Inputs, page_size: int | None) -> dict[str, Callable[[], torch.Tensor]]:
    """nhd / hnd over pages (when page_size), nhd-dense / hnd-dense: functions returning out [b, H_q, d]."""
    p = inputs.problem
    b, h_kv, group, d = p.batch, p.heads_kv, p.heads_q // p.heads_kv, p.head_dim
    kv_lens = inputs.kv_lens
    scale = inputs.scale
    q_hnd = inputs.q.view(b, h_kv, group, d).reshape(b * h_kv, group, d)
    lens_hnd = kv_lens.repeat_interleave(h_kv)
    heads = torch.arange(h_kv, device=inputs.device, dtype=torch.int32)
    runs = {}
    if page_size:
        k, v, table = inputs.paged(page_size)
        pool = k.shape[0]
        k_hnd = k.permute(0, 2, 1, 3).contiguous().view(pool * h_kv, page_size, 1, d)
        v_hnd = v.permute(0, 2, 1, 3).contiguous().view(pool * h_kv, page_size, 1, d)
        table_hnd = (table[:, None, :] * h_kv + heads[None, :, None]).reshape(b * h_kv, -1).contiguous()
        runs["nhd"] = _call(inputs.q, k, v, kv_lens, table, p.max_kv, scale)
        hnd = _call(q_hnd, k_hnd, v_hnd, lens_hnd, table_hnd, p.max_kv, scale)
        runs["hnd"] = lambda: hnd().view(b, p.heads_q, d)
    k_dense, v_dense = inputs.k_dense, inputs.v_dense
    s_pad = k_dense.shape[1]
    k_dhnd = k_dense.permute(0, 2, 1, 3).contiguous().view(b * h_kv, s_pad, 1, d)
    v_dhnd = v_dense.permute(0, 2, 1, 3).contiguous().view(b * h_kv, s_pad, 1, d)
    runs["nhd-dense"] = _call(inputs.q, k_dense, v_dense, kv_lens, None, p.max_kv, scale)
    dense_hnd = _call(q_hnd, k_dhnd, v_dhnd, lens_hnd, None, p.max_kv, scale)
    runs["hnd-dense"] = lambda: dense_hnd().view(b, p.heads_q, d)
    return runs


def check() -> None:
    """CPU (TRITON_INTERPRET=1): every head-major variant equals its token-major twin on small decode batches."""
    for heads_q, heads_kv in ((4, 2), (2, 2), (4, 1)):
        problem = Problem(q_lens=(1, 1, 1), kv_lens=(40, 17, 64), heads_q=heads_q, heads_kv=heads_kv, causal=True,
                          dtype=torch.float32, head_dim=16, head_dim_v=16)
        runs = {name: fn() for name, fn in variants(Inputs(problem, torch.device("cpu")), 16).items()}
        for twin in ("hnd", "hnd-dense"):
            err = (runs[twin] - runs[twin.replace("hnd", "nhd")]).abs().max().item()
            print(f"{heads_q}/{heads_kv} {twin}: max err {err:.1e}")
            assert err < 1e-5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", default="", help="bench_decode cell names (exact), separated by |")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        return check()
    cfg = BenchConfig(device=torch.device("cuda"))
    cells = {c.name: c for c in bench_decode.cells(cfg)}
    for name in [c for c in args.cells.split("|") if c]:
        cell = cells[name]
        inputs = Inputs(cell.problem, cfg.device, page_order=cell.page_order)
        page_size = cell.page_size if cell.kv_source == "paged" else None
        runs = {"cudnn": make_sdpa_cudnn(cell, inputs)[0].fn, **variants(inputs, page_size)}
        outs = {k: fn().float() for k, fn in runs.items() if k != "cudnn"}
        torch.cuda.synchronize()
        errs = {k: (outs[k] - outs[k.replace("hnd", "nhd")]).abs().max().item() for k in outs if "hnd" in k}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            for key, fn in runs.items():
                times[key].append(time_fn(fn, True, cfg, settled=True).us_graph)
        for key, us in times.items():
            err = f"  err vs nhd {errs[key]:.1e}" if key in errs else ""
            print(f"{name:<24} {key:<10} " + " / ".join(f"{u:7.1f}" for u in us) + f" us{err}", flush=True)
        del inputs, runs, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
