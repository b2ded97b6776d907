"""Repeat one kernel call many times and count wrong results: a hunt for intermittent races.

Runs tests/test_kernels.py's ragged thd prefill case (7 sequences of 1 to 8192 tokens, GQA 32/8, d128,
bf16; non-causal unless ``--causal``) ``--repeats`` times per ``ATTN_FUSED_VARIANTS`` setting given
(``default`` = the tables), in one process, refilling the output with a sentinel before each call. A run
is wrong if any row holds NaN or differs from the fp32 reference by more than 0.025. This is how the
warp-specialized kernel's one NaN in the GPU suite (commit 87c85d6) was chased::

    python -m benchmarks.repeat_check --repeats 300 \\
        default "prefill/contiguous=tma+int32_offsets+heavy_tiles_first+warp_specialize"

Needs CUDA. Several copies of it in parallel load the GPU the way the sharded GPU suite does.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch

TOLERANCE = 0.025
LENGTHS = (1, 17, 513, 2048, 8192, 3001, 64)


def check(variants: str, repeats: int, causal: bool) -> str:
    from attention.kernels import attention_forward
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
    wrong, nan_rows, worst = 0, 0, 0.0
    start = time.perf_counter()
    for _ in range(repeats):
        inputs["out_base"].fill_(SENTINEL)
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
        got = torch.cat([inputs["out"][b, starts[b]: starts[b] + n] for b, n in enumerate(LENGTHS)]).float()
        rows = int(got.isnan().any(-1).sum())
        error = float((got - expected).abs().nan_to_num(float("inf")).max())
        wrong += bool(rows or error > TOLERANCE)
        nan_rows += rows
        worst = max(worst, error)
    return (f"{variants}: {wrong}/{repeats} runs wrong, {nan_rows} NaN (token, head) rows, worst error {worst:.3g} "
            f"({time.perf_counter() - start:.1f} s)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help="ATTN_FUSED_VARIANTS values, or 'default'")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args(argv)
    for variants in args.variants:
        print(check(variants, args.repeats, args.causal), flush=True)


if __name__ == "__main__":
    main()
