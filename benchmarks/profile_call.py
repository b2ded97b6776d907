"""Where the host time of one eager decode call goes: cProfile over back-to-back calls.

Profiles (batch 1, context 256, GQA 32/8, d=128, page 16) ``attention_forward`` alone, and
``DotProductAttention`` + ``InferenceParams.step`` (the KV append included), each for ``--calls``
calls after a warm-up, and writes the functions with the most own time and the most cumulative time.
The bench_overhead suite says how much; this says where (Triton's launcher, our argument checks, ...).

    python -m benchmarks.profile_call --out profile.txt [--calls 500]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from benchmarks.argtypes import positive_int
from benchmarks.cells import Inputs, Problem
from benchmarks.config import environment_smoke_default

TOP = 40


def _calls(device: torch.device, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    from attention import DotProductAttention
    from attention.kernels import attention_forward
    from inference import InferenceParams

    problem = Problem(q_lens=(1,), kv_lens=(256,), heads_q=32, heads_kv=8, causal=True, dtype=dtype)
    inputs = Inputs(problem, device)
    k, v, page_table = inputs.paged(16)
    out = torch.empty(1, 1, 32, 128, dtype=dtype, device=device)
    q4 = inputs.q.unsqueeze(0)

    def kernel_only() -> object:
        return attention_forward(q4, k, v, out, cu_seqlens_q=inputs.cu_q, cu_seqlens_kv=inputs.cu_kv,
                                 page_table=page_table, max_seqlen_q=1, max_seqlen_kv=256, total_q=1,
                                 softmax_scale=inputs.scale, causal=True, bottom_right=True)

    params = InferenceParams(1, 1 << 16, 8, 128, dtype, is_paged=True, page_size=16, device=device)
    params.allocate_memory(1)
    params.pre_step(OrderedDict({0: 256}))
    params.pre_step(OrderedDict({0: 1}))
    module = DotProductAttention(32, 128, num_gqa_groups=8, qkv_format="bshd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="fused")
    q = torch.randn(1, 1, 32, 128, dtype=dtype, device=device)
    new_k, new_v = (torch.randn(1, 1, 8, 128, dtype=dtype, device=device) for _ in range(2))

    def module_step() -> object:
        return module(q, new_k, new_v, inference_params=params)

    return {"attention_forward": kernel_only, "DotProductAttention + InferenceParams.step": module_step}


def profile(fn: Callable[[], object], calls: int) -> str:
    for _ in range(3):
        fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    text.write(f"{calls} calls\n")
    stats.sort_stats("tottime").print_stats(TOP)
    stats.sort_stats("cumulative").print_stats(TOP)
    return text.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="profile.txt")
    parser.add_argument("--calls", type=positive_int, default=500)
    args = parser.parse_args(argv)
    environment_smoke_default()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float16
    sections = []
    for name, fn in _calls(device, dtype).items():
        sections.append(f"## {name} ({device.type})\n\n" + profile(fn, args.calls if cuda else 1))
        if cuda:
            torch.cuda.synchronize()
    with open(args.out, "w") as handle:
        handle.write("\n\n".join(sections))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
