"""Repeat one kernel call many times and count wrong results: a hunt for intermittent races.

Runs tests/test_kernels.py's ragged thd prefill case (7 sequences of 1 to 8192 tokens, GQA 32/8, d128,
bf16; non-causal unless ``--causal``) ``--repeats`` times per ``ATTN_FUSED_VARIANTS`` setting given
(``default`` = the tables), in one process, refilling the output with a sentinel before each call. Each
line names the plan that ran (HopperPlan: the Gluon sm90 kernel; ForwardPlan: the general kernel, also
under ``ATTN_FUSED_HOPPER=0``). A run is wrong if any row holds NaN or differs from the fp32 reference by
more than 0.025::

    python -m benchmarks.repeat_check --repeats 300 [--causal] [--pollute] default

``--pollute`` runs the general kernel over NaN inputs of the same shapes before every checked call, so
every SM's shared memory holds NaN when the checked kernel starts (the GPU suite's paged tests fill
unowned cache slots with NaN): a kernel that reads a shared-memory tile before its copy has landed then
returns NaN instead of an older, finite tile's values.

``--processes N`` runs N copies at once (each its own CUDA context, as the sharded GPU suite does), so
the GPU time-slices between them, which raises the odds of a race inside a kernel (the removed Triton
warp-specialized kernel returned NaN rows in 92-100 % of such runs on the H200, 2026-11-30)::

    python -m benchmarks.repeat_check --processes 3 --repeats 3000 default

Needs CUDA; each process peaks at ~45 GB of GPU memory (the fp32 reference of the 8192-token sequence).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import torch

from benchmarks.argtypes import positive_int

TOLERANCE = 0.025
LENGTHS = (1, 17, 513, 2048, 8192, 3001, 64)


def check(variants: str, repeats: int, causal: bool, pollute: bool = False) -> str:
    from attention.kernels import attention_forward
    from attention.kernels.configs import select_forward_config
    from tests.test_kernels import SENTINEL, AttentionCase, build_inputs

    if variants == "default":
        os.environ.pop("ATTN_FUSED_VARIANTS", None)
    else:
        os.environ["ATTN_FUSED_VARIANTS"] = variants
    case = AttentionCase(LENGTHS, LENGTHS, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="thd",
                         causal=causal, num_splits=None)
    inputs = build_inputs(case, "cuda")
    starts = inputs["q_start"].tolist()
    expected = torch.cat(inputs["expected"]).float()
    if pollute:  # the general kernel over NaN copies of the inputs (same shapes and strides)
        nan_inputs = [_nan_like(inputs[name]) for name in ("q", "k", "v", "out")]
        general = select_forward_config(head_dim_qk=128, head_dim_v=128, group_size=4, max_seqlen_q=max(LENGTHS),
                                        interpret=False, max_seqlen_kv=max(LENGTHS))
    from attention.kernels import attention_fwd

    attention_fwd._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    kernel = ", ".join(sorted({type(plan).__name__ for plan in attention_fwd._plans.values()}))
    wrong, nan_rows, worst = 0, 0, 0.0
    start = time.perf_counter()
    for _ in range(repeats):
        if pollute:
            attention_forward(*nan_inputs, **inputs["call"], config=general)
        inputs["out_base"].fill_(SENTINEL)
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
        got = torch.cat([inputs["out"][b, starts[b]: starts[b] + n] for b, n in enumerate(LENGTHS)]).float()
        rows = int(got.isnan().any(-1).sum())
        error = float((got - expected).abs().nan_to_num(float("inf")).max())
        wrong += bool(rows or error > TOLERANCE)
        nan_rows += rows
        worst = max(worst, error)
    label = f"{variants} [{kernel}]" + (" (shared memory polluted)" if pollute else "")
    return (f"{label}: {wrong}/{repeats} runs wrong, {nan_rows} NaN (token, head) rows, worst error {worst:.3g} "
            f"({time.perf_counter() - start:.1f} s)")


def _nan_like(x: torch.Tensor) -> torch.Tensor:
    """NaN with x's shape and strides (a thd tensor expanded over the batch stays expanded)."""
    if x.stride(0) == 0:
        return torch.full_like(x[:1], float("nan")).expand_as(x)
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).fill_(float("nan"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help="ATTN_FUSED_VARIANTS values, or 'default'")
    parser.add_argument("--repeats", type=positive_int, default=300)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--pollute", action="store_true", help="NaN in shared memory before every checked call")
    parser.add_argument("--processes", type=positive_int, default=1,
                        help="run this many copies at once (GPU time-slicing)")
    args = parser.parse_args(argv)
    if args.processes > 1:
        one = [sys.executable, "-m", "benchmarks.repeat_check", *args.variants, "--repeats", str(args.repeats),
               *["--causal"] * args.causal, *["--pollute"] * args.pollute]
        copies = [subprocess.Popen(one) for _ in range(args.processes)]
        raise SystemExit(max(copy.wait() for copy in copies))
    for variants in args.variants:
        print(check(variants, args.repeats, args.causal, args.pollute), flush=True)


if __name__ == "__main__":
    main()
