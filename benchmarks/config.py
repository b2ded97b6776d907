"""Run-wide benchmark settings (``BenchConfig``) and the command-line options every script shares."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.argtypes import non_negative_float, positive_float

if TYPE_CHECKING:
    from benchmarks.timing import Timing


@dataclass
class BenchConfig:
    """Run-wide settings. ``deadline`` (time.monotonic) and a lost CUDA context stop new cells."""

    device: torch.device
    smoke: bool = False
    warmup_ms: float = 5.0
    rep_ms: float = 30.0
    settle_ms: float = 250.0
    """Back-to-back calls before timing a settled cell (``Cell.settle``): benchmarks/timing.py says why."""
    throughput_rep_ms: float = 300.0
    """The timing window of a settled cell (at least ``rep_ms``): long enough to average the clock's
    swings under the power cap (benchmarks/timing.py)."""
    cpu_reps: int = 1
    graphs: bool = True
    check: bool = True
    l2_flush: str = "read"
    """How graph replays flush L2 before each replay (benchmarks/timing.py): ``read`` (cold and clean) or ``zero``."""
    providers: tuple[str, ...] | None = None
    cells: tuple[str, ...] | None = None
    deadline: float | None = None
    seed: int = 0
    verbose: bool = True
    context_lost: str | None = None
    progress_csv: str | None = None
    memo: dict[Any, tuple[Timing, str]] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def stop_reason(self, grace_s: float = 0.0) -> str | None:
        """Why new work must not start: a lost CUDA context, or the deadline (+ ``grace_s``) passed."""
        if self.context_lost:
            return f"CUDA context lost earlier ({self.context_lost}); rerun this suite alone"
        if self.deadline is not None and time.monotonic() > self.deadline + grace_s:
            return "time budget exhausted (raise --budget-s, or run this suite alone)"
        return None

    def wants_cell(self, name: str) -> bool:
        return not self.cells or any(part in name for part in self.cells)

    def wants_provider(self, name: str) -> bool:
        return not self.providers or name in self.providers


def environment_smoke_default() -> None:
    """Smoke runs without a GPU execute the fused kernels in Triton's interpreter (before any import)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def add_common_arguments(parser: Any, default_budget_s: float) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="output directory (CSV, PNG, markdown)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, a few calls: checks the scripts (CPU: fused kernels in the interpreter)")
    parser.add_argument("--providers", default=None, help="comma list of providers to run (default: all)")
    parser.add_argument("--cells", default=None, help="comma list of substrings: run only cells whose name matches")
    parser.add_argument("--budget-s", type=non_negative_float, default=default_budget_s,
                        help="wall-clock budget; cells left when it runs out are reported as skipped (0 = none)")
    parser.add_argument("--warmup-ms", type=non_negative_float, default=5.0, help="do_bench warmup per measurement")
    parser.add_argument("--rep-ms", type=positive_float, default=30.0,
                        help="do_bench / graph-replay time per measurement")
    parser.add_argument("--settle-ms", type=non_negative_float, default=250.0,
                        help="prefill and mixed cells: run the call back to back this long before timing it, "
                             "so the GPU is at the call's own clock under its power cap (0: off)")
    parser.add_argument("--throughput-rep-ms", type=positive_float, default=300.0,
                        help="time per measurement of a prefill or mixed cell (at least --rep-ms): the clock "
                             "swings under the power cap, and a short window catches one phase of it")
    parser.add_argument("--no-graphs", action="store_true", help="skip CUDA-graph replay timings")
    parser.add_argument("--l2-flush", choices=("read", "zero"), default="read",
                        help="before each graph replay, read 256 MB (L2 cold and clean; default) or zero it "
                             "(L2 left full of dirty lines, written back during the timed call)")
    parser.add_argument("--no-check", action="store_true", help="skip comparing outputs across providers")
    parser.add_argument("--quiet", action="store_true", help="no per-measurement progress lines")


def _split(text: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None


def check_providers(parser: Any, providers: str | None) -> None:
    """A ``--providers`` name that no factory has is a parser error (a typo would run nothing and exit 0)."""
    from benchmarks.providers import FACTORIES

    unknown = [name for name in _split(providers) or () if name not in FACTORIES]
    if unknown:
        parser.error(f"--providers: unknown {', '.join(unknown)} (known: {', '.join(FACTORIES)})")


def config_from_args(args: Any, budget_s: float | None = None) -> BenchConfig:
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    budget = args.budget_s if budget_s is None else budget_s
    return BenchConfig(
        device=device, smoke=args.smoke, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
        settle_ms=0.0 if args.smoke else args.settle_ms,  # smoke runs check the scripts, not the clocks
        throughput_rep_ms=args.throughput_rep_ms,
        graphs=not args.no_graphs, check=not args.no_check, l2_flush=args.l2_flush, providers=_split(args.providers),
        cells=_split(args.cells), deadline=time.monotonic() + budget if budget and budget > 0 else None,
        verbose=not args.quiet,
    )


def bench_dtype(cfg: BenchConfig) -> torch.dtype:
    """bf16 on the GPU; fp16 in the CPU interpreter (its bf16 ``tl.dot`` gives wrong numbers)."""
    return torch.bfloat16 if cfg.cuda else torch.float16
