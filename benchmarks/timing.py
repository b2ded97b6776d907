"""Timing one provider call, and telling whether a failure left the CUDA context usable.

* eager: ``triton.testing.do_bench`` (median, p20/p80), which zeroes a 256 MB buffer before every
  call, so L2 is cold;
* CUDA graph (latency cells): one call captured in a graph, replayed with the same L2 flush before
  each replay and CUDA events around the replay only (``do_bench_cudagraph`` keeps L2 warm, which
  flatters cells whose KV fits the H200's 50 MB L2).

On CPU (smoke runs) a wall-clock median; no graphs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.config import BenchConfig

FLUSH_BYTES = 256 * 1024 * 1024


@dataclass
class Timing:
    us_eager: float | None = None
    p20: float | None = None
    p80: float | None = None
    us_graph: float | None = None
    note: str = ""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_FLUSH: dict[torch.device, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    if device not in _FLUSH:
        _FLUSH[device] = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
    return _FLUSH[device]


def _graph_replay_us(fn: Callable[[], Any], device: torch.device, rep_ms: float) -> float:
    """Median µs of one CUDA-graph replay of ``fn`` with L2 flushed before each replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    try:
        flush = _flush_buffer(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        torch.cuda.synchronize(device)
        estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
        count = int(min(max(rep_ms / (estimate_ms + 0.1), 10), 500))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            flush.zero_()
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize(device)
        return 1000.0 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    finally:
        del graph


def time_fn(fn: Callable[[], Any], cuda_graph: bool, cfg: BenchConfig) -> Timing:
    """Time ``fn``: eager median (p20, p80) with cold L2, plus CUDA-graph replay when asked.

    On CPU (smoke runs) a wall-clock median of ``cfg.cpu_reps`` calls; no graphs.
    """
    if not cfg.cuda:
        times = []
        for _ in range(max(1, cfg.cpu_reps)):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return Timing(us_eager=statistics.median(times), p20=min(times), p80=max(times))
    import triton.testing

    median, p20, p80 = triton.testing.do_bench(
        fn, warmup=cfg.warmup_ms, rep=cfg.rep_ms, quantiles=[0.5, 0.2, 0.8], return_mode="median")
    timing = Timing(us_eager=median * 1000, p20=p20 * 1000, p80=p80 * 1000)
    if cuda_graph and cfg.graphs:
        try:
            timing.us_graph = _graph_replay_us(fn, cfg.device, cfg.rep_ms)
        except Exception as error:  # noqa: BLE001 - a provider that cannot be captured still has eager numbers
            timing.note = f"graph capture failed: {short_error(error)}"
            recover(cfg, error)
    return timing


# ------------------------------------------------------------------------------------------------
# Failures: a short message for the row, and whether the CUDA context survived.

_FATAL = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
          "an illegal instruction", "CUDA error: unknown error", "uncorrectable ECC")


def short_error(error: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def recover(cfg: BenchConfig, error: BaseException) -> None:
    """After an exception: is the CUDA context still usable? If not, stop the remaining cells."""
    if not cfg.cuda:
        return
    message = str(error)
    try:
        torch.cuda.synchronize(cfg.device)
    except Exception as sync_error:  # noqa: BLE001
        cfg.context_lost = short_error(sync_error, 160)
        return
    if any(marker in message for marker in _FATAL):
        cfg.context_lost = short_error(error, 160)
