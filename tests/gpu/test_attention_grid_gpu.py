"""The cross-backend grid on CUDA: bf16/fp16, realistic shapes, every backend against the fp32 oracle
(computed on the GPU) at the backend's own tolerance; plus the automatic choice of ``fused``.

Run on the lent H200: ``python -m pytest -q -m gpu tests/gpu/test_attention_grid_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from attention import DotProductAttention
from attention.selection import registry
from tests.test_attention_grid import (
    MASKS,
    Case,
    check_case,
    grid_params,
    is_causal,
    is_padding,
    make_inputs,
    make_module,
    reference_output,
)

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16
DEVICE = "cuda"
SHAPES = [(512, 512), (128, 1024), (1, 1024)]   # prefill, chunked prefill / cross, decode
HEADS = [(16, 16), (16, 4), (16, 1)]            # MHA, GQA, MQA


def _pad(mask: str, fmt: str) -> str:
    return "cu" if is_padding(mask) and fmt != "thd" else "none"


MASK_CASES = [
    Case(fmt=fmt, b=b, s_q=sq, s_kv=skv, h=h, h_kv=hk, d_qk=d, d_v=d, mask=mask, padding=_pad(mask, fmt), dtype=dtype)
    for mask in MASKS
    for (sq, skv) in SHAPES
    for (fmt, b, (h, hk), d, dtype) in (("bshd", 2, HEADS[0], 128, BF16), ("bshd", 4, HEADS[1], 64, FP16),
                                        ("sbhd", 2, HEADS[2], 128, BF16), ("bshd", 3, HEADS[1], 128, BF16))
] + [
    Case(fmt="thd", b=b, s_q=sq, s_kv=skv, h=h, h_kv=hk, d_qk=d, d_v=d, mask=mask, pad_between=pb, dtype=dtype)
    for mask in ("padding", "padding_causal", "padding_causal_bottom_right")
    for (sq, skv) in ((512, 512), (128, 1024), (1, 1024))
    for pb in (False, True)
    for (b, (h, hk), d, dtype) in ((4, HEADS[1], 128, BF16), (2, HEADS[0], 64, FP16))
]

HEAD_DIM_CASES = [
    Case(fmt=fmt, b=2, s_q=sq, s_kv=skv, h=16, h_kv=4, d_qk=dqk, d_v=dv, mask=mask, padding=_pad(mask, fmt),
         dtype=dtype)
    for (dqk, dv) in ((64, 64), (128, 128), (256, 256), (192, 128), (128, 64), (96, 96))
    for (fmt, mask) in (("bshd", "causal"), ("bshd", "padding_causal_bottom_right"), ("thd", "padding_causal"))
    for (sq, skv) in ((256, 256), (1, 768))
    for dtype in (BF16, FP16)
]

WINDOW_CASES = [
    Case(fmt=fmt, b=2, s_q=sq, s_kv=skv, h=16, h_kv=4, d_qk=128, d_v=128, mask=mask, window=w, bottom_right=br,
         padding=_pad(mask, fmt), dtype=dtype)
    for mask in MASKS
    for w in (((128, 0), (0, 0), (-1, 0)) if is_causal(mask) else ((64, 64), (256, 0), (0, 32)))
    for (sq, skv) in ((512, 512), (128, 1024))
    for br in ((None,) if is_causal(mask) else (True, False))
    for (fmt, dtype) in (("bshd", BF16),) + ((("thd", FP16),) if is_padding(mask) else ())
]

ALIBI_CASES = [
    Case(fmt=fmt, b=2, s_q=sq, s_kv=skv, h=16, h_kv=hk, d_qk=128, d_v=128, mask=mask, bias="alibi", alibi=alibi,
         bottom_right=br, padding=_pad(mask, fmt), dtype=dtype)
    for mask in ("no_mask", "padding", "causal", "causal_bottom_right", "padding_causal_bottom_right")
    for alibi in ("default", "h", "bh")
    for br in ((True, False) if not is_causal(mask) else (None,))
    for (sq, skv) in ((256, 256), (64, 512))
    for (fmt, hk, dtype) in (("bshd", 16, BF16), ("sbhd", 4, FP16))
] + [
    Case(fmt="thd", b=3, s_q=sq, s_kv=skv, h=16, h_kv=4, d_qk=64, d_v=64, mask=mask, bias="alibi", alibi=alibi,
         pad_between=True, dtype=BF16)
    for mask in ("padding", "padding_causal_bottom_right")
    for alibi in ("default", "bh")
    for (sq, skv) in ((256, 256), (64, 512))
]

BIAS_CASES = [
    Case(fmt=fmt, b=2, s_q=sq, s_kv=skv, h=16, h_kv=4, d_qk=64, d_v=64, mask=mask, bias=bias, bias_shape=shape,
         padding=_pad(mask, fmt), dtype=dtype)
    for bias in ("post_scale_bias", "pre_scale_bias")
    for shape in ("11ss", "1hss", "b1ss", "bhss", "111s")
    for mask in ("no_mask", "causal", "padding_causal_bottom_right")
    for (sq, skv) in ((256, 256), (128, 512))
    for (fmt, dtype) in (("bshd", BF16), ("sbhd", FP16))
]

SOFTMAX_CASES = [
    Case(fmt=fmt, b=3, s_q=sq, s_kv=skv, h=16, h_kv=4, d_qk=128, d_v=128, mask=mask, window=w, softmax=softmax,
         padding=_pad(mask, fmt), pad_between=fmt == "thd", dtype=dtype)
    for softmax in ("vanilla", "off-by-one", "learnable")
    for (fmt, mask, w) in (("bshd", "no_mask", None), ("bshd", "causal", None), ("bshd", "padding", None),
                           ("bshd", "causal", (128, 0)), ("thd", "padding_causal", None),
                           ("thd", "padding_causal_bottom_right", (64, 0)))
    for (sq, skv) in ((512, 512), (1, 1024))
    for dtype in (BF16, FP16)
]

PADDING_CASES = [
    Case(fmt=fmt, b=4, s_q=sq, s_kv=skv, h=16, h_kv=4, d_qk=128, d_v=128, mask=mask, padding="mask", dtype=dtype)
    for fmt in ("bshd", "sbhd")
    for mask in ("padding", "padding_causal", "padding_causal_bottom_right")
    for (sq, skv) in ((384, 384), (128, 640))
    for dtype in (BF16, FP16)
]

ARBITRARY_CASES = [
    Case(fmt="bshd", b=2, s_q=sq, s_kv=skv, h=16, h_kv=4, d_qk=64, d_v=64, mask="arbitrary", arbitrary=shape,
         dtype=dtype)
    for shape in ("b1ss", "1hss", "bhss", "11ss")
    for (sq, skv) in ((256, 256), (128, 512))
    for dtype in (BF16, FP16)
]


def _params(cases):
    return grid_params(cases, keep_slow=len(cases))


@pytest.mark.parametrize("backend,case", _params(MASK_CASES))
def test_masks_heads_shapes_gpu(backend, case):
    check_case(case, backend, DEVICE)


@pytest.mark.parametrize("backend,case", _params(HEAD_DIM_CASES))
def test_head_dims_gpu(backend, case):
    check_case(case, backend, DEVICE)


@pytest.mark.parametrize("backend,case", _params(WINDOW_CASES))
def test_sliding_windows_gpu(backend, case):
    check_case(case, backend, DEVICE)


@pytest.mark.parametrize("backend,case", _params(ALIBI_CASES))
def test_alibi_gpu(backend, case):
    check_case(case, backend, DEVICE)


@pytest.mark.parametrize("backend,case", _params(BIAS_CASES))
def test_bias_tensors_gpu(backend, case):
    check_case(case, backend, DEVICE)


@pytest.mark.parametrize("backend,case", _params(SOFTMAX_CASES))
def test_softmax_types_gpu(backend, case):
    check_case(case, backend, DEVICE)


@pytest.mark.parametrize("backend,case", _params(PADDING_CASES))
def test_padding_masks_gpu(backend, case):
    check_case(case, backend, DEVICE)


@pytest.mark.parametrize("backend,case", _params(ARBITRARY_CASES))
def test_arbitrary_mask_gpu(backend, case):
    check_case(case, backend, DEVICE)


# ------------------------------------------------------------------------------------------------
# The automatic choice on CUDA
# ------------------------------------------------------------------------------------------------

AUTO_CASES = [
    Case(fmt="bshd", b=2, s_q=1024, s_kv=1024, h=16, h_kv=4, d_qk=128, d_v=128, mask="causal", dtype=BF16),
    Case(fmt="sbhd", b=2, s_q=512, s_kv=512, h=16, h_kv=16, d_qk=64, d_v=64, mask="no_mask", dtype=FP16),
    Case(fmt="bshd", b=4, s_q=1, s_kv=1024, h=16, h_kv=1, d_qk=128, d_v=128, mask="causal_bottom_right", dtype=BF16),
    Case(fmt="thd", b=4, s_q=512, s_kv=512, h=16, h_kv=4, d_qk=128, d_v=128, mask="padding_causal", dtype=BF16),
    Case(fmt="thd", b=3, s_q=256, s_kv=256, h=16, h_kv=4, d_qk=64, d_v=64, mask="padding_causal_bottom_right",
         pad_between=True, dtype=FP16),
    Case(fmt="bshd", b=2, s_q=512, s_kv=512, h=16, h_kv=4, d_qk=256, d_v=256, mask="padding_causal",
         padding="mask", dtype=BF16),
    Case(fmt="bshd", b=2, s_q=512, s_kv=512, h=16, h_kv=4, d_qk=128, d_v=128, mask="causal", window=(128, 0),
         dtype=BF16),
    Case(fmt="bshd", b=2, s_q=256, s_kv=256, h=16, h_kv=16, d_qk=128, d_v=128, mask="causal", bias="alibi",
         alibi="default", dtype=FP16),
    Case(fmt="bshd", b=2, s_q=256, s_kv=256, h=16, h_kv=4, d_qk=128, d_v=128, mask="causal", softmax="off-by-one",
         dtype=BF16),
    Case(fmt="bshd", b=2, s_q=256, s_kv=256, h=16, h_kv=4, d_qk=192, d_v=128, mask="causal", dtype=BF16),
]


@pytest.mark.parametrize("case", AUTO_CASES, ids=lambda c: c.id)
def test_automatic_choice_is_fused_on_cuda(case):
    """Without ``backend=``, a supported fp16/bf16 inference call on CUDA runs the Triton kernels."""
    inputs = make_inputs(case, DEVICE)
    module = make_module(case, inputs, None, DEVICE)
    q, k, v, fwd = inputs["q"], inputs["k"], inputs["v"], inputs["fwd"]
    with torch.no_grad():
        text = module.explain(q, k, v, **fwd)
        out = module(q, k, v, **fwd)
    assert module.last_backend == "fused", text
    assert text.startswith("Selected backend: fused"), text
    atol, rtol = registry()["fused"].capabilities.tolerances[case.dtype]
    torch.testing.assert_close(out.float(), reference_output(inputs), atol=atol, rtol=rtol)


def test_training_call_on_cuda_avoids_fused():
    """With inputs that require grad the forward-only fused backend is passed over."""
    q = torch.randn(2, 256, 16, 128, device=DEVICE, dtype=BF16, requires_grad=True)
    k = torch.randn(2, 256, 4, 128, device=DEVICE, dtype=BF16, requires_grad=True)
    v = torch.randn(2, 256, 4, 128, device=DEVICE, dtype=BF16, requires_grad=True)
    module = DotProductAttention(16, 128, num_gqa_groups=4, qkv_format="bshd", attn_mask_type="causal")
    out = module(q, k, v)
    assert module.last_backend != "fused"
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
