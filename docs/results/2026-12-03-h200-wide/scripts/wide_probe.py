"""Where the wide mixed kernel's decodes go (H200): M2 whole, M2's prefill alone in the launch (decodes without
queries), M2's decodes beside a 64-token chunk (the decode warps nearly alone) and M1 whole, for main's mixed kernel
and wide_variants.py's kernel: PROBE 0 (as attention_mixed_wide_hopper.py), 1 (decode warps only load: wait, reissue),
2 (decode warps only compute, on their first tiles), 3 (S^T as four independent partial sums), 4 (decode warps only load, every tile from the item's first tile's rows: L2 hits, no page ids), and two decode warps of three 16-key stages. Graph replays,
settled, µs, variants alternated, two rounds; the outputs of PROBE 0 against main's (max abs difference).

    git apply docs/results/2026-12-03-h200-wide/scripts/wide-kernel.diff   # (on ee8f791)
    VARIANTS=main,wide CELLS="M2 whole" ROUNDS=3 PYTHONPATH=. python3 docs/results/2026-12-03-h200-wide/scripts/wide_probe.py
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import wide_variants

from attention.kernels import attention_fwd as launcher
from attention.kernels import hopper_mixed
from benchmarks import providers
from benchmarks.bench_mixed import _mixed
from benchmarks.cells import Inputs
from benchmarks.config import add_common_arguments, config_from_args
from benchmarks.timing import graph_replay_us

ONLY = os.environ.get("VARIANTS")  # comma list: run only these
CELLS = os.environ.get("CELLS")  # comma list of cell names: time only these
VARIANTS = {  # name -> (wide env, PROBE, DECODERS_N)
    "main": (None, 0, 3),
    "wide": ("1", 0, 3),
    "loads-only": ("1", 1, 3),
    "math-only": ("1", 2, 3),
    "partials": ("1", 3, 3),
    "loads-same": ("1", 4, 3),
    "2x3-stages": ("128,2,16,3,208,88,168", 0, 2),
}
_launch = hopper_mixed.MixedHopperPlan._kernel_launch
_probe = {"PROBE": 0, "DECODERS_N": 3}


def _patched(self, zero_tail, table_stride):
    launch = _launch(self, zero_tail, table_stride)
    if self.wide:
        launch.fn = wide_variants.attention_mixed_wide_hopper_kernel
        launch.constexprs.update(_probe)
    return launch


hopper_mixed.MixedHopperPlan._kernel_launch = _patched


def main() -> None:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, 0)
    cfg = config_from_args(parser.parse_args())
    dtype = torch.bfloat16
    m1 = _mixed("M1", (2048, 2048), 128, 2048, dtype)
    m2 = _mixed("M2", (2048, 16384), 64, 4096, dtype)
    m2d = _mixed("M2d", (64, 16384), 64, 4096, dtype)
    cells = {"M2 whole": m2.whole, "M2 prefill in launch": m2.prefill_in_launch, "M2 decodes + 64-token chunk":
             m2d.whole, "M1 whole": m1.whole}
    if CELLS:
        cells = {name: cell for name, cell in cells.items() if name in CELLS.split(",")}
    variants = {name: v for name, v in VARIANTS.items() if not ONLY or name in ONLY.split(",")}
    runners = {}
    for name, cell in cells.items():
        inputs = Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order)
        runner, reason = providers.make_fused(cell, inputs)
        assert runner is not None, reason
        runners[name] = runner
    outputs = {}
    for round_ in range(int(os.environ.get("ROUNDS", "2"))):
        for variant, (env, probe, decoders) in variants.items():
            if env is None:
                os.environ.pop("ATTN_FUSED_HOPPER_MIXED_WIDE", None)
            else:
                os.environ["ATTN_FUSED_HOPPER_MIXED_WIDE"] = env
            _probe.update(PROBE=probe, DECODERS_N=decoders)
            launcher._plans.clear()
            for name, runner in runners.items():
                with torch.no_grad():
                    out = runner.fn()
                    torch.cuda.synchronize()
                    if round_ == 0 and variant in ("main", "wide", "2x3-stages"):
                        outputs[variant, name] = out.float()
                    us = graph_replay_us(runner.fn, cfg, settled=True)
                print(f"round {round_} {variant:11} {name:30} {us:9.1f}", flush=True)
    for variant in ("wide", "2x3-stages"):
        for name in runners:
            if (variant, name) not in outputs or ("main", name) not in outputs:
                continue
            diff = (outputs[variant, name] - outputs["main", name]).abs().max().item()
            print(f"max |{variant} - main| {name:30} {diff:.4g}")


if __name__ == "__main__":
    main()
