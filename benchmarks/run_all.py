"""Run the benchmark suites and write one combined report.

    python -m benchmarks.run_all --out DIR [--smoke] [--only decode,mixed,prefill,overhead] [--isolate]

Writes ``DIR/results.md`` (header, method, per-suite summary + all rows, errors: ready to paste into
docs/benchmarks.md), ``DIR/results.csv`` (every row of every suite) and ``DIR/<suite>.png`` for
decode, mixed and prefill: at most 5 files. Both result files are rewritten after each suite, so
a run cut short keeps what it measured.

``--budget-s`` (default 500) is shared among the suites by weight; time a suite leaves unused goes
to the next ones, and cells that find their suite's time spent are reported as skipped.
By default every suite runs in this process (kernels compile once). ``--isolate`` runs each suite
in a child process instead (Triton's disk cache still spares most recompiles): a CUDA error that
poisons the context, or a crash, then costs only the rest of that suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks import config
from benchmarks.harness import Row
from benchmarks.timing import short_error

SUITES = ("decode", "mixed", "prefill", "overhead")
WEIGHTS = {"decode": 0.30, "mixed": 0.18, "prefill": 0.42, "overhead": 0.10}
DEFAULT_BUDGET_S = 500.0
CHILD_GRACE_S = 90.0
"""A child suite may overrun its share by a compile or a long cell; past this it is killed."""


def _module(suite: str):
    import importlib

    return importlib.import_module(f"benchmarks.bench_{suite}")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    config.add_common_arguments(parser, DEFAULT_BUDGET_S)
    parser.add_argument("--only", default=",".join(SUITES), help=f"comma list of suites among {', '.join(SUITES)}")
    parser.add_argument("--isolate", action="store_true", help="run each suite in its own process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.suites = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"--only: unknown suite(s) {unknown}; choose among {list(SUITES)}")
    config.check_providers(parser, args.providers)
    return args


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The options a child suite process inherits."""
    out = ["--warmup-ms", str(args.warmup_ms), "--rep-ms", str(args.rep_ms), "--settle-ms", str(args.settle_ms),
           "--throughput-rep-ms", str(args.throughput_rep_ms), "--l2-flush", args.l2_flush]
    for flag in ("smoke", "no_graphs", "no_check", "quiet"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    for option in ("providers", "cells"):
        if getattr(args, option):
            out += ["--" + option, getattr(args, option)]
    return out


def _run_child(suite: str, args: argparse.Namespace, budget_s: float) -> list[Row]:
    work = tempfile.mkdtemp(prefix=f"bench-{suite}-")
    command = [sys.executable, "-m", "benchmarks.run_all", "--child", "--only", suite, "--out", work,
               "--budget-s", f"{max(budget_s, 1.0) if budget_s > 0 else 0:.0f}", *_forwarded(args)]
    timeout = budget_s + CHILD_GRACE_S if budget_s > 0 else None
    # flash-attn-4's on-disk kernel cache lets later suites reuse the earlier ones' compiles
    env = dict(os.environ)
    env.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    note = ""
    try:
        completed = subprocess.run(command, timeout=timeout, check=False, env=env)
        if completed.returncode != 0:
            note = f"suite process exited with status {completed.returncode}"
    except subprocess.TimeoutExpired:
        note = f"suite process killed after {timeout:.0f} s"
    final, progress = os.path.join(work, "results.csv"), os.path.join(work, "progress.csv")
    from benchmarks import report

    rows = report.read_csv(final) if os.path.exists(final) else (
        report.read_csv(progress) if os.path.exists(progress) else [])
    shutil.rmtree(work, ignore_errors=True)
    if note:
        rows.append(Row(suite, "-", "(suite process)", "-", status="error",
                        note=note + ("; rows above are what it finished" if rows else "")))
    return rows


def _write(out_dir: str, header: dict[str, str], results: dict[str, list[Row]]) -> None:
    from benchmarks import report

    all_rows = [row for rows in results.values() for row in rows]
    report.write_csv(all_rows, os.path.join(out_dir, "results.csv"))
    with open(os.path.join(out_dir, "results.md"), "w") as handle:
        handle.write(report.markdown_report(header, results))


def main(argv: Sequence[str] | None = None) -> dict[str, list[Row]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.smoke:
        config.environment_smoke_default()
    os.makedirs(args.out, exist_ok=True)
    if args.child:  # one suite, rows only: the parent renders
        cfg = config.config_from_args(args)
        cfg.progress_csv = os.path.join(args.out, "progress.csv")
        rows = _module(args.suites[0]).run(cfg)
        from benchmarks import report

        report.write_csv(rows, os.path.join(args.out, "results.csv"))
        return {args.suites[0]: rows}

    import torch

    from benchmarks import report

    start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    header = report.environment_header(device, args.l2_flush)
    header["command"] = "`python -m benchmarks.run_all " + " ".join(argv) + "`"
    results: dict[str, list[Row]] = {}
    timings: dict[str, str] = {}
    for index, suite in enumerate(args.suites):
        share = 0.0
        if args.budget_s and args.budget_s > 0:
            left = max(args.budget_s - (time.monotonic() - start), 1.0)
            share = left * WEIGHTS[suite] / sum(WEIGHTS[s] for s in args.suites[index:])
        print(f"=== {suite} (budget {share:.0f} s)" if share else f"=== {suite}", flush=True)
        suite_start = time.monotonic()
        if args.isolate:
            rows = _run_child(suite, args, share)
        else:
            cfg = config.config_from_args(args, budget_s=share)
            try:
                rows = _module(suite).run(cfg)
            except Exception as error:  # noqa: BLE001 - one broken suite must not lose the others
                rows = [Row(suite, "-", "(suite)", "-", status="error", note=short_error(error))]
        results[suite] = rows
        timings[suite] = f"{time.monotonic() - suite_start:.0f} s"
        report.print_suite(suite, rows)
        if suite != "overhead":
            reason = report.plot_suite(suite, rows, os.path.join(args.out, f"{suite}.png"),
                                       f"{suite} - {header.get('gpu', '')} - {header['date']}")
            if reason:
                print(f"  no {suite}.png: {reason}")
        header["wall time"] = ", ".join(f"{k} {v}" for k, v in timings.items()) + \
            f"; total {time.monotonic() - start:.0f} s"
        _write(args.out, header, results)
    print(f"wrote {args.out}/results.md, results.csv and the plots in {time.monotonic() - start:.0f} s", flush=True)
    return results


if __name__ == "__main__":
    main()
