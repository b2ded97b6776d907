"""Tensors on a GPU that is not the current one: a model spread over GPUs in one process (transformers'
``device_map="auto"``) calls each layer with its own GPU's tensors and never changes the current device. Our
Triton launches (attention, split combine, KV append) and flash-attn-4 take the current device's stream, so each
launch makes its tensors' device current. Every call on cuda:1, with cuda:0 current, must give what the same call
gives on cuda:0 (whose results the other GPU tests check against the reference)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from attention.kernels.attention_fwd import attention_forward
from inference import InferenceParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (run on nvidia-h100-x2)")]

HEADS, HEADS_KV, HEAD_DIM = 8, 2, 64
STEPS = ({0: 40, 1: 24}, {0: 1, 1: 1}, {0: 1, 1: 1}, {0: 1, 1: 1, 2: 9}, {0: 1, 1: 1, 2: 1}, {1: 1, 2: 1},
         {2: 1, 1: 1})
"""A prefill, decodes, a mixed step (a sequence joins), decodes, one sequence gone, the rest in another order (a
non-paged cache moves its rows: the re-index kernel)."""


def _close(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=2e-2, rtol=2e-2)


def _serve(device: torch.device, backend: str | None, qkv_format: str, page_size: int | None) -> list[torch.Tensor]:
    """Two layers served over STEPS on ``device`` (inputs drawn on the CPU: the same on every device)."""
    generator = torch.Generator().manual_seed(0)
    params = InferenceParams(4, 256, HEADS_KV, HEAD_DIM, torch.bfloat16, is_paged=page_size is not None,
                             page_size=page_size, qkv_format=qkv_format, device=device)
    layers = []
    for number in (1, 2):
        params.allocate_memory(number)
        layers.append(DotProductAttention(HEADS, HEAD_DIM, HEADS_KV, qkv_format=qkv_format,
                                          attn_mask_type="padding_causal", layer_number=number, backend=backend))
    outputs = []
    for lengths in STEPS:
        params.pre_step(OrderedDict(lengths))
        shape = (sum(lengths.values()),) if qkv_format == "thd" else (len(lengths), max(lengths.values()))
        for layer in layers:
            q, k, v = (torch.randn(*shape, heads, HEAD_DIM, generator=generator, dtype=torch.bfloat16).to(device)
                       for heads in (HEADS, HEADS_KV, HEADS_KV))
            with torch.no_grad():
                outputs.append(layer(q, k, v, inference_params=params))
    return outputs


@pytest.mark.parametrize("backend", ["fused", "unfused", None])
@pytest.mark.parametrize("page_size", [16, None])
@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
def test_serving_on_a_gpu_that_is_not_current(backend, page_size, qkv_format):
    torch.cuda.set_device(0)
    expected = _serve(torch.device("cuda", 0), backend, qkv_format, page_size)
    got = _serve(torch.device("cuda", 1), backend, qkv_format, page_size)
    assert torch.cuda.current_device() == 0 and all(out.device.index == 1 for out in got)
    _close(got, expected)


@pytest.mark.parametrize("backend", ["fused", "flash4", None])
@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
def test_one_module_on_two_gpus_in_turn(backend, qkv_format):
    """One module's calls alternate between the GPUs (its kept plans are per device), prefill-sized (the Hopper
    prefill kernel on sm90) and small."""
    if backend == "flash4":
        pytest.importorskip("flash_attn.cute", reason="flash-attn-4 is not installed")
    torch.cuda.set_device(0)
    layer = DotProductAttention(HEADS, HEAD_DIM, HEADS_KV, qkv_format=qkv_format, attn_mask_type="causal",
                                backend=backend)
    generator = torch.Generator().manual_seed(1)
    for tokens in (512, 40, 512):
        shape = (2 * tokens,) if qkv_format == "thd" else (2, tokens)
        q, k, v = (torch.randn(*shape, heads, HEAD_DIM, generator=generator, dtype=torch.bfloat16)
                   for heads in (HEADS, HEADS_KV, HEADS_KV))
        extra = {}
        if qkv_format == "thd":
            extra = {"cu_seqlens_q": torch.tensor([0, tokens, 2 * tokens], dtype=torch.int32),
                     "max_seqlen_q": tokens, "max_seqlen_kv": tokens}
            extra["cu_seqlens_kv"] = extra["cu_seqlens_q"]
        outputs = []
        for index in (0, 1, 0, 1):
            device = torch.device("cuda", index)
            moved = {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in extra.items()}
            outputs.append(layer(q.to(device), k.to(device), v.to(device), **moved))
        assert torch.cuda.current_device() == 0 and [out.device.index for out in outputs] == [0, 1, 0, 1]
        _close(outputs[1:], outputs[:1] * 3)


def test_attention_forward_on_a_gpu_that_is_not_current():
    torch.cuda.set_device(0)
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(2, 300, HEADS, HEAD_DIM, generator=generator, dtype=torch.float16)
    k, v = (torch.randn(2, 700, HEADS_KV, HEAD_DIM, generator=generator, dtype=torch.float16) for _ in range(2))
    cu_q = torch.tensor([0, 300, 600], dtype=torch.int32)
    cu_kv = torch.tensor([0, 700, 1400], dtype=torch.int32)
    outputs = []
    for index in (0, 1, 1):
        device = torch.device("cuda", index)
        out = torch.zeros(2, 300, HEADS, HEAD_DIM, dtype=torch.float16, device=device)
        attention_forward(q.to(device), k.to(device), v.to(device), out, cu_seqlens_q=cu_q.to(device),
                          cu_seqlens_kv=cu_kv.to(device), max_seqlen_q=300, max_seqlen_kv=700,
                          softmax_scale=HEAD_DIM ** -0.5, causal=True, bottom_right=True)
        outputs.append(out)
    _close(outputs[1:], outputs[:1] * 2)
