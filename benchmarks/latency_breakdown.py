"""Where the time of a latency-bound split-KV decode goes: the attention grid, the combine, the floor.

For each decode cell named (default: the small-batch cells, whose graphs run tens of µs) it times,
as CUDA-graph replays with L2 flushed before each (``benchmarks.timing``), side by side:
  floor           an empty one-program Triton kernel (what the timing method itself costs);
  fused           the kernel as the tables configure it (attention grid + combine launch);
  attention only  the same attention grid with the combine launch left out (output not final);
  combine only    the combine launch alone, on the partials the attention grid wrote;
  dependent / fused combine   the two alternatives to a plain second launch (ForwardConfig fields);
  sdpa_cudnn      torch SDPA with cuDNN on contiguous K/V (the best competitor on these cells).

    python -m benchmarks.latency_breakdown --out breakdown.md [--cells "1x8k,8x4k"]
    python -m benchmarks.latency_breakdown --smoke --out /tmp/breakdown.md   # CPU: the smoke cells, interpreter
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from benchmarks import bench_decode
from benchmarks.cells import Cell, Inputs
from benchmarks.config import BenchConfig, environment_smoke_default
from benchmarks.timing import short_error, time_fn

DEFAULT_CELLS = ("1x8k p16", "1x32k p16", "8x4k p16", "32x2k p16", "32x4k verify")


@functools.cache
def _empty_jit() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def empty(x_ptr):
        tl.store(x_ptr, 0)

    return empty


def _empty_kernel(device: torch.device) -> Callable[[], None]:
    x = torch.zeros(1, device=device)
    return lambda: _empty_jit()[(1,)](x)


def _variants(cell: Cell, inputs: Inputs) -> list[tuple[str, Callable[[], Any]]]:
    from attention.kernels import attention_fwd
    from benchmarks.providers import FACTORIES, _fused
    from benchmarks.sweep import _base_config

    config = _base_config(cell, tuned=True)
    fused = _fused(cell, inputs, cell.kv_source)[0].fn
    saved: list[tuple] = []
    combine = attention_fwd._combine

    def keep_partials(*args: Any) -> None:
        saved[:] = [args]

    def attention_only() -> Any:
        attention_fwd._combine = keep_partials
        try:
            return fused()
        finally:
            attention_fwd._combine = combine

    attention_only()
    rows: list[tuple[str, Callable[[], Any]]] = [("floor (empty kernel)", _empty_kernel(inputs.device)),
                                                 ("fused", fused), ("attention only", attention_only)]
    if saved:
        rows.append(("combine only", lambda: combine(*saved[0])))
    for name, field in (("dependent combine", "dependent_combine"), ("fused combine", "fused_combine")):
        rows.append((name, _fused(cell, inputs, cell.kv_source, config=replace(config, **{field: True}))[0].fn))
    runner, _reason = FACTORIES["sdpa_cudnn"](cell, inputs)
    if runner is not None:
        rows.append(("sdpa_cudnn", runner.fn))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cells", default=None, help="comma list of name fragments (default: the small-batch cells)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny cells on the CPU (Triton's interpreter): a plumbing check")
    args = parser.parse_args(argv)
    if args.smoke:
        environment_smoke_default()
    cfg = BenchConfig(device=torch.device("cpu" if args.smoke else "cuda"), smoke=args.smoke)
    wanted = args.cells.split(",") if args.cells else ([""] if args.smoke else list(DEFAULT_CELLS))
    lines = ["| cell | what | µs (graph, L2 flushed) |", "|---|---|---|"]
    for cell in bench_decode.cells(cfg):
        if not any(part in cell.name for part in wanted):
            continue
        inputs = Inputs(cell.problem, cfg.device)
        for name, fn in _variants(cell, inputs):
            try:
                timing = time_fn(fn, True, cfg)
                lines.append(f"| {cell.name} | {name} | {timing.us_graph or timing.us_eager:.1f} |")
            except Exception as error:  # noqa: BLE001 - report and go on
                lines.append(f"| {cell.name} | {name} | error: {short_error(error, 120)} |")
            print(lines[-1], flush=True)
    with open(args.out, "w") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
