"""The fused backend on the GPU with inputs the kernels do not read as given, and with padded thd offsets whose
values nothing checks there (``ATTN_CHECK_SEQLENS`` unset: no host sync): compared with tests/reference.py."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from inference import InferenceParams
from tests.reference import reference_attention

pytestmark = pytest.mark.gpu

DEVICE, DTYPE = "cuda", torch.bfloat16
H, H_KV, D = 8, 2, 128


def _reference(q, k, v, **kwargs) -> torch.Tensor:
    cpu = {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
    return reference_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), **cpu)


def _module(fmt: str) -> DotProductAttention:
    return DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format=fmt, attn_mask_type="padding_causal",
                               backend="fused")


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_strided_last_dim_and_cu_seqlens(fmt):
    lead = (2, 96) if fmt == "bshd" else (150,)
    cu = torch.tensor([0, 0, 64, 0, 150, 0], dtype=torch.int32, device=DEVICE)[::2]
    kwargs = {} if fmt == "bshd" else {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "max_seqlen_q": 86, "max_seqlen_kv": 86}
    module = _module(fmt)
    for strided in (True, False, True):
        q, k, v = (torch.randn(*lead, heads, 2 * D if strided else D, device=DEVICE, dtype=DTYPE)
                   for heads in (H, H_KV, H_KV))
        if strided:
            q, k, v = (x[..., ::2] for x in (q, k, v))
        out = module(q, k, v, **kwargs)
        expected = _reference(q, k, v, qkv_format=fmt, attn_mask_type="padding_causal",
                              **{name: value for name, value in kwargs.items() if name.startswith("cu_")})
        torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("pad_between_seqs", [None, False])
def test_padded_thd_offsets_whatever_the_hint(pad_between_seqs, monkeypatch):
    """Gaps between the sequences come back zero and every real row right, even with a (wrong) False hint
    that no value check refuses (the default on CUDA)."""
    monkeypatch.delenv("ATTN_CHECK_SEQLENS", raising=False)
    lengths, slots = torch.tensor([70, 33, 128]), torch.tensor([80, 40, 136])
    cu = torch.cat([torch.zeros(1), lengths.cumsum(0)]).int().to(DEVICE)
    cu_padded = torch.cat([torch.zeros(1), slots.cumsum(0)]).int().to(DEVICE)
    rows = int(slots.sum())
    q, k, v = (torch.randn(rows, heads, D, device=DEVICE, dtype=DTYPE) for heads in (H, H_KV, H_KV))
    kwargs = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "cu_seqlens_q_padded": cu_padded,
              "cu_seqlens_kv_padded": cu_padded}
    out = _module("thd")(q, k, v, max_seqlen_q=128, max_seqlen_kv=128, pad_between_seqs=pad_between_seqs, **kwargs)
    expected = _reference(q, k, v, qkv_format="thd", attn_mask_type="padding_causal", **kwargs)
    torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_a_query_short_of_the_cache_step_is_refused(fmt):
    """The fused kernel would read and write past q's end; the step's K/V are not appended."""
    params = InferenceParams(2, 256, H_KV, D, DTYPE, is_paged=True, page_size=16, qkv_format=fmt, device=DEVICE)
    params.allocate_memory(1)
    params.pre_step(OrderedDict({"a": 40, "b": 7}))
    lead, short = ((47,), (8,)) if fmt == "thd" else ((2, 40), (2, 8))
    q = torch.randn(*short, H, D, device=DEVICE, dtype=DTYPE)
    k, v = (torch.randn(*lead, H_KV, D, device=DEVICE, dtype=DTYPE) for _ in range(2))
    module = DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format=fmt, attn_mask_type="padding_causal",
                                 layer_number=1, backend="fused")
    k_cache = params.cache_manager.cache[1][0].clone()
    with pytest.raises(ValueError, match="query_layer"):
        module(q, k, v, inference_params=params)
    assert torch.equal(params.cache_manager.cache[1][0], k_cache)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("interleave", [-3, -2])
def test_packed_qkv_and_kv_layers(fmt, interleave):
    """TE's qkv_layer (MHA) and kv_layer (GQA): the kernels read q / k / v as strided views of one buffer
    ([..., 3, h, d] rows, or heads interleaved with the three)."""
    lead = {"bshd": (2, 160), "sbhd": (160, 2), "thd": (250,)}[fmt]
    cu = torch.tensor([0, 90, 250], dtype=torch.int32, device=DEVICE)
    kwargs = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "max_seqlen_q": 160, "max_seqlen_kv": 160} \
        if fmt == "thd" else {}
    lengths = {name: kwargs[name] for name in ("cu_seqlens_q", "cu_seqlens_kv") if name in kwargs}
    mask = "padding_causal" if fmt == "thd" else "causal"
    packed = torch.randn(*lead, *((3, H, D) if interleave == -3 else (H, 3, D)), device=DEVICE, dtype=DTYPE)
    mha = DotProductAttention(H, D, qkv_format=fmt, attn_mask_type=mask, backend="fused")
    out = mha(qkv_layer=packed, qkv_interleave_dim=interleave, **kwargs)
    q, k, v = packed.unbind(interleave)
    torch.testing.assert_close(out.float().cpu(), _reference(q, k, v, qkv_format=fmt, attn_mask_type=mask, **lengths),
                               atol=2e-2, rtol=2e-2)
    kv = torch.randn(*lead, *((2, H_KV, D) if interleave == -3 else (H_KV, 2, D)), device=DEVICE, dtype=DTYPE)
    gqa = DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format=fmt, attn_mask_type=mask, backend="fused")
    out = gqa(q, kv_layer=kv, qkv_interleave_dim=interleave, **kwargs)
    k, v = kv.unbind(interleave)
    torch.testing.assert_close(out.float().cpu(), _reference(q, k, v, qkv_format=fmt, attn_mask_type=mask, **lengths),
                               atol=2e-2, rtol=2e-2)
