"""Run suite cells' calls a few times and nothing else: a target for Nsight Compute or Nsight Systems.

Each cell named by ``--cells`` (substrings, any suite's: benchmarks/suites.py) is built once and each provider of
``--providers`` (default ``fused``) called ``--calls`` times, untimed, then the GPU drained. Profile one call of one
kernel, ours beside flash-attn-4's on the same cell (its kernel names hold ``flash``), e.g. (``--clock-control none``
leaves the clocks as the lent H200 runs them; ``--import-source yes`` and then ``ncu --import R.ncu-rep --page source
--csv --print-source sass`` give each SASS instruction's count and stall samples):

    ncu --clock-control none --kernel-name regex:attention_fwd_hopper --launch-skip 2 --launch-count 1 --set full \\
        -o R python3 -m benchmarks.run_cell --cells "M2 part: prefill" --providers fused --calls 3

(Nsight Systems makes no report on the lent machines: the workplace's device notes.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from benchmarks.argtypes import positive_int
from benchmarks.cells import Inputs
from benchmarks.config import (
    BenchConfig,
    add_common_arguments,
    check_providers,
    config_from_args,
    environment_smoke_default,
)
from benchmarks.suites import wanted_cells
from benchmarks.timing import synchronize


def cell_runners(cfg: BenchConfig, parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, Any, str]]:
    """(cell name, provider, runner or None, why not) for every cell ``--cells`` names and every provider of
    ``--providers`` (default ``fused``), each cell's inputs built once. An unknown provider is a parser error,
    raised here, before any cell is built."""
    from benchmarks.providers import FACTORIES

    providers = cfg.providers or ("fused",)
    check_providers(parser, ",".join(providers))

    def runners() -> Iterator[tuple[str, str, Any, str]]:
        for cell in wanted_cells(cfg):
            inputs = Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order)
            for name in providers:
                runner, reason = FACTORIES[name](cell, inputs)
                yield cell.name, name, runner, reason

    return runners()


def main(argv: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    """Returns (cell, provider, what happened) per pair: ``ran N calls`` or why the provider cannot run it."""
    environment_smoke_default()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, 0)
    parser.add_argument("--calls", type=positive_int, default=3, help="calls of each provider on each cell")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    done = []
    for cell_name, name, runner, reason in cell_runners(cfg, parser):
        if runner is None:
            done.append((cell_name, name, f"cannot run it: {reason}"))
        else:
            calls = max(1, args.calls)
            for _ in range(calls):
                runner.fn()
            synchronize(cfg.device)
            done.append((cell_name, name, f"ran {calls} call{'s' if calls > 1 else ''}"))
        print(" | ".join(done[-1]), flush=True)
    return done


if __name__ == "__main__":
    main(sys.argv[1:])
