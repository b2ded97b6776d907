"""Fused Triton attention forward on CUDA at realistic shapes (bf16 / fp16) vs the fp32 reference.

The reference (tests/reference.py) is evaluated on the GPU; cases come from the builder in
tests/test_kernels.py. Run on the H200: `pytest -m gpu tests/gpu/test_kernels_gpu.py`.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from tests.test_kernels import AttentionCase, build_inputs, check_output, run_and_check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

if torch.cuda.is_available():
    from attention.kernels import attention_forward

GPU_TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}
DTYPES = [torch.bfloat16, torch.float16]
C = AttentionCase


def _lengths(seed: int, count: int, low: int, high: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randint(low, high) for _ in range(count))


def check_on_gpu(case: AttentionCase) -> None:
    run_and_check(case, "cuda", GPU_TOLERANCE[case.dtype])


# decode rows + a prefill + a chunked prefill, GQA 32/8, d128
_MIXED_Q = (1,) * 12 + (300, 700)
_MIXED_KV = _lengths(1, 12, 1, 4096) + (300, 2900)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
def test_paged_mixed_batch_page_sizes(page_size: int, dtype: torch.dtype) -> None:
    check_on_gpu(C(_MIXED_Q, _MIXED_KV, heads=(32, 8), d_qk=128, d_v=128, dtype=dtype, layout="paged",
                   page_size=page_size, causal=True, bottom_right=True, num_splits=None))


@pytest.mark.parametrize("layout", ["cache", "thd"])
def test_mixed_batch_over_a_contiguous_cache(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed batch over a non-paged cache (configs.mixed_batch) runs the paged tables' tile with a 16-row tile
    for its decodes (SMALL_BLOCK_M), and matches the reference (the general kernel's path: on sm90 the mixed kernel
    takes such batches unless switched off)."""
    from attention.kernels import attention_fwd
    from attention.kernels.hopper_mixed import MIXED_HOPPER_ENV

    monkeypatch.setenv(MIXED_HOPPER_ENV, "0")
    attention_fwd._plans.clear()
    q_lens = (700,) + (1,) * 16  # fewer than 64 queries per sequence on average: not the Gluon kernel's
    kv_lens = (2900,) + _lengths(2, 16, 1, 4096) if layout == "cache" else q_lens
    check_on_gpu(C(q_lens, kv_lens, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout=layout,
                   causal=True, bottom_right=True, num_splits=None))
    launches = [plan.attention for plan in attention_fwd._plans.values() if hasattr(plan, "attention")]
    assert launches and all(launch.constexprs["SMALL_BLOCK_M"] == 16 for launch in launches)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_chunks_over_small_pages_run_over_a_copy(page_size: int, dtype: torch.dtype, monkeypatch) -> None:
    """Chunks of thousands of tokens (GQA 32/8: >= GATHER_MIN_PACKED_ROWS packed rows per sequence) over
    pages below GATHER_MAX_PAGE_SIZE run over a contiguous copy of their pages (page_gather.py), when the
    Gluon kernel does not read them in place (on sm90 it does from 16 tokens: switched off here; its own tests
    are tests/gpu/test_hopper_gpu.py)."""
    from attention.kernels import attention_fwd
    from attention.kernels.hopper_forward import HOPPER_SMALL_PAGES_ENV
    from attention.kernels.page_gather import gather_pages

    monkeypatch.setenv(HOPPER_SMALL_PAGES_ENV, "0")
    copies = []
    monkeypatch.setattr(attention_fwd, "gather_pages", lambda *args: copies.append(args[3]) or gather_pages(*args))
    check_on_gpu(C((2048, 1500, 1024), (6144 + 2048, 1500, 3000), heads=(32, 8), d_qk=128, d_v=128, dtype=dtype,
                   layout="paged", page_size=page_size, causal=True, bottom_right=True, num_splits=None))
    assert copies == [-(-8192 // page_size)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_ragged_prefill_thd(causal: bool, dtype: torch.dtype) -> None:
    lengths = (1, 17, 513, 2048, 8192, 3001, 64)
    check_on_gpu(C(lengths, lengths, heads=(32, 8), d_qk=128, d_v=128, dtype=dtype, layout="thd",
                   causal=causal, num_splits=None))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "paged"])
def test_head_dims_gqa_64_8(layout: str, head_dim: int, dtype: torch.dtype) -> None:
    q_lens, kv_lens = (1, 1, 5, 900, 33), (1500, 1, 800, 900, 2000)
    check_on_gpu(C(q_lens, kv_lens, heads=(64, 8), d_qk=head_dim, d_v=head_dim, dtype=dtype, layout=layout,
                   page_size=64, causal=True, bottom_right=True, num_splits=None))


@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_mqa_decode_and_chunk(num_splits: int | None) -> None:
    check_on_gpu(C((1, 1, 1, 64), (8000, 3, 1025, 4000), heads=(32, 1), d_qk=128, d_v=128, dtype=torch.bfloat16,
                   layout="paged", page_size=16, causal=True, bottom_right=True, num_splits=num_splits))


@pytest.mark.parametrize("d_qk, d_v", [(192, 128), (128, 64), (72, 40)])
def test_different_qk_and_v_head_dims(d_qk: int, d_v: int) -> None:
    check_on_gpu(C((1, 400, 3), (2000, 400, 1000), heads=(16, 4), d_qk=d_qk, d_v=d_v, dtype=torch.float16,
                   layout="cache", causal=True, bottom_right=True, num_splits=None))


@pytest.mark.parametrize(
    "case",
    [
        C((1, 1, 512), (6000, 900, 4096), window=(1024, 0), causal=True, bottom_right=True, layout="paged",
          page_size=16, heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, num_splits=None),
        C((2048, 700), (2048, 700), window=(128, 128), layout="bshd", heads=(16, 4), d_qk=64, d_v=64,
          dtype=torch.float16),
        C((1, 300, 1), (3000, 300, 17), alibi="bh", causal=True, bottom_right=True, layout="cache",
          heads=(16, 4), d_qk=128, d_v=128, dtype=torch.float16, num_splits=None),
        C((1, 1, 1000), (5000, 1, 1000), alibi="h", layout="thd", heads=(8, 8), d_qk=128, d_v=128,
          dtype=torch.bfloat16),
        C((1, 4, 1, 200), (7000, 50, 2, 150), sink=True, causal=True, bottom_right=True, layout="paged",
          page_size=64, heads=(64, 8), d_qk=64, d_v=64, dtype=torch.bfloat16, num_splits=None),
        C((1, 4, 200), (7000, 50, 150), sink=True, causal=True, bottom_right=True, layout="paged",
          page_size=64, heads=(64, 8), d_qk=64, d_v=64, dtype=torch.float16, num_splits=1),
    ],
    ids=str,
)
def test_windows_alibi_sinks(case: AttentionCase) -> None:
    check_on_gpu(case)


def _random_case(seed: int) -> AttentionCase:
    """A random batch composition: decodes, prefills, chunked prefills, spec-verify rows, empties."""
    rng = random.Random(seed)
    q_lens, kv_lens = [], []
    for _ in range(rng.randint(1, 12)):
        kind = rng.choice(["decode", "decode", "prefill", "chunk", "verify", "empty"])
        if kind == "decode":
            q_len, kv_len = 1, rng.randint(1, 6000)
        elif kind == "prefill":
            q_len = kv_len = rng.randint(1, 2048)
        elif kind == "chunk":
            kv_len = rng.randint(2, 6000)
            q_len = rng.randint(1, min(kv_len, 1024))
        elif kind == "verify":
            q_len = rng.randint(2, 8)
            kv_len = q_len + rng.randint(0, 3000)
        else:
            q_len, kv_len = 0, rng.choice([0, rng.randint(1, 50)])
        q_lens.append(q_len)
        kv_lens.append(kv_len)
    if max(q_lens) == 0:
        q_lens[0], kv_lens[0] = 1, max(kv_lens[0], 1)
    heads = rng.choice([(32, 8), (64, 8), (8, 1), (16, 16), (28, 4)])
    head_dim = rng.choice([64, 128, 256])
    layout = rng.choice(["paged", "paged", "cache", "thd", "bshd"])
    window = rng.choice([(-1, -1), (-1, -1), (rng.randint(0, 2000), 0), (rng.randint(0, 500), rng.randint(0, 500))])
    return C(tuple(q_lens), tuple(kv_lens), heads=heads, d_qk=head_dim, d_v=head_dim,
             dtype=rng.choice(DTYPES), layout=layout, page_size=rng.choice([1, 16, 64, 256]),
             causal=rng.random() < 0.7, bottom_right=True, window=window,
             sink=rng.random() < 0.2, num_splits=rng.choice([None, None, 1, 3]), seed=seed)


@pytest.mark.parametrize("seed", range(16))
def test_fuzz_random_batches(seed: int) -> None:
    check_on_gpu(_random_case(seed))


def test_cuda_graph_replay_with_new_metadata() -> None:
    """Capture one decode/verify batch, then change lengths, page table and cache in place; replay."""
    common = dict(heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged", page_size=16,
                  causal=True, bottom_right=True, num_splits=None, num_pages=2400, max_pages=260)
    case_a = C((1,) * 8, _lengths(2, 8, 1, 4000), seed=2, **common)
    case_b = C((2, 1, 1, 2, 1, 1, 0, 0), _lengths(3, 6, 1, 4000) + (0, 5), seed=3, **common)
    inputs_a, inputs_b = build_inputs(case_a, "cuda"), build_inputs(case_b, "cuda")
    call = {**inputs_a["call"], "max_seqlen_q": 3, "max_seqlen_kv": 260 * 16}
    args = (inputs_a["q"], inputs_a["k"], inputs_a["v"], inputs_a["out"])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention_forward(*args, **call)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            attention_forward(*args, **call)
    finally:
        torch.cuda.set_sync_debug_mode("default")

    inputs_a["out_base"].fill_(7.0)
    graph.replay()
    torch.cuda.synchronize()
    check_output(case_a, inputs_a, GPU_TOLERANCE[case_a.dtype])

    inputs_a["q"][0].copy_(inputs_b["q"][0])
    for name in ("k", "v"):
        inputs_a[name].copy_(inputs_b[name])
    for name in ("cu_seqlens_q", "cu_seqlens_kv", "page_table", "q_start"):
        call[name].copy_(inputs_b["call"][name])
    inputs_a["out_base"].fill_(7.0)
    graph.replay()
    torch.cuda.synchronize()
    check_output(case_b, {**inputs_a, "expected": inputs_b["expected"], "q_start": inputs_b["q_start"]},
                 GPU_TOLERANCE[case_b.dtype])


def test_split_heuristic_agrees_with_single_split() -> None:
    case = C((1,), (32768,), heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, layout="paged",
             page_size=16, num_splits=None)
    inputs = build_inputs(case, "cuda")
    split_out = attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"].clone(), **inputs["call"])
    single_out = attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"].clone(),
                                   **{**inputs["call"], "num_splits": 1})
    torch.testing.assert_close(split_out.float(), single_out.float(), atol=2e-2, rtol=2e-2)
    check_output(replace(case, num_splits=1), {**inputs, "out": single_out}, GPU_TOLERANCE[case.dtype])


@pytest.mark.parametrize("q_lens, kv_lens, head_dim, pad", [
    ((1,) * 8, (300, 4000, 17, 1, 900, 64, 2048, 129), 128, 40),   # decode: the general kernel's tail programs
    ((1,) * 12 + (300, 700), (1000, 300, 64, 65, 17, 1, 4096, 2047, 300, 31, 128, 3000, 300, 2900), 128, 40),  # mixed
    # prefill (on an H100 / H200 the Gluon kernel: its grid's last sequence of programs); 300 rows outnumber the
    # 256 programs of (600, 1000) at d128; d64 runs three consumer groups
    ((600, 1000), (600, 1500), 128, 40),
    ((600, 1000), (600, 1500), 128, 300),
    ((600, 1000), (600, 1500), 64, 40),
    ((600, 1000), (600, 1500), 256, 40),
])
def test_zero_tail_thd_padding_rows_read_zero(q_lens: tuple, kv_lens: tuple, head_dim: int, pad: int) -> None:
    """thd over a paged cache with ``pad`` rows past the last sequence: zero_tail writes zeros there (on an H200 the
    general kernel's tail programs for the decodes, the mixed kernel's programs for the mixed batch, the Gluon
    prefill kernel's tail programs), in eager calls and in a CUDA graph replayed after the rows held garbage;
    the real rows match the reference."""
    from attention.kernels.attention_fwd import packed_attention_forward

    case = C(q_lens, kv_lens, heads=(32, 8), d_qk=head_dim, d_v=head_dim, dtype=torch.bfloat16, layout="paged",
             causal=True, bottom_right=True, num_splits=None)
    inputs = build_inputs(case, "cuda")
    a = inputs["call"]
    q = inputs["q"][0]
    real = int(a["cu_seqlens_q"][-1])
    padded_q = torch.cat([q[:real], torch.randn(pad, *q.shape[1:], dtype=q.dtype, device="cuda")])
    out = torch.full((padded_q.shape[0], 32 * head_dim), float("nan"), dtype=q.dtype, device="cuda")

    def call() -> object:
        return packed_attention_forward(
            padded_q, inputs["k"], inputs["v"], out, len(q_lens), a["cu_seqlens_q"], a["cu_seqlens_kv"],
            a["cu_seqlens_q"], None, a["page_table"], a["max_seqlen_q"], a["max_seqlen_kv"], padded_q.shape[0],
            a["softmax_scale"], True, -1, 0, True, None, None, None, True)

    plan = call()
    if len(q_lens) == 2 and torch.cuda.get_device_capability() == (9, 0):   # the prefills: the Gluon kernel's tail
        assert type(plan).__name__ == "HopperPlan", f"planned {plan}"
    assert bool((out[real:] == 0).all())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert bool((out[real:] == 0).all())
    inputs["out"][0][:real].copy_(out[:real].unflatten(-1, (32, head_dim)))
    check_output(case, inputs, GPU_TOLERANCE[case.dtype])
    # a replay whose last sequence brings 100 fewer queries: the tail starts where the device's cu_seqlens_q says
    if q_lens[-1] > 100:
        a["cu_seqlens_q"][-1] -= 100
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert bool((out[real - 100:] == 0).all()) and not bool(out[:real - 100].isnan().any())
