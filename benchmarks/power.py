"""SM clock and board power while a cell's calls run back to back: what the power cap takes from a launch.

The H200 runs a long prefill at its 700 W cap, and a mixed launch's decodes (DRAM traffic) take their power out of the
SM clock (docs/benchmarks_log.md, fifty-second session: M2's one launch at 1,515 MHz, its prefill alone at 1,665). Each
cell named by ``--cells`` (substrings, any suite's) is built once per provider (``--providers``, default ``fused``),
called back to back for ``--warmup-s``, then for ``--seconds`` while ``nvidia-smi`` samples the SM clock, the power
draw and the clock-limit reasons every ``--interval-ms``. Prints and writes (``power.md``, ``power.csv``) per cell and
provider: the samples, the median SM clock (p10-p90), the median power and how many samples the software power cap
held. Needs ``nvidia-smi``; runs eager calls (a call shorter than the host's launch time leaves gaps: decode cells
read low). The figures above came from the same sampling in shell (the session's results, scripts/power.sh). This
module's first device run lost its last window to nvidia-smi's block-buffered pipe; the line-buffered reader that
replaced it ran on the H200 on 2026-12-04 (docs/results/2026-12-04-h200-10b3ebc/out/call1, call3): 42-78 samples a
window, M2's launch at 1,575 MHz and its prefill alone at 1,702, both at the cap.

    python -m benchmarks.power --cells "M2 2k chunk,M2 probe,M2 part" --out /tmp/power
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.argtypes import non_negative_float, positive_float, positive_int

SW_POWER_CAP = 0x4
"""nvidia-smi's clocks_event_reasons bit for the software power cap (the board's power limit)."""

QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"


@dataclass(frozen=True)
class Sample:
    """One nvidia-smi reading, stamped with this process's time.monotonic() when it arrived."""

    at: float
    sm_mhz: float
    power_w: float
    reasons: int


def parse_sample(line: str, at: float) -> Sample | None:
    """An nvidia-smi ``--query-gpu={QUERY} --format=csv,noheader,nounits`` line -> a Sample (None: unreadable).

    Example:
        >>> parse_sample("1515, 691.20, 0x0000000000000004", at=12.5)
        Sample(at=12.5, sm_mhz=1515.0, power_w=691.2, reasons=4)
    """
    fields = [field.strip() for field in line.split(",")]
    if len(fields) != 3:
        return None
    try:
        return Sample(at, float(fields[0]), float(fields[1]), int(fields[2], 16))
    except ValueError:
        return None


def summarize(samples: Sequence[Sample]) -> dict[str, float]:
    """Median SM clock with its 10th / 90th percentiles, median power, and the share of samples power-capped.

    Example:
        >>> summarize([Sample(0.0, 1500.0, 690.0, SW_POWER_CAP), Sample(0.05, 1700.0, 600.0, 0)])["capped"]
        0.5
    """
    if not samples:
        raise ValueError("no samples: the cell ran shorter than the sampling interval, or nvidia-smi printed nothing")
    clocks = sorted(sample.sm_mhz for sample in samples)
    count = len(clocks)
    return {
        "samples": count, "sm_mhz": statistics.median(clocks), "sm_mhz_p10": clocks[count // 10],
        "sm_mhz_p90": clocks[(9 * count) // 10], "power_w": statistics.median(sample.power_w for sample in samples),
        "capped": sum(bool(sample.reasons & SW_POWER_CAP) for sample in samples) / count,
    }


class Sampler:
    """nvidia-smi sampling GPU ``index`` every ``interval_ms`` in the background, line-buffered (stdbuf) and read by a
    thread that stamps each line on arrival: no clock or time zone of nvidia-smi's to match."""

    def __init__(self, index: int, interval_ms: int) -> None:
        if shutil.which("nvidia-smi") is None:
            raise SystemExit("benchmarks.power needs nvidia-smi on PATH (it samples the clock and power)")
        gpu = nvidia_smi_id(index, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        self.process = subprocess.Popen(
            [*line_buffered, "nvidia-smi", "-i", gpu, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
             "-lms", str(interval_ms)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.samples: list[Sample] = []
        self.unread: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            sample = parse_sample(line, time.monotonic())
            if sample is None:
                self.unread.append(line.strip())
            else:
                self.samples.append(sample)

    def stop(self) -> list[Sample]:
        """Ends the sampling; every sample taken. Raises, with nvidia-smi's words, if it gave none."""
        self.process.terminate()
        self.process.wait(timeout=10)
        self.reader.join(timeout=10)  # (the thread alone reads stdout)
        if not self.samples:
            errors = self.process.stderr.read().strip()
            raise RuntimeError(f"nvidia-smi gave no samples: {' '.join(self.unread[:3] + [errors])[:500]}")
        return self.samples


def nvidia_smi_id(index: int, visible_devices: str = "") -> str:
    """nvidia-smi's ``-i`` for CUDA device ``index`` under CUDA_VISIBLE_DEVICES ``visible_devices``: its entry where
    set (an index or a UUID, which nvidia-smi takes either), else the index.

    Example:
        >>> nvidia_smi_id(1, "3,5"), nvidia_smi_id(1)
        ('5', '1')
    """
    visible = [entry.strip() for entry in visible_devices.split(",") if entry.strip()]
    return visible[index] if index < len(visible) else str(index)


def _run_for(fn: Callable[[], None], seconds: float, synchronize: Callable[[], None]) -> int:
    """Calls fn back to back for ``seconds`` (the GPU drained at the end); returns the calls made. Not
    timing.settle: it drains the GPU after every batch, and each drain idles it, which a power reading would see."""
    calls, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(16):  # a host clock read every 16 calls
            fn()
        calls += 16
    synchronize()
    return calls


def measure(runs: Iterable[tuple[str, str, Callable[[], None]]], sampler: Sampler, seconds: float, warmup_s: float,
            synchronize: Callable[[], None], tail_s: float = 0.0) -> list[dict]:
    """Each (cell, provider, call) of ``runs`` called back to back for ``warmup_s``, then for ``seconds`` in a window
    of ``sampler``'s samples (stopped ``tail_s`` after the last run, also on an error); a row per run: summarize's
    figures with the cell, provider and calls (a window without samples: ``samples`` 0 and no figures)."""
    windows = []
    try:
        for cell, provider, fn in runs:
            _run_for(fn, warmup_s, synchronize)
            start = time.monotonic()
            calls = _run_for(fn, seconds, synchronize)
            windows.append((cell, provider, calls, start, time.monotonic()))
        time.sleep(tail_s)  # the last window's samples arrive
    finally:
        samples = sampler.stop()
    rows = []
    for cell, provider, calls, start, end in windows:
        inside = [sample for sample in samples if start <= sample.at <= end]
        rows.append({"cell": cell, "provider": provider, "calls": calls,
                     **(summarize(inside) if inside else {"samples": 0})})
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Returns measure's rows (also written to ``--out``)."""
    import torch

    from benchmarks.config import add_common_arguments, config_from_args
    from benchmarks.run_cell import cell_runners
    from benchmarks.timing import synchronize

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, 0)
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="sampled time of each cell's calls")
    parser.add_argument("--warmup-s", type=non_negative_float, default=0.5, help="calls before the sampled window")
    parser.add_argument("--interval-ms", type=positive_int, default=50, help="nvidia-smi's sampling period")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.power measures a GPU's clock and power: no CUDA device here")
    cfg = config_from_args(args)

    runners = cell_runners(cfg, parser)

    def runs():
        for cell_name, name, runner, reason in runners:
            if runner is None:
                print(f"{cell_name} | {name} | cannot run it: {reason}", flush=True)
            else:
                yield cell_name, name, runner.fn

    rows = measure(runs(), Sampler(torch.cuda.current_device(), args.interval_ms), args.seconds, args.warmup_s,
                   lambda: synchronize(cfg.device), tail_s=3 * args.interval_ms / 1000)
    _write(rows, Path(args.out))
    return rows


FIELDS = ("cell", "provider", "calls", "samples", "sm_mhz", "sm_mhz_p10", "sm_mhz_p90", "power_w", "capped")


def _write(rows: list[dict], out: Path) -> None:
    lines = ["| cell | provider | calls | samples | SM MHz median (p10-p90) | power W | power-capped |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        figures = (f"{row['sm_mhz']:,.0f} ({row['sm_mhz_p10']:,.0f}-{row['sm_mhz_p90']:,.0f}) | {row['power_w']:.0f} | "
                   f"{row['capped']:.0%}") if row["samples"] else "no samples | – | –"
        lines.append(f"| {row['cell']} | {row['provider']} | {row['calls']} | {row['samples']} | {figures} |")
    table = "\n".join(lines)
    print(table, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "power.md").write_text(table + "\n")
    with open(out / "power.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, restval="")
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
