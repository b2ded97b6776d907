"""Checkout A/B of the fused backend: the same cells timed in several source trees, in alternating processes.

A kernel change is code, not an environment variable, so env_ab (variants inside one process) cannot set it against
main: each tree (a checkout, or an export with a diff applied) runs in its own process. This runs
``python -m benchmarks.env_ab`` (the default environment only) in each ``--tree NAME=PATH`` in turn, ``--passes``
times, the order reversed every other pass (the H200's clock drifts under its power cap), then prints a table: per
cell and tree the µs of every round of every pass, their mean and its ratio to the first tree's. It writes
``OUT/tree_ab.md`` (the run's header: date, commit of this checkout, GPU, versions; each tree with the source files
in which it differs from the first; the table) and ``OUT/tree_ab.csv`` (every measurement); each process's own
env_ab output is in ``OUT/NAME-PASS/``. Outputs are not compared across trees: run a tree's GPU tests before merging
it.

    python -m benchmarks.tree_ab --tree main=. --tree k-ahead=abtree2 --cells "M2 part: prefill,M2 2k chunk" \\
        --rounds 3 --passes 2 --out ab/

Arguments after ``--`` go to every env_ab process (``-- --smoke``: tiny shapes, the CPU interpreter).
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.argtypes import positive_float, positive_int


@dataclass(frozen=True)
class TreeMeasurement:
    tree: str
    pass_: int
    round: int
    cell: str
    us: float


def parse_tree(text: str) -> tuple[str, str]:
    """``NAME=PATH`` -> (NAME, PATH); raises ValueError naming the expected form."""
    name, equals, path = text.partition("=")
    if not (equals and name and path) or "/" in name:
        raise ValueError(f"--tree {text!r}: expected NAME=PATH (a name without '/', the tree's root directory)")
    if not os.path.isdir(os.path.join(path, "benchmarks")):
        raise ValueError(f"--tree {text!r}: {path} holds no benchmarks/ (not a tree of this project)")
    return name, path


SOURCE_FOLDERS = ("attention", "inference", "benchmarks", "tests", "scripts")
"""Where trees differ in code (docs/ and results are left out: an export for an A/B usually drops them)."""


def differing_files(reference: str, path: str) -> list[str]:
    """Files under SOURCE_FOLDERS that differ between trees ``reference`` and ``path`` or exist in one only, as paths
    relative to the trees' roots, sorted (``__pycache__`` folders skipped)."""
    def files(root: str) -> set[str]:
        found = set()
        for folder in SOURCE_FOLDERS:
            for directory, subfolders, names in os.walk(os.path.join(root, folder)):
                subfolders[:] = [d for d in subfolders if d != "__pycache__"]
                found.update(os.path.relpath(os.path.join(directory, n), root) for n in names)
        return found

    ours, theirs = files(reference), files(path)
    return sorted((ours ^ theirs) | {f for f in ours & theirs if not filecmp.cmp(os.path.join(reference, f),
                                                                              os.path.join(path, f), shallow=False)})


def describe_trees(trees: dict[str, str]) -> list[str]:
    """Markdown lines: each tree's path and the files in which it differs from the first."""
    first, first_path = next(iter(trees.items()))
    lines = []
    for name, path in trees.items():
        line = f"- `{name}`: `{os.path.abspath(path)}`"
        if name != first:
            changed = differing_files(first_path, path)
            line += (f"; differs from `{first}` in " + ", ".join(f"`{f}`" for f in changed)) if changed \
                else f"; the same source files as `{first}`"
        lines.append(line)
    return lines


def header() -> str:
    """The run's header (benchmarks.report's: date, this checkout's commit, GPU, versions) as a markdown table."""
    import torch

    from benchmarks import report

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    info = report.environment_header(device)
    del info["L2 flush"]  # each tree's env_ab output has its own
    return report.header_table(info)


def run_tree(name: str, path: str, pass_: int, args: argparse.Namespace, extra: Sequence[str]) -> list[TreeMeasurement]:
    """One env_ab process in tree ``path``; its default's measurements (none if it failed, with its log's tail)."""
    out = os.path.abspath(os.path.join(args.out, f"{name}-{pass_}"))
    os.makedirs(out, exist_ok=True)
    root = os.path.abspath(path)
    command = [sys.executable, "-m", "benchmarks.env_ab", "--cells", args.cells, "--rounds", str(args.rounds),
               "--quiet", "--out", out, *extra]
    env = {**os.environ, "PYTHONPATH": root}
    start = time.monotonic()
    with open(os.path.join(out, "env_ab.log"), "w") as log:
        try:
            code = subprocess.run(command, check=False, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    print(f"{name} pass {pass_}: exit {code} in {time.monotonic() - start:.0f} s", flush=True)
    table = os.path.join(out, "env_ab.csv")
    if code != 0 or not os.path.exists(table):
        with open(os.path.join(out, "env_ab.log")) as log:
            print("".join(log.readlines()[-5:]), end="", flush=True)
        return []
    with open(table, newline="") as handle:
        return [TreeMeasurement(name, pass_, int(row["round"]), row["cell"], float(row["us"]))
                for row in csv.DictReader(handle) if row["variant"] == "default"]


def table(measurements: Sequence[TreeMeasurement], trees: Sequence[str]) -> str:
    """Markdown: a row per (cell, tree), every pass's rounds, their mean, the ratio of means to the first tree's."""
    lines = ["| cell | tree | µs, each pass's rounds | mean µs | × " + trees[0] + " |", "|---|---|---|---|---|"]
    for cell in dict.fromkeys(m.cell for m in measurements):
        first = [m.us for m in measurements if m.cell == cell and m.tree == trees[0]]
        for tree in trees:
            rows = [m for m in measurements if m.cell == cell and m.tree == tree]
            if not rows:
                lines.append(f"| {cell} | {tree} | – | – | – |")
                continue
            mean = statistics.fmean(m.us for m in rows)
            passes = "; ".join(" / ".join(f"{m.us:,.1f}" for m in rows if m.pass_ == p)
                               for p in dict.fromkeys(m.pass_ for m in rows))
            ratio = f"{mean / statistics.fmean(first):.3f}" if first else "–"
            lines.append(f"| {cell} | {tree} | {passes} | {mean:,.1f} | {ratio} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[TreeMeasurement]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="a source tree to time (repeat: two or more; the first is the reference)")
    parser.add_argument("--cells", required=True, help="comma list of substrings of the suites' cell names")
    parser.add_argument("--rounds", type=positive_int, default=3, help="env_ab rounds in each process")
    parser.add_argument("--passes", type=positive_int, default=2,
                        help="processes per tree, the order reversed every other")
    parser.add_argument("--timeout", type=positive_float, default=600, help="seconds one process may take")
    parser.add_argument("--out", default="tree_ab", help="output directory")
    args = parser.parse_args(argv)
    try:
        pairs = [parse_tree(text) for text in args.tree]
    except ValueError as error:
        parser.error(str(error))
    trees = dict(pairs)
    if len(trees) < len(pairs):
        parser.error("--tree: each tree needs its own NAME")
    if len(trees) < 2:
        parser.error("--tree: name two trees or more (NAME=PATH each)")
    names = list(trees)
    measurements: list[TreeMeasurement] = []
    for pass_ in range(max(1, args.passes)):
        for name in names if pass_ % 2 == 0 else names[::-1]:
            measurements += run_tree(name, trees[name], pass_, args, extra)
    text = table(measurements, names)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tree_ab.md"), "w") as handle:
        handle.write("\n".join(["# Tree A/B", "", header(), "", *describe_trees(trees), "", text, ""]))
    with open(os.path.join(args.out, "tree_ab.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["tree", "pass", "round", "cell", "us"])
        writer.writerows((m.tree, m.pass_, m.round, m.cell, m.us) for m in measurements)
    return measurements


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)   # no measurement at all: every process failed (their logs say why)
