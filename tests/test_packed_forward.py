"""``packed_attention_forward``: the fused backend's positional launcher path (3-D thd tensors,
cu_seqlens-style starts) computes what ``attention_forward`` computes, and its launch plans are keyed
so that a changed stride, dtype or batch is planned (and validated) afresh, never served a stale plan."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import triton_available
from tests.test_kernels import SENTINEL, C, build_inputs, check_output

pytestmark = pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))


def _packed_call(inputs: dict, q: torch.Tensor | None = None, batch: int | None = None,
                 out: torch.Tensor | None = None) -> None:
    """The case's call through packed_attention_forward, with q, k, v and out as 3-D thd views."""
    from attention.kernels.attention_fwd import packed_attention_forward

    a = inputs["call"]
    cu_style = [None if x is None else torch.cat([x, x[-1:]]) for x in (a.get("q_start"), a.get("kv_start"))]
    q = inputs["q"][0] if q is None else q
    packed_attention_forward(
        q, inputs["k"][0], inputs["v"][0], inputs["out"][0] if out is None else out,
        inputs["q"].shape[0] if batch is None else batch,
        a["cu_seqlens_q"], a["cu_seqlens_kv"], *cu_style, None, a["max_seqlen_q"], a["max_seqlen_kv"],
        a["total_q"], a["softmax_scale"], a["causal"], *a["window_size"], a["bottom_right"], a["alibi_slopes"],
        a["softmax_offset"], a["num_splits"])


def test_packed_thd_matches_the_reference_and_new_metadata_gets_a_new_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    from attention.kernels import attention_fwd

    monkeypatch.setattr(attention_fwd, "_plans", {})
    case = C((3, 2), (5, 7), layout="thd", causal=True, bottom_right=True)
    inputs = build_inputs(case)
    _packed_call(inputs)
    check_output(case, inputs)
    _packed_call(inputs)   # a repeat call: the same plan
    assert len(attention_fwd._plans) == 1

    q = inputs["q"][0]
    # another head stride
    strided = torch.empty(q.shape[0], q.shape[1] + 1, q.shape[2], dtype=q.dtype, device=q.device)[:, 1:]
    strided.copy_(q)
    inputs["out"].fill_(SENTINEL)
    _packed_call(inputs, strided)
    check_output(case, inputs)
    assert len(attention_fwd._plans) == 2

    with pytest.raises(ValueError, match="dtype"):
        _packed_call(inputs, q.half())
    with pytest.raises(ValueError, match="cu_seqlens_q must have length 2"):
        _packed_call(inputs, batch=1)   # a batch the cu_seqlens do not describe
    assert len(attention_fwd._plans) == 2


def test_starts_that_are_not_the_cu_seqlens_are_keyed_on_their_own_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan key marks q_start / kv_start that are the cu_seqlens themselves; any other start tensor is keyed
    (and validated) on its own metadata, however the cu_seqlens look."""
    from attention.kernels import attention_fwd

    monkeypatch.setattr(attention_fwd, "_plans", {})
    case = C((3, 2), (5, 7), layout="thd")
    inputs = build_inputs(case)
    a = inputs["call"]
    cu_q, cu_kv = a["cu_seqlens_q"], a["cu_seqlens_kv"]
    batch = inputs["q"].shape[0]

    def call(q_start: torch.Tensor, kv_start: torch.Tensor) -> None:
        attention_fwd.packed_attention_forward(
            inputs["q"][0], inputs["k"][0], inputs["v"][0], inputs["out"][0], batch, cu_q, cu_kv, q_start, kv_start,
            None, a["max_seqlen_q"], a["max_seqlen_kv"], a["total_q"], a["softmax_scale"], False, -1, -1, False,
            None, None, None)

    call(cu_q, cu_kv)   # starts = cu_seqlens (ignoring the case's padded layout: only the keys matter here)
    first = inputs["out"].clone()
    inputs["out"].fill_(SENTINEL)
    call(cu_q.clone(), cu_kv.clone())   # equal metadata, other tensors: planned once more, same result
    assert len(attention_fwd._plans) == 2
    torch.testing.assert_close(inputs["out"], first, rtol=0, atol=0)
    with pytest.raises(ValueError, match="q_start"):
        call(cu_q.long(), cu_kv)
    with pytest.raises(ValueError, match="kv_start"):
        call(cu_q, cu_kv.long())


def test_a_changed_environment_switch_gets_a_new_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans are keyed on ATTN_FUSED_VARIANTS, ATTN_FUSED_HOPPER and TRITON_INTERPRET as they are at each call."""
    from attention.kernels import attention_fwd
    from attention.kernels.configs import VARIANTS_ENV
    from attention.kernels.hopper_forward import HOPPER_ENV

    monkeypatch.setattr(attention_fwd, "_plans", {})
    case = C((3, 2), (5, 7), layout="thd", causal=True, bottom_right=True)
    inputs = build_inputs(case)
    _packed_call(inputs)
    _packed_call(inputs)
    assert len(attention_fwd._plans) == 1
    monkeypatch.setenv(VARIANTS_ENV, "decode/paged=int32_offsets")
    _packed_call(inputs)
    assert len(attention_fwd._plans) == 2
    monkeypatch.setenv("TRITON_INTERPRET", "true")   # the same meaning as "1", another value
    inputs["out"].fill_(SENTINEL)
    _packed_call(inputs)
    check_output(case, inputs)
    assert len(attention_fwd._plans) == 3
    monkeypatch.setenv(HOPPER_ENV, "0")
    _packed_call(inputs)
    assert len(attention_fwd._plans) == 4


def test_an_output_with_flattened_heads_gets_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """out may be [T, H * D_v] (DotProductAttention's layout): the same values land in it, under a plan of its own."""
    from attention.kernels import attention_fwd

    monkeypatch.setattr(attention_fwd, "_plans", {})
    case = C((3, 2), (5, 7), layout="thd", causal=True, bottom_right=True)
    inputs = build_inputs(case)
    _packed_call(inputs)
    check_output(case, inputs)
    unflat = inputs["out"][0]
    flat = torch.full((unflat.shape[0], unflat.shape[1] * unflat.shape[2]), SENTINEL, dtype=unflat.dtype,
                      device=unflat.device)
    _packed_call(inputs, out=flat)
    _packed_call(inputs, out=flat)
    assert len(attention_fwd._plans) == 2
    torch.testing.assert_close(flat.unflatten(-1, unflat.shape[1:]), unflat, rtol=0, atol=0)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("layout", ["cache", "paged"])
def test_zero_tail_writes_zeros_past_the_last_sequence(monkeypatch: pytest.MonkeyPatch, layout: str,
                                                       num_splits: int) -> None:
    """thd rows past cu_seqlens_q[-1] (padding) come out zero with zero_tail, from the kernel's tail programs
    (the split-KV path too); without it they are left alone. The real rows match the reference either way."""
    from attention.kernels import attention_fwd

    monkeypatch.setattr(attention_fwd, "_plans", {})
    case = C((3, 1, 4), (5, 9, 4), layout=layout, causal=True, bottom_right=True, num_splits=num_splits)
    inputs = build_inputs(case)
    a = inputs["call"]
    q = inputs["q"][0]
    real = int(a["cu_seqlens_q"][-1])
    # 37 rows of no sequence
    padded_q = torch.cat([q, torch.randn(37, *q.shape[1:], dtype=q.dtype, device=q.device)])
    out = torch.full((padded_q.shape[0], *q.shape[1:-1], case.d_v), SENTINEL, dtype=q.dtype, device=q.device)
    for zero_tail in (False, True):
        attention_fwd.packed_attention_forward(
            padded_q, inputs["k"], inputs["v"], out, len(case.q_lens), a["cu_seqlens_q"], a["cu_seqlens_kv"],
            a["cu_seqlens_q"], None, a.get("page_table"), a["max_seqlen_q"], a["max_seqlen_kv"], padded_q.shape[0],
            a["softmax_scale"], True, -1, 0, True, None, None, a["num_splits"], zero_tail)
        tail = out[real:]
        assert bool((tail == 0).all()) if zero_tail else bool((tail == SENTINEL).all())
    inputs["out"][0][:real].copy_(out[:real])  # (sequences back to back: the case's q_start is the cu_seqlens)
    check_output(case, inputs)


def test_zero_tail_needs_thd_rows() -> None:
    from attention.kernels import attention_forward

    q = torch.zeros(2, 4, 2, 16)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="zero_tail needs thd rows"):
        attention_forward(q, q, q, torch.zeros_like(q), cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4,
                          max_seqlen_kv=4, softmax_scale=0.25, zero_tail=True)


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 255, 256, 257, 511, 4095, 4096, 4097, 32767, 40000, 131073])
def test_a_plans_kv_length_bounds_the_calls_by_at_most_a_sixteenth_above_256(length: int) -> None:
    """kv_length_bucket: a multiple of 16 at or above the call's length, at most 1/16 of it above from 256 keys on,
    and never past the next power of two (the configuration tables' bounds)."""
    from attention.kernels.attention_fwd import kv_length_bucket

    bucket = kv_length_bucket(length)
    assert length <= bucket and bucket % 16 == 0
    assert bucket - length < max(16, length / 16)
    assert bucket <= 1 << max(0, (length - 1).bit_length()) or bucket == 16


@pytest.mark.parametrize(("length", "total", "seqs"), [(4097, 3000, 3), (300, None, 2), (256, 256, 1), (64, 0, 4)])
def test_remembered_kv_length_buckets_are_the_arithmetics(length: int, total: int | None, seqs: int) -> None:
    """kv_length_buckets: the bucket and the mean's bucket, the same from memory as computed; a negative total is
    refused every time (nothing remembered for it)."""
    from attention.kernels.attention_fwd import kv_length_bucket, kv_length_buckets, mean_kv_length

    expected = (kv_length_bucket(length), mean_kv_length(total, seqs, kv_length_bucket(length)))
    assert kv_length_buckets(length, total, seqs) == expected
    assert kv_length_buckets(length, total, seqs) == expected   # the remembered pair
    for _ in range(2):
        with pytest.raises(ValueError, match="total_kv must be >= 0"):
            kv_length_buckets(length, -1, seqs)
