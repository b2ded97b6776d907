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
