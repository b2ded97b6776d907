"""The fused backend's plumbing around the kernel (the kernel itself: tests/test_kernels.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attention.backends.fused import output_rows_may_be_padding
from attention.params import AttentionParams

PARAMS = AttentionParams(dtype=torch.float16, device_type="cpu")


@pytest.mark.parametrize("fields, q_shape, expected", [
    (dict(kv_cache="paged", qkv_format="bshd"), (8, 1, 4, 16), False),     # decode: every row a real token
    (dict(kv_cache="paged", qkv_format="sbhd"), (1, 8, 4, 16), False),
    (dict(kv_cache="paged", qkv_format="bshd"), (8, 3, 4, 16), True),      # chunks of unequal length
    (dict(kv_cache="non_paged", qkv_format="thd"), (9, 4, 16), True),
    (dict(kv_cache="paged", qkv_format="bshd", pad_between_seqs=True), (8, 1, 4, 16), True),
    (dict(attn_mask_type="padding_causal"), (2, 5, 4, 16), True),
    (dict(attn_mask_type="causal"), (2, 5, 4, 16), False),
])
def test_fused_output_starts_from_zeros_only_where_rows_can_be_padding(fields, q_shape, expected) -> None:
    assert output_rows_may_be_padding(replace(PARAMS, **fields), torch.Size(q_shape)) is expected


def test_eager_cache_steps_size_split_kv_on_the_longest_sequence_not_the_capacity() -> None:
    """A 64k-token cache holding sequences of 30 and 257 tokens: split-KV is sized for 257 in an
    eager step; without InferenceParams (no cache) max_seqlen_kv stands as given."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from attention.backends.fused import split_sizing_kv_length
    from inference import InferenceParams

    params = InferenceParams(2, 1 << 16, 2, 16, torch.float16, is_paged=True, page_size=16, device="cpu")
    params.pre_step(OrderedDict({"a": 30, "b": 256}))
    params.pre_step(OrderedDict({"a": 1, "b": 1}))
    assert params.longest_sequence == 257
    query = torch.empty(2, 1, 4, 16)
    assert split_sizing_kv_length(SimpleNamespace(inference_params=params, max_seqlen_kv=1 << 16, query=query)) == 257
    assert split_sizing_kv_length(SimpleNamespace(inference_params=None, max_seqlen_kv=900, query=query)) == 900
    params.reset()
    assert params.longest_sequence == 0


def test_the_fused_backend_hands_the_kernel_the_longest_sequence(monkeypatch) -> None:
    """Through DotProductAttention: the kernel call of an eager decode step over a 4096-token cache
    holding sequences of 30 and 257 tokens gets max_seqlen_kv 257."""
    from collections import OrderedDict

    from attention import DotProductAttention, custom_ops
    from attention.backends.fused import FusedBackend
    from inference import InferenceParams

    if FusedBackend().availability_reason():
        pytest.skip(FusedBackend().availability_reason())
    seen = []
    eager, op = custom_ops.OPS["fused_attention_forward"]
    monkeypatch.setitem(custom_ops.OPS, "fused_attention_forward",
                        (lambda *args: seen.append(args[13]), op))  # args[13]: max_seqlen_kv
    params = InferenceParams(2, 4096, 2, 16, torch.float16, is_paged=True, page_size=16, device="cpu")
    params.allocate_memory(1)
    params.pre_step(OrderedDict({"a": 30, "b": 256}))
    params.pre_step(OrderedDict({"a": 1, "b": 1}))
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="fused")
    q, k = torch.randn(2, 1, 4, 16, dtype=torch.float16), torch.randn(2, 1, 2, 16, dtype=torch.float16)
    module(q, k, k.clone(), inference_params=params)
    assert seen == [257]


@pytest.mark.parametrize("value", ["1", "true", "on"])
def test_cpu_tensors_are_accepted_under_every_spelling_triton_interprets(value, monkeypatch) -> None:
    """TRITON_INTERPRET is read as Triton reads it: "true" interprets as "1" does."""
    from attention.backends.fused import FusedBackend

    monkeypatch.setenv("TRITON_INTERPRET", value)
    reasons = FusedBackend().extra_reasons(replace(PARAMS, device_type="cpu", dtype=torch.float32))
    assert not any("TRITON_INTERPRET" in reason for reason in reasons), reasons
