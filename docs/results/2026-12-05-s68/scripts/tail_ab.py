"""Does the Gluon prefill kernel zeroing a thd output's tail rows itself (ZERO_TAIL) beat the memset of the whole
output it ran after before? One process, graph replays (L2 flushed, settled), alternating rounds:

    memset   out.zero_() + the kernel without ZERO_TAIL (the path before this session)
    kernel   the kernel with ZERO_TAIL: its grid's last sequence zeros rows cu_seqlens_q[-1] .. T - 1

thd, bf16, GQA 32/8 (d64: the three-consumer-group kernel, whose ZERO_TAIL build spills 96 B against 8 B on
Triton 3.9's ptxas), causal bottom-right, non-paged K/V; ``pad`` rows past the last sequence (random q).

    python tail_ab.py [--rounds 3] [--smoke]
"""
from __future__ import annotations

import argparse

import torch

from attention.kernels.attention_fwd import packed_attention_forward
from benchmarks.config import BenchConfig
from benchmarks.timing import time_fn

CELLS = (  # (label, head dim, sequence lengths, pad rows)
    ("d128 1x2k (M1's prefill)", 128, (2048,), 64),
    ("d128 4x4k", 128, (4096,) * 4, 64),
    ("d64 1x2k", 64, (2048,), 64),
    ("d64 4x4k", 64, (4096,) * 4, 64),
    ("d256 1x2k", 256, (2048,), 64),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    cfg = BenchConfig(device=torch.device("cuda"))
    torch.manual_seed(0)
    print(f"{'cell':<26} {'memset':>9} {'kernel':>9}  kernel/memset  (µs, graph replays, each round)", flush=True)
    for label, head_dim, lens, pad in CELLS[:1] if args.smoke else CELLS:
        tokens = sum(lens)
        q = torch.randn(tokens + pad, 32, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(tokens, 8, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
        outs = {name: torch.full((tokens + pad, 32 * head_dim), float("nan"), device="cuda", dtype=torch.bfloat16)
                for name in ("memset", "kernel")}

        def call(name: str) -> None:
            out = outs[name]
            if name == "memset":
                out.zero_()
            packed_attention_forward(q, k, v, out, len(lens), cu, cu, cu, cu, None, max(lens), max(lens),
                                     tokens + pad, head_dim ** -0.5, True, -1, 0, True, None, None, None,
                                     name == "kernel")

        for name in outs:
            call(name)
        torch.cuda.synchronize()
        assert bool((outs["kernel"][tokens:] == 0).all()), "tail rows not zero"
        assert torch.equal(outs["kernel"], outs["memset"]), "outputs differ"
        for round_ in range(args.rounds):
            times = {name: time_fn(lambda name=name: call(name), True, cfg, settled=True).us for name in outs}
            print(f"{label:<26} {times['memset']:>9.1f} {times['kernel']:>9.1f}  "
                  f"{times['kernel'] / times['memset']:.3f}  (round {round_ + 1})", flush=True)


if __name__ == "__main__":
    main()
