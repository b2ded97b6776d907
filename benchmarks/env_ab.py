"""Environment A/B of the fused backend: the same cells under named environment variants, in one process.

Kernel switches, tiles and register splits are environment variables read when a call is planned, so one
process can run a cell under each variant in turn (the plan cache is emptied at every switch). Each round runs
every variant on every cell, the variant order reversed every other round: the H200's clock drifts under its
power cap, and alternating keeps a drift from favouring one variant. Each call is timed as its suite times it
(prefill and mixed cells settled and over the throughput window, latency cells as CUDA-graph replays), and each
variant's output is compared with the default's. Prints a line per measurement, then a markdown table: per cell
and variant the µs of every round, their mean, its ratio to the default's and the largest difference from the
default's output; writes the table with the run's header (date, commit, GPU, versions, the variants) to
``OUT/env_ab.md`` and every measurement to ``OUT/env_ab.csv``.

    python -m benchmarks.env_ab --cells "M2 2k chunk,64x4k p16" --rounds 3 \\
        --variant "pingpong=ATTN_FUSED_HOPPER_PINGPONG=1" --variant "free=ATTN_FUSED_HOPPER_PINGPONG=0"

A variant is ``NAME=VAR=VALUE[;VAR=VALUE...]`` (an empty VALUE unsets VAR); ``default``, the environment the
process started with, always runs and is the one the others are compared with. ``--cells`` picks cells of
bench_decode, bench_mixed (whole batches, their parts and probes) and bench_prefill by substring, as the suites do;
every picked cell's inputs stay on the GPU for the whole run (the large decode cells hold 1-4 GB of K/V each).
``--providers fused_dpa`` times ``DotProductAttention`` in place of ``attention_forward`` (its CUDA-graph captures plan
without the step's lengths). The outputs compared are those of an eager call, which plans with the lengths: a
variant that changes only what a capture runs shows in the graph timings (the latency cells'), not in the max diff.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import os
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from benchmarks.argtypes import positive_int
from benchmarks.cells import Inputs
from benchmarks.config import BenchConfig, add_common_arguments, config_from_args, environment_smoke_default
from benchmarks.suites import wanted_cells
from benchmarks.timing import time_fn

DEFAULT = "default"


@dataclass(frozen=True)
class Measurement:
    round: int
    variant: str
    cell: str
    us: float
    max_diff: float | None
    """Largest absolute difference from the default's output (None: the default's own, or not compared)."""


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=VAR=VALUE[;VAR=VALUE...]`` -> (NAME, {VAR: VALUE}); raises ValueError naming the expected form."""
    name, _, assignments = text.partition("=")
    env = {}
    for item in filter(None, assignments.split(";")):
        var, equals, value = item.partition("=")
        if not equals or not var.strip():
            env = {}
            break
        env[var.strip()] = value
    if not name.strip() or not env or name.strip() == DEFAULT:
        raise ValueError(f"--variant {text!r}: expected NAME=VAR=VALUE[;VAR=VALUE...] with NAME other than "
                         f"{DEFAULT!r}")
    return name.strip(), env


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Set (or, for an empty value, unset) these variables and empty the plan cache; restore both after."""
    from attention.kernels import attention_fwd  # here: smoke runs set TRITON_INTERPRET before the kernels load

    saved = {var: os.environ.get(var) for var in env}
    try:
        for var, value in env.items():
            if value:
                os.environ[var] = value
            else:
                os.environ.pop(var, None)
        attention_fwd._plans.clear()
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        attention_fwd._plans.clear()


PROVIDERS = ("fused", "fused_dpa")
"""What env_ab may time: ``attention_forward`` with the host's lengths (the default), or ``DotProductAttention``,
whose graph captures plan without them."""


def run(cfg: BenchConfig, variants: dict[str, dict[str, str]], rounds: int) -> list[Measurement]:
    """Every round: each variant (the default first in round 0; the order reversed every other round) on each of
    the config's cells. The default's outputs of round 0 are the reference of the others' first outputs."""
    from benchmarks.providers import FACTORIES

    provider = (cfg.providers or PROVIDERS[:1])[0]
    runners = {}
    for cell in wanted_cells(cfg):
        runner, reason = FACTORIES[provider](cell, Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order))
        if runner is None:
            raise SystemExit(f"{cell.name}: {provider} cannot run it ({reason})")
        runners[cell.name] = (cell, runner)
    order = [DEFAULT, *variants]
    reference: dict[str, torch.Tensor] = {}
    measurements = []
    for round_ in range(rounds):
        if round_ and cfg.stop_reason():   # --budget-s: whole rounds only, so every variant has the same count
            print(f"stopped after {round_} round(s): {cfg.stop_reason()}", flush=True)
            break
        for variant in order if round_ % 2 == 0 else order[::-1]:
            with environment(variants.get(variant, {})), torch.no_grad():
                for name, (cell, runner) in runners.items():
                    out = runner.to_thd(runner.fn()).float()
                    max_diff = None
                    if variant == DEFAULT:
                        reference.setdefault(name, out)
                    elif round_ == 0 and cfg.check:   # --no-check: no comparison
                        max_diff = (out - reference[name]).abs().max().item()
                    us = time_fn(runner.fn, cell.latency, cfg, settled=cell.settle).us
                    measurements.append(Measurement(round_, variant, name, us, max_diff))
                    if cfg.verbose:
                        print(f"round {round_} {variant:>12} {name:52} {us:10.1f} µs", flush=True)
    return measurements


def table(measurements: Sequence[Measurement]) -> str:
    """Markdown: a row per (cell, variant), the rounds' µs, their mean, the ratio of means to the default's."""
    lines = ["| cell | variant | µs, each round | mean µs | × default | max diff from default |",
             "|---|---|---|---|---|---|"]
    cells = list(dict.fromkeys(m.cell for m in measurements))
    variants = list(dict.fromkeys(m.variant for m in measurements))
    for cell in cells:
        means = {}
        for variant in variants:
            rows = [m for m in measurements if m.cell == cell and m.variant == variant]
            means[variant] = statistics.fmean(m.us for m in rows)
            diffs = [m.max_diff for m in rows if m.max_diff is not None]
            lines.append(f"| {cell} | {variant} | {' / '.join(f'{m.us:,.1f}' for m in rows)} | "
                         f"{means[variant]:,.1f} | {means[variant] / means[DEFAULT]:.3f} | "
                         f"{f'{max(diffs):.3g}' if diffs else '–'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Measurement]:
    environment_smoke_default()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, 0)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE[;VAR=VALUE...]",
                        help="an environment variant (repeat for more); the default always runs")
    parser.add_argument("--rounds", type=positive_int, default=2, help="rounds of every variant on every cell")
    args = parser.parse_args(argv)
    try:
        pairs = [parse_variant(text) for text in args.variant]
    except ValueError as error:
        parser.error(str(error))
    variants = dict(pairs)
    if len(variants) < len(pairs):
        parser.error("--variant: each variant needs its own NAME")
    if args.providers and args.providers not in PROVIDERS:
        parser.error(f"--providers: env_ab times one of {', '.join(PROVIDERS)}")
    cfg = config_from_args(args)
    measurements = run(cfg, variants, max(1, args.rounds))
    print(table(measurements))
    print("wrote " + ", ".join(write(measurements, variants, cfg, args.out)))
    return measurements


def write(measurements: Sequence[Measurement], variants: dict[str, dict[str, str]], cfg: BenchConfig,
          out_dir: str) -> list[str]:
    """``env_ab.md`` (the run's header, the variants, the table) and ``env_ab.csv`` (every measurement)."""
    from benchmarks import report

    os.makedirs(out_dir, exist_ok=True)
    md, csv_path = os.path.join(out_dir, "env_ab.md"), os.path.join(out_dir, "env_ab.csv")
    header = report.environment_header(cfg.device, cfg.l2_flush)
    lines = ["# Environment A/B", "", report.header_table(header), "",
             f"Variants against `{DEFAULT}` (the environment as started):", ""]
    lines += [f"- `{name}`: " + "; ".join(f"`{var}={value}`" for var, value in env.items())
              for name, env in variants.items()]
    with open(md, "w") as handle:
        handle.write("\n".join([*lines, "", table(measurements), ""]))
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[field.name for field in dataclasses.fields(Measurement)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(m) for m in measurements)
    return [md, csv_path]


if __name__ == "__main__":
    main(sys.argv[1:])
