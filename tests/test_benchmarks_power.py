"""benchmarks/power.py without a GPU: nvidia-smi's lines parsed, samples summarized per window, the runs measured
with a stand-in sampler, and the sampler itself on a stand-in nvidia-smi."""

from __future__ import annotations

import os
import stat
import time

import pytest

from benchmarks import power
from benchmarks.power import SW_POWER_CAP, Sample, Sampler, measure, parse_sample, summarize


def test_nvidia_smi_lines_parse_and_unreadable_ones_do_not() -> None:
    assert parse_sample("1515, 691.20, 0x0000000000000004", 2.0) == Sample(2.0, 1515.0, 691.2, SW_POWER_CAP)
    assert parse_sample("1980, 485.00, 0x0000000000000000", 2.0).reasons == 0
    assert parse_sample("[N/A], 80.90, 0x0000000000000001", 2.0) is None  # a field nvidia-smi could not read
    assert parse_sample("Failed to initialize NVML: Driver/library version mismatch", 2.0) is None


def test_summary_gives_median_percentiles_power_and_the_capped_share() -> None:
    samples = [Sample(0.0, mhz, 690.0, SW_POWER_CAP if mhz < 1900 else 0) for mhz in range(1500, 2000, 50)]
    summary = summarize(samples)
    assert summary["samples"] == 10 and summary["sm_mhz"] == 1725.0
    assert (summary["sm_mhz_p10"], summary["sm_mhz_p90"]) == (1550.0, 1950.0)
    assert summary["power_w"] == 690.0 and summary["capped"] == 0.8
    with pytest.raises(ValueError, match="no samples"):
        summarize([])


class _Sampler:
    """Samples every millisecond from its start to its stop, at 1,500 MHz while the 'slow' call ran last, else 1,900."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.running = []

    def record(self, name: str) -> None:
        if not self.running or self.running[-1][1] != name:
            self.running.append((time.monotonic(), name))

    def stop(self) -> list[Sample]:
        end, samples, at = time.monotonic(), [], self.start
        while at <= end:
            last = [name for when, name in self.running if when <= at]
            slow = bool(last) and last[-1] == "slow"
            samples.append(Sample(at, 1500.0 if slow else 1900.0, 690.0, SW_POWER_CAP if slow else 0))
            at += 0.001
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


def _fake_nvidia_smi(tmp_path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_the_sampler_stamps_lines_as_they_arrive(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(tmp_path, monkeypatch, "while true; do echo '1515, 691.20, 0x4'; sleep 0.01; done\n")
    before = time.monotonic()
    sampler = Sampler(0, 10)
    time.sleep(0.3)
    samples = sampler.stop()
    assert len(samples) >= 5 and all(s.sm_mhz == 1515.0 and s.reasons == SW_POWER_CAP for s in samples)
    assert before <= samples[0].at <= samples[-1].at <= time.monotonic()


def test_a_sampler_that_got_nothing_says_what_nvidia_smi_said(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(tmp_path, monkeypatch, "echo 'No devices were found'; echo 'NVML: not found' >&2\n")
    sampler = Sampler(0, 10)
    time.sleep(0.1)
    with pytest.raises(RuntimeError, match="no samples: No devices were found NVML: not found"):
        sampler.stop()


def test_a_window_without_samples_is_a_row_saying_so(tmp_path) -> None:
    class Silent:
        def stop(self) -> list[Sample]:
            return [Sample(-1.0, 1500.0, 690.0, 0)]  # a sample from before any window

    rows = measure([("cell", "fused", lambda: None)], Silent(), seconds=0.01, warmup_s=0.0, synchronize=lambda: None)
    assert rows == [{"cell": "cell", "provider": "fused", "calls": rows[0]["calls"], "samples": 0}]
    power._write(rows, tmp_path)
    table = (tmp_path / "power.md").read_text()
    assert "| cell | fused |" in table and "no samples" in table
    assert (tmp_path / "power.csv").read_text().splitlines()[0].startswith("cell,provider,calls,samples,sm_mhz")
