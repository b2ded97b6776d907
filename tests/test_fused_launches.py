"""The fused backend's kernel plans kept under a module's call plan (attention.backends.fused_launches).

A repeat eager call launches the plan kept under its choice; what the signature and the choice leave
open (q's strides, the softmax scale, another cache object, the KV length's 16-key step) finds its own
plan. Every output is checked against tests/reference.py over the sequences' whole history, and the
launcher's long way (``packed_attention_forward``, which keys every tensor) is counted. On CPU the kernels run
in the Triton interpreter (fp32, head dim 16); on a GPU (``-m gpu``) in fp16 at head dim 64, which on an H200
takes the Hopper decode kernel and its direct launches.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import attention
from attention.backends.fused import FusedBackend
from attention.kernels.availability import kernels_interpreted
from inference import InferenceParams
from tests.reference import reference_attention

HEADS, GROUPS = 4, 2

pytestmark = pytest.mark.skipif(FusedBackend().availability_reason() is not None,
                                reason=f"fused backend unavailable: {FusedBackend().availability_reason()}")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    if request.param == "cpu" and torch.cuda.is_available() and not kernels_interpreted():
        pytest.skip("CPU tensors run the fused kernels only under TRITON_INTERPRET=1")
    return request.param


@pytest.fixture
def planned(monkeypatch):
    """How often the fused backend took packed_attention_forward (a plan not kept yet) and launch_plan (a kept one)."""
    from attention.backends import fused_launches

    counts = {"packed": 0, "kept": 0}
    packed, launch = fused_launches.packed_attention_forward, fused_launches.launch_plan

    def counting_packed(*args):
        counts["packed"] += 1
        return packed(*args)

    def counting_launch(*args):
        counts["kept"] += 1
        return launch(*args)

    monkeypatch.setattr(fused_launches, "packed_attention_forward", counting_packed)
    monkeypatch.setattr(fused_launches, "launch_plan", counting_launch)
    return counts


class Decode:
    """A thd decode through a paged cache, each step checked against the reference over every token so far."""

    def __init__(self, attn: attention.DotProductAttention, device: str, total_num_pages: int | None = None) -> None:
        self.attn = attn
        self.device = device
        self.dtype, self.dim, page_size = (torch.float32, 16, 4) if device == "cpu" else (torch.float16, 64, 16)
        self.tolerance = 1e-4 if device == "cpu" else 2e-3
        self.cache = InferenceParams(2, 64, GROUPS, self.dim, self.dtype, is_paged=True, page_size=page_size,
                                     total_num_pages=total_num_pages, device=device)
        self.cache.allocate_memory(1)
        self.history = {name: [[], []] for name in "qkv"}

    def step(self, lengths: tuple[int, int], q: torch.Tensor | None = None) -> None:
        total = sum(lengths)
        q = self.randn(total, HEADS, self.dim) if q is None else q
        k, v = self.randn(total, GROUPS, self.dim), self.randn(total, GROUPS, self.dim)
        self.cache.pre_step(OrderedDict(enumerate(lengths)))
        out = self.attn(q, k, v, inference_params=self.cache)
        start = 0
        for seq, length in enumerate(lengths):
            for name, x in (("q", q), ("k", k), ("v", v)):
                self.history[name][seq].append(x[start:start + length])
            keys, values = torch.cat(self.history["k"][seq]), torch.cat(self.history["v"][seq])
            want = reference_attention(
                q[start:start + length].float(), keys.float(), values.float(), qkv_format="thd",
                cu_seqlens_q=torch.tensor([0, length], dtype=torch.int32, device=self.device),
                cu_seqlens_kv=torch.tensor([0, keys.shape[0]], dtype=torch.int32, device=self.device),
                attn_mask_type="padding_causal_bottom_right", softmax_scale=self.attn.softmax_scale)
            torch.testing.assert_close(out[start:start + length].float().cpu(), want.cpu(), atol=self.tolerance,
                                       rtol=self.tolerance)
            start += length

    def randn(self, *size: int) -> torch.Tensor:
        return torch.randn(*size, dtype=self.dtype, device=self.device)


def _module(device: str) -> attention.DotProductAttention:
    return attention.DotProductAttention(HEADS, 16 if device == "cpu" else 64, num_gqa_groups=GROUPS,
                                         qkv_format="thd", attn_mask_type="padding_causal", layer_number=1,
                                         backend="fused")


def test_a_repeat_decode_step_launches_the_kept_plan_and_stays_right(planned, device):
    decode = Decode(_module(device), device)
    decode.step((5, 3))   # prefill: its own choice
    for _ in range(5):    # decodes to 10 keys: one choice, one 16-key step of the KV length
        decode.step((1, 1))
    assert planned == {"packed": 2, "kept": 4}
    assert ("fused", 1) in decode.cache.layout_memo


@pytest.mark.parametrize("change", ["q strides", "softmax scale", "another cache", "kv length past 16"])
def test_what_the_choice_leaves_open_finds_its_own_plan(planned, device, change):
    attn = _module(device)
    decode = Decode(attn, device)
    decode.step((13, 3))
    decode.step((1, 1))
    decode.step((1, 1))   # 15 keys in the first sequence
    assert planned == {"packed": 2, "kept": 1}
    if change == "q strides":   # the same sizes, every head's row twice as far apart
        decode.step((1, 1), q=decode.randn(2, HEADS, 2 * decode.dim)[..., :decode.dim])
    elif change == "softmax scale":
        attn.softmax_scale = 0.3
        decode.step((1, 1))
    elif change == "another cache":   # a page table of other sizes: the same signature and choice
        decode = Decode(attn, device, total_num_pages=40)
        decode.step((5, 3))
        decode.step((1, 1))
    else:
        decode.step((1, 1))   # 16 keys: the kept plan
        decode.step((1, 1))   # 17
    assert planned["packed"] == 3 + (change == "another cache")


def test_a_cache_object_without_a_layout_memo_keys_its_buffers_every_call(planned, device):
    decode = Decode(_module(device), device)
    del decode.cache.layout_memo
    for lengths in ((5, 3), (1, 1), (1, 1)):
        decode.step(lengths)
    assert planned == {"packed": 2, "kept": 1}
