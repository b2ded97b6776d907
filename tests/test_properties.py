"""Property-based tests (hypothesis), with a fixed, derandomised example budget so CI is reproducible.

1. Random shapes, formats, masks and windows: every backend that says it can run a call agrees with
   the fp32 reference (``tests/reference.py``) at its own tolerance.
2. Random serving traces (arrivals, per-sequence step lengths, finishes, page exhaustion) through
   ``InferenceParams``: every new token's output matches a full recomputation, and the page
   accounting stays exact; a refused step (``KVCacheFullError``) changes nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention import DotProductAttention, explain
from attention.selection import registry
from tests.reference import reference_attention, reference_one_sequence

try:
    from inference import InferenceParams, KVCacheFullError
except ImportError:  # pragma: no cover - while inference/ is being written
    InferenceParams = KVCacheFullError = None

PROFILE = settings(max_examples=30, deadline=None, derandomize=True, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CAUSAL = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")


def _tolerance(name: str, dtype: torch.dtype) -> tuple[float, float]:
    return registry()[name].capabilities.tolerances.get(dtype, (1e-4, 1e-4))


def _runnable(module: DotProductAttention, q, k, v, **kwargs) -> bool:
    return explain(module, q, k, v, **kwargs).startswith("Selected backend:")


@st.composite
def attention_cases(draw):
    fmt = draw(st.sampled_from(("bshd", "sbhd", "thd")))
    masks = ("padding", "padding_causal", "padding_causal_bottom_right") if fmt == "thd" else (
        "no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
        "arbitrary")
    mask_type = draw(st.sampled_from(masks))
    b = draw(st.integers(1, 3))
    h_kv = draw(st.sampled_from((1, 2)))
    h = h_kv * draw(st.sampled_from((1, 2)))
    d = draw(st.sampled_from((8, 16)))
    s_q, s_kv = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    if "padding" in mask_type:
        lens_q = draw(st.lists(st.integers(1, s_q), min_size=b, max_size=b))
        lens_kv = draw(st.lists(st.integers(1, s_kv), min_size=b, max_size=b))
    else:
        lens_q, lens_kv = [s_q] * b, [s_kv] * b
    gaps = draw(st.lists(st.integers(0, 2), min_size=2 * b, max_size=2 * b)) if fmt == "thd" and draw(
        st.booleans()) else None
    if draw(st.booleans()):
        window = None
    elif mask_type in CAUSAL:
        window = (draw(st.integers(0, 6)), 0)
    else:
        window = (draw(st.integers(0, 6)), draw(st.integers(0, 6)))
    return dict(fmt=fmt, mask_type=mask_type, b=b, h=h, h_kv=h_kv, d=d, s_q=s_q, s_kv=s_kv, lens_q=lens_q,
                lens_kv=lens_kv, gaps=gaps, window=window, seed=draw(st.integers(0, 2**16)))


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _make_inputs(c: dict):
    g = torch.Generator().manual_seed(c["seed"])
    kwargs: dict = {}
    ref_kwargs: dict = {}
    if c["fmt"] == "thd":
        cu_q, cu_kv = _cu(c["lens_q"]), _cu(c["lens_kv"])
        if c["gaps"] is not None:
            gq, gkv = c["gaps"][: c["b"]], c["gaps"][c["b"]:]
            cu_q_pad = _cu([n + gap for n, gap in zip(c["lens_q"], gq)])
            cu_kv_pad = _cu([n + gap for n, gap in zip(c["lens_kv"], gkv)])
            kwargs.update(cu_seqlens_q_padded=cu_q_pad, cu_seqlens_kv_padded=cu_kv_pad)
            t_q, t_kv = int(cu_q_pad[-1]), int(cu_kv_pad[-1])
        else:
            t_q, t_kv = int(cu_q[-1]), int(cu_kv[-1])
        shape_q, shape_kv = (t_q,), (t_kv,)
        kwargs.update(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
    else:
        b, s_q, s_kv = c["b"], c["s_q"], c["s_kv"]
        shape_q, shape_kv = ((b, s_q), (b, s_kv)) if c["fmt"] == "bshd" else ((s_q, b), (s_kv, b))
        if "padding" in c["mask_type"]:
            kwargs.update(cu_seqlens_q=_cu(c["lens_q"]), cu_seqlens_kv=_cu(c["lens_kv"]))
        if c["mask_type"] == "arbitrary":
            kwargs["attention_mask"] = torch.rand(b, 1, s_q, s_kv, generator=g) < 0.3
    q = torch.randn(*shape_q, c["h"], c["d"], generator=g)
    k = torch.randn(*shape_kv, c["h_kv"], c["d"], generator=g)
    v = torch.randn(*shape_kv, c["h_kv"], c["d"], generator=g)
    ref_kwargs = {key: value for key, value in kwargs.items() if key != "attention_mask"}
    ref_kwargs["attention_mask"] = kwargs.get("attention_mask")
    return q, k, v, kwargs, ref_kwargs


@PROFILE
@given(case=attention_cases())
def test_every_backend_matches_the_reference(case: dict) -> None:
    q, k, v, kwargs, ref_kwargs = _make_inputs(case)
    expected = reference_attention(q, k, v, qkv_format=case["fmt"], attn_mask_type=case["mask_type"],
                                   window_size=case["window"] if case["window"] is not None else (
                                       (-1, 0) if case["mask_type"] in CAUSAL else None), **ref_kwargs)
    ran = []
    for name in registry():
        module = DotProductAttention(case["h"], case["d"], num_gqa_groups=case["h_kv"], qkv_format=case["fmt"],
                                     attn_mask_type=case["mask_type"], window_size=case["window"], backend=name)
        if not _runnable(module, q, k, v, **kwargs):
            continue
        out = module(q, k, v, **kwargs)
        atol, rtol = _tolerance(name, q.dtype)
        torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")
        ran.append(name)
    assert "unfused" in ran


# --- serving traces ---------------------------------------------------------------------------------

H, H_KV, D, PAGE, MAX_BATCH, MAX_SEQ = 2, 1, 8, 4, 3, 16
#: Backends that run on this CPU (the fused kernels through the Triton interpreter).
CPU_BACKENDS = tuple(n for n, b in registry().items()
                     if b.availability_reason() is None and "cpu" in b.capabilities.device_types)


@st.composite
def serving_traces(draw):
    """Per step: new prompts (length), then for each running sequence finish it or give a step length."""
    steps = []
    for _ in range(draw(st.integers(2, 7))):
        arrivals = draw(st.lists(st.integers(1, 12), max_size=2))
        moves = draw(st.lists(st.one_of(st.none(), st.integers(1, 3)), min_size=MAX_BATCH, max_size=MAX_BATCH))
        steps.append((arrivals, moves))
    return dict(steps=steps, paged=draw(st.booleans()), total_pages=draw(st.integers(3, 7)),
                fmt=draw(st.sampled_from(("bshd", "thd"))), backend=draw(st.sampled_from(CPU_BACKENDS)),
                seed=draw(st.integers(0, 2**16)))


def _check_pages(ip) -> None:
    manager = ip.cache_manager
    owned = {seq: manager.get_page_list(seq) for seq in ip.sequences}
    flat = [p for pages in owned.values() for p in pages]
    assert len(flat) == len(set(flat)), "a page belongs to two sequences"
    assert len(flat) + manager.allocator.num_free == ip.total_num_pages
    assert set(flat).isdisjoint(manager.allocator.free_pages)
    expected_table = torch.zeros_like(manager.page_table)
    for row, (seq, length) in enumerate(ip.sequences.items()):
        assert len(owned[seq]) == math.ceil(length / PAGE)
        expected_table[row, : len(owned[seq])] = torch.tensor(owned[seq], dtype=torch.int32)
    assert torch.equal(manager.page_table, expected_table), "the page table is not rows of pages, zeros after"


def _state(ip):
    state = (OrderedDict(ip.sequences), ip.cu_seqlens_q.clone(), ip.cu_seqlens_kv.clone())
    if ip.is_paged:
        state += (ip.cache_manager.page_table.clone(), list(ip.cache_manager.allocator.free_pages))
    return state


def _same(a, b) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


@pytest.mark.skipif(InferenceParams is None, reason="inference is not importable yet")
@PROFILE
@given(trace=serving_traces())
def test_serving_trace_outputs_and_page_accounting(trace: dict) -> None:
    g = torch.Generator().manual_seed(trace["seed"])
    paging = dict(is_paged=True, page_size=PAGE, total_num_pages=trace["total_pages"]) if trace["paged"] else {}
    ip = InferenceParams(MAX_BATCH, MAX_SEQ, num_heads_kv=H_KV, head_dim_k=D, dtype=torch.float32,
                         device="cpu", qkv_format=trace["fmt"], **paging)
    ip.allocate_memory(1)
    attn = DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format=trace["fmt"],
                               attn_mask_type="padding_causal", layer_number=1,
                               backend=[trace["backend"], "unfused"])   # unfused when fused cannot run fp32
    history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    next_id = 0
    for arrivals, moves in trace["steps"]:
        step: OrderedDict[int, int] = OrderedDict()
        for seq, move in zip(list(ip.sequences), moves):
            if move is not None and ip.sequences[seq] + move <= MAX_SEQ:
                step[seq] = move
        for length in arrivals:
            if len(step) < MAX_BATCH:
                step[next_id] = length
                next_id += 1
        while True:   # page exhaustion: drop the newest entry and retry; a refusal changes nothing
            if not step:
                break
            before = _state(ip)
            try:
                ip.pre_step(step)
                break
            except KVCacheFullError as error:
                assert error.pages_needed > error.pages_free
                assert _same(_state(ip), before)
                step.popitem(last=True)
        if not step:
            continue
        for seq in list(history):
            if seq not in step:
                del history[seq]
        if ip.is_paged:
            _check_pages(ip)
        lens = list(step.values())
        new = {seq: [torch.randn(n, h, D, generator=g) for h in (H, H_KV, H_KV)] for seq, n in step.items()}
        if trace["fmt"] == "thd":
            q, k, v = (torch.cat([new[s][i] for s in step]) for i in range(3))
            out = attn(q, k, v, cu_seqlens_q=ip.cu_seqlens_q[: len(step) + 1], max_seqlen_q=max(lens),
                       inference_params=ip)
            rows = torch.split(out, lens)
        else:
            q, k, v = (torch.zeros(len(step), max(lens), h, D) for h in (H, H_KV, H_KV))
            for row, seq in enumerate(step):
                n = step[seq]
                q[row, :n], k[row, :n], v[row, :n] = new[seq]
            out = attn(q, k, v, inference_params=ip)
            rows = [out[row, :n] for row, n in enumerate(lens)]
            for row, n in enumerate(lens):
                assert out[row, n:].eq(0).all(), "padded query rows must be zero"
        for row, seq in enumerate(step):
            k_all = torch.cat([history[seq][0], new[seq][1]]) if seq in history else new[seq][1]
            v_all = torch.cat([history[seq][1], new[seq][2]]) if seq in history else new[seq][2]
            history[seq] = (k_all, v_all)
            expected = reference_one_sequence(new[seq][0], k_all, v_all, causal=True, bottom_right=True)
            atol, rtol = _tolerance(attn.last_backend, torch.float32)
            torch.testing.assert_close(rows[row].reshape(expected.shape), expected, atol=atol, rtol=rtol)
        assert dict(ip.sequences) == {seq: history[seq][0].shape[0] for seq in step}
