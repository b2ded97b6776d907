"""The benchmark scripts in smoke mode (tiny shapes; on CPU the fused kernels run in Triton's interpreter).

These check that every script runs end to end and that every provider computes the same attention,
not how fast anything is (timings live in benchmarks, never in tests). The competitor plumbing
(flash-attn 2, flash-attn-4, SDPA) is exercised on CPU with stand-ins that implement each API's
documented semantics in plain PyTorch, so a layout or page-table mistake shows up here, not on the GPU.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from attention.kernels import configs
from benchmarks import (
    bench_decode,
    bench_mixed,
    bench_overhead,
    bench_prefill,
    env_ab,
    harness,
    providers,
    report,
    run_all,
    run_cell,
    suites,
    tree_ab,
)
from benchmarks.cells import Cell, Inputs, Problem
from benchmarks.config import BenchConfig
from benchmarks.harness import COMPETITORS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fused_ok(rows) -> bool:
    return any(r.provider == "fused" and r.status == "ok" for r in rows)


# ------------------------------------------------------------------------------------------------
# Pure helpers.


def test_flops_count_the_causal_trapezoid() -> None:
    chunk = Problem(q_lens=(2048,), kv_lens=(8192,), heads_q=32, heads_kv=8, causal=True)
    assert chunk.flops == pytest.approx(2 * 32 * 2048 * 256 * (6144 + 8192) / 2)
    full = Problem(q_lens=(4096,), kv_lens=(4096,), heads_q=32, heads_kv=32, causal=False)
    causal = Problem(q_lens=(4096,), kv_lens=(4096,), heads_q=32, heads_kv=32, causal=True)
    assert full.flops == 4 * 32 * 4096 * 4096 * 128
    assert causal.flops == pytest.approx(full.flops / 2, rel=1e-3)


def test_kv_bytes_of_a_decode_batch() -> None:
    problem = Problem(q_lens=(1,) * 64, kv_lens=(4096,) * 64, heads_q=32, heads_kv=8)
    assert problem.kv_bytes == 64 * 4096 * 8 * 256 * 2  # 1.07 GB, perf_anchors.md section 2


def test_ragged_lengths_are_heavy_tailed() -> None:
    lengths = bench_decode.ragged_lengths()
    assert len(lengths) == 64 and max(lengths) == 32768
    assert abs(sum(lengths) / 64 - 4096) < 0.05 * 4096
    assert sorted(lengths)[32] < 4096  # median below the mean
    prefill = bench_prefill.ragged_prefill_lengths()
    assert len(prefill) == 16 and min(prefill) == 128 and max(prefill) == 4096


def test_inputs_layouts_hold_the_same_numbers() -> None:
    problem = Problem(q_lens=(1, 3, 2), kv_lens=(5, 40, 17), heads_q=4, heads_kv=2, head_dim=16, head_dim_v=16,
                      dtype=torch.float32)
    inputs = Inputs(problem, torch.device("cpu"))
    k_cache, v_cache, table = inputs.paged(8)
    packed_k, packed_v = inputs.packed_kv()
    start = 0
    for b, length in enumerate(problem.kv_lens):
        pages = table[b, : math.ceil(length / 8)].long()
        assert torch.equal(k_cache[pages].reshape(-1, 2, 16)[:length], inputs.k_dense[b, :length])
        assert torch.equal(v_cache[pages].reshape(-1, 2, 16)[:length], inputs.v_dense[b, :length])
        assert torch.equal(packed_k[start : start + length], inputs.k_dense[b, :length])
        assert torch.equal(packed_v[start : start + length], inputs.v_dense[b, :length])
        start += length
    used = torch.cat([table[b, : math.ceil(n / 8)] for b, n in enumerate(problem.kv_lens)])
    assert sorted(used.tolist()) == list(range(k_cache.shape[0]))  # a permutation of the pages


def test_csv_round_trip(tmp_path) -> None:
    rows = [harness.Row("decode", "g", "cell", "fused", layout="paged-16", us=12.5, gbps=1000.0, note="a; b"),
            harness.Row("decode", "g", "cell", "flash2", status="n/a", note="needs CUDA")]
    report.write_csv(rows, str(tmp_path / "r.csv"))
    back = report.read_csv(str(tmp_path / "r.csv"))
    assert back == rows


def test_settle_runs_the_call_back_to_back_for_its_time(monkeypatch) -> None:
    from benchmarks import timing

    # a clock that only the call moves, by 2**-10 s (about 1 ms, exact in binary): the verdict holds on a loaded host
    clock_s = [0.0]
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock_s[0]))
    calls, drains = [], []

    def call() -> None:
        clock_s[0] += 2.0**-10
        calls.append(None)

    count = timing.settle(call, 30.0, lambda: drains.append(len(calls)))
    # one call, then batches of a tenth of the time (3 calls), drained after each, until 30 ms have passed
    assert count == len(calls) == 31 and drains == list(range(1, 32, 3))
    assert timing.settle(call, 0.0, lambda: None) == 0


def test_only_cells_that_settle_are_timed_settled(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(harness, "time_fn", lambda fn, graph, cfg, settled=False: (
        seen.append((graph, settled)), harness.Timing(us_eager=1.0))[1])
    cfg = BenchConfig(device=torch.device("cpu"), settle_ms=123.0)
    runner = SimpleNamespace(fn=lambda: torch.zeros(1, 1, 1), graphable=True, describe=None,
                             to_thd=lambda out: out, layout="thd", note="")
    for latency, settle in ((False, True), (True, False), (True, True)):
        cell = Cell("c", "g", Problem(q_lens=(1,), kv_lens=(4,)), "dense", None, latency=latency, settle=settle)
        harness._measure(cell, "unfused", runner, harness.Row("s", "g", "c", "unfused"), cfg, [])
    # a latency cell that settles (mixed) is not served the timing of the same problem unsettled
    assert seen == [(False, True), (True, False), (True, True)]


def test_graph_replays_are_timed_in_two_rounds_and_rows_keep_the_faster(monkeypatch) -> None:
    """run_cell times each fresh graph replay again after the cell's first round, in the same order: a faster
    second round replaces the row's time (and the memoised timing later cells share), a slower one does not."""
    second = {"fused": 18.5, "sdpa_cudnn": 19.5}
    order = []
    monkeypatch.setattr(harness, "time_fn", lambda fn, graph, cfg, settled=False: harness.Timing(
        us_eager=30.0, us_graph={"fused": 19.0, "sdpa_cudnn": 18.7}[fn.__name__]))
    monkeypatch.setattr(harness, "graph_replay_us", lambda fn, cfg, settled=False: (
        order.append(fn.__name__), second[fn.__name__])[1])

    def factory(name):
        def fn():
            return torch.zeros(1, 1, 1)
        fn.__name__ = name
        return lambda cell, inputs: (harness.Runner(fn, lambda out: out, "thd"), None)

    cfg = BenchConfig(device=torch.device("cpu"), check=False)
    cell = Cell("c", "g", Problem(q_lens=(1,), kv_lens=(4,)), "dense", None, latency=True)
    rows = harness.run_cell("s", cell, cfg, {"fused": factory("fused"), "sdpa_cudnn": factory("sdpa_cudnn")})
    assert order == ["sdpa_cudnn", "fused"]  # harness.REFERENCE_ORDER
    assert {row.provider: (row.us, row.us_graph) for row in rows} == {"fused": (18.5, 18.5),
                                                                      "sdpa_cudnn": (18.7, 18.7)}
    assert sorted(timing.us_graph for timing, _ in cfg.memo.values()) == [18.5, 18.7]
    fused = next(row for row in rows if row.provider == "fused")
    assert fused.gbps == pytest.approx(cell.problem.kv_bytes / 18.5e-6 / 1e9)  # the metrics follow the time


def test_prefill_and_mixed_cells_settle_decode_cells_do_not() -> None:
    cfg = BenchConfig(device=torch.device("cpu"))
    assert all(cell.settle for cell in bench_prefill.cells(cfg))
    assert all(cell.settle for mixed in bench_mixed.cells(cfg)
               for cell in (mixed.whole, *mixed.parts, mixed.prefill_in_launch))
    assert not any(cell.settle for cell in bench_decode.cells(cfg))


@pytest.mark.parametrize("smoke", [True, False])
def test_served_mixed_cells_place_every_part_as_runs(smoke: bool) -> None:
    cfg = BenchConfig(device=torch.device("cpu"), smoke=smoke)
    mixed = bench_mixed.cells(cfg)
    served = [m for m in mixed if m.whole.name.endswith("served, page runs")]
    assert served and len(served) == len(mixed) // 2
    names = [cell.name for m in mixed for cell in (m.whole, *m.parts, m.prefill_in_launch)]
    assert len(set(names)) == len(names)  # a served part is not mistaken for the random one (env_ab, targets)
    for m in mixed:
        order = "runs" if m in served else "random"
        assert {cell.page_order for cell in (m.whole, *m.parts, m.prefill_in_launch)} == {order}


def test_settled_calls_are_timed_over_the_longer_window(monkeypatch) -> None:
    import triton.testing

    from benchmarks import timing
    from benchmarks.timing import time_fn

    windows = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep, quantiles, return_mode: (
        windows.append(rep), [1.0, 1.0, 1.0])[1])
    cfg = BenchConfig(device=torch.device("cuda"), settle_ms=0.0, rep_ms=30.0, throughput_rep_ms=300.0)
    time_fn(lambda: None, False, cfg, settled=True)
    time_fn(lambda: None, False, cfg)
    time_fn(lambda: None, False, BenchConfig(device=torch.device("cuda"), settle_ms=0.0, rep_ms=500.0),
            settled=True)
    assert windows == [300.0, 30.0, 500.0]  # the throughput window, the latency window, never below --rep-ms
    replays = []
    monkeypatch.setattr(timing, "_graph_replay_us",
                        lambda fn, device, rep_ms, l2_flush: (replays.append((rep_ms, l2_flush)), 1.0)[1])
    time_fn(lambda: None, True, cfg, settled=True)
    time_fn(lambda: None, True, BenchConfig(device=torch.device("cuda"), settle_ms=0.0, l2_flush="zero"))
    assert replays == [(300.0, "read"), (30.0, "zero")]  # a settled cell's replays take the same window
    calls = []
    monkeypatch.setattr(timing, "synchronize", lambda device: None)
    settling = BenchConfig(device=torch.device("cuda"), settle_ms=5.0)
    time_fn(lambda: calls.append(None), False, settling, settled=True)
    assert len(calls) > 1  # run back to back before do_bench (stubbed: it makes no calls)
    calls.clear()
    time_fn(lambda: calls.append(None), False, settling)
    assert not calls  # a cell that does not settle is timed at once


def test_settling_and_the_throughput_window_defaults_smoke_runs_and_forwarding() -> None:
    import argparse

    from benchmarks import config

    parser = argparse.ArgumentParser()
    config.add_common_arguments(parser, 1.0)
    assert config.config_from_args(parser.parse_args([])).settle_ms == 250.0
    assert config.config_from_args(parser.parse_args(["--settle-ms", "40"])).settle_ms == 40.0
    assert config.config_from_args(parser.parse_args(["--smoke"])).settle_ms == 0.0
    forwarded = run_all._forwarded(run_all._parse(["--settle-ms", "40", "--throughput-rep-ms", "90"]))
    assert forwarded[forwarded.index("--settle-ms") + 1] == "40.0"
    assert config.config_from_args(parser.parse_args([])).throughput_rep_ms == 300.0
    assert forwarded[forwarded.index("--throughput-rep-ms") + 1] == "90.0"

# ------------------------------------------------------------------------------------------------
# Every script, smoke mode, in-process.


@pytest.mark.parametrize("module", [bench_decode, bench_mixed, bench_prefill, bench_overhead],
                         ids=["decode", "mixed", "prefill", "overhead"])
def test_suite_smoke(module, tmp_path) -> None:
    rows = module.main(["--smoke", "--out", str(tmp_path), "--quiet"])
    bad = [(r.cell, r.provider, r.status, r.note) for r in rows if r.status in ("error", "mismatch", "skipped")]
    assert not bad
    suite = module.SUITE
    assert (tmp_path / f"{suite}.csv").exists() and (tmp_path / f"{suite}.md").exists()
    if suite == "overhead":
        assert all(r.host_us and r.host_us > 0 for r in rows if r.status == "ok")
        assert any(r.provider.startswith("auto + InferenceParams.step") and r.status == "ok" for r in rows)
        return
    by_cell: dict[str, list] = {}
    for row in rows:
        by_cell.setdefault(row.cell, []).append(row)
    for cell, cell_rows in by_cell.items():
        assert _fused_ok(cell_rows), cell
        checked = [r for r in cell_rows if r.max_err is not None]
        assert len(checked) >= 2, f"{cell}: outputs were not compared"
        auto = next(r for r in cell_rows if r.provider == "auto")
        assert auto.note.startswith("→ fused")
    if suite == "mixed":
        whole = [r for r in rows if r.group == "M1"]
        assert {"fused (separately)", "best competitors (separately)", "best separately"} <= {r.provider for r in whole}
        parts = [[r.us for r in rows if r.cell == part.name and r.status == "ok"
                  and r.provider in ("fused", *COMPETITORS)]
                 for part in bench_mixed.cells(BenchConfig(device=torch.device("cpu"), smoke=True))[0].parts]
        best = next(r for r in whole if r.provider == "best separately")
        assert best.us == pytest.approx(sum(map(min, parts)))   # the fastest provider of each part
        probe = [r for r in rows if "probe" in r.cell]
        assert {r.provider for r in probe} == {"unfused", "fused", "auto"}
        fused = next(r for r in whole if r.provider == "fused")
        assert "in the launch (decodes without queries)" in fused.note, fused.note


def test_a_mixed_cell_picked_by_name_runs_its_parts(monkeypatch) -> None:
    """``--cells`` names whole mixed cells; their parts and probe run whatever their names (before, the filter
    dropped them: no separate calls, so no mixed target)."""
    ran = []
    monkeypatch.setattr(harness, "run_cells", lambda suite, cells, cfg, factories: ran.extend(
        c.name for c in cells if cfg.wants_cell(c.name)) or [])   # run_cells' own filter
    cfg = BenchConfig(device=torch.device("cpu"), smoke=True, cells=("served, page runs",))
    bench_mixed.run(cfg)
    served = bench_mixed.cells(cfg)[1]
    assert ran == [cell.name for cell in (served.whole, *served.parts, served.prefill_in_launch)]


def test_run_all_writes_one_report(tmp_path) -> None:
    results = run_all.main(["--smoke", "--out", str(tmp_path), "--quiet", "--only", "decode,overhead",
                            "--cells", "verify"])
    assert set(results) == {"decode", "overhead"}
    text = (tmp_path / "results.md").read_text()
    for needle in ("# Benchmark results", "## decode", "## overhead", "| commit |", "fused × best"):
        assert needle in text
    rows = report.read_csv(str(tmp_path / "results.csv"))
    assert {r.suite for r in rows} == {"decode", "overhead"}
    assert sorted(os.listdir(tmp_path)) == ["decode.png", "results.csv", "results.md"]


def test_run_all_isolated_suites(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT)
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.run_all", "--smoke", "--isolate", "--quiet", "--out", str(tmp_path),
         "--only", "decode", "--cells", "2x64 verify"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = report.read_csv(str(tmp_path / "results.csv"))
    assert _fused_ok(rows) and not [r for r in rows if r.status in ("error", "mismatch")]


# ------------------------------------------------------------------------------------------------
# Competitor plumbing on CPU, against stand-ins with each API's semantics.


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """q [s_q, h, d], k/v [s_k, h_kv, d] -> [s_q, h, d_v]; causal aligned bottom-right (flash-attn)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal:
        s_q, s_k = q.shape[0], k.shape[0]
        visible = torch.arange(s_k)[None, :] <= torch.arange(s_q)[:, None] + (s_k - s_q)
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)


def _keys(cache: torch.Tensor, b: int, length: int, table: torch.Tensor | None) -> torch.Tensor:
    if table is None:
        return cache[b, :length]
    page = cache.shape[1]
    return cache[table[b, : math.ceil(length / page)].long()].reshape(-1, *cache.shape[2:])[:length]


def _flash2_stand_in() -> SimpleNamespace:
    def with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None, causal=False):
        if block_table is not None:
            assert k_cache.shape[1] % 256 == 0, "flash-attn 2 paged KV needs page_size % 256 == 0"
        outs = [_attend(q[b], _keys(k_cache, b, int(n), block_table), _keys(v_cache, b, int(n), block_table),
                        softmax_scale, causal) for b, n in enumerate(cache_seqlens.tolist())]
        return torch.stack(outs)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False, block_table=None):
        outs = []
        for b in range(cu_q.numel() - 1):
            qb = q[cu_q[b] : cu_q[b + 1]]
            if block_table is None:
                kb, vb = k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
            else:
                assert k.shape[1] % 256 == 0
                length = int(cu_k[b + 1] - cu_k[b])
                kb, vb = _keys(k, b, length, block_table), _keys(v, b, length, block_table)
            outs.append(_attend(qb, kb, vb, softmax_scale, causal))
        return torch.cat(outs)

    return SimpleNamespace(flash_attn_with_kvcache=with_kvcache, flash_attn_varlen_func=varlen)


def _flash4_stand_in(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                     seqused_k=None, page_table=None, softmax_scale=None, causal=False):
    assert page_table is None or cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
    batched = cu_seqlens_q is None
    batch = q.shape[0] if batched else cu_seqlens_q.numel() - 1
    outs = []
    for b in range(batch):
        qb = q[b] if batched else q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]
        if cu_seqlens_k is not None:
            kb, vb = k[cu_seqlens_k[b] : cu_seqlens_k[b + 1]], v[cu_seqlens_k[b] : cu_seqlens_k[b + 1]]
        else:
            length = int(seqused_k[b])
            kb, vb = _keys(k, b, length, page_table), _keys(v, b, length, page_table)
        outs.append(_attend(qb, kb, vb, softmax_scale, causal))
    out = torch.stack(outs) if batched else torch.cat(outs)
    return out, None


def test_competitors_compute_the_same_attention(monkeypatch) -> None:
    from torch.nn.attention import SDPBackend

    monkeypatch.setattr(providers, "flash2_module", lambda: (_flash2_stand_in(), None))
    monkeypatch.setattr(providers, "flash4_function", lambda: (_flash4_stand_in, None))
    monkeypatch.setattr(providers, "_is_cuda", lambda inputs: True)
    monkeypatch.setitem(providers.SDPA_BACKENDS, "cudnn", SDPBackend.MATH)
    cfg = BenchConfig(device=torch.device("cpu"), smoke=True, verbose=False,
                      providers=("unfused", "sdpa_flash", "sdpa_cudnn", "flash2", "flash4"))
    cells = list(bench_decode.cells(cfg)) + list(bench_prefill.cells(cfg))
    for mixed in bench_mixed.cells(cfg):
        cells += [mixed.whole, *mixed.parts]
    ragged_q = Cell("mixed q lengths, non-paged", "x",
                    Problem(q_lens=(3, 1), kv_lens=(20, 9), heads_q=4, heads_kv=2, head_dim=16, head_dim_v=16,
                            causal=True, dtype=torch.float16), "dense", None)
    rows = harness.run_cells("x", cells + [ragged_q], cfg, providers.FACTORIES)
    assert not [(r.cell, r.provider, r.status, r.note) for r in rows if r.status in ("error", "mismatch")]
    ran = {(r.cell, r.provider): r for r in rows if r.status == "ok"}
    for cell in cells:
        for name in ("unfused", "flash2", "flash4"):
            assert (cell.name, name) in ran, (cell.name, name)
        p = cell.problem
        if p.uniform_q and p.uniform_kv:
            assert (cell.name, "sdpa_flash") in ran
            # torch reaches cuDNN with a bottom-right causal mask only through a materialised mask: n/a there
            bottom_right = p.causal and 1 < p.max_q < p.max_kv
            assert ((cell.name, "sdpa_cudnn") in ran) != bottom_right, cell.name
    paged = [r for r in rows if r.status == "ok" and r.cell == "2x96 p16"]
    layouts = {r.provider: r.layout for r in paged}
    assert layouts["flash2"] == "paged-256" and layouts["flash4"] == "paged-128" and layouts["sdpa_flash"] == "bhsd"
    assert all(r.max_err is not None for r in rows if r.status == "ok")
    skipped = {(r.cell, r.provider): r.note for r in rows if r.status == "n/a"}
    assert "ragged" in skipped[("3 ragged p8", "sdpa_flash")]
    assert "non-paged" in skipped[("mixed q lengths, non-paged", "flash2")]


def test_the_module_over_a_static_paged_cache_runs_through_the_unfused_backend() -> None:
    """``auto`` falls to the unfused backend where the fused one cannot run (no Triton, an interpreter it refuses),
    which reads a paged cache through ``convert_paged_to_nonpaged(layer, rows)``: the benchmarks' static cache took
    no ``rows`` and every paged ``auto`` cell errored there (the device's numpy 2.5, 2026-12-06)."""
    cfg = BenchConfig(device=torch.device("cpu"), smoke=True, verbose=False)
    cell = next(cell for cell in bench_decode.cells(cfg) if cell.kv_source == "paged")
    inputs = Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order)
    paged, _ = providers._dpa(cell, inputs, "unfused", "paged")
    dense, _ = providers._dpa(cell, inputs, "unfused", "dense")
    assert paged.layout == f"paged-{cell.page_size}"
    torch.testing.assert_close(paged.to_thd(paged.fn()), dense.to_thd(dense.fn()))


def test_a_provider_computing_something_else_is_flagged(monkeypatch) -> None:
    def top_left_causal(q, k, v, **kwargs):  # forgets the bottom-right alignment of a chunk
        kwargs["causal"] = False
        return _flash4_stand_in(q, k, v, **kwargs)

    monkeypatch.setattr(providers, "flash4_function", lambda: (top_left_causal, None))
    cfg = BenchConfig(device=torch.device("cpu"), smoke=True, verbose=False, providers=("unfused", "flash4"))
    chunk = next(c for c in bench_prefill.cells(cfg) if c.kv_source == "paged")
    rows = harness.run_cells("x", [chunk], cfg, providers.FACTORIES)
    flash4 = next(r for r in rows if r.provider == "flash4")
    assert flash4.status == "mismatch" and "MISMATCH vs unfused" in flash4.note
    assert flash4.speedup is None  # never counted as the best competitor


def test_a_provider_that_skips_a_page_of_a_long_context_is_flagged(monkeypatch) -> None:
    """Outputs averaged over thousands of keys are small, so an absolute bound alone passed a provider that never
    read the last 16 keys of 4k (|err| ~1e-2 under fp16's 2e-2); the relative bound flags it."""
    def short_read(q, k, v, seqused_k=None, **kwargs):
        return _flash4_stand_in(q, k, v, seqused_k=seqused_k - 16, **kwargs)

    monkeypatch.setattr(providers, "flash4_function", lambda: (short_read, None))
    cfg = BenchConfig(device=torch.device("cpu"), smoke=True, verbose=False, providers=("unfused", "flash4"))
    cell = Cell("1x4k p16", "x", Problem(q_lens=(1,), kv_lens=(4096,), heads_q=4, heads_kv=2, head_dim=16,
                                        head_dim_v=16, causal=False, dtype=torch.float16), "paged", 16)
    rows = harness.run_cells("x", [cell], cfg, providers.FACTORIES)
    flash4 = next(r for r in rows if r.provider == "flash4")
    assert flash4.max_err < harness.ERROR_TOLERANCE[torch.float16], flash4.max_err   # the absolute bound passes it
    assert flash4.status == "mismatch" and "relative" in flash4.note, (flash4.status, flash4.note)


def test_config_sweep_runs_every_variant_and_agrees_with_the_default(cpu_fused) -> None:
    """benchmarks/sweep.py on two tiny cells: each variant runs and matches the default's output."""
    from benchmarks import sweep

    cfg = BenchConfig(device=torch.device("cpu"), smoke=True)
    measured: list[sweep.Measured] = []
    for cell in (bench_decode.cells(cfg)[1], bench_prefill.cells(cfg)[0]):
        rows = sweep.sweep_cell(cell, cfg, measured=measured)
        assert len(rows) == len(sweep._variants(cell)) > 1
        for row in rows:
            assert "error" not in row and float(row.split("|")[-2]) < 5e-3, row
    assert {m.shape_class for m in measured} == {"decode/paged", "prefill/contiguous"}
    assert any("rotate_kv_tiles" in m.variants for m in measured)
    picked = configs.parse_variants(sweep.pick_variants(measured))  # whatever won, a string the kernel reads
    assert set(picked) == {"decode/paged", "prefill/contiguous"}


def test_latency_breakdown_times_every_part(tmp_path, cpu_fused) -> None:
    """benchmarks/latency_breakdown.py on the smoke cells: each split-KV cell gets the floor, the whole
    call, the attention grid alone, the combine alone and both alternatives, with no errors."""
    from benchmarks import latency_breakdown

    out = tmp_path / "breakdown.md"
    latency_breakdown.main(["--smoke", "--out", str(out), "--cells", "MQA"])
    rows = [line.split("|")[2].strip() for line in out.read_text().splitlines()[2:]]
    assert rows[:6] == ["floor (empty kernel)", "fused", "attention only", "combine only", "dependent combine",
                        "fused combine"], rows
    assert "error" not in out.read_text()


def test_sweep_compiles_its_variants_in_worker_processes(cpu_fused) -> None:
    """--compile-workers: two spawned processes share one small cell's variants and run each once."""
    from benchmarks import sweep

    cfg = BenchConfig(device=torch.device("cpu"), smoke=True)
    cell = bench_decode.cells(cfg)[1]
    done = sweep.compile_in_parallel("decode", [cell.name], True, 2, time.monotonic() + 300, "cpu", True)
    assert done == len(sweep._variants(cell, layout_only=True))


def test_report_header_names_the_kernel_tuning(monkeypatch) -> None:
    monkeypatch.setenv("ATTN_FUSED_VARIANTS", "decode/paged=fused_combine")
    monkeypatch.delenv("ATTN_TRITON_FAST_LAUNCH", raising=False)
    header = report.environment_header(torch.device("cpu"))
    assert header["ATTN_FUSED_VARIANTS"] == "decode/paged=fused_combine"
    assert "ATTN_TRITON_FAST_LAUNCH" not in header
    assert header["L2 flush"] == "read" and report.environment_header(torch.device("cpu"), "zero")["L2 flush"] == "zero"


def test_sweep_compares_nothing_when_the_default_fails(monkeypatch) -> None:
    """A cell whose default config fails measures no variant against another variant."""
    from benchmarks import sweep

    cfg = BenchConfig(device=torch.device("cpu"), smoke=True)
    cell = bench_decode.cells(cfg)[1]
    monkeypatch.setattr(sweep, "_variants", lambda *args: [("default", {}), ("other", {})])
    monkeypatch.setattr(sweep, "_fused", lambda *args, **kwargs: (None, "does not compile"))
    measured: list = []
    rows = sweep.sweep_cell(cell, cfg, measured=measured)
    assert "error: " in rows[0] and "skipped: the default failed" in rows[1]
    assert measured == []


def test_served_page_orders():
    """A serving run's page table: FIFO deals a decode batch's pages round-robin, page runs keep each sequence's
    together; every provider reads the same numbers through either."""
    from benchmarks.cells import served_page_table

    lengths = (1000,) * 15 + (700,)
    page_bytes = 16 * 8 * 128 * 2            # 32 KiB: runs of 64 pages
    for order in ("runs", "fifo"):
        table, pool = served_page_table(lengths, 16, page_bytes, order)
        flat = [page for pages in table for page in pages]
        assert len(flat) == len(set(flat)) and max(flat) < pool
        assert [len(pages) for pages in table] == [63] * 15 + [44]
        # pages not next to their predecessor: after the history FIFO deals out pages in the order they came back,
        # the runs keep each sequence's adjacent
        jumps = [sum(b != a + 1 for a, b in zip(pages, pages[1:])) for pages in table]
        assert (max(jumps) <= 1) if order == "runs" else (sum(jumps) >= 100), (order, jumps)
    problem = Problem(q_lens=(1, 1), kv_lens=(40, 70), heads_q=4, heads_kv=2, head_dim=16, head_dim_v=16,
                      dtype=torch.float32)
    for order in ("random", "fifo", "runs"):
        k_cache, _, page_table = Inputs(problem, torch.device("cpu"), page_order=order).paged(16)
        dense = Inputs(problem, torch.device("cpu")).k_dense
        for seq, length in enumerate(problem.kv_lens):
            rows = k_cache[page_table[seq, : -(-length // 16)].long()].flatten(0, 1)[:length]
            assert torch.equal(rows, dense[seq, :length]), order


# ------------------------------------------------------------------------------------------------
# benchmarks/env_ab.py: environment variants alternated in one process.


def test_env_ab_variants_parse_or_name_the_expected_form() -> None:
    assert env_ab.parse_variant("tile=ATTN_A=64,2,1;ATTN_B=") == ("tile", {"ATTN_A": "64,2,1", "ATTN_B": ""})
    for bad in ("tile", "tile=ATTN_A", "=ATTN_A=1", "default=ATTN_A=1", "tile=;"):
        with pytest.raises(ValueError, match="NAME=VAR=VALUE"):
            env_ab.parse_variant(bad)


def test_env_ab_sets_and_restores_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("ATTN_ENV_AB_KEPT", "before")
    monkeypatch.delenv("ATTN_ENV_AB_NEW", raising=False)
    with env_ab.environment({"ATTN_ENV_AB_KEPT": "", "ATTN_ENV_AB_NEW": "1"}):
        assert "ATTN_ENV_AB_KEPT" not in os.environ and os.environ["ATTN_ENV_AB_NEW"] == "1"
    assert os.environ["ATTN_ENV_AB_KEPT"] == "before" and "ATTN_ENV_AB_NEW" not in os.environ


def test_env_ab_alternates_variants_and_compares_outputs(capsys, tmp_path, cpu_fused) -> None:
    measurements = env_ab.main(["--smoke", "--quiet", "--cells", "chunk 16 on 64 prefix p16", "--rounds", "2",
                                "--variant", "general=ATTN_FUSED_HOPPER=0", "--out", str(tmp_path)])
    assert [(m.round, m.variant) for m in measurements] == [
        (0, "default"), (0, "general"), (1, "general"), (1, "default")]
    assert all(m.us > 0 for m in measurements)
    assert [m.max_diff is None for m in measurements] == [True, False, True, True]  # round 0's others only
    assert measurements[1].max_diff < 1e-2  # the same attention (on a GPU another kernel's rounding)
    table = capsys.readouterr().out
    assert "| chunk 16 on 64 prefix p16 | general |" in table and "| 1.000 |" in table
    written = (tmp_path / "env_ab.md").read_text()
    assert "`general`: `ATTN_FUSED_HOPPER=0`" in written and "| chunk 16 on 64 prefix p16 | general |" in written
    assert len((tmp_path / "env_ab.csv").read_text().splitlines()) == 1 + len(measurements)


def test_env_ab_times_the_module_with_fused_dpa_and_refuses_other_providers(capsys, tmp_path, cpu_fused) -> None:
    measurements = env_ab.main(["--smoke", "--quiet", "--cells", "chunk 16 on 64 prefix p16", "--rounds", "1",
                                "--providers", "fused_dpa", "--variant",
                                "one=ATTN_FUSED_HOPPER_MIXED_DEVICE_RULE=0", "--out", str(tmp_path)])
    assert [m.variant for m in measurements] == ["default", "one"] and measurements[1].max_diff < 1e-2
    with pytest.raises(SystemExit):
        env_ab.main(["--smoke", "--quiet", "--providers", "flash4", "--out", str(tmp_path)])
    assert "env_ab times one of fused, fused_dpa" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# benchmarks/tree_ab.py: source trees timed in alternating processes.


def test_tree_ab_trees_parse_or_name_the_expected_form(tmp_path) -> None:
    assert tree_ab.parse_tree(f"main={ROOT}") == ("main", ROOT)
    for bad in ("main", f"={ROOT}", "main=", f"a/b={ROOT}"):
        with pytest.raises(ValueError, match="NAME=PATH"):
            tree_ab.parse_tree(bad)
    with pytest.raises(ValueError, match="no benchmarks/"):
        tree_ab.parse_tree(f"empty={tmp_path}")


def test_tree_ab_names_the_files_a_tree_changes(tmp_path) -> None:
    for tree in ("a", "b"):
        for name, text in (("attention/kernel.py", "x = 1"), ("attention/__pycache__/kernel.pyc", tree),
                           ("docs/notes.md", tree), ("tests/test_x.py", "ok")):
            (tmp_path / tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / tree / name).write_text(text)
    assert tree_ab.differing_files(str(tmp_path / "a"), str(tmp_path / "b")) == []
    (tmp_path / "b" / "attention" / "kernel.py").write_text("x = 2")
    (tmp_path / "b" / "benchmarks").mkdir()
    (tmp_path / "b" / "benchmarks" / "new.py").write_text("")
    assert tree_ab.differing_files(str(tmp_path / "a"), str(tmp_path / "b")) == ["attention/kernel.py",
                                                                                  "benchmarks/new.py"]
    lines = tree_ab.describe_trees({"a": str(tmp_path / "a"), "b": str(tmp_path / "b")})
    assert lines[1].endswith("differs from `a` in `attention/kernel.py`, `benchmarks/new.py`")


def test_tree_ab_alternates_trees_in_processes_and_tabulates(capsys, tmp_path, cpu_fused) -> None:
    measurements = tree_ab.main(["--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--cells", "chunk 16 on 64 prefix p16",
                                 "--rounds", "1", "--passes", "2", "--out", str(tmp_path), "--", "--smoke"])
    assert [(m.tree, m.pass_) for m in measurements] == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    assert all(m.us > 0 and m.cell == "chunk 16 on 64 prefix p16" for m in measurements)
    out = capsys.readouterr().out
    assert "| chunk 16 on 64 prefix p16 | a |" in out and "| 1.000 |" in out and "b pass 1: exit 0" in out
    report = (tmp_path / "tree_ab.md").read_text()
    assert (tmp_path / "b-1" / "env_ab.csv").exists() and "| b |" in report
    assert "| commit |" in report and "the same source files as `a`" in report
    assert len((tmp_path / "tree_ab.csv").read_text().splitlines()) == 1 + len(measurements)


def test_run_cell_calls_the_named_cells_providers_and_says_which_cannot(capsys, cpu_fused) -> None:
    done = run_cell.main(["--smoke", "--cells", "chunk 16 on 64 prefix p16", "--providers", "fused,flash4",
                          "--calls", "2"])
    assert done[0] == ("chunk 16 on 64 prefix p16", "fused", "ran 2 calls")
    assert done[1][:2] == ("chunk 16 on 64 prefix p16", "flash4") and len(done) == 2
    with pytest.raises(SystemExit):
        run_cell.main(["--smoke", "--cells", "chunk 16", "--providers", "fused,nonesuch"])
    assert "unknown nonesuch" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--providers", "fused,nonesuch"], "--providers: unknown nonesuch"),
    (["--cells", "nonesuch"], "--cells: no decode cell matches nonesuch"),
])
def test_a_suite_refuses_names_that_match_nothing(argv, message, capsys, tmp_path) -> None:
    """A typo ran nothing, wrote empty reports and exited 0."""
    from benchmarks import bench_decode

    with pytest.raises(SystemExit):
        bench_decode.main(["--smoke", "--out", str(tmp_path), *argv])
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module, argv, message", [
    ("bench_decode", ["--rep-ms", "0"], "--rep-ms: must be a positive number, got 0"),
    ("bench_mixed", ["--budget-s", "-1"], "--budget-s: must be a non-negative number, got -1"),
    ("bench_prefill", ["--settle-ms", "nan"], "--settle-ms: must be a non-negative number, got nan"),
    ("host_proxy", ["--calls", "0"], "--calls: must be a positive integer, got 0"),
    ("env_ab", ["--rounds", "0"], "--rounds: must be a positive integer, got 0"),
    ("tree_ab", ["--cells", "x", "--passes", "-2"], "--passes: must be a positive integer, got -2"),
    ("run_cell", ["--calls", "two"], "--calls: invalid int value: 'two'"),
    ("sweep", ["--compile-workers", "-1"], "--compile-workers: must be a non-negative integer, got -1"),
])
def test_scripts_refuse_counts_and_durations_out_of_range(module, argv, message, capsys) -> None:
    """A zero count or duration used to end in a traceback (a division by zero, an empty min()) or a silent no-op."""
    import importlib

    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"benchmarks.{module}").main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_every_suite_cell_once_and_cells_picked_by_substring() -> None:
    cfg = BenchConfig(device=torch.device("cpu"), smoke=True, cells=("M1 part",))
    names = [cell.name for cell in suites.every_cell(cfg)]
    assert len(names) == len(set(names)) and any("decodes" in n for n in names) and any("chunk" in n for n in names)
    assert [cell.name for cell in suites.wanted_cells(cfg)] == [n for n in names if "M1 part" in n]
    with pytest.raises(SystemExit, match="--cells"):
        suites.wanted_cells(BenchConfig(device=torch.device("cpu"), smoke=True, cells=("nonesuch",)))


def test_queue_rule_cells_are_mixed_batches_env_ab_can_pick() -> None:
    """bench_mixed.queue_rule_cells: one to three dealt rounds of prefill items each, picked by name from every_cell."""
    cfg = BenchConfig(device=torch.device("cpu"), cells=("MXR ",))
    cells = bench_mixed.queue_rule_cells(cfg)
    assert [cell.name for cell in suites.wanted_cells(cfg)] == [cell.name for cell in cells]
    assert len(cells) == len(bench_mixed.QUEUE_RULE_BATCHES) and all(c.name.endswith(" p16") for c in cells)
    for cell in cells:
        chunk, *decodes = cell.problem.q_lens
        assert -(-32 * chunk // 128 // 132) in (1, 2, 3) and set(decodes) == {1}  # dealt rounds of 132 items
    assert bench_mixed.queue_rule_cells(BenchConfig(device=torch.device("cpu"), smoke=True)) == []


def test_tile_rule_cells_are_mixed_batches_env_ab_can_pick() -> None:
    """bench_mixed.tile_rule_cells: whole batches the mixed kernel takes (configs.mixed_batch), picked by name from
    every_cell, none under --smoke."""
    cfg = BenchConfig(device=torch.device("cpu"), cells=("MX ",))
    cells = bench_mixed.tile_rule_cells(cfg)
    non_paged = [cell for cell in cells if cell.kv_source == "dense"]
    ruled = [cell for cell in cells if cell.name.startswith("MX ")]
    assert len(ruled) == len(bench_mixed.TILE_RULE_BATCHES) + len(bench_mixed.TILE_RULE_NON_PAGED) == 14
    assert len(cells) == len(ruled) + 4 * len(bench_mixed.TILE_RULE_OTHER_BATCHES)
    assert len({cell.name for cell in cells}) == len(cells) and all("non-paged" in c.name for c in non_paged)
    assert all(cell.problem.head_dim == 64 for cell in cells if cell.name.startswith("MXD d64 "))
    assert all(set(cell.problem.q_lens[1:]) == {4} for cell in cells if cell.name.startswith(("MXV ", "MXDV ")))
    assert all(cell.problem.heads_kv == 1 for cell in cells if cell.name.startswith("MXQ "))
    for cell in cells:
        q_lens = cell.problem.q_lens
        assert configs.mixed_batch(len(q_lens), sum(q_lens), max(q_lens)), cell.name
    assert [cell.name for cell in suites.wanted_cells(cfg)] == [cell.name for cell in ruled]
    assert bench_mixed.tile_rule_cells(BenchConfig(device=torch.device("cpu"), smoke=True)) == []
