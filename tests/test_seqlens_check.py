"""cu_seqlens whose values do not fit the call are refused before any backend runs (``attention.seqlens_check``).

CPU: the values are checked by default there; ``ATTN_CHECK_SEQLENS`` turns the check on for CUDA or off.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from attention.seqlens_check import values_checked
from inference import InferenceParams

H, H_KV, D = 4, 2, 16


def _i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _thd(tokens: int = 10, kv_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv_tokens = tokens if kv_tokens is None else kv_tokens
    return torch.randn(tokens, H, D), torch.randn(kv_tokens, H_KV, D), torch.randn(kv_tokens, H_KV, D)


def _module(fmt: str = "thd", mask: str = "padding_causal") -> DotProductAttention:
    return DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format=fmt, attn_mask_type=mask, backend="unfused")


THD_REFUSED = [
    pytest.param(dict(cu_seqlens_q=_i32(0, 6, 5), cu_seqlens_kv=_i32(0, 5, 10)),
                 r"cu_seqlens_q must be cumulative lengths: non-decreasing, from 0; got \[0, 6, 5\]",
                 id="decreasing"),
    pytest.param(dict(cu_seqlens_q=_i32(-1, 5, 10), cu_seqlens_kv=_i32(0, 5, 10)),
                 r"cu_seqlens_q must be cumulative lengths", id="negative"),
    pytest.param(dict(cu_seqlens_q=_i32(2, 6, 10), cu_seqlens_kv=_i32(0, 4, 8)),
                 r"cu_seqlens_q must be cumulative lengths: non-decreasing, from 0; got \[2, 6, 10\]",
                 id="not from 0"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 4, 8), cu_seqlens_kv=_i32(0, 4, 8),
                      cu_seqlens_q_padded=_i32(0, 5, -1), cu_seqlens_kv_padded=_i32(0, 5, 10)),
                 r"cu_seqlens_q_padded must be non-decreasing offsets >= 0", id="padded decreasing"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 3, 5), cu_seqlens_kv=_i32(0, 3, 5), cu_seqlens_q_padded=_i32(0, 4, 8),
                      cu_seqlens_kv_padded=_i32(0, 4, 8), pad_between_seqs=False),
                 r"pad_between_seqs=False says the sequences are packed, but cu_seqlens_q_padded \[0, 4, 8\] starts "
                 r"them elsewhere than cu_seqlens_q \[0, 3, 5\]", id="pad_between_seqs=False with gaps"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 5, 12), cu_seqlens_kv=_i32(0, 5, 10)),
                 r"cu_seqlens_q ends at 12, past query_layer's 10 tokens \(dim 0 in thd\)", id="past q"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 5, 10), cu_seqlens_kv=_i32(0, 5, 11)),
                 r"cu_seqlens_kv ends at 11, past key_layer's 10 tokens", id="past kv"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 5, 10), cu_seqlens_kv=_i32(0, 5, 10), max_seqlen_q=4),
                 r"max_seqlen_q=4 is less than sequence 0's 5 tokens \(cu_seqlens_q\)", id="max_seqlen_q"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 5, 10), cu_seqlens_kv=_i32(0, 2, 10), max_seqlen_q=5, max_seqlen_kv=7),
                 r"max_seqlen_kv=7 is less than sequence 1's 8 tokens \(cu_seqlens_kv\)", id="max_seqlen_kv"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 4, 8), cu_seqlens_kv=_i32(0, 4, 8),
                      cu_seqlens_q_padded=_i32(0, 3, 10), cu_seqlens_kv_padded=_i32(0, 5, 10)),
                 r"cu_seqlens_q_padded leaves sequence 0 a slot of 3 rows for its 4 tokens", id="padded slot"),
    pytest.param(dict(cu_seqlens_q=_i32(0, 4, 8), cu_seqlens_kv=_i32(0, 4, 8),
                      cu_seqlens_q_padded=_i32(0, 5, 11), cu_seqlens_kv_padded=_i32(0, 5, 10)),
                 r"cu_seqlens_q_padded ends at 11, past query_layer's 10 tokens", id="padded past q"),
]


@pytest.mark.parametrize("kwargs, message", THD_REFUSED)
def test_thd_values_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _module()(*_thd(), **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(cu_seqlens_q=_i32(0, 5, 10), cu_seqlens_kv=_i32(0, 5, 10), max_seqlen_q=5, max_seqlen_kv=5),
    dict(cu_seqlens_q=_i32(0, 3, 7), cu_seqlens_kv=_i32(0, 3, 7)),                       # trailing padding rows
    dict(cu_seqlens_q=_i32(0, 4, 8), cu_seqlens_kv=_i32(0, 4, 8),
         cu_seqlens_q_padded=_i32(0, 5, 10), cu_seqlens_kv_padded=_i32(0, 5, 10)),        # padding between
    dict(cu_seqlens_q=_i32(0, 4, 8), cu_seqlens_kv=_i32(0, 4, 8),
         cu_seqlens_q_padded=_i32(2, 6, 10), cu_seqlens_kv_padded=_i32(2, 6, 10)),        # padded from row 2
    dict(cu_seqlens_q=_i32(0, 4, 8), cu_seqlens_kv=_i32(0, 4, 8), cu_seqlens_q_padded=_i32(0, 4, 8),
         cu_seqlens_kv_padded=_i32(0, 4, 8), pad_between_seqs=False),                    # padded = packed, promised
    dict(cu_seqlens_q=_i32(0, 3, 7), cu_seqlens_kv=_i32(0, 3, 7), cu_seqlens_q_padded=_i32(0, 3, 10),
         cu_seqlens_kv_padded=_i32(0, 3, 10), pad_between_seqs=False),                   # padding after the last only
    dict(cu_seqlens_q=_i32(0, 0, 10), cu_seqlens_kv=_i32(0, 0, 10)),                      # an empty sequence
], ids=["exact", "tail", "padded", "padded from 2", "promised packed", "tail padded, packed", "empty"])
def test_thd_values_accepted(kwargs: dict) -> None:
    out = _module()(*_thd(), **kwargs)
    assert out.shape == (10, H * D)


def test_checked_on_every_call_not_only_the_first() -> None:
    """A repeat call with the same shapes takes the module's plan; the values are still read."""
    attn, (q, k, v) = _module(), _thd()
    attn(q, k, v, cu_seqlens_q=_i32(0, 5, 10), cu_seqlens_kv=_i32(0, 5, 10))
    with pytest.raises(ValueError, match="cu_seqlens_kv ends at 13"):
        attn(q, k, v, cu_seqlens_q=_i32(0, 5, 10), cu_seqlens_kv=_i32(0, 5, 13))


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_bshd_lengths_past_the_s_dim_refused(fmt: str) -> None:
    batch, seqlen = 2, 6
    shape = (batch, seqlen) if fmt == "bshd" else (seqlen, batch)
    q, k, v = torch.randn(*shape, H, D), torch.randn(*shape, H_KV, D), torch.randn(*shape, H_KV, D)
    attn = _module(fmt, "padding")
    with pytest.raises(ValueError, match=rf"cu_seqlens_q gives sequence 1 7 tokens, past query_layer's 6 positions "
                                         rf"\(the s dim in {fmt}\)"):
        attn(q, k, v, cu_seqlens_q=_i32(0, 3, 10), cu_seqlens_kv=_i32(0, 6, 12))
    assert attn(q, k, v, cu_seqlens_q=_i32(0, 3, 9), cu_seqlens_kv=_i32(0, 6, 12)).shape == (*shape, H * D)


def test_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert values_checked(cpu) and not values_checked(cuda)          # unset: CPU tensors only
    monkeypatch.setenv("ATTN_CHECK_SEQLENS", "1")
    assert values_checked(cpu) and values_checked(cuda)
    monkeypatch.setenv("ATTN_CHECK_SEQLENS", "0")
    assert not values_checked(cpu) and not values_checked(cuda)
    _module()(*_thd(), cu_seqlens_q=_i32(0, 6, 5), cu_seqlens_kv=_i32(0, 5, 10))   # not read: runs
    monkeypatch.setenv("ATTN_CHECK_SEQLENS", "yes")
    with pytest.raises(ValueError, match=r"ATTN_CHECK_SEQLENS must be 0 or 1 \(unset: check CPU tensors only\); "
                                         r"got 'yes'"):
        _module()(*_thd(), cu_seqlens_q=_i32(0, 5, 10), cu_seqlens_kv=_i32(0, 5, 10))


def test_kv_cache_step_ignores_given_cu_seqlens() -> None:
    """With inference_params the step supplies the cu_seqlens (as in TE): given ones are not read."""
    params = InferenceParams(2, 32, H_KV, D, torch.float32, qkv_format="thd", device="cpu")
    params.allocate_memory(layer_number=1)
    params.pre_step(OrderedDict({"a": 5, "b": 5}))
    attn = DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format="thd", attn_mask_type="padding_causal",
                               layer_number=1, backend="unfused")
    out = attn(*_thd(), inference_params=params, cu_seqlens_q=_i32(0, 6, 5), cu_seqlens_kv=_i32(0, 6, 5))
    assert out.shape == (10, H * D)


def test_bshd_cu_seqlens_ignored_without_a_padding_mask() -> None:
    """bshd / sbhd without a padding mask run full lengths (as TE): given cu_seqlens are not read."""
    q, k, v = torch.randn(2, 6, H, D), torch.randn(2, 6, H_KV, D), torch.randn(2, 6, H_KV, D)
    out = _module("bshd", "causal")(q, k, v, cu_seqlens_q=_i32(0, 9, 5), cu_seqlens_kv=_i32(0, 9, 5))
    assert out.shape == (2, 6, H * D)


@pytest.mark.gpu
def test_cuda_values_checked_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = (x.cuda().half() for x in _thd())
    attn = DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format="thd", attn_mask_type="padding_causal").cuda()
    good, bad = _i32(0, 5, 10).cuda(), _i32(0, 5, 12).cuda()
    monkeypatch.setenv("ATTN_CHECK_SEQLENS", "1")
    with pytest.raises(ValueError, match="cu_seqlens_kv ends at 12, past key_layer's 10 tokens"):
        attn(q, k, v, cu_seqlens_q=good, cu_seqlens_kv=bad)
    assert attn(q, k, v, cu_seqlens_q=good, cu_seqlens_kv=good, max_seqlen_q=5, max_seqlen_kv=5).shape == (10, H * D)


def _left_padded(batch: int = 2, seqlen: int = 6, pads: tuple[int, ...] = (2, 0)):
    q, k, v = torch.randn(batch, seqlen, H, D), torch.randn(batch, seqlen, H_KV, D), torch.randn(batch, seqlen, H_KV, D)
    mask = torch.zeros(batch, 1, 1, seqlen, dtype=torch.bool)
    for row, pad in enumerate(pads):
        mask[row, ..., :pad] = True
    return q, k, v, mask


@pytest.mark.parametrize("pair", [False, True], ids=["one mask", "q and kv masks"])
def test_left_padded_mask_refused(pair: bool) -> None:
    """Lengths are counted from a padding mask, so left padding would be read as right padding."""
    q, k, v, mask = _left_padded()
    name = r"attention_mask\[0\] \(queries\)" if pair else "attention_mask"
    with pytest.raises(ValueError, match=rf"{name} row 0 pads a position before a real token: a padding mask "
                                         r"\[b, 1, 1, s\] \(True = padded\) must be right-padded"):
        _module("bshd", "padding_causal")(q, k, v, attention_mask=(mask, mask) if pair else mask)
    with pytest.raises(ValueError, match=r"A Hugging Face attention_mask, 1 = keep, means the opposite: pass "
                                         r"~mask.bool\(\)"):   # (what a keep-mask of right padding looks like)
        _module("bshd", "padding_causal")(q, k, v, attention_mask=~mask.flip(-1))
    right = torch.zeros_like(mask)
    right[0, ..., 4:] = True
    assert _module("bshd", "padding_causal")(q, k, v, attention_mask=right).shape == (2, 6, H * D)


def test_a_mask_padding_every_position_is_warned_about() -> None:
    """A Hugging Face keep-mask of an unpadded batch (all True) read as TE's padding mask pads everything: every
    output row is zero, silently."""
    q, k, v, mask = _left_padded()
    with pytest.warns(UserWarning, match=r"attention_mask marks every position as padded \(True = padded\), so every "
                                         r"output row is zero"):
        out = _module("bshd", "padding_causal")(q, k, v, attention_mask=torch.ones_like(mask))
    assert not out.any()


def test_left_padding_through_the_named_alternatives() -> None:
    """What the error suggests works: thd with padded offsets, or the mask as an arbitrary mask."""
    from tests.reference import reference_one_sequence

    q, k, v, mask = _left_padded()
    expected = [reference_one_sequence(q[0, 2:], k[0, 2:], v[0, 2:], causal=True),
                reference_one_sequence(q[1], k[1], v[1], causal=True)]
    padded = _i32(2, 6, 12)   # row 0's 4 tokens start at 2, row 1's 6 at 6
    packed = _module("thd", "padding_causal")(
        q.reshape(12, H, D), k.reshape(12, H_KV, D), v.reshape(12, H_KV, D), cu_seqlens_q=_i32(0, 4, 10),
        cu_seqlens_kv=_i32(0, 4, 10), cu_seqlens_q_padded=padded, cu_seqlens_kv_padded=padded,
    ).reshape(2, 6, H, D)
    torch.testing.assert_close(packed[0, 2:], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], expected[1], atol=1e-5, rtol=1e-5)
    causal_and_padding = mask | torch.ones(6, 6, dtype=torch.bool).triu(1)   # True = masked
    arbitrary = _module("bshd", "arbitrary")(q, k, v, attention_mask=causal_and_padding).reshape(2, 6, H, D)
    torch.testing.assert_close(arbitrary[0, 2:], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(arbitrary[1], expected[1], atol=1e-5, rtol=1e-5)
