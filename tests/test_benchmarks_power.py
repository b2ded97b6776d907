"""benchmarks/power.py without a GPU: nvidia-smi's lines parsed, samples summarized per window, the runs measured
with a stand-in sampler."""

from __future__ import annotations

import datetime

import pytest

from benchmarks import power
from benchmarks.power import SW_POWER_CAP, Sample, measure, parse_samples, summarize


def test_nvidia_smi_lines_parse_and_unreadable_ones_drop() -> None:
    samples = parse_samples([
        "2026/12/04 15:30:33.277, 1515, 691.20, 0x0000000000000004",
        "2026/12/04 15:30:33.333, [N/A], 80.90, 0x0000000000000001",  # a field nvidia-smi could not read
        "Failed to initialize NVML",
        "2026/12/04 15:30:33.390, 1980, 485.00, 0x0000000000000000",
    ])
    assert [(s.sm_mhz, s.power_w, s.reasons) for s in samples] == [(1515.0, 691.2, SW_POWER_CAP), (1980.0, 485.0, 0)]
    assert samples[0].at == datetime.datetime(2026, 12, 4, 15, 30, 33, 277000)


def test_summary_gives_median_percentiles_power_and_the_capped_share() -> None:
    at = datetime.datetime(2026, 12, 4)
    samples = [Sample(at, mhz, 690.0, SW_POWER_CAP if mhz < 1900 else 0) for mhz in range(1500, 2000, 50)]
    summary = summarize(samples)
    assert summary["samples"] == 10 and summary["sm_mhz"] == 1725.0
    assert (summary["sm_mhz_p10"], summary["sm_mhz_p90"]) == (1550.0, 1950.0)
    assert summary["power_w"] == 690.0 and summary["capped"] == 0.8
    with pytest.raises(ValueError, match="no samples"):
        summarize([])


class _Sampler:
    """Samples every millisecond from its start to its stop, at 1,500 MHz while the 'slow' call ran last, else 1,900."""

    def __init__(self) -> None:
        self.start = datetime.datetime.now()
        self.running = []

    def record(self, name: str) -> None:
        if not self.running or self.running[-1][1] != name:
            self.running.append((datetime.datetime.now(), name))

    def stop(self) -> list[Sample]:
        end, samples, at = datetime.datetime.now(), [], self.start
        while at <= end:
            last = [name for when, name in self.running if when <= at]
            slow = bool(last) and last[-1] == "slow"
            samples.append(Sample(at, 1500.0 if slow else 1900.0, 690.0, SW_POWER_CAP if slow else 0))
            at += datetime.timedelta(milliseconds=1)
        return samples


def test_each_run_is_summarized_over_its_own_window() -> None:
    sampler = _Sampler()
    runs = [("M2 2k chunk", "fused", lambda: sampler.record("slow")),
            ("M2 part: 64 decodes", "fused", lambda: sampler.record("fast"))]
    drained = []
    rows = measure(runs, sampler, seconds=0.05, warmup_s=0.01, synchronize=lambda: drained.append(1))
    assert [(row["cell"], row["provider"]) for row in rows] == [(cell, provider) for cell, provider, _ in runs]
    assert rows[0]["sm_mhz"] == 1500.0 and rows[0]["capped"] == 1.0
    assert rows[1]["sm_mhz"] == 1900.0 and rows[1]["capped"] == 0.0
    assert all(row["calls"] >= 16 and row["samples"] >= 40 for row in rows) and len(drained) == 4


def test_the_sampler_stops_when_a_run_fails() -> None:
    sampler = _Sampler()
    stopped = []
    sampler.stop = lambda: stopped.append(1) or []

    def broken() -> None:
        raise RuntimeError("CUDA error")

    with pytest.raises(RuntimeError):
        measure([("cell", "fused", broken)], sampler, seconds=0.01, warmup_s=0.0, synchronize=lambda: None)
    assert stopped == [1]


def test_without_a_gpu_it_says_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        power.main(["--cells", "M2 2k chunk"])
