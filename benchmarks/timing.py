"""Timing one provider call, and telling whether a failure left the CUDA context usable.

* eager: ``triton.testing.do_bench`` (median, p20/p80), which zeroes a 256 MB buffer before every
  call, so L2 is cold;
* CUDA graph (latency cells): one call captured in a graph, replayed with an L2 flush before each
  replay and CUDA events around the replay only (``do_bench_cudagraph`` keeps L2 warm, which
  flatters cells whose KV fits the H200's 50 MB L2). The flush (``cfg.l2_flush``) reads 256 MB, which
  leaves L2 cold and clean, as a decode step finds it after the previous layer's weight reads. Zeroing
  the buffer instead (``zero``, do_bench's flush and this suite's until 2026-12-01) leaves L2 full of
  dirty lines that the timed call writes back as it reads: on the H200 that added 4-5 µs to a 1x8k
  decode and 9 µs to 1x32k and 64x4k, for every provider alike (docs/benchmarks_log.md, twenty-third
  session);
* two rounds: a cell's graph replays are timed once per provider, then once more in the same order (a new
  capture each), and each row keeps its faster round (``harness.run_cell``). On the H200 the ``fused`` row's
  first graph read 0.5-1.5 µs above the same kernel through the other entry points (1x8k decode 19.7 against
  18.5 µs for ``fused_dpa``), and a new capture of the same call in a later round did not (19.0, then 18.5 and
  18.5; 8x4k 41.9, then 40.4). Replaying the first graph a quarter of its count before timing it did not help
  (docs/benchmarks_log.md, twenty-fourth session);
* settling (``cfg.settle_ms``; the settled cells, ``Cell.settle``: prefill and mixed): the call runs back
  to back for that long before it is timed. Compute-bound kernels hold the H200 at its 700 W cap, where
  the SM clock falls from 1980 to about 1550-1790 MHz (nvidia-smi: reason "SW power cap"), so a short
  window measures whatever clock the previous work left: on 2026-12-01 the fused prefill ran at 581-694
  TFLOP/s in a 35 ms window on an idle H200 and at 515-610 after 200 ms of its own calls (four d128
  cells). Settled, every provider is timed at its own steady clock under the cap, whichever provider ran
  before it;
* the window (``cfg.throughput_rep_ms``, default 300 ms; the settled cells, eager and graph replay
  alike): under the cap the clock keeps swinging (nvidia-smi: 1395-1980 MHz samples within one prefill
  run), and do_bench's default 30 ms window catches one phase of it. On 2026-12-01 the same fused kernel timed
  through two entry points (``fused`` and ``auto``) in one run differed by up to 11 % per cell with 30 ms
  windows, and by at most 2.4 % with 300 ms windows (four d128 cells, two runs each; docs/benchmarks_log.md,
  fourteenth session).
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

    @property
    def us(self) -> float | None:
        """The call's time: the graph replay's when measured, else the eager median."""
        return self.us_graph if self.us_graph is not None else self.us_eager


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_FLUSH: dict[torch.device, torch.Tensor] = {}
_SINK: dict[torch.device, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    if device not in _FLUSH:
        _FLUSH[device] = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
    return _FLUSH[device]


def flush_l2(device: torch.device, how: str = "read") -> None:
    """Evict L2: read the 256 MB buffer (``read``: clean lines left) or zero it (``zero``: dirty lines left)."""
    buffer = _flush_buffer(device)
    if how == "zero":
        buffer.zero_()
    else:
        if device not in _SINK:
            _SINK[device] = torch.empty((), dtype=torch.int64, device=device)
        torch.sum(buffer.view(torch.int64), 0, out=_SINK[device])


def _graph_replay_us(fn: Callable[[], Any], device: torch.device, rep_ms: float, l2_flush: str = "read") -> float:
    """Median µs of one CUDA-graph replay of ``fn`` with L2 flushed (``flush_l2``) before each replay."""
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
            flush_l2(device, l2_flush)
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize(device)
        return 1000.0 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    finally:
        del graph


def _window_ms(cfg: BenchConfig, settled: bool) -> float:
    """The timing window of a call: a settled cell's is the longer (see the module's note)."""
    return max(cfg.rep_ms, cfg.throughput_rep_ms) if settled else cfg.rep_ms


def graph_replay_us(fn: Callable[[], Any], cfg: BenchConfig, settled: bool = False) -> float:
    """A CUDA-graph replay timing of ``fn`` over this call's window (``time_fn``'s, and a cell's second round)."""
    return _graph_replay_us(fn, cfg.device, _window_ms(cfg, settled), cfg.l2_flush)


def settle(fn: Callable[[], Any], settle_ms: float, wait: Callable[[], None]) -> int:
    """Run ``fn`` back to back for at least ``settle_ms`` of wall time (``wait`` drains the queue after
    each batch of calls, a batch sized to about a tenth of the time); returns the number of calls."""
    calls, batch = 0, 1
    start = time.perf_counter()
    while (elapsed_ms := (time.perf_counter() - start) * 1e3) < settle_ms:
        if calls:
            per_call_ms = max(elapsed_ms / calls, 1e-3)
            batch = max(1, min(int(settle_ms / 10 / per_call_ms), 1000))
        for _ in range(batch):
            fn()
        wait()
        calls += batch
    return calls


def time_fn(fn: Callable[[], Any], cuda_graph: bool, cfg: BenchConfig, settled: bool = False) -> Timing:
    """Time ``fn``: eager median (p20, p80) with cold L2, plus CUDA-graph replay when asked. A
    ``settled`` call (a settled cell's, ``Cell.settle``) first runs back to back for ``cfg.settle_ms`` (the GPU
    at this call's steady clock) and is then timed over ``cfg.throughput_rep_ms`` (see the module's note).

    On CPU (smoke runs) a wall-clock median of ``cfg.cpu_reps`` calls; no graphs, no settling.
    """
    if not cfg.cuda:
        times = []
        for _ in range(max(1, cfg.cpu_reps)):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return Timing(us_eager=statistics.median(times), p20=min(times), p80=max(times))
    import triton.testing

    rep_ms = _window_ms(cfg, settled)
    if settled and cfg.settle_ms > 0:
        settle(fn, cfg.settle_ms, lambda: synchronize(cfg.device))
    median, p20, p80 = triton.testing.do_bench(
        fn, warmup=cfg.warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8], return_mode="median")
    timing = Timing(us_eager=median * 1000, p20=p20 * 1000, p80=p80 * 1000)
    if cuda_graph and cfg.graphs:
        try:
            timing.us_graph = graph_replay_us(fn, cfg, settled)
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
