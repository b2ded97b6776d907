"""CPU proxy for the host cost of one eager decode call: the calls of ``benchmarks.host_ab`` without a GPU.

Builds ``benchmarks.profile_call``'s decode (batch 1, context 256, GQA 32/8, d=128, page 16) on CPU
tensors (float16) and times N back-to-back calls (µs per call, fastest of R repeats, the calls
interleaved) of:

* ``attention_forward``: the kernel launcher, direct;
* ``dpa_static_thd``: ``DotProductAttention(backend="fused")`` in thd over a read-only paged cache;
* ``dpa_step_bshd``: the same module in bshd through ``InferenceParams.step`` (the KV append);
* ``pre_step_64``: ``InferenceParams.pre_step`` of 64 decoding sequences (host_ab's).

Stubs, so no kernel runs and nothing needs CUDA: ``KernelLaunch.__call__`` is a no-op (the attention,
combine and append launches), the fused backend's availability check passes without a GPU (it
asks for CUDA or ``TRITON_INTERPRET=1``; the interpreter would change the configuration), and the
cache append takes the Triton path as on a GPU (on CPU tensors it would take the torch one).
Configuration is chosen as on the H200 (no interpreter, 132 SMs), so the split counts are the
H200's: the thd call over 256 keys runs one launch, the bshd step over 257 keys two splits and a combine.
With ``--sm90`` the calls plan as on the H200 itself: the Gluon kernels' plans (the decode kernel here), the
descriptors they make at a launch's first call at an address not counted (inside the stubbed launch).

    python -m benchmarks.host_proxy [--calls 200] [--repeats 25] [--profile [NAME]] [--sm90]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable, Sequence

import torch

from attention.backends import fused
from attention.kernels import attention_fwd, hopper_forward, launch
from benchmarks.argtypes import positive_int
from inference import kv_append


def _stub(sm90: bool = False) -> None:
    launch.KernelLaunch.__call__ = lambda self, *tensors: None
    fused._triton_reason = lambda: None
    attention_fwd.num_streaming_multiprocessors = lambda device: 132
    kv_append._use_triton = lambda cache, implementation: implementation != "torch"
    if sm90:
        hopper_forward._on_sm90 = lambda q: True


def calls() -> dict[str, Callable[[], object]]:
    """host_ab's calls, built on CPU in float16 (pre_step's uploads are plain copies here)."""
    from benchmarks.host_ab import decode_calls, pre_step_call

    device = torch.device("cpu")
    return {**decode_calls(device, torch.float16), "pre_step_64": pre_step_call(device, torch.float16)}


def measure(fns: dict[str, Callable[[], object]], n: int, repeats: int) -> dict[str, float]:
    """Fastest repeat's µs per call of each function, the functions interleaved within each repeat."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / n * 1e6)
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=positive_int, default=200)
    parser.add_argument("--repeats", type=positive_int, default=25)
    parser.add_argument("--profile", nargs="?", const="dpa_static_thd", help="cProfile this call (top 30)")
    parser.add_argument("--sm90", action="store_true", help="plan as on an sm90 GPU (the Gluon kernels' plans)")
    args = parser.parse_args(argv)
    _stub(args.sm90)
    with torch.no_grad():
        fns = calls()
        for fn in fns.values():
            for _ in range(20):
                fn()
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [fns[args.profile]() for _ in range(args.calls * 10)])
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            return
        best = measure(fns, args.calls, args.repeats)
    print(" ".join(f"{name}={us:.1f}" for name, us in best.items()), flush=True)


if __name__ == "__main__":
    main()
