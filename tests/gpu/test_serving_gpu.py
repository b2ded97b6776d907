"""An eager serving step on the GPU makes no host sync: ``pre_step`` and every layer's
``DotProductAttention`` call (KV append + fused attention) only queue work, so the host can run ahead
of the GPU. ``torch.cuda.set_sync_debug_mode("error")`` turns any synchronizing call into an error."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from inference import InferenceParams

pytestmark = pytest.mark.gpu

HEADS, HEADS_KV, HEAD_DIM, LAYERS = 8, 2, 64, 2


@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
@pytest.mark.parametrize("page_size", [16, None])
def test_an_eager_serving_step_makes_no_host_sync(qkv_format, page_size):
    device, dtype = torch.device("cuda"), torch.bfloat16
    params = InferenceParams(4, 512, HEADS_KV, HEAD_DIM, dtype, is_paged=page_size is not None, page_size=page_size,
                             max_ctx_len=64, qkv_format=qkv_format, device=device)
    layers = []
    for number in range(1, LAYERS + 1):
        params.allocate_memory(number)
        layers.append(DotProductAttention(HEADS, HEAD_DIM, HEADS_KV, qkv_format=qkv_format,
                                          attn_mask_type="padding_causal", layer_number=number, backend="fused"))

    def step(lengths: dict[int, int]) -> torch.Tensor:
        params.pre_step(OrderedDict(lengths))
        if qkv_format == "thd":
            shape = (sum(lengths.values()),)
        else:
            shape = (len(lengths), max(lengths.values()))
        out = None
        for layer in layers:
            q = torch.randn(*shape, HEADS, HEAD_DIM, device=device, dtype=dtype)
            k, v = (torch.randn(*shape, HEADS_KV, HEAD_DIM, device=device, dtype=dtype) for _ in range(2))
            out = layer(q, k, v, inference_params=params)   # thd: the cache supplies cu_seqlens
        return out

    step({0: 40, 1: 24})          # prefill, compiles
    step({0: 1, 1: 1})            # the first decode step compiles its kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):       # 20 decode steps cross a page boundary (page 16)
            out = step({0: 1, 1: 1})
        out = step({0: 1, 1: 1, 2: 9})   # a new sequence joins with a prefill: a mixed step
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("backend", ["fused", None])
@pytest.mark.parametrize("page_size", [16, None])
def test_a_decode_batch_padded_to_max_batch_size_matches_the_step(backend, page_size):
    """TE's CUDA-graph recipe: a bshd step at max_batch_size rows, rows past batch_size padding. The real rows match
    the step at its own batch (prefill, then decodes: the Gluon decode kernel on sm90), the padding rows are zero."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    outputs = []
    for batch in (8, 3):
        params = InferenceParams(8, 512, HEADS_KV, HEAD_DIM, dtype, is_paged=page_size is not None,
                                 page_size=page_size, device=device)
        params.allocate_memory(1)
        layer = DotProductAttention(HEADS, HEAD_DIM, HEADS_KV, qkv_format="bshd", attn_mask_type="padding_causal",
                                    layer_number=1, backend=backend)
        generator = torch.Generator(device=device).manual_seed(1)
        out = []
        for lengths in ({0: 40, 1: 24, 2: 7}, {0: 1, 1: 1, 2: 1}, {0: 1, 1: 1, 2: 1}):
            params.pre_step(OrderedDict(lengths))
            shape = (8, max(lengths.values()))
            q = torch.randn(*shape, HEADS, HEAD_DIM, device=device, dtype=dtype, generator=generator)
            k, v = (torch.randn(*shape, HEADS_KV, HEAD_DIM, device=device, dtype=dtype, generator=generator)
                    for _ in range(2))
            with torch.no_grad():
                out.append(layer(q[:batch], k[:batch], v[:batch], inference_params=params))
        outputs.append(out)
    for padded, exact in zip(*outputs):
        torch.testing.assert_close(padded[:3], exact, atol=2e-2, rtol=2e-2)
        assert padded[3:].eq(0).all()
