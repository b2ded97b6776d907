"""Host cost of the eager decode entry points, robust to a noisy host: the fastest of 25 repeats.

For comparing two checkouts on one machine, alternate processes (the host's noise drifts over
minutes, so back-to-back runs of one checkout are not comparable with later runs of the other).
Run the file by its path, so that ``PYTHONPATH`` picks the checkout (``python -m`` would put the
current directory first)::

    git archive REV attention inference benchmarks | tar x -C /tmp/old
    for i in 1 2 3; do
      PYTHONPATH=. python benchmarks/host_ab.py --label new
      PYTHONPATH=/tmp/old python benchmarks/host_ab.py --label old
    done

Prints one line per run, µs per call (wall time of 100 back-to-back calls / 100, fastest repeat):
``attention_forward`` and ``dpa_step_bshd`` (``benchmarks.profile_call``'s two calls: the kernel
launcher, batch 1, 256 keys, page 16; ``DotProductAttention(backend="fused")`` in bshd through
``InferenceParams.step``, the KV append included), ``dpa_static_thd`` (the module in thd over a
read-only paged cache) and ``pre_step_64`` (``InferenceParams.pre_step`` of 64 decoding sequences).
Needs CUDA.

Where the time goes, on the GPU's host (``benchmarks.host_proxy`` profiles the same calls on CPU)::

    python benchmarks/host_ab.py --profile dpa_static_thd   # cProfile of one call, top 30 by own time
    python benchmarks/host_ab.py --no-launch                # the calls with every kernel launch stubbed
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

CALLS = 100
REPEATS = 25


def decode_calls(device: torch.device, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """profile_call's two decode calls (every checkout since f9e03c0 has that function: the A/B needs it
    from both) and a thd call over a read-only cache, on ``device`` (benchmarks.host_proxy: on CPU)."""
    from attention import DotProductAttention
    from benchmarks.cells import Inputs, Problem
    from benchmarks.profile_call import _calls as profiled_calls
    from benchmarks.providers import StaticKVCache

    profiled = profiled_calls(device, dtype)
    inputs = Inputs(Problem(q_lens=(1,), kv_lens=(256,), heads_q=32, heads_kv=8, causal=False, dtype=dtype), device)
    static = StaticKVCache(inputs, 16)
    new_k, new_v = inputs.new_tokens()
    dpa_thd = DotProductAttention(32, 128, num_gqa_groups=8, qkv_format="thd", attn_mask_type="padding",
                                  layer_number=1, backend="fused").to(device)
    return {
        "attention_forward": profiled["attention_forward"],
        "dpa_static_thd": lambda: dpa_thd(inputs.q, new_k, new_v, inference_params=static, cu_seqlens_q=inputs.cu_q,
                                          cu_seqlens_kv=inputs.cu_kv, max_seqlen_q=1),
        "dpa_step_bshd": profiled["DotProductAttention + InferenceParams.step"],
    }


def pre_step_call(device: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    """``InferenceParams.pre_step`` of 64 decoding sequences on 16-token pages (every 16th step crosses a page
    boundary for all of them). Every ~4,000 steps the batch starts over (reset and a 100-token prefill)."""
    from inference import InferenceParams

    batch = InferenceParams(64, 4096, 8, 128, dtype, is_paged=True, page_size=16, device=device)
    prefill = OrderedDict((seq, 100) for seq in range(64))
    decode = OrderedDict((seq, 1) for seq in range(64))
    batch.pre_step(prefill)

    def step() -> None:
        if batch.longest_sequence == 4096:
            batch.reset()
            batch.pre_step(prefill)
        batch.pre_step(decode)

    return step


def _calls() -> dict[str, Callable[[], object]]:
    # the decode calls on the GPU, plus a 64-sequence pre_step.
    device, dtype = torch.device("cuda"), torch.bfloat16
    return {**decode_calls(device, dtype), "pre_step_64": pre_step_call(device, dtype)}


def measure() -> dict[str, float]:
    calls = _calls()
    best: dict[str, float] = {}
    with torch.no_grad():
        for fn in calls.values():
            for _ in range(20):
                fn()
        for _ in range(REPEATS):   # the entry points interleaved, so a noisy stretch hits them all
            for name, fn in calls.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(CALLS):
                    fn()
                per_call = (time.perf_counter() - start) / CALLS * 1e6
                best[name] = min(best.get(name, float("inf")), per_call)
        torch.cuda.synchronize()
    return best


def profile(name: str) -> None:
    """cProfile of ``CALLS`` x 10 calls of one entry point (after a warm-up), top 30 functions by own time."""
    fn = _calls()[name]
    with torch.no_grad():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [fn() for _ in range(CALLS * 10)])
        torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="")
    parser.add_argument("--profile", metavar="NAME", help="cProfile this entry point (e.g. dpa_static_thd)")
    parser.add_argument("--no-launch", action="store_true",
                        help="stub every kernel launch (KernelLaunch.__call__), the host path's CUDA tensors kept")
    args = parser.parse_args(argv)
    if args.no_launch:
        from attention.kernels import launch
        launch.KernelLaunch.__call__ = lambda self, *tensors: None
    if args.profile:
        profile(args.profile)
        return
    best = measure()
    print(args.label, " ".join(f"{name}={us:.1f}" for name, us in best.items()), flush=True)


if __name__ == "__main__":
    main()
