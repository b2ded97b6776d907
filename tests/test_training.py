"""Training through the module: autograd of the unfused backend against autograd through the fp32
oracle, dropout semantics, and the selection of a backward-capable backend."""

from __future__ import annotations

import pytest
import torch

from attention import DotProductAttention
from tests.cpu_fused import cpu_fused_reason
from tests.reference import reference_attention

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

#: (atol, rtol) of outputs against the fp32 oracle; gradients get 10x (fp64 inputs: the oracle is fp32).
TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2)}


def cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


CASES = {
    # name: (format, b, s_q, s_kv, h, h_kv, d_qk, d_v, mask, extra)
    "bshd-mha-no_mask": ("bshd", 2, 7, 7, 4, 4, 16, 16, "no_mask", {}),
    "bshd-gqa-causal": ("bshd", 2, 7, 7, 4, 2, 16, 16, "causal", {}),
    "sbhd-mqa-causal_bottom_right-cross": ("sbhd", 2, 5, 9, 4, 1, 16, 8, "causal_bottom_right", {}),
    "bshd-gqa-padding_causal-ragged": ("bshd", 3, 8, 8, 4, 2, 16, 16, "padding_causal", {"ragged": True}),
    "bshd-padding-mask-cross": ("bshd", 3, 6, 10, 4, 2, 16, 16, "padding_causal_bottom_right", {"ragged": True}),
    "thd-gqa-padding_causal": ("thd", 3, 8, 8, 4, 2, 16, 16, "padding_causal", {}),
    "thd-pad_between-window": ("thd", 3, 8, 8, 4, 2, 16, 16, "padding_causal_bottom_right",
                               {"pad_between": True, "window": (3, 0)}),
    "bshd-alibi-window": ("bshd", 2, 8, 8, 4, 4, 16, 16, "no_mask", {"alibi": True, "window": (2, 2)}),
    "bshd-learnable": ("bshd", 2, 7, 7, 4, 2, 16, 16, "causal", {"softmax": "learnable"}),
    "thd-learnable": ("thd", 3, 8, 8, 4, 2, 16, 16, "padding", {"softmax": "learnable"}),
    "bshd-off-by-one": ("bshd", 2, 7, 7, 4, 2, 16, 16, "padding_causal", {"softmax": "off-by-one", "ragged": True}),
    "bshd-post_scale_bias-1hss": ("bshd", 2, 6, 6, 4, 2, 16, 16, "causal", {"bias": (1, 4, 6, 6)}),
    "sbhd-post_scale_bias-bhss-cross": ("sbhd", 2, 5, 9, 4, 2, 16, 16, "no_mask", {"bias": (2, 4, 5, 9)}),
    "bshd-pre_scale_bias-111s": ("bshd", 2, 6, 6, 4, 4, 16, 16, "padding", {"bias": (1, 1, 1, 6),
                                                                          "bias_type": "pre_scale_bias",
                                                                          "ragged": True}),
    "bshd-bf16-gqa-causal": ("bshd", 2, 7, 7, 4, 2, 16, 16, "causal", {"dtype": torch.bfloat16}),
    "thd-cross-mla": ("thd", 3, 6, 10, 4, 2, 16, 8, "padding_causal_bottom_right", {}),
    "bshd-rows-without-keys": ("bshd", 2, 9, 5, 4, 2, 16, 16, "causal_bottom_right", {}),   # s_q > s_kv
    "sbhd-learnable-cross": ("sbhd", 2, 5, 9, 4, 2, 16, 16, "no_mask", {"softmax": "learnable"}),
    "bshd-arbitrary-masked-row": ("bshd", 2, 6, 8, 4, 2, 16, 16, "arbitrary", {"arbitrary": True}),
    "bshd-fp64-learnable-bias": ("bshd", 2, 6, 6, 4, 2, 8, 8, "causal", {"dtype": torch.float64,
                                                                        "softmax": "learnable",
                                                                        "bias": (2, 1, 6, 6)}),
}


def build(name: str):
    fmt, b, s_q, s_kv, h, h_kv, d_qk, d_v, mask, extra = CASES[name]
    dtype = extra.get("dtype", torch.float32)
    fwd, ref = {}, {}
    if fmt == "thd":
        lens_q = torch.randint(1, s_q + 1, (b,)).tolist()
        lens_kv = lens_q if s_q == s_kv else torch.randint(1, s_kv + 1, (b,)).tolist()
        fwd.update(cu_seqlens_q=cu(lens_q), cu_seqlens_kv=cu(lens_kv))
        t_q, t_kv = sum(lens_q), sum(lens_kv)
        if extra.get("pad_between"):
            gaps = torch.randint(1, 4, (b,)).tolist()
            fwd.update(cu_seqlens_q_padded=cu([n + g for n, g in zip(lens_q, gaps)]),
                       cu_seqlens_kv_padded=cu([n + g for n, g in zip(lens_kv, gaps)]))
            t_q = t_kv = int(fwd["cu_seqlens_q_padded"][-1])
        shapes = (t_q, h, d_qk), (t_kv, h_kv, d_qk), (t_kv, h_kv, d_v)
        ref.update(fwd)
    else:
        def shape(s, heads, d):
            return (b, s, heads, d) if fmt == "bshd" else (s, b, heads, d)

        shapes = shape(s_q, h, d_qk), shape(s_kv, h_kv, d_qk), shape(s_kv, h_kv, d_v)
        if extra.get("ragged"):
            lens_q = torch.randint(1, s_q + 1, (b,)).tolist()
            lens_kv = lens_q if s_q == s_kv else torch.randint(1, s_kv + 1, (b,)).tolist()
            if s_q == s_kv:   # self-attention: TE's [b,1,1,s] padding mask
                fwd["attention_mask"] = (torch.arange(s_q)[None] >= torch.tensor(lens_q)[:, None]).view(b, 1, 1, s_q)
            else:
                fwd.update(cu_seqlens_q=cu(lens_q), cu_seqlens_kv=cu(lens_kv))
            ref.update(cu_seqlens_q=cu(lens_q), cu_seqlens_kv=cu(lens_kv))
    q, k, v = (torch.randn(*s, dtype=dtype).requires_grad_() for s in shapes)
    if "window" in extra:
        fwd["window_size"] = ref["window_size"] = extra["window"]
    if extra.get("arbitrary"):   # True = masked out; query row 1 of sequence 0 sees no key (zero out and gradient)
        masked = torch.rand(b, 1, s_q, s_kv) < 0.4
        masked[0, 0, 1] = True
        fwd["attention_mask"] = ref["attention_mask"] = masked
    if extra.get("alibi"):
        fwd["core_attention_bias_type"] = ref["bias_type"] = "alibi"
    bias = None
    if "bias" in extra:
        bias = torch.randn(*extra["bias"], dtype=dtype).requires_grad_()
        fwd["core_attention_bias_type"] = ref["bias_type"] = extra.get("bias_type", "post_scale_bias")
        fwd["core_attention_bias"] = bias
    softmax = extra.get("softmax", "vanilla")
    module = DotProductAttention(h, d_qk if d_qk == d_v else (d_qk, d_v), num_gqa_groups=h_kv, qkv_format=fmt,
                                 attn_mask_type=mask, softmax_type=softmax,
                                 attention_type="self" if s_q == s_kv else "cross", backend="unfused")
    if softmax == "learnable":
        with torch.no_grad():
            module.softmax_offset.copy_(torch.randn(h))
    module = module.to(dtype)
    ref.update(qkv_format=fmt, attn_mask_type=mask)
    return module, (q, k, v), bias, fwd, ref


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_the_reference(name):
    module, (q, k, v), bias, fwd, ref = build(name)
    out = module(q, k, v, **fwd)
    assert module.last_backend == "unfused"
    grad_out = torch.randn_like(out)
    leaves = [q, k, v] + ([bias] if bias is not None else [])
    offset = module.softmax_offset
    if module.softmax_type == "learnable":
        leaves.append(offset)
    grads = torch.autograd.grad(out, leaves, grad_out)

    # The same computation through the fp32 oracle, on fp32 copies of the same values.
    up = torch.float32
    rq, rk, rv = (t.detach().to(up).requires_grad_() for t in (q, k, v))
    r_leaves = [rq, rk, rv]
    if bias is not None:
        r_bias = bias.detach().to(up).requires_grad_()
        ref["bias"] = r_bias
        r_leaves.append(r_bias)
    if module.softmax_type != "vanilla":
        r_offset = offset.detach().to(up).clone().requires_grad_(module.softmax_type == "learnable")
        ref["softmax_offset"] = r_offset
        if module.softmax_type == "learnable":
            r_leaves.append(r_offset)
    expected = reference_attention(rq, rk, rv, **ref)
    r_grads = torch.autograd.grad(expected, r_leaves, grad_out.to(expected.dtype))

    atol, rtol = TOL[q.dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=atol, rtol=rtol)
    names = ["dq", "dk", "dv"] + (["dbias"] if bias is not None else []) + (
        ["dsoftmax_offset"] if module.softmax_type == "learnable" else [])
    for label, g, r in zip(names, grads, r_grads):
        assert g.dtype == (q.dtype if label != "dsoftmax_offset" else offset.dtype)
        assert torch.isfinite(g).all(), label
        torch.testing.assert_close(g.float(), r.float(), atol=atol * 10, rtol=rtol * 10,
                                   msg=lambda m, label=label: f"{label}: {m}")


def test_learnable_offset_is_trained_and_off_by_one_is_not():
    module, (q, k, v), _, fwd, _ = build("bshd-learnable")
    assert isinstance(module.softmax_offset, torch.nn.Parameter)
    module(q, k, v, **fwd).sum().backward()
    assert module.softmax_offset.grad is not None and module.softmax_offset.grad.abs().sum() > 0
    module, (q, k, v), _, fwd, _ = build("bshd-off-by-one")
    assert not isinstance(module.softmax_offset, torch.nn.Parameter)
    assert list(module.parameters()) == []


def test_padded_positions_get_zero_gradients():
    module, (q, k, v), _, fwd, _ref = build("thd-pad_between-window")
    module(q, k, v, **fwd).pow(2).sum().backward()
    cu_q, cu_p = fwd["cu_seqlens_q"], fwd["cu_seqlens_q_padded"]
    valid = torch.zeros(q.shape[0], dtype=torch.bool)
    for i in range(cu_q.numel() - 1):
        valid[int(cu_p[i]) : int(cu_p[i]) + int(cu_q[i + 1] - cu_q[i])] = True
    assert (~valid).any()
    for t in (q, k, v):
        assert t.grad[~valid].eq(0).all()
        assert t.grad[valid].ne(0).any()


# ------------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------------


def _dropout_inputs():
    q = torch.randn(2, 16, 4, 16)
    k = torch.randn(2, 16, 2, 16)
    v = torch.randn(2, 16, 2, 16)
    return q, k, v


def _module(p: float) -> DotProductAttention:
    return DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal",
                               attention_dropout=p)


def test_eval_mode_ignores_dropout():
    q, k, v = _dropout_inputs()
    expected = _module(0.0).eval()(q, k, v)
    out = _module(0.5).eval()(q, k, v)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_dropout_in_training_changes_the_output():
    q, k, v = _dropout_inputs()
    expected = _module(0.0).eval()(q, k, v)
    module = _module(0.5).train()
    out = module(q, k, v)
    assert module.last_backend == "unfused"
    assert not torch.allclose(out, expected)
    # Dropout rescales the kept probabilities by 1 / (1 - p): with v = 1 each output is 2 x (the kept
    # probability mass), so outputs are not all one; with no dropout they are exactly one.
    ones = torch.ones_like(v)
    dropped = module(q, k, ones)
    assert not torch.allclose(dropped, torch.ones_like(dropped))
    torch.testing.assert_close(_module(0.0).train()(q, k, ones), torch.ones_like(dropped))
    assert dropped.mean().sub(1).abs() < 0.25


def test_zero_dropout_in_training_equals_eval():
    q, k, v = _dropout_inputs()
    torch.testing.assert_close(_module(0.0).train()(q, k, v), _module(0.0).eval()(q, k, v), atol=0, rtol=0)


def test_same_seed_same_dropout():
    q, k, v = _dropout_inputs()
    module = _module(0.3).train()
    torch.manual_seed(123)
    first = module(q, k, v)
    torch.manual_seed(123)
    second = module(q, k, v)
    third = module(q, k, v)
    torch.testing.assert_close(first, second, atol=0, rtol=0)
    assert not torch.equal(second, third)


def test_dropout_gradients_flow():
    q, k, v = (t.requires_grad_() for t in _dropout_inputs())
    module = _module(0.2).train()
    module(q, k, v).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_dropout_keeps_the_fused_backend_out():
    q, k, v = _dropout_inputs()
    module = _module(0.5).train()
    with torch.no_grad():
        text = module.explain(q, k, v)
    assert "Selected backend: unfused" in text
    assert "dropout not supported" in text


# ------------------------------------------------------------------------------------------------
# Selection under autograd
# ------------------------------------------------------------------------------------------------

needs_fused = pytest.mark.usefixtures("cpu_fused")
"""The test hands the fused backend CPU tensors: skipped where it cannot take them (tests/cpu_fused.py)."""


def _half_inputs(requires_grad: bool):
    dtype = torch.float16
    q = torch.randn(1, 8, 2, 16, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(1, 8, 2, 16, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(1, 8, 2, 16, dtype=dtype, requires_grad=requires_grad)
    return q, k, v


@needs_fused
def test_fused_is_chosen_for_inference():
    q, k, v = _half_inputs(False)
    module = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    module(q, k, v)
    assert module.last_backend == "fused"


@pytest.mark.parametrize("what", ["q", "k", "v", "bias", "learnable"])
def test_fused_is_skipped_when_a_gradient_is_needed(what):
    q, k, v = _half_inputs(False)
    kwargs = {}
    softmax = "learnable" if what == "learnable" else "vanilla"
    if what in "qkv":
        {"q": q, "k": k, "v": v}[what].requires_grad_()
    module = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal", softmax_type=softmax).half()
    if what == "bias":
        # The fused backend takes no bias tensor anyway; what matters is that the module notices
        # the gradient: requires_grad shows in the selection inputs.
        kwargs = {"core_attention_bias_type": "post_scale_bias",
                      "core_attention_bias": torch.randn(1, 2, 8, 8, dtype=torch.float16, requires_grad=True)}
    text = module.explain(q, k, v, **kwargs)
    assert "requires_grad = True" in text
    out = module(q, k, v, **kwargs)
    assert module.last_backend == "unfused"
    assert out.requires_grad
    if what != "bias":
        assert "no backward pass" in text
        with torch.no_grad():   # no graph: the same call may use the forward-only backend
            module(q, k, v, **kwargs)
            no_grad_text = module.explain(q, k, v, **kwargs)
        assert "requires_grad = False" in no_grad_text
        if cpu_fused_reason() is None:
            assert module.last_backend == "fused"


def test_requesting_fused_for_training_is_an_error():
    q, k, v = _half_inputs(True)
    module = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal", backend="fused")
    with pytest.raises(ValueError, match="no backward pass"):
        module(q, k, v)


@needs_fused
@pytest.mark.parametrize("transform", ["forward_ad", "jvp"])
def test_forward_mode_derivatives_keep_the_forward_only_backend_out(transform):
    """A dual tensor does not require grad, so the fused backend ran and its output carried no tangent (forward_ad),
    or failed reading a torch.func-wrapped tensor's data (jvp). A tangent or a torch.func transform now counts as
    a derivative, as requires_grad does: the unfused backend runs, and the tangent matches its own."""
    import torch.autograd.forward_ad as forward_ad

    q, k, v = _half_inputs(False)
    tangent = torch.randn_like(q)
    module = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal").half()
    if transform == "forward_ad":
        with forward_ad.dual_level():
            dual = forward_ad.make_dual(q, tangent)
            assert "requires_grad = True" in module.explain(dual, k, v)
            out_tangent = forward_ad.unpack_dual(module(dual, k, v)).tangent
    else:
        out_tangent = torch.func.jvp(lambda x: module(x, k, v), (q,), (tangent,))[1]
    assert module.last_backend == "unfused" and out_tangent is not None
    reference = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal", backend="unfused").half()
    expected = torch.func.jvp(lambda x: reference(x, k, v), (q,), (tangent,))[1]
    torch.testing.assert_close(out_tangent, expected)
    assert expected.abs().sum() > 0


def test_garbage_in_padding_reaches_no_real_token():
    """NaN in V's padding slots (a torch.empty buffer) made the unfused backend's real rows and their gradients NaN
    (0 * NaN): bshd past a padding mask's keys, and thd whose padded offsets leave row 0 to padding."""
    torch.manual_seed(0)
    module = DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="padding", backend="unfused")
    q, k, v = (torch.randn(2, 4, 2, 8) for _ in range(3))
    mask = torch.tensor([[False, False, True, True], [False, False, False, True]])[:, None, None, :]
    k[mask[:, 0, 0]] = float("nan")
    v[mask[:, 0, 0]] = float("nan")
    q.requires_grad_(), v.requires_grad_()
    out = module(q, k, v, attention_mask=mask)
    real = ~mask[:, 0, 0]
    assert out[real].isfinite().all()
    out[real].sum().backward()
    assert q.grad.isfinite().all() and v.grad[real].isfinite().all() and v.grad[~real].eq(0).all()

    thd = DotProductAttention(2, 8, qkv_format="thd", attn_mask_type="padding", backend="unfused")
    cu_seqlens, cu_padded = cu([2, 3]), torch.tensor([0, 3, 7], dtype=torch.int32) + 1   # rows 0, 3, 7 padding
    q, k, v = (torch.randn(8, 2, 8) for _ in range(3))
    for t in (q, k, v):
        t[[0, 3, 7]] = float("nan")
    out = thd(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens, cu_seqlens_q_padded=cu_padded,
              cu_seqlens_kv_padded=cu_padded, max_seqlen_q=4, max_seqlen_kv=4)
    real_rows = [1, 2, 4, 5, 6]
    assert out[real_rows].isfinite().all() and out[[0, 3, 7]].eq(0).all()


def test_alibi_slopes_are_constants():
    """Slopes that require grad got a gradient from the unfused backend only (flash-attn returns none; TE takes
    them as fp32 constants): no backend differentiates them."""
    module = DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="causal", backend="unfused")
    q = torch.randn(1, 5, 2, 8, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25], requires_grad=True)
    module(q, q.detach(), q.detach(), core_attention_bias_type="alibi", alibi_slopes=slopes).sum().backward()
    assert q.grad is not None and slopes.grad is None


def test_thd_without_tokens_stays_in_the_graph():
    """q, k and v of no tokens: the output was a constant, so backward() failed; now the gradients are empty."""
    module = DotProductAttention(2, 8, qkv_format="thd", attn_mask_type="padding", backend="unfused")
    q, k, v = (torch.randn(0, 2, 8, requires_grad=True) for _ in range(3))
    zero = torch.zeros(3, dtype=torch.int32)
    out = module(q, k, v, cu_seqlens_q=zero, cu_seqlens_kv=zero, max_seqlen_q=1, max_seqlen_kv=1)
    assert out.shape == (0, 16) and out.requires_grad
    out.sum().backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape
