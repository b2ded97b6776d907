"""Bad inputs get a ValueError that names the argument; TE's normalisation of mask names and windows."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from attention import DotProductAttention, call_setup
from attention.masks import check_set_window_size, normalize_mask_type
from attention.selection import ENV_SWITCHES

B, S, H, HK, D, DV = 2, 6, 4, 2, 8, 8


def qkv(fmt="bshd", b=B, s_q=S, s_kv=S, h=H, hk=HK, d=D, dv=DV, dtype=torch.float32):
    """Valid q/k/v for ``DotProductAttention(H, (D, DV), num_gqa_groups=HK)``."""
    def shape(s, heads, dim):
        return {"bshd": (b, s, heads, dim), "sbhd": (s, b, heads, dim), "thd": (b * s, heads, dim)}[fmt]

    return (torch.randn(*shape(s_q, h, d), dtype=dtype), torch.randn(*shape(s_kv, hk, d), dtype=dtype),
            torch.randn(*shape(s_kv, hk, dv), dtype=dtype))


def _fused_device(backend: str) -> str:
    """Where a test's fused case runs: on the GPU where there is one (CPU tensors run the fused kernels only under
    TRITON_INTERPRET=1, the CPU suite's mode)."""
    return "cuda" if backend == "fused" and torch.cuda.is_available() else "cpu"


def module(**kwargs) -> DotProductAttention:
    # The unfused backend, so that every error here comes from the module's own checks (the fused
    # backend, chosen automatically under the Triton interpreter, has argument checks of its own).
    defaults = {"num_attention_heads": H, "kv_channels": (D, DV), "num_gqa_groups": HK, "qkv_format": "bshd",
                    "attn_mask_type": "no_mask", "backend": "unfused"}
    return DotProductAttention(**{**defaults, **kwargs})


def cu(*lengths: int) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def test_valid_baseline_runs():
    """The fixtures below are valid; each test breaks exactly one thing."""
    q, k, v = qkv()
    assert module()(q, k, v).shape == (B, S, H * DV)
    q, k, v = qkv("thd")
    out = module(qkv_format="thd", attn_mask_type="padding")(q, k, v, cu_seqlens_q=cu(S, S), cu_seqlens_kv=cu(S, S))
    assert out.shape == (B * S, H * DV)


# ------------------------------------------------------------------------------------------------
# q/k/v tensors
# ------------------------------------------------------------------------------------------------


def test_query_heads_must_match_num_attention_heads():
    q, k, v = qkv(h=H * 2)
    with pytest.raises(ValueError, match="query_layer"):
        module()(q, k, v)


@pytest.mark.parametrize("which", ["key_layer", "value_layer"])
def test_kv_heads_must_match_num_gqa_groups(which):
    q, k, v = qkv()
    if which == "key_layer":
        k = torch.randn(B, S, HK * 2, D)
        v = torch.randn(B, S, HK * 2, DV)
    else:
        v = torch.randn(B, S, 1, DV)
    with pytest.raises(ValueError, match=which):
        module()(q, k, v)


@pytest.mark.parametrize("which", ["key_layer", "value_layer"])
def test_dtypes_must_agree(which):
    q, k, v = qkv()
    if which == "key_layer":
        k = k.half()
    else:
        v = v.double()
    with pytest.raises(ValueError, match=which):
        module()(q, k, v)


def test_integer_inputs_are_rejected():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="query_layer"):
        module()(q.to(torch.int32), k, v)


@pytest.mark.parametrize("which", ["key_layer", "value_layer"])
def test_devices_must_agree(which):
    q, k, v = qkv()
    if which == "key_layer":
        k = k.to("meta")
    else:
        v = v.to("meta")
    with pytest.raises(ValueError, match=which):
        module()(q, k, v)


@pytest.mark.parametrize("which", ["query_layer", "key_layer"])
def test_qk_head_dim_must_match_kv_channels(which):
    q, k, v = qkv()
    if which == "query_layer":
        q = torch.randn(B, S, H, D + 8)
    else:
        k = torch.randn(B, S, HK, D + 8)
    with pytest.raises(ValueError, match=which):
        module()(q, k, v)


def test_v_head_dim_must_match_d_v():
    q, k, v = qkv(dv=DV * 2)
    with pytest.raises(ValueError, match="value_layer"):
        module()(q, k, v)
    q, k, v = qkv(dv=DV * 2)   # and the pair form of kv_channels is honoured
    assert module(kv_channels=(D, DV * 2))(q, k, v).shape == (B, S, H * DV * 2)


def test_k_and_v_must_agree_on_all_but_the_last_dim():
    q, k, v = qkv()
    v = torch.randn(B, S + 1, HK, DV)
    with pytest.raises(ValueError, match="value_layer"):
        module()(q, k, v)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_batch_sizes_must_agree(fmt):
    q, _, _ = qkv(fmt)
    _, k, v = qkv(fmt, b=B + 1)
    with pytest.raises(ValueError, match="key_layer"):
        module(qkv_format=fmt)(q, k, v)


@pytest.mark.parametrize("fmt,ndim", [("bshd", 3), ("sbhd", 5), ("thd", 4)])
def test_wrong_ndim_for_format(fmt, ndim):
    q, k, v = qkv("bshd")
    shapes = {3: (B * S, H, D), 4: (B, S, H, D), 5: (1, B, S, H, D)}
    q = torch.randn(*shapes[ndim])
    with pytest.raises(ValueError, match="query_layer"):
        module(qkv_format=fmt, attn_mask_type="padding")(q, k, v)


# ------------------------------------------------------------------------------------------------
# thd and cu_seqlens
# ------------------------------------------------------------------------------------------------


def test_thd_without_cu_seqlens():
    q, k, v = qkv("thd")
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        module(qkv_format="thd", attn_mask_type="padding")(q, k, v)


def test_thd_cross_attention_needs_cu_seqlens_kv():
    q, k, v = qkv("thd")
    with pytest.raises(ValueError, match="cu_seqlens_kv"):
        module(qkv_format="thd", attn_mask_type="padding", attention_type="cross")(q, k, v, cu_seqlens_q=cu(S, S))


def test_thd_self_attention_takes_the_queries_cu_seqlens_only_for_as_many_key_tokens():
    """Without cu_seqlens_kv the keys are read at cu_seqlens_q's offsets: with more key tokens than query tokens
    that dropped the last keys silently; it is refused, naming cu_seqlens_kv."""
    q, k, v = qkv("thd")
    m = module(qkv_format="thd", attn_mask_type="padding")
    torch.testing.assert_close(m(q, k, v, cu_seqlens_q=cu(S, S)), m(q, k, v, cu_seqlens_q=cu(S, S),
                                                                     cu_seqlens_kv=cu(S, S)))
    longer = torch.cat([k, k[:3]]), torch.cat([v, v[:3]])
    with pytest.raises(ValueError, match=rf"key_layer has {2 * S + 3} and query_layer {2 * S}: pass cu_seqlens_kv"):
        m(q, *longer, cu_seqlens_q=cu(S, S))
    # the keys' own offsets given: they are read there (the queries' lengths), whatever key_layer's token count
    offsets = dict(cu_seqlens_kv_padded=torch.tensor([0, S + 3, 2 * S + 3], dtype=torch.int32))
    torch.testing.assert_close(m(q, *longer, cu_seqlens_q=cu(S, S), **offsets),
                               m(q, *longer, cu_seqlens_q=cu(S, S), cu_seqlens_kv=cu(S, S), **offsets))


@pytest.mark.parametrize("mask_type, fmt, reason", [
    ("causal", "bshd", r"attn_mask_type='causal' reads no mask \(a mask that only repeats it can be left out; a "
                       r"padding mask needs a padding type such as 'padding_causal', any other mask 'arbitrary'\)"),
    ("no_mask", "sbhd", r"attn_mask_type='no_mask' reads no mask"),
    ("padding", "thd", r"qkv_format='thd' takes each sequence's lengths from cu_seqlens_q / cu_seqlens_kv"),
    ("padding_causal", "bshd", r"the given cu_seqlens give each sequence's lengths \(self-attention: one of "
                               r"cu_seqlens_q / cu_seqlens_kv serves both sides"),
])
def test_a_mask_that_is_not_read_is_warned_about_once(mask_type, fmt, reason, monkeypatch):
    """TE ignores attention_mask silently where the mask type or format reads none; a padding mask passed with the
    default causal type then attends padded keys. A UserWarning says so, once per reason."""
    monkeypatch.setattr(call_setup, "_WARNED", set())
    q, k, v = qkv(fmt)
    m = module(qkv_format=fmt, attn_mask_type=mask_type)
    lengths = dict(cu_seqlens_q=cu(S, S), cu_seqlens_kv=cu(S, S)) if fmt == "thd" or "padding" in mask_type else {}
    pad = torch.zeros(2, 1, 1, S, dtype=torch.bool)
    pad[:, ..., S - 2:] = True   # masks the last two keys (if it were read)
    with pytest.warns(UserWarning, match=rf"attention_mask is given but not read: {reason}") as record:
        out = m(q, k, v, attention_mask=pad, **lengths)
    assert record[0].filename == __file__   # the caller's line, past nn.Module's frames and the package's
    torch.testing.assert_close(out, m(q, k, v, **lengths))   # as in TE: the mask is not applied
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(q, k, v, attention_mask=pad, **lengths)   # once
        module(qkv_format="bshd", attn_mask_type="padding")(*qkv("bshd"), attention_mask=pad)   # read: no warning
    monkeypatch.setattr(call_setup, "_WARNED", set())
    m.explain(q, k, v, attention_mask=pad, **lengths)   # explain() runs nothing: it leaves the warning to the call
    with pytest.warns(UserWarning, match="attention_mask is given but not read"):
        m(q, k, v, attention_mask=pad, **lengths)


@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right", "arbitrary"])
def test_thd_with_a_non_padding_mask(mask):
    q, k, v = qkv("thd")
    with pytest.raises(ValueError, match="attn_mask_type"):
        module(qkv_format="thd", attn_mask_type=mask)(q, k, v, cu_seqlens_q=cu(S, S), cu_seqlens_kv=cu(S, S))


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"])
@pytest.mark.parametrize("bad", ["int64", "float", "2-D", "one entry", "list"])
def test_cu_seqlens_must_be_1d_int32(name, bad):
    q, k, v = qkv("thd")
    good = cu(S, S)
    value = {"int64": good.long(), "float": good.float(), "2-D": good[None], "one entry": good[:1],
             "list": good.tolist()}[bad]
    kwargs = {"cu_seqlens_q": good, "cu_seqlens_kv": good}
    kwargs[name] = value
    with pytest.raises(ValueError, match=name):
        module(qkv_format="thd", attn_mask_type="padding")(q, k, v, **kwargs)


def test_cu_seqlens_on_another_device():
    q, k, v = qkv("thd")
    with pytest.raises(ValueError, match="cu_seqlens_kv"):
        module(qkv_format="thd", attn_mask_type="padding")(q, k, v, cu_seqlens_q=cu(S, S),
                                                           cu_seqlens_kv=cu(S, S).to("meta"))


def test_thd_cu_seqlens_q_and_kv_must_describe_the_same_batch():
    q, k, v = qkv("thd")
    with pytest.raises(ValueError, match="cu_seqlens_kv"):
        module(qkv_format="thd", attn_mask_type="padding")(q, k, v, cu_seqlens_q=cu(S, S),
                                                           cu_seqlens_kv=cu(S, S - 2, 2))


def test_bshd_cu_seqlens_shorter_than_the_batch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        module(attn_mask_type="padding")(q, k, v, cu_seqlens_q=cu(S), cu_seqlens_kv=cu(S, S))


def test_padding_attention_mask_of_a_wrong_shape():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="attention_mask"):
        module(attn_mask_type="padding")(q, k, v, attention_mask=torch.zeros(B, 1, 1, S + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask"):
        module(attn_mask_type="padding")(q, k, v, attention_mask=torch.zeros(B, 1, 1, S))   # not bool


@pytest.mark.parametrize("given", ["pair", "pair and cu_seqlens_q", "pair and cu_seqlens_kv"])
def test_a_mask_pair_gives_each_side_its_lengths_unless_cu_seqlens_are_given(given):
    """Self-attention with (q_mask, kv_mask): the keys' lengths come from the kv mask even when only
    cu_seqlens_q is given (it used to stand for both sides)."""
    from tests.reference import reference_attention

    q, k, v = qkv()
    lengths_q, lengths_kv = (6, 3), (2, 5)
    masks = tuple(torch.arange(S)[None, None, None, :] >= torch.tensor(lengths)[:, None, None, None]
                  for lengths in (lengths_q, lengths_kv))
    extra = {"pair and cu_seqlens_q": {"cu_seqlens_q": cu(*lengths_q)},
             "pair and cu_seqlens_kv": {"cu_seqlens_kv": cu(*lengths_kv)}}.get(given, {})
    out = module(attn_mask_type="padding")(q, k, v, attention_mask=masks, **extra)
    expected = reference_attention(q, k, v, qkv_format="bshd", attn_mask_type="padding",
                                   cu_seqlens_q=cu(*lengths_q), cu_seqlens_kv=cu(*lengths_kv))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(B * S,), (1, 1, B, S), (S, B), (B, 1, S, 1), (B, S)])
def test_padding_mask_with_b_times_s_elements_but_not_b_1_1_s_is_refused(shape):
    """Lengths are counted per row of dim 0: another layout of b * s flags would be read along the wrong axis."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match=re.escape(f"bool [b,1,1,s] = [{B},1,1,{S}] tensor")) as refused:
        module(attn_mask_type="padding")(q, k, v, attention_mask=torch.zeros(shape, dtype=torch.bool))
    assert f"shape {shape}" in str(refused.value)


# ------------------------------------------------------------------------------------------------
# Module options and names
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["causal_top_left", "bottom_right", "padding,arbitrary", "", "Causal-Padding"])
def test_bad_mask_names(name):
    with pytest.raises(ValueError, match="attn_mask_type"):
        module(attn_mask_type=name)
    q, k, v = qkv()
    if name:   # an empty per-call override means "the module's default"
        with pytest.raises(ValueError, match="attn_mask_type"):
            module()(q, k, v, attn_mask_type=name)


def test_mask_type_must_be_a_string():
    with pytest.raises(ValueError, match="attn_mask_type"):
        module(attn_mask_type=None)


@pytest.mark.parametrize("window", [(-2, 0), (0, -2), (3,), (1, 2, 3), (1.5, 2), "(1, 2)", 3, (-1, 4), (4, -1)])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_bad_windows(window, mask):
    if mask == "causal" and window == (4, -1):
        pytest.skip("causal masks force right=0: (4, -1) is normalised to (4, 0), as in TE")
    with pytest.raises(ValueError, match="window_size"):
        module(attn_mask_type=mask, window_size=window)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="window_size"):
        module(attn_mask_type=mask)(q, k, v, window_size=window)


@pytest.mark.parametrize("kwargs, message", [
    ({"bottom_right_diagonal": "no"}, r"bottom_right_diagonal must be True, False \(or 1 / 0\) or None; got 'no'"),
    ({"bottom_right_diagonal": 2}, r"bottom_right_diagonal must be True, False \(or 1 / 0\) or None; got 2"),
    ({"max_seqlen_q": "5"}, r"max_seqlen_q must be an int >= 0 or None; got '5'"),
    ({"max_seqlen_kv": -1}, r"max_seqlen_kv must be an int >= 0 or None; got -1"),
    ({"max_seqlen_q": 6.0}, r"max_seqlen_q must be an int >= 0 or None; got 6.0"),
    ({"pad_between_seqs": "yes"}, r"pad_between_seqs must be True, False or None \(inferred\); got 'yes'"),
    ({"core_attention_bias_type": "post_scale_bias", "core_attention_bias": torch.zeros(1, 1, S, S, dtype=torch.bool)},
     r"core_attention_bias must be a floating-point tensor .* attn_mask_type='arbitrary'"),
])
def test_bad_host_arguments_and_bool_bias(kwargs, message):
    """Values that used to be read loosely: "no" as a true diagonal flag, a bool mask added to the scores as 0/1."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match=message):
        module(attn_mask_type="padding")(q, k, v, **kwargs)
    if "bottom_right_diagonal" in kwargs:   # the constructor's too
        with pytest.raises(ValueError, match=message):
            module(**kwargs)


def test_numpy_and_one_element_tensor_scalars_are_read_as_their_values():
    """Megatron passes max_seqlen_* as tensors to TE; numpy scalars come from data pipelines: both are their
    ``.item()`` (a host sync for a CUDA tensor, as in TE)."""
    import numpy as np

    from tests.reference import reference_attention

    q, k, v = qkv(fmt="thd", b=2, s_q=5, s_kv=5)
    lengths = cu(3, 7)
    expected = reference_attention(q, k, v, qkv_format="thd", attn_mask_type="padding_causal", cu_seqlens_q=lengths,
                                   cu_seqlens_kv=lengths, softmax_scale=0.25)
    m = module(qkv_format="thd", attn_mask_type="padding_causal", softmax_scale=torch.tensor(0.25),
               bottom_right_diagonal=np.bool_(False))
    out = m(q, k, v, cu_seqlens_q=lengths, cu_seqlens_kv=lengths, max_seqlen_q=torch.tensor(7),
            max_seqlen_kv=np.int64(7), pad_between_seqs=torch.tensor(False), bottom_right_diagonal=np.bool_(False))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1"])
def test_softmax_scale_must_be_a_finite_number(scale):
    with pytest.raises(ValueError, match="softmax_scale must be a finite number or None"):
        module(softmax_scale=scale)


@pytest.mark.parametrize("fmt", ["bhsd", "BSHD", "thd_2bshd", "", None])
def test_bad_qkv_format(fmt):
    with pytest.raises(ValueError, match="qkv_format"):
        module(qkv_format=fmt)


def test_bad_qkv_format_per_call():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="qkv_format"):
        module()(q, k, v, qkv_format="hsbd")


@pytest.mark.parametrize("softmax_type", ["off_by_one", "sink", "Vanilla", None])
def test_bad_softmax_type(softmax_type):
    with pytest.raises(ValueError, match="softmax_type"):
        module(softmax_type=softmax_type)


@pytest.mark.parametrize("groups", [3, 5, 8, 0, -2])
def test_num_gqa_groups_must_divide_heads(groups):
    with pytest.raises(ValueError, match="num_gqa_groups"):
        module(num_gqa_groups=groups)


@pytest.mark.parametrize("kv_channels", [(8,), (8, 8, 8), "8", None, 0, -16, True, 8.0, (16, -1), (16, 8.5)])
def test_bad_kv_channels(kv_channels):
    with pytest.raises(ValueError, match="kv_channels"):
        module(kv_channels=kv_channels)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, "0.1"])
def test_bad_attention_dropout(p):
    with pytest.raises(ValueError, match="attention_dropout"):
        module(attention_dropout=p)


@pytest.mark.parametrize("name, value", [("num_attention_heads", 4.7), ("num_attention_heads", "4"),
                                         ("num_attention_heads", True), ("num_gqa_groups", 2.5),
                                         ("layer_number", -1), ("layer_number", 1.9),
                                         ("layer_number", "a"), ("return_max_logit", "no"), ("backend", 3)])
def test_constructor_arguments_are_not_coerced(name, value):
    """Such values became other values silently (4.7 heads were 4; layer_number=1.9 wrote layer 1's cache;
    return_max_logit="no" was True) or raised Python's own errors; each is refused naming the argument."""
    with pytest.raises(ValueError, match=name):
        module(**{name: value})


@pytest.mark.parametrize("value", [True, torch.tensor(True), torch.tensor([True]), 2.0, "2", torch.tensor(2.0)])
def test_integers_refuse_bools_of_every_kind(value):
    from attention.integers import as_int

    assert as_int(value) is None


def test_integer_arguments_may_be_numpy_integers():
    import numpy as np

    m = module(num_attention_heads=np.int64(H), kv_channels=np.int32(D), num_gqa_groups=np.int64(HK),
               layer_number=np.int64(2))
    assert (m.num_attention_heads, m.head_dim_qk, m.num_gqa_groups, m.layer_number) == (H, D, HK, 2)
    assert all(type(x) is int for x in (m.num_attention_heads, m.head_dim_qk, m.num_gqa_groups, m.layer_number))


def test_bad_attention_type():
    with pytest.raises(ValueError, match="attention_type"):
        module(attention_type="encoder")


@pytest.mark.parametrize("backend", ["cudnn", "flash5", "", ["unfused", "triton"], []])
def test_unknown_backend_name(backend):
    with pytest.raises(ValueError, match="backend"):
        module(backend=backend)


@pytest.mark.parametrize("name, value, message", [
    ("backend", "cudnn", "backend: unknown backend 'cudnn'"),
    ("backend", ["unfused", "triton"], "backend: unknown backend 'triton'"),
    ("attention_dropout", 2.0, r"attention_dropout must be a number in \[0, 1\); got 2.0"),
    ("softmax_scale", "x", "softmax_scale must be a finite number or None"),
    ("softmax_scale", float("nan"), "softmax_scale must be a finite number or None"),
    ("softmax_type", "learnable", "softmax_type is fixed when the module is built"),
    ("softmax_type", "softmax", "softmax_type must be one of"),
    ("layer_number", True, "layer_number must be an int >= 0; got True"),
    ("layer_number", 1.0, "layer_number must be an int >= 0; got 1.0"),
    ("layer_number", "1", "layer_number must be an int >= 0; got '1'"),
    ("attention_type", "bogus", "attention_type must be 'self' or 'cross'; got 'bogus'"),
])
def test_assignments_after_construction_are_checked_as_the_arguments(name, value, message):
    """``attn.backend = "unfused"`` was read a character at a time (KeyError: 'u'); a softmax_type set later found
    no sink logits, a string softmax_scale failed deep in a backend. Each assignment is checked as the constructor's
    argument, and a refused one leaves the module as it was."""
    m = module()
    before = {key: getattr(m, key) for key in ("backend", "attention_dropout", "softmax_scale", "softmax_type",
                                               "layer_number", "_layer_number_defaulted", "attention_type")}
    with pytest.raises(ValueError, match=message):
        setattr(m, name, value)
    assert {key: getattr(m, key) for key in before} == before
    q, k, v = qkv()
    m(q, k, v)


def test_head_counts_set_after_construction_are_checked_at_the_call():
    """num_gqa_groups set to 3 beside 4 heads failed deep in a backend (a size mismatch naming no argument)."""
    m = module()
    m.num_gqa_groups = 3
    q = torch.randn(B, S, H, D)
    k = v = torch.randn(B, S, 3, D)
    with pytest.raises(ValueError, match=rf"num_gqa_groups must be an int >= 1 that divides num_attention_heads={H}; "
                                         r"got 3"):
        m(q, k, v)
    m.num_gqa_groups = 2.0   # (a float ran)
    with pytest.raises(ValueError, match=r"num_gqa_groups must be an int >= 1 .*got 2.0"):
        m(q, k, v)
    m.num_gqa_groups, m.num_attention_heads = HK, "4"   # (a string failed on a bare TypeError)
    with pytest.raises(ValueError, match=r"num_attention_heads must be an int >= 1; got '4'"):
        m(q, k, v)


def test_assignments_after_construction_are_normalised():
    import numpy as np

    m = module(backend=None)
    m.backend = "unfused"
    assert m.backend == ("unfused",)
    m.backend = "flash"   # a family: its generations, as backend="flash" gives
    assert m.backend == module(backend="flash").backend
    m.backend = None
    assert m.backend is None
    m.softmax_scale = None   # the default, 1/sqrt(d_qk)
    assert m.softmax_scale == pytest.approx(D ** -0.5)
    m.softmax_scale = torch.tensor(0.5)   # a one-element tensor: its value
    assert m.softmax_scale == 0.5 and type(m.softmax_scale) is float
    m.softmax_type = "vanilla"   # the same type again: allowed
    m.attention_dropout = 0   # an int: stored as a float
    assert m.attention_dropout == 0.0 and type(m.attention_dropout) is float
    assert m._layer_number_defaulted   # built without one: TE's layer 1
    m.layer_number = np.int64(1)   # a numpy integer: its int; named now, so not TE's default layer any more
    assert m.layer_number == 1 and type(m.layer_number) is int and not m._layer_number_defaulted


def test_num_splits_may_be_a_numpy_integer():
    import numpy as np

    q, k, v = qkv()
    m = module()
    torch.testing.assert_close(m(q, k, v, num_splits=np.int64(1)), m(q, k, v))
    with pytest.raises(ValueError, match="num_splits must be an int >= 1"):
        m(q, k, v, num_splits=np.int64(0))
    with pytest.raises(ValueError, match="num_splits must be an int >= 1; got True"):
        module()(q, k, v, num_splits=True)   # (a fresh module: a call plan made for 1 serves its equal, True)


@pytest.mark.parametrize("given", ["cu_seqlens_q", "cu_seqlens_kv"])
def test_one_cu_seqlens_serves_both_sides_of_self_attention(given):
    """bshd self-attention given only one of cu_seqlens_q / cu_seqlens_kv: the other side has the same lengths
    (only cu_seqlens_kv used to leave the queries at full length, silently)."""
    q, k, v = qkv()
    m = module(attn_mask_type="padding_causal")
    lengths = cu(4, S)
    torch.testing.assert_close(m(q, k, v, **{given: lengths}),
                               m(q, k, v, cu_seqlens_q=lengths, cu_seqlens_kv=lengths))


@pytest.mark.parametrize("given", ["cu_seqlens_q", "cu_seqlens_kv"])
def test_a_mask_beside_one_cu_seqlens_of_self_attention_is_warned_about(given, monkeypatch):
    """The one cu_seqlens serves both sides, so the mask beside it is not read: it was dropped silently."""
    monkeypatch.setattr(call_setup, "_WARNED", set())
    q, k, v = qkv()
    m = module(attn_mask_type="padding_causal")
    pad = torch.zeros(2, 1, 1, S, dtype=torch.bool)
    pad[:, ..., 2:] = True
    with pytest.warns(UserWarning, match="attention_mask is given but not read: the given cu_seqlens give"):
        out = m(q, k, v, attention_mask=pad, **{given: cu(4, S)})
    torch.testing.assert_close(out, m(q, k, v, cu_seqlens_q=cu(4, S), cu_seqlens_kv=cu(4, S)))
    monkeypatch.setattr(call_setup, "_WARNED", set())


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask_type", ["causal", "no_mask"])
def test_cu_seqlens_that_are_not_read_are_warned_about_once(fmt, mask_type, monkeypatch):
    """cu_seqlens with a mask type without padding were ignored silently in bshd / sbhd (as in TE): every
    sequence is full length there. A UserWarning says so, once per mask type."""
    monkeypatch.setattr(call_setup, "_WARNED", set())
    q, k, v = qkv(fmt)
    m = module(qkv_format=fmt, attn_mask_type=mask_type)
    with pytest.warns(UserWarning, match=rf"cu_seqlens_q / cu_seqlens_kv are given but not read: "
                                         rf"attn_mask_type='{mask_type}' has no padding"):
        out = m(q, k, v, cu_seqlens_q=cu(4, S), cu_seqlens_kv=cu(4, S))
    torch.testing.assert_close(out, m(q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(q, k, v, cu_seqlens_q=cu(4, S))   # once
        module(qkv_format=fmt, attn_mask_type="padding")(q, k, v, cu_seqlens_q=cu(4, S))   # read: no warning
    monkeypatch.setattr(call_setup, "_WARNED", set())


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("given", ["cu_seqlens_q_padded", "cu_seqlens_kv_padded", "pad_between_seqs"])
def test_thd_layout_arguments_given_in_bshd_are_warned_about_once(fmt, given, monkeypatch):
    """Padded offsets (even nonsense ones) and pad_between_seqs=True in bshd / sbhd were ignored silently, where
    unread cu_seqlens are warned about. A UserWarning says so, once per format; the output is the call's without."""
    monkeypatch.setattr(call_setup, "_WARNED", set())
    q, k, v = qkv(fmt)
    m = module(qkv_format=fmt, attn_mask_type="padding")
    lengths = cu(4, S)
    value = True if given == "pad_between_seqs" else torch.tensor([7, 1, 0], dtype=torch.int32)
    with pytest.warns(UserWarning, match=rf"pad_between_seqs are given but not read: they lay out thd's packed "
                                         rf"tokens, and in {fmt} every sequence starts at its own row"):
        out = m(q, k, v, cu_seqlens_q=lengths, cu_seqlens_kv=lengths, **{given: value})
    torch.testing.assert_close(out, m(q, k, v, cu_seqlens_q=lengths, cu_seqlens_kv=lengths), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(q, k, v, cu_seqlens_q=lengths, cu_seqlens_kv=lengths, **{given: value})   # once
        m(q, k, v, pad_between_seqs=False)   # (False asks for nothing)
    monkeypatch.setattr(call_setup, "_WARNED", set())


# ------------------------------------------------------------------------------------------------
# Bias, ALiBi and arbitrary masks
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias_type", ["post_scale_bias", "pre_scale_bias"])
def test_bias_type_without_a_tensor(bias_type):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="core_attention_bias"):
        module()(q, k, v, core_attention_bias_type=bias_type)


@pytest.mark.parametrize("bias_type", ["no_bias", "alibi"])
def test_bias_tensor_with_a_tensorless_bias_type(bias_type):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="core_attention_bias"):
        module()(q, k, v, core_attention_bias_type=bias_type, core_attention_bias=torch.zeros(1, 1, S, S))


def test_unknown_bias_type():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="core_attention_bias_type"):
        module()(q, k, v, core_attention_bias_type="relative")


@pytest.mark.parametrize("shape", [(S, S), (1, S, S), (3, 1, S, S), (1, 3, S, S), (B, H, S + 1, S),
                                   (1, 1, S, S - 1), (1, 1, 1, S + 1), (1, 1, 1, 1, S)])
def test_bias_of_a_wrong_shape(shape):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="core_attention_bias"):
        module()(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=torch.zeros(*shape))


def test_bias_on_another_device():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="core_attention_bias"):
        module()(q, k, v, core_attention_bias_type="post_scale_bias",
                 core_attention_bias=torch.zeros(1, 1, S, S, device="meta"))


@pytest.mark.parametrize("shape", [(H + 1,), (1, H), (B + 1, H), (B, H, 1), ()])
def test_alibi_slopes_of_a_wrong_shape(shape):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="alibi_slopes"):
        module()(q, k, v, core_attention_bias_type="alibi", alibi_slopes=torch.ones(shape))


@pytest.mark.parametrize("backend", ["unfused", "fused"])
@pytest.mark.parametrize("view", ["transposed", "expanded", "strided"])
def test_alibi_slopes_may_be_any_view(backend, view):
    """Slopes as a strided or expanded view run as their contiguous copy (the fused backend refused them after
    selection, naming a contiguous last dim)."""
    device = _fused_device(backend)
    slopes = {"transposed": torch.rand(H, B, device=device).t(),
              "expanded": torch.rand(1, 1, device=device).expand(B, H),
              "strided": torch.rand(2 * H, device=device)[::2]}[view]
    q, k, v = (x.half().to(device) for x in qkv())
    m = module(attn_mask_type="causal", backend=backend)
    out = m(q, k, v, core_attention_bias_type="alibi", alibi_slopes=slopes)
    expected = m(q, k, v, core_attention_bias_type="alibi", alibi_slopes=slopes.contiguous())
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("slopes, message", [([1.0] * H, "alibi_slopes must be a floating-point tensor"),
                                             (torch.ones(H, dtype=torch.int64), "alibi_slopes must be a floating"),
                                             (torch.ones(H, device="meta"), "alibi_slopes must be on the inputs'")])
def test_alibi_slopes_that_are_not_tensors_on_the_inputs_device(slopes, message):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=message):
        module()(q, k, v, core_attention_bias_type="alibi", alibi_slopes=slopes)


def test_a_padding_mask_on_another_device():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="attention_mask for the query side must be on the inputs' device"):
        module(attn_mask_type="padding")(q, k, v, attention_mask=torch.zeros(B, 1, 1, S, dtype=torch.bool,
                                                                             device="meta"))


def test_inference_params_must_be_inference_params():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="inference_params must be an inference.InferenceParams"):
        module(attn_mask_type="padding_causal")(q, k, v, inference_params={})


def test_inference_params_are_checked_after_a_cache_step_too():
    """The call plan of a cache step was keyed on "some inference_params": a dict in its place then skipped the check
    and failed with an AttributeError deep in the step."""
    from collections import OrderedDict

    from inference import InferenceParams

    cache = InferenceParams(B, 16, HK, D, torch.float32, head_dim_v=DV, device="cpu")
    cache.allocate_memory(1)
    m = module(attn_mask_type="padding_causal")
    q, k, v = qkv(s_q=1, s_kv=1)
    cache.pre_step(OrderedDict((seq, 1) for seq in range(B)))
    with torch.no_grad():
        m(q, k, v, inference_params=cache)
    for wrong in ({}, "cache", object()):
        with pytest.raises(ValueError, match="inference_params must be an inference.InferenceParams"):
            m(q, k, v, inference_params=wrong)


def test_alibi_slopes_need_the_alibi_bias_type():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="alibi_slopes"):
        module()(q, k, v, alibi_slopes=torch.ones(H))


@pytest.mark.parametrize("shape", [(S, S), (H, S, S), (1, S, S)])
def test_arbitrary_masks_of_fewer_dims_broadcast_as_in_te(shape):
    """TE takes any mask broadcastable to [b, h, s_q, s_kv]: [s_q, s_kv] and [h, s_q, s_kv] too (they were
    refused as not 4-D)."""
    from tests.reference import reference_attention

    torch.manual_seed(0)
    q, k, v = qkv()
    mask = torch.rand(shape) < 0.3
    m = module(attn_mask_type="arbitrary")
    expected = reference_attention(q, k, v, qkv_format="bshd", attn_mask_type="arbitrary",
                                   attention_mask=mask.view(*(1,) * (4 - mask.dim()), *shape))
    for _ in range(2):   # the second call through the call plan
        torch.testing.assert_close(m(q, k, v, attention_mask=mask), expected)


def test_arbitrary_mask_missing_or_not_bool():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="attention_mask must be a bool tensor .*; got None$"):
        module(attn_mask_type="arbitrary")(q, k, v)
    with pytest.raises(ValueError, match=rf"; got a torch.float32 tensor of shape \[{B}, 1, {S}, {S}\]; an additive "
                                         r"float mask \(0 / -inf\) is `attention_mask < 0` as a bool mask"):
        module(attn_mask_type="arbitrary")(q, k, v, attention_mask=torch.zeros(B, 1, S, S))


@pytest.mark.parametrize("shape", [(S,), (S, S + 1), (B, 1, S, S + 1), (B + 1, 1, S, S), (1, H + 1, S, S),
                                   (1, B, 1, S, S)])
def test_arbitrary_mask_not_broadcastable(shape):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="attention_mask"):
        module(attn_mask_type="arbitrary")(q, k, v, attention_mask=torch.zeros(shape, dtype=torch.bool))


# ------------------------------------------------------------------------------------------------
# Backends and the environment
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", sorted(ENV_SWITCHES))
@pytest.mark.parametrize("value", ["2", "yes", ""])
def test_nvte_switch_with_a_bad_value(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    q, k, v = qkv()
    with pytest.raises(ValueError, match=variable):
        module(backend=None)(q, k, v)


def test_nvte_switch_zero_disables(monkeypatch):
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    q, k, v = qkv()
    with pytest.raises(ValueError, match="No dot product attention backend is available") as err:
        module(backend=None)(q, k, v)
    assert "unfused" not in str(err.value).split("Backends tried")[1].replace(
        "disabled by environment: fused, unfused", "")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "1")
    m = module(backend=None)
    m(q, k, v)
    assert m.last_backend == "unfused"


def test_requested_backend_never_falls_back():
    q, k, v = qkv()
    m = module(attn_mask_type="arbitrary", backend="fused")
    with pytest.raises(ValueError, match="fused") as err:
        m(q, k, v, attention_mask=torch.zeros(B, 1, S, S, dtype=torch.bool))
    assert "arbitrary" in str(err.value)


# ------------------------------------------------------------------------------------------------
# TE's normalisation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given,canonical", [
    ("padding,causal", "padding_causal"),
    ("causal_padding", "padding_causal"),
    ("causal,padding", "padding_causal"),
    ("padding,causal,bottom_right", "padding_causal_bottom_right"),
    ("causal,bottom_right", "causal_bottom_right"),
    ("no_mask", "no_mask"),
    ("arbitrary", "arbitrary"),
])
def test_mask_name_normalisation(given, canonical):
    assert normalize_mask_type(given) == canonical
    assert module(attn_mask_type=given).attn_mask_type == canonical


def test_normalised_mask_names_give_the_same_output():
    q, k, v = qkv()
    lens = cu(4, 6)
    expected = module(attn_mask_type="padding_causal")(q, k, v, cu_seqlens_q=lens, cu_seqlens_kv=lens)
    for name in ("padding,causal", "causal_padding"):
        out = module(attn_mask_type=name)(q, k, v, cu_seqlens_q=lens, cu_seqlens_kv=lens)
        torch.testing.assert_close(out, expected, atol=0, rtol=0)
        out = module()(q, k, v, attn_mask_type=name, cu_seqlens_q=lens, cu_seqlens_kv=lens)
        torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("mask", ["causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"])
@pytest.mark.parametrize("given,expected", [(None, (-1, 0)), ((-1, 0), (-1, 0)), ((3, 0), (3, 0)),
                                            ((3, 2), (3, 0)), ((-1, -1), (-1, 0)), ((0, 5), (0, 0)),
                                            ((4, -1), (4, 0)), ([2, 0], (2, 0))])
def test_causal_windows_force_right_to_zero(mask, given, expected):
    assert check_set_window_size(mask, given) == expected
    assert module(attn_mask_type=mask, window_size=given).window_size == expected


@pytest.mark.parametrize("mask", ["no_mask", "padding", "arbitrary"])
@pytest.mark.parametrize("given,expected", [(None, (-1, -1)), ((-1, 0), (-1, -1)), ((-1, -1), (-1, -1)),
                                            ((2, 2), (2, 2)), ((0, 0), (0, 0)), ((3, 0), (3, 0))])
def test_non_causal_windows(mask, given, expected):
    assert check_set_window_size(mask, given) == expected
    assert module(attn_mask_type=mask, window_size=given).window_size == expected


@pytest.mark.parametrize("backend", ["unfused", "fused"])
@pytest.mark.parametrize("mask", ["no_mask", "padding", "causal"])
@pytest.mark.parametrize("window", [(2**31 - 1, 2**31 - 1), (2**63 - 1, 2**63 - 1), (2**70, 10**30)])
def test_windows_past_any_sequence_act_as_no_window(backend, mask, window):
    """Bounds past any sequence are clamped to masks.WINDOW_BOUND_LIMIT: the fused kernels added 2**31 - 1 to a
    position in int32 and the unfused backend 2**63 - 1 in int64, wrapping to windows that hid keys."""
    from tests.reference import reference_attention

    q, k, v = (x.half().to(_fused_device(backend)) if backend == "fused" else x for x in qkv(s_q=9, s_kv=9))
    out = module(attn_mask_type=mask, backend=backend)(q, k, v, window_size=window)
    expected = reference_attention(q, k, v, qkv_format="bshd", attn_mask_type=mask)
    torch.testing.assert_close(out.float().cpu(), expected.float().cpu(), atol=2e-3, rtol=2e-3)


def test_numpy_integer_windows_are_taken_and_bools_refused():
    import numpy as np

    assert check_set_window_size("no_mask", (np.int64(3), np.int32(2))) == (3, 2)
    assert type(check_set_window_size("no_mask", (np.int64(3), 2))[0]) is int
    with pytest.raises(ValueError, match="window_size"):
        check_set_window_size("no_mask", (True, 2))


def test_window_normalisation_warns():
    """As TE, with warnings.warn (a user's filters apply; the logger carries selection's reports only)."""
    with pytest.warns(UserWarning, match=r"window_size=\(3, 2\) has right != 0 for mask causal; using \(3, 0\)"):
        assert check_set_window_size("causal", (3, 2)) == (3, 0)
    with pytest.warns(UserWarning, match=r"window_size=\(-1, 0\) with mask no_mask is not causal; using \(-1, -1\)"):
        assert check_set_window_size("no_mask", (-1, 0)) == (-1, -1)


def test_window_normalisation_reaches_the_call():
    """A per-call window is normalised against the per-call mask: (4, 4) under causal acts as (4, 0)."""
    q, k, v = qkv(s_q=9, s_kv=9)
    m = module(attn_mask_type="no_mask")
    text = m.explain(q, k, v, attn_mask_type="causal", window_size=(4, 4))
    assert "window_size = (4, 0)" in text
    torch.testing.assert_close(m(q, k, v, attn_mask_type="causal", window_size=(4, 4)),
                               m(q, k, v, attn_mask_type="causal", window_size=(4, 0)), atol=0, rtol=0)
    assert "window_size = (-1, -1)" in m.explain(q, k, v, window_size=(-1, 0))


def test_the_constructors_window_is_normalised_for_its_mask_type():
    """As TE's constructor: a causal module's (2, 2) is stored as (2, 0), and a call that passes another mask type
    uses (2, 0) too (it used (2, 2))."""
    q, k, v = qkv(s_q=9, s_kv=9)
    m = module(attn_mask_type="causal", window_size=(2, 2))
    assert m.window_size == (2, 0)
    torch.testing.assert_close(m(q, k, v, attn_mask_type="no_mask"),
                               module()(q, k, v, window_size=(2, 0)), atol=0, rtol=0)


def test_assigning_window_size_changes_later_calls():
    """As in TE, ``module.window_size = ...`` is the window of the calls that pass none (the call plan made
    before it is not reused); a bad value is refused when assigned."""
    from tests.reference import reference_attention

    q, k, v = qkv(s_q=9, s_kv=9)
    m = module()
    torch.testing.assert_close(m(q, k, v), reference_attention(q, k, v, qkv_format="bshd"))
    m.window_size = (1, 1)
    assert m.window_size == (1, 1)
    torch.testing.assert_close(m(q, k, v), reference_attention(q, k, v, qkv_format="bshd", window_size=(1, 1)))
    with pytest.raises(ValueError, match="window_size"):
        m.window_size = (-2, 0)
    assert m.window_size == (1, 1)


def test_bottom_right_alignment_is_forced_by_the_mask_type():
    q, k, v = qkv(s_q=4, s_kv=9)
    m = module()
    assert "bottom_right_diagonal = False" in m.explain(q, k, v, attn_mask_type="causal", bottom_right_diagonal=True)
    assert "bottom_right_diagonal = True" in m.explain(q, k, v, attn_mask_type="causal_bottom_right",
                                                       bottom_right_diagonal=False)
    assert "bottom_right_diagonal = True" in m.explain(q, k, v)
    assert "bottom_right_diagonal = False" in m.explain(q, k, v, bottom_right_diagonal=False)
