"""Checks of the fp32 oracle against independent computations (mostly torch SDPA, math path)."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.reference import default_alibi_slopes, reference_attention, reference_one_sequence

ATOL = 1e-5
RTOL = 1e-5


def sdpa_one_sequence(q, k, v, *, attn_mask=None, is_causal=False, scale=None):
    """torch SDPA on ``[s, h, d]`` tensors, GQA by repeating kv heads; returns ``[s_q, h, d_v]``."""
    group_size = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group_size, dim=1)
    v = v.repeat_interleave(group_size, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(),
        attn_mask=attn_mask, is_causal=is_causal, scale=scale,
    )
    return out.transpose(0, 1)


def random_qkv(s_q, s_kv, h, h_kv, d_qk, d_v, dtype=torch.float32):
    return (torch.randn(s_q, h, d_qk, dtype=dtype), torch.randn(s_kv, h_kv, d_qk, dtype=dtype),
            torch.randn(s_kv, h_kv, d_v, dtype=dtype))


@pytest.mark.parametrize("s_q,s_kv", [(1, 1), (3, 5), (5, 3), (4, 4)])
@pytest.mark.parametrize("h,h_kv", [(2, 2), (4, 1), (4, 2)])
@pytest.mark.parametrize("d_qk,d_v", [(8, 8), (8, 4)])
@pytest.mark.parametrize("softmax_scale", [None, 0.3])
def test_no_mask_matches_sdpa(s_q, s_kv, h, h_kv, d_qk, d_v, softmax_scale):
    q, k, v = random_qkv(s_q, s_kv, h, h_kv, d_qk, d_v)
    out = reference_one_sequence(q, k, v, softmax_scale=softmax_scale)
    expected = sdpa_one_sequence(q, k, v, scale=softmax_scale)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("s_q,s_kv", [(4, 4), (3, 6), (6, 3)])
@pytest.mark.parametrize("h,h_kv", [(2, 2), (4, 2)])
def test_top_left_causal_matches_sdpa(s_q, s_kv, h, h_kv):
    q, k, v = random_qkv(s_q, s_kv, h, h_kv, 8, 8)
    out = reference_one_sequence(q, k, v, causal=True)
    expected = sdpa_one_sequence(q, k, v, is_causal=True)  # SDPA's causal is top-left
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("s_q,s_kv", [(4, 4), (1, 7), (3, 6)])
def test_bottom_right_causal_matches_sdpa_with_shifted_tril(s_q, s_kv):
    q, k, v = random_qkv(s_q, s_kv, 2, 1, 8, 8)
    allowed = torch.ones(s_q, s_kv, dtype=torch.bool).tril(diagonal=s_kv - s_q)
    out = reference_one_sequence(q, k, v, causal=True, bottom_right=True)
    expected = sdpa_one_sequence(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_input_is_computed_in_fp32(dtype):
    q, k, v = random_qkv(3, 4, 2, 2, 8, 8, dtype=dtype)
    out = reference_one_sequence(q, k, v)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, sdpa_one_sequence(q, k, v), atol=ATOL, rtol=RTOL)


def test_hand_computed_window_and_alibi():
    # s_q=2, s_kv=3, bottom-right (off=1), window (1, 0): query 0 sees keys {0,1}, query 1 {1,2}.
    # Logits = q.k (scale 1) - 0.5 * |i + 1 - j|.
    q = torch.tensor([[[1.0]], [[2.0]]])
    k = torch.tensor([[[1.0]], [[0.0]], [[-1.0]]])
    v = torch.tensor([[[1.0]], [[2.0]], [[4.0]]])
    out = reference_one_sequence(
        q, k, v, softmax_scale=1.0, window_size=(1, 0), bottom_right=True,
        alibi_slopes=torch.tensor([0.5]),
    )
    row0 = (math.exp(0.5) * 1 + math.exp(0.0) * 2) / (math.exp(0.5) + math.exp(0.0))
    row1 = (math.exp(-0.5) * 2 + math.exp(-2.0) * 4) / (math.exp(-0.5) + math.exp(-2.0))
    torch.testing.assert_close(out.reshape(2), torch.tensor([row0, row1]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("bottom_right", [False, True])
@pytest.mark.parametrize("window_size", [(-1, -1), (1, 1), (2, 0), (0, -1)])
def test_window_and_alibi_match_sdpa_float_mask(bottom_right, window_size):
    s_q, s_kv, h = 4, 6, 2
    q, k, v = random_qkv(s_q, s_kv, h, h, 8, 8)
    slopes = torch.tensor([0.25, 0.125])
    off = s_kv - s_q if bottom_right else 0
    float_mask = torch.zeros(h, s_q, s_kv)
    for i in range(s_q):
        for j in range(s_kv):
            left, right = window_size
            hidden = (right >= 0 and j > i + off + right) or (left >= 0 and j < i + off - left)
            for head in range(h):
                float_mask[head, i, j] = -math.inf if hidden else -slopes[head] * abs(i + off - j)
    out = reference_one_sequence(q, k, v, window_size=window_size, bottom_right=bottom_right,
                                 alibi_slopes=slopes)
    expected = sdpa_one_sequence(q, k, v, attn_mask=float_mask)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("bias_heads", [1, 3])
@pytest.mark.parametrize("bias_type", ["post_scale_bias", "pre_scale_bias"])
def test_bias_matches_sdpa(bias_heads, bias_type):
    q, k, v = random_qkv(4, 5, 3, 3, 8, 8)
    bias = torch.randn(bias_heads, 4, 5)
    scale = 0.5
    out = reference_one_sequence(q, k, v, softmax_scale=scale, bias=bias, bias_type=bias_type)
    sdpa_bias = bias if bias_type == "post_scale_bias" else scale * bias
    expected = sdpa_one_sequence(q, k, v, attn_mask=sdpa_bias, scale=scale)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_arbitrary_mask_matches_sdpa_bool_mask():
    q, k, v = random_qkv(4, 5, 2, 2, 8, 8)
    mask = torch.rand(2, 4, 5) < 0.5
    mask[:, :, 0] = False  # keep every row non-empty so SDPA has no NaN
    out = reference_one_sequence(q, k, v, mask=mask)
    expected = sdpa_one_sequence(q, k, v, attn_mask=~mask)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("offset", [[0.0, 0.0], [1.5, -2.0]])
def test_sink_equals_extra_zero_value_key(causal, offset):
    """A sink logit is a key whose logit is offset_h and whose value is zero."""
    s_q, s_kv, h = 3, 4, 2
    q, k, v = random_qkv(s_q, s_kv, h, h, 8, 8)
    softmax_offset = torch.tensor(offset)
    out = reference_one_sequence(q, k, v, causal=causal, softmax_offset=softmax_offset)

    k_ext = torch.cat([k, torch.zeros(1, h, 8)])
    v_ext = torch.cat([v, torch.zeros(1, h, 8)])
    float_mask = torch.zeros(h, s_q, s_kv + 1)
    float_mask[:, :, s_kv] = softmax_offset.view(h, 1)
    if causal:
        hidden = ~torch.ones(s_q, s_kv, dtype=torch.bool).tril()
        float_mask[:, :, :s_kv] = float_mask[:, :, :s_kv].masked_fill(hidden, -math.inf)
    expected = sdpa_one_sequence(q, k_ext, v_ext, attn_mask=float_mask)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_off_by_one_sink_denominator():
    q, k, v = random_qkv(2, 3, 1, 1, 4, 4)
    out = reference_one_sequence(q, k, v, softmax_scale=1.0, softmax_offset=torch.zeros(1))
    weights = torch.exp(q[:, 0] @ k[:, 0].T)  # [s_q, s_kv]
    expected = (weights @ v[:, 0]) / (1.0 + weights.sum(dim=1, keepdim=True))
    torch.testing.assert_close(out[:, 0], expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(causal=True, bottom_right=True),  # s_q > s_kv: the first rows see nothing
        dict(window_size=(0, 0), bottom_right=True),
        dict(mask=torch.ones(1, 5, 3, dtype=torch.bool)),
        dict(causal=True, bottom_right=True, softmax_offset=torch.tensor([0.3, -0.2])),
    ],
)
def test_rows_without_keys_are_zero(kwargs):
    q, k, v = random_qkv(5, 3, 2, 2, 4, 4)
    out = reference_one_sequence(q, k, v, **kwargs)
    assert torch.isfinite(out).all()
    if "mask" in kwargs:
        assert out.eq(0).all()
    else:
        assert out[:2].eq(0).all() and out[2:].ne(0).any()


def test_empty_kv_gives_zeros():
    q, k, v = random_qkv(3, 0, 2, 2, 4, 4)
    assert reference_one_sequence(q, k, v).eq(0).all()


def test_default_alibi_slopes():
    torch.testing.assert_close(default_alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0))
    expected_12 = torch.cat([2.0 ** -torch.arange(1.0, 9.0),
                             2.0 ** -torch.tensor([0.5, 1.5, 2.5, 3.5])])
    torch.testing.assert_close(default_alibi_slopes(12), expected_12)
    torch.testing.assert_close(default_alibi_slopes(1), torch.tensor([2.0 ** -8]))


# ----------------------------------------------------------------------------- batched API

MASK_TYPES = ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right"]


@pytest.mark.parametrize("attn_mask_type", MASK_TYPES)
@pytest.mark.parametrize("bias_type", ["no_bias", "alibi"])
@pytest.mark.parametrize("window_size", [None, (2, 0)])
def test_thd_with_pad_tokens_equals_per_sequence_bshd(attn_mask_type, bias_type, window_size):
    h, h_kv, d = 4, 2, 8
    lengths_q, lengths_kv = [3, 1, 4], [5, 2, 4]
    gaps = [1, 0, 2]  # pad tokens after each sequence
    q_parts, k_parts, v_parts, per_sequence = [], [], [], []
    for len_q, len_kv, gap in zip(lengths_q, lengths_kv, gaps):
        q_i, k_i, v_i = random_qkv(len_q, len_kv, h, h_kv, d, d)
        per_sequence.append(reference_attention(
            q_i[None], k_i[None], v_i[None], qkv_format="bshd", attn_mask_type=attn_mask_type,
            bias_type=bias_type, window_size=window_size)[0])
        q_parts += [q_i, torch.randn(gap, h, d)]
        k_parts += [k_i, torch.randn(gap, h_kv, d)]
        v_parts += [v_i, torch.randn(gap, h_kv, d)]

    def cumulative(values):
        return torch.tensor([0] + list(torch.tensor(values).cumsum(0)), dtype=torch.int32)

    out = reference_attention(
        torch.cat(q_parts), torch.cat(k_parts), torch.cat(v_parts), qkv_format="thd",
        cu_seqlens_q=cumulative(lengths_q), cu_seqlens_kv=cumulative(lengths_kv),
        cu_seqlens_q_padded=cumulative([n + g for n, g in zip(lengths_q, gaps)]),
        cu_seqlens_kv_padded=cumulative([n + g for n, g in zip(lengths_kv, gaps)]),
        attn_mask_type=attn_mask_type, bias_type=bias_type, window_size=window_size,
    )
    expected = torch.cat([torch.cat([o, torch.zeros(g, h * d)]) for o, g in zip(per_sequence, gaps)])
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("attn_mask_type", MASK_TYPES)
def test_bshd_padding_zeroes_pad_rows_and_uses_actual_lengths(attn_mask_type):
    b, s_q, s_kv, h, d = 2, 4, 6, 2, 8
    q, k, v = torch.randn(b, s_q, h, d), torch.randn(b, s_kv, h, d), torch.randn(b, s_kv, h, d)
    lengths_q, lengths_kv = [2, 4], [5, 3]
    out = reference_attention(
        q, k, v, qkv_format="bshd", attn_mask_type=attn_mask_type,
        cu_seqlens_q=torch.tensor([0, 2, 6], dtype=torch.int32),
        cu_seqlens_kv=torch.tensor([0, 5, 8], dtype=torch.int32),
    )
    causal = "causal" in attn_mask_type
    top_left = attn_mask_type in ("causal", "padding_causal")
    for i in range(b):
        len_q, len_kv = lengths_q[i], lengths_kv[i]
        q_i, k_i, v_i = q[i, :len_q], k[i, :len_kv], v[i, :len_kv]
        allowed = torch.ones(len_q, len_kv, dtype=torch.bool)
        if causal:
            allowed = allowed.tril(diagonal=0 if top_left else len_kv - len_q)
        expected = sdpa_one_sequence(q_i, k_i, v_i, attn_mask=allowed).reshape(len_q, h * d)
        torch.testing.assert_close(out[i, :len_q], expected, atol=ATOL, rtol=RTOL)
        assert out[i, len_q:].eq(0).all()


@pytest.mark.parametrize("bias_shape", [(1, 1, 1, 5), (1, 2, 3, 5), (2, 1, 3, 5), (2, 2, 3, 5)])
@pytest.mark.parametrize("bias_type", ["post_scale_bias", "pre_scale_bias"])
def test_dense_bias_shapes_match_sdpa(bias_shape, bias_type):
    b, s_q, s_kv, h, d = 2, 3, 5, 2, 8
    q, k, v = torch.randn(b, s_q, h, d), torch.randn(b, s_kv, h, d), torch.randn(b, s_kv, h, d)
    bias = torch.randn(bias_shape)
    out = reference_attention(q, k, v, qkv_format="bshd", bias=bias, bias_type=bias_type,
                              softmax_scale=0.4)
    sdpa_bias = bias if bias_type == "post_scale_bias" else 0.4 * bias
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=sdpa_bias, scale=0.4
    ).transpose(1, 2).reshape(b, s_q, h * d)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_per_sequence_alibi_slopes_and_arbitrary_mask():
    b, s, h, d = 2, 4, 2, 8
    q, k, v = torch.randn(b, s, h, d), torch.randn(b, s, h, d), torch.randn(b, s, h, d)
    slopes = torch.tensor([[0.5, 0.25], [0.125, 1.0]])
    attention_mask = torch.rand(b, 1, s, s) < 0.3
    out = reference_attention(q, k, v, qkv_format="bshd", attn_mask_type="arbitrary",
                              attention_mask=attention_mask, bias_type="alibi",
                              alibi_slopes=slopes)
    for i in range(b):
        expected = reference_one_sequence(q[i], k[i], v[i], bottom_right=True,
                                          alibi_slopes=slopes[i], mask=attention_mask[i])
        torch.testing.assert_close(out[i], expected.reshape(s, h * d), atol=0, rtol=0)


@pytest.mark.parametrize("attn_mask_type", ["no_mask", "padding_causal", "causal_bottom_right"])
def test_sbhd_equals_bshd_transposed(attn_mask_type):
    b, s_q, s_kv, h, h_kv, d = 2, 3, 5, 4, 2, 8
    q, k, v = torch.randn(b, s_q, h, d), torch.randn(b, s_kv, h_kv, d), torch.randn(b, s_kv, h_kv, d)
    kwargs = dict(attn_mask_type=attn_mask_type, softmax_offset=torch.randn(h),
                  cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32),
                  cu_seqlens_kv=torch.tensor([0, 4, 9], dtype=torch.int32))
    out_bshd = reference_attention(q, k, v, qkv_format="bshd", **kwargs)
    out_sbhd = reference_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                   qkv_format="sbhd", **kwargs)
    assert out_sbhd.shape == (s_q, b, h * d)
    torch.testing.assert_close(out_sbhd, out_bshd.transpose(0, 1), atol=0, rtol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(qkv_format="bhsd"), "qkv_format"),
        (dict(qkv_format="bshd", attn_mask_type="padding,causal"), "attn_mask_type"),
        (dict(qkv_format="bshd", bias_type="post_scale_bias"), "bias"),
        (dict(qkv_format="bshd", bias=torch.zeros(1, 1, 2, 2)), "bias"),
        (dict(qkv_format="bshd", alibi_slopes=torch.ones(2)), "alibi_slopes"),
        (dict(qkv_format="bshd", attn_mask_type="arbitrary"), "attention_mask"),
        (dict(qkv_format="thd"), "q must be 3-D"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    q = k = v = torch.randn(1, 2, 2, 4)
    with pytest.raises(ValueError, match=match):
        reference_attention(q, k, v, **kwargs)


def test_thd_requires_cu_seqlens_and_gqa_divisibility():
    q = k = v = torch.randn(4, 2, 4)
    with pytest.raises(ValueError, match="cu_seqlens"):
        reference_attention(q, k, v, qkv_format="thd", attn_mask_type="padding")
    with pytest.raises(ValueError, match="multiple"):
        reference_one_sequence(torch.randn(2, 3, 4), torch.randn(2, 2, 4), torch.randn(2, 2, 4))
