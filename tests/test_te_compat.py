"""TransformerEngine-compatibility knobs: ``checkpoint_core_attention``, ``fast_zero_fill``,
``num_splits`` (forward) and ``return_max_logit`` (constructor); TE's argument order and its parallelism, FP8,
score_mod and packed-input arguments (``attention/te_arguments.py``).

CPU: the unfused backend, and the fused kernel in the Triton interpreter (``tests/conftest.py``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from attention import DotProductAttention
from attention.backends.base import capability_reasons
from attention.backends.flash import Flash3Backend, Flash4Backend
from attention.backends.unfused import UnfusedBackend
from attention.params import AttentionParams
from attention.selection import registry
from tests.cpu_fused import skip_without_cpu_fused
from tests.reference import reference_attention

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

H, H_KV, D = 4, 2, 16


def cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def attn(**kwargs) -> DotProductAttention:
    base = {"num_attention_heads": H, "kv_channels": D, "num_gqa_groups": H_KV, "qkv_format": "bshd",
            "attn_mask_type": "causal"}
    return DotProductAttention(**{**base, **kwargs})


def qkv(b=2, s_q=8, s_kv=8, dtype=torch.float32, requires_grad=False):
    q = torch.randn(b, s_q, H, D, dtype=dtype)
    k = torch.randn(b, s_kv, H_KV, D, dtype=dtype)
    v = torch.randn(b, s_kv, H_KV, D, dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def grads(module, q, k, v, **fwd):
    for t in (q, k, v):
        t.grad = None
    out = module(q, k, v, **fwd)
    out = out[0] if isinstance(out, tuple) else out
    (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    return out.detach(), [t.grad.clone() for t in (q, k, v)]


# ------------------------------------------------------------------------------------------------
# checkpoint_core_attention
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", ["causal", "padding_causal"])
def test_checkpoint_gives_the_same_gradients_and_recomputes(mask, monkeypatch):
    module = attn(attn_mask_type=mask, backend="unfused")
    q, k, v = qkv(b=3, requires_grad=True)
    fwd = {"cu_seqlens_q": cu([8, 5, 3]), "cu_seqlens_kv": cu([8, 6, 2])} if "padding" in mask else {}
    out_ref, grads_ref = grads(module, q, k, v, **fwd)

    calls = []
    real_forward = UnfusedBackend.forward
    monkeypatch.setattr(UnfusedBackend, "forward", lambda self, call: calls.append(1) or real_forward(self, call))
    out, grads_ckpt = grads(module, q, k, v, checkpoint_core_attention=True, **fwd)
    assert len(calls) == 2, "the backend runs again in backward (recomputation)"
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
    for g, g_ref in zip(grads_ckpt, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)

    calls.clear()
    with torch.no_grad():
        module(q, k, v, checkpoint_core_attention=True, **fwd)
    assert len(calls) == 1, "no checkpoint without grads"


def test_checkpoint_with_dropout_replays_the_same_mask():
    module = attn(attention_dropout=0.3, backend="unfused").train()
    q, k, v = qkv(requires_grad=True)
    torch.manual_seed(1)
    out_ref, grads_ref = grads(module, q, k, v)
    torch.manual_seed(1)
    out, grads_ckpt = grads(module, q, k, v, checkpoint_core_attention=True)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
    for g, g_ref in zip(grads_ckpt, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)


def test_checkpoint_with_learnable_sink_and_bias_gradients():
    module = attn(backend="unfused", softmax_type="learnable")
    with torch.no_grad():
        module.softmax_offset.normal_()
    q, k, v = qkv(requires_grad=True)
    bias = torch.randn(1, H, 8, 8, requires_grad=True)
    fwd = {"core_attention_bias_type": "post_scale_bias", "core_attention_bias": bias}
    results = []
    for checkpoint in (False, True):
        bias.grad = None
        module.softmax_offset.grad = None
        _, g = grads(module, q, k, v, checkpoint_core_attention=checkpoint, **fwd)
        results.append(g + [bias.grad.clone(), module.softmax_offset.grad.clone()])
    for g, g_ref in zip(results[1], results[0]):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["unfused", "fused"])
def test_checkpoint_is_accepted_without_grads(backend):
    if backend == "fused":
        skip_without_cpu_fused()
    module = attn(backend=backend)
    q, k, v = qkv()
    torch.testing.assert_close(module(q, k, v, checkpoint_core_attention=True), module(q, k, v), rtol=0, atol=0)
    assert "Selected backend: " + backend in module.explain(q, k, v, checkpoint_core_attention=True)


def test_checkpoint_is_not_a_selection_input():
    """Every backend keeps its verdict: checkpointing wraps whatever runs."""
    q, k, v = qkv()
    module = attn()
    assert module.explain(q, k, v, checkpoint_core_attention=True) == module.explain(q, k, v)


# ------------------------------------------------------------------------------------------------
# fast_zero_fill
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["unfused", "fused"])
@pytest.mark.parametrize("fast_zero_fill", [True, False])
def test_fast_zero_fill_changes_nothing(backend, fast_zero_fill):
    if backend == "fused":
        skip_without_cpu_fused()
    module = attn(attn_mask_type="padding_causal", backend=backend)
    q, k, v = qkv(b=2)
    fwd = {"cu_seqlens_q": cu([8, 3]), "cu_seqlens_kv": cu([8, 3])}
    out = module(q, k, v, fast_zero_fill=fast_zero_fill, **fwd)
    torch.testing.assert_close(out, module(q, k, v, **fwd), rtol=0, atol=0)
    assert torch.all(out[1, 3:] == 0), "padded query rows are zero whatever fast_zero_fill says"
    assert module.explain(q, k, v, fast_zero_fill=fast_zero_fill, **fwd) == module.explain(q, k, v, **fwd)


# ------------------------------------------------------------------------------------------------
# num_splits
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, 1.0, 2.5, True, "2", None])
def test_num_splits_must_be_a_positive_int(bad):
    q, k, v = qkv()
    module = attn(backend="unfused")
    with pytest.raises(ValueError, match="num_splits"):
        module(q, k, v, num_splits=bad)
    with pytest.raises(ValueError, match="num_splits"):
        module.explain(q, k, v, num_splits=bad)


def test_num_splits_is_a_params_field():
    assert AttentionParams().num_splits == 1
    p = AttentionParams(num_splits=4)
    assert hash(p) != hash(AttentionParams()) or p != AttentionParams()
    assert "num_splits = 4" in p.describe()


def _sm(cc, **kwargs) -> AttentionParams:
    return AttentionParams(device_type="cuda", compute_capability=cc, **kwargs)


def test_num_splits_capabilities_follow_te():
    backends = registry()
    sheet = {name: b.capabilities.num_splits for name, b in backends.items()}
    assert sheet == {"fused": True, "flash2": False, "flash3": True, "flash4": True, "unfused": False}
    for cc in ((9, 0), (10, 0)):
        p = _sm(cc, num_splits=2)
        for name in ("flash2", "unfused"):
            assert "num_splits != 1 not supported" in capability_reasons(backends[name].capabilities, p)
        for name in ("fused", "flash3", "flash4"):
            assert not any("num_splits" in r for r in capability_reasons(backends[name].capabilities, p))
        assert not any("num_splits" in r for r in capability_reasons(backends[name].capabilities, _sm(cc)))
    # flash-attn-4 splits KV on sm100+ only (TE turns it off below)
    flash4 = backends["flash4"]
    assert "num_splits != 1 needs sm100 or newer (flash-attn-4 splits KV only there), got sm90" in (
        flash4.extra_reasons(_sm((9, 0), num_splits=2)))
    assert "num_splits != 1 needs sm100 or newer (flash-attn-4 splits KV only there), got sm80" in (
        flash4.extra_reasons(_sm((8, 0), num_splits=2)))
    assert not any("num_splits" in r for r in flash4.extra_reasons(_sm((10, 0), num_splits=2)))
    assert not any("num_splits" in r for r in flash4.extra_reasons(_sm((9, 0))))
    # the fused kernel takes at most 64 splits
    fused = backends["fused"]
    assert not any("num_splits" in r for r in fused.extra_reasons(_sm((9, 0), num_splits=64)))
    assert any("num_splits=65" in r for r in fused.extra_reasons(_sm((9, 0), num_splits=65)))


def test_unfused_refuses_num_splits_with_a_reason():
    q, k, v = qkv()
    module = attn(backend="unfused")
    with pytest.raises(ValueError, match="num_splits != 1 not supported"):
        module(q, k, v, num_splits=2)
    assert "num_splits != 1 not supported" in module.explain(q, k, v, num_splits=2)
    module(q, k, v, num_splits=1)   # the default is fine everywhere


def test_num_splits_default_keeps_the_automatic_choice():
    q, k, v = qkv(dtype=torch.float64)   # only unfused runs fp64
    module = attn()
    module(q, k, v, num_splits=1)
    assert module.last_backend == "unfused"
    with pytest.raises(ValueError, match="No dot product attention backend"):
        module(q, k, v, num_splits=2)


@pytest.mark.parametrize("num_splits", [1, 2, 3])
def test_fused_honours_num_splits(num_splits, monkeypatch, cpu_fused):
    from attention.backends import fused_launches

    seen = []
    real = fused_launches.packed_attention_forward   # the eager launch: num_splits, zero_tail, then total_kv

    def spy(*args):
        seen.append(args[-3])
        return real(*args)

    monkeypatch.setattr(fused_launches, "packed_attention_forward", spy)
    q, k, v = qkv(b=2, s_q=4, s_kv=40)
    fwd = {"attn_mask_type": "causal_bottom_right", "num_splits": num_splits}
    out = attn(backend="fused")(q, k, v, **fwd)
    expected = attn(backend="unfused")(q, k, v, attn_mask_type="causal_bottom_right")
    assert seen == [None if num_splits == 1 else num_splits], "1 keeps the kernel's heuristic; > 1 is forced"
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_automatic_selection_with_num_splits_skips_unfused(cpu_fused):
    q, k, v = qkv()   # fp32 on CPU: fused (interpreter) and unfused can both run
    module = attn()
    module(q, k, v, num_splits=2)
    assert module.last_backend == "fused"


def _call(params: AttentionParams):
    return SimpleNamespace(params=params, softmax_scale=0.125, softmax_offset=None,
                           query=torch.empty(0))


def test_flash_adapters_pass_num_splits_only_when_asked():
    flash3, flash4 = Flash3Backend(), Flash4Backend()
    assert "num_splits" not in flash3._kwargs(_call(_sm((9, 0))))
    assert flash3._kwargs(_call(_sm((9, 0), num_splits=3)))["num_splits"] == 3
    assert "num_splits" not in flash4._kwargs(_call(_sm((10, 0))))
    assert flash4._kwargs(_call(_sm((10, 0), num_splits=3)))["num_splits"] == 3


# ------------------------------------------------------------------------------------------------
# return_max_logit
# ------------------------------------------------------------------------------------------------

def expected_max_logit(q, k, lens_q, lens_kv, *, causal, bottom_right, scale, bias=None, window=(-1, -1),
                       slopes=None, masked=None):
    """Independent: per sequence, per head, per query row, the max over the keys it sees of
    ``scale * q.k + bias - slope * |i + offset - j|`` (ALiBi counts, as a bias does; a softmax sink does not);
    padded rows, masked keys (causal, the window, ``masked`` True) never count. fp32 ``[h]``."""
    h, group = q.shape[2], q.shape[2] // k.shape[2]
    best = torch.full((h,), -math.inf, dtype=torch.float64)
    left, right = window
    for b, (n_q, n_kv) in enumerate(zip(lens_q, lens_kv)):
        offset = n_kv - n_q if bottom_right else 0
        for head in range(h):
            for i in range(n_q):
                for j in range(n_kv):
                    if (causal and j > i + offset) or (right >= 0 and j > i + offset + right) \
                            or (left >= 0 and j < i + offset - left) or (masked is not None and masked[b, 0, i, j]):
                        continue
                    logit = scale * float(q[b, i, head].double() @ k[b, j, head // group].double())
                    if bias is not None:
                        logit += float(bias[min(b, bias.shape[0] - 1), min(head, bias.shape[1] - 1), i, j])
                    if slopes is not None:
                        logit -= float(slopes[head]) * abs(i + offset - j)
                    best[head] = max(best[head], logit)
    return best.float()


@pytest.mark.parametrize("feature", ["window", "alibi", "sink", "arbitrary", "sbhd"])
def test_max_logit_with_the_module_features(feature):
    """A window and an arbitrary mask drop the keys they hide, ALiBi's term counts (as a bias's does), a softmax
    sink does not (it is no key's logit), sbhd reads as bshd."""
    q, k, v = qkv(b=2, s_q=6, s_kv=9)
    q = q * 3
    options, fwd, expected_kwargs = {}, {}, {}
    if feature == "window":
        options["window_size"] = expected_kwargs["window"] = (2, 1)
        options["attn_mask_type"] = "no_mask"
    elif feature == "alibi":
        fwd["core_attention_bias_type"] = "alibi"
        fwd["alibi_slopes"] = expected_kwargs["slopes"] = torch.tensor([0.5, 1.0, 2.0, 4.0])[:H]
    elif feature == "sink":
        options["softmax_type"] = "off-by-one"
    elif feature == "arbitrary":
        options["attn_mask_type"] = "arbitrary"
        fwd["attention_mask"] = expected_kwargs["masked"] = torch.rand(2, 1, 6, 9) < 0.5
    module = attn(**{"attn_mask_type": "causal_bottom_right", **options}, return_max_logit=True,
                  qkv_format="sbhd" if feature == "sbhd" else "bshd", softmax_scale=0.3)
    inputs = tuple(x.transpose(0, 1).contiguous() for x in (q, k, v)) if feature == "sbhd" else (q, k, v)
    _, max_logit = module(*inputs, **fwd)
    assert module.last_backend == "unfused"
    mask = module.attn_mask_type
    expected = expected_max_logit(q, k, [6, 6], [9, 9], causal="causal" in mask, bottom_right=True, scale=0.3,
                                  **expected_kwargs)
    torch.testing.assert_close(max_logit, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask,lens_q,lens_kv", [
    ("no_mask", [6, 6], [9, 9]),
    ("causal", [6, 6], [6, 6]),
    ("causal_bottom_right", [6, 6], [9, 9]),
    ("padding", [6, 2], [9, 4]),
    ("padding_causal_bottom_right", [6, 3], [9, 5]),
])
def test_max_logit_matches_a_direct_computation(mask, lens_q, lens_kv):
    q, k, v = qkv(b=2, s_q=6, s_kv=9)
    q = q * 3   # large logits: the padded rows' values would win if they counted
    module = attn(attn_mask_type=mask, return_max_logit=True, softmax_scale=0.3)
    fwd = {"cu_seqlens_q": cu(lens_q), "cu_seqlens_kv": cu(lens_kv)} if "padding" in mask else {}
    out, max_logit = module(q, k, v, **fwd)
    assert module.last_backend == "unfused"
    assert max_logit.dtype == torch.float32 and max_logit.shape == (H,)
    causal = "causal" in mask
    expected = expected_max_logit(q, k, lens_q, lens_kv, causal=causal, bottom_right=mask != "causal", scale=0.3)
    torch.testing.assert_close(max_logit, expected, rtol=1e-5, atol=1e-5)
    plain = attn(attn_mask_type=mask, softmax_scale=0.3, backend="unfused")(q, k, v, **fwd)
    torch.testing.assert_close(out, plain, rtol=0, atol=0)


def test_max_logit_excludes_padded_rows():
    q, k, v = qkv(b=2, s_q=6, s_kv=6)
    q[1, 2:] = 100.0   # padded rows of sequence 1 would dominate
    module = attn(attn_mask_type="padding", return_max_logit=True)
    _, max_logit = module(q, k, v, cu_seqlens_q=cu([6, 2]), cu_seqlens_kv=cu([6, 2]))
    expected = expected_max_logit(q, k, [6, 2], [6, 2], causal=False, bottom_right=True, scale=1 / math.sqrt(D))
    torch.testing.assert_close(max_logit, expected, rtol=1e-5, atol=1e-5)
    assert max_logit.max() < 50


def test_max_logit_includes_the_bias_and_thd():
    lens = [5, 3]
    q, k, v = qkv(b=2, s_q=5, s_kv=5)
    bias = torch.randn(1, H, 5, 5) * 4
    module = attn(attn_mask_type="causal", return_max_logit=True)
    _, max_logit = module(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    expected = expected_max_logit(q, k, [5, 5], [5, 5], causal=True, bottom_right=False, scale=1 / math.sqrt(D),
                                  bias=bias)
    torch.testing.assert_close(max_logit, expected, rtol=1e-5, atol=1e-5)

    # thd: the same tokens packed; the out keeps [t, h*d]
    q_t = torch.cat([q[0, :5], q[1, :3]])
    k_t = torch.cat([k[0, :5], k[1, :3]])
    v_t = torch.cat([v[0, :5], v[1, :3]])
    thd = attn(attn_mask_type="padding_causal", qkv_format="thd", return_max_logit=True)
    out, max_logit = thd(q_t, k_t, v_t, cu_seqlens_q=cu(lens), cu_seqlens_kv=cu(lens))
    assert out.shape == (8, H * D)
    expected = expected_max_logit(q, k, lens, lens, causal=True, bottom_right=False, scale=1 / math.sqrt(D))
    torch.testing.assert_close(max_logit, expected, rtol=1e-5, atol=1e-5)


def test_max_logit_only_on_unfused():
    sheet = {name: b.capabilities.return_max_logit for name, b in registry().items()}
    assert sheet == {"fused": False, "flash2": False, "flash3": False, "flash4": False, "unfused": True}
    p = _sm((9, 0), return_max_logit=True)
    for name in ("fused", "flash2", "flash3", "flash4"):
        assert "return_max_logit not supported" in registry()[name].support_reasons(p)
    q, k, v = qkv()
    module = attn(return_max_logit=True, backend="fused")
    with pytest.raises(ValueError, match="return_max_logit not supported"):
        module(q, k, v)


def test_max_logit_with_grads_and_checkpoint():
    q, k, v = qkv(requires_grad=True)
    module = attn(return_max_logit=True)
    plain = attn(backend="unfused")
    _, grads_ref = grads(plain, q, k, v)
    for checkpoint in (False, True):
        out, max_logit = module(q, k, v, checkpoint_core_attention=checkpoint)
        assert not max_logit.requires_grad and out.requires_grad
        _, g = grads(module, q, k, v, checkpoint_core_attention=checkpoint)
        for a, b in zip(g, grads_ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# torch.compile
# ------------------------------------------------------------------------------------------------

def test_new_knobs_compile_without_graph_breaks():
    torch.compiler.reset()
    try:
        module = attn(return_max_logit=True, backend="unfused")
        compiled = torch.compile(module, fullgraph=True, dynamic=False)
        q, k, v = qkv()
        out, max_logit = compiled(q, k, v, fast_zero_fill=False, checkpoint_core_attention=True)
        ref_out, ref_max = module(q, k, v)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(max_logit, ref_max)
    finally:
        torch.compiler.reset()


def test_positional_constructor_arguments_bind_as_in_te():
    """TE's order after window_size: bottom_right_diagonal, sequence_parallel, tp_size, get_rng_state_tracker,
    tp_group, layer_number, attention_type, cp_* , softmax_scale, ... (the 8th positional once became softmax_scale:
    True, a scale of 1)."""
    m = DotProductAttention(H, D, H_KV, 0.0, "bshd", "no_mask", None, False, False, 1, None, None, 3, "cross",
                            None, None, None, "p2p", 0.5, "vanilla", False, "core_attention")
    assert (m.bottom_right_diagonal, m.sequence_parallel, m.tp_size, m.layer_number, m.attention_type,
            m.softmax_scale, m.name) == (False, False, 1, 3, "cross", 0.5, "core_attention")
    assert attn().softmax_scale == 1 / math.sqrt(D)
    with pytest.raises(TypeError):   # ours, after TE's: keyword only
        DotProductAttention(H, D, H_KV, 0.0, "bshd", "causal", None, None, False, 1, None, None, None, "self",
                            None, None, None, "p2p", None, "vanilla", False, None, "unfused")
    with pytest.raises(ValueError, match="softmax_scale"):
        attn(softmax_scale=True)
    with pytest.raises(ValueError, match="sequence_parallel"):   # TE's older order: layer_number would be 1
        DotProductAttention(H, D, H_KV, 0.0, "bshd", "causal", None, None, 3)
    import numpy as np

    assert attn(tp_size=np.int64(1)).tp_size == 1


def test_te_parallelism_arguments_of_one_partition_are_taken():
    m = attn(sequence_parallel=True, tp_size=1, tp_group=None, get_rng_state_tracker=None, cp_group=None,
             cp_global_ranks=[0], cp_stream=None, cp_comm_type="a2a", name="attn")
    m.set_context_parallel_group(None, None, None, "p2p")
    q, k, v = torch.randn(2, 5, H, D), torch.randn(2, 5, H_KV, D), torch.randn(2, 5, H_KV, D)
    torch.testing.assert_close(m(q, k, v), attn()(q, k, v))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(tp_size=2), NotImplementedError, "tensor parallelism"),
    (dict(tp_size=0), ValueError, "tp_size"),
    (dict(cp_comm_type="ring"), ValueError, "cp_comm_type"),
    (dict(sequence_parallel=3), ValueError, "sequence_parallel must be True or False"),
])
def test_te_parallelism_this_package_cannot_run_is_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        attn(**kwargs)


def test_dropout_runs_in_the_rng_trackers_stream():
    """With get_rng_state_tracker, dropout runs under its fork() (Megatron's model-parallel RNG), as in TE."""
    import contextlib

    forks = []

    class Tracker:
        def fork(self):
            forks.append(1)
            return contextlib.nullcontext()

    m = attn(attention_dropout=0.5, get_rng_state_tracker=Tracker, backend="unfused")
    q, k, v = torch.randn(2, 5, H, D), torch.randn(2, 5, H_KV, D), torch.randn(2, 5, H_KV, D)
    m.eval()(q, k, v)
    assert forks == []   # no dropout in eval mode
    m.train()(q, k, v)
    assert forks == [1]


@pytest.mark.parametrize("kwargs, message", [
    (dict(fp8_output=True), "fp8_output=True: FP8 attention is not implemented"),
    (dict(bf16_backward=True), "bf16_backward"),
    (dict(score_mod=lambda score: score), "score_mod"),
    (dict(score_mod_tensors={}), "score_mod_tensors"),
])
def test_fp8_and_score_mod_are_refused_unless_default(kwargs, message):
    q, k, v = torch.randn(2, 5, H, D), torch.randn(2, 5, H_KV, D), torch.randn(2, 5, H_KV, D)
    m = attn()
    m(q, k, v, fp8_output=False, bf16_backward=False, score_mod=None)
    with pytest.raises(NotImplementedError, match=message):
        m(q, k, v, **kwargs)
    with pytest.raises(NotImplementedError, match=message):
        m.explain(q, k, v, **kwargs)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("interleave", [-3, -2])
def test_packed_qkv_and_kv_layers_run_as_their_views(fmt, interleave):
    """TE HEAD's qkv_layer ([..., 3, h, d] or [..., h, 3, d]) and kv_layer beside query_layer (MHA: one head
    count for the packed buffer)."""
    lead = {"bshd": (2, 5), "sbhd": (5, 2), "thd": (10,)}[fmt]
    packed = torch.randn(*lead, *((3, H, D) if interleave == -3 else (H, 3, D)))
    q, k, v = packed.unbind(interleave)
    kw = dict(cu_seqlens_q=cu([5, 5]), cu_seqlens_kv=cu([5, 5])) if fmt == "thd" else {}
    mask = "padding_causal" if fmt == "thd" else "causal"
    m = attn(num_gqa_groups=H, qkv_format=fmt, attn_mask_type=mask)
    expected = reference_attention(q.contiguous(), k.contiguous(), v.contiguous(), qkv_format=fmt,
                                   attn_mask_type=mask, **kw)
    torch.testing.assert_close(m(qkv_layer=packed, qkv_interleave_dim=interleave, **kw), expected)
    kv = torch.stack([k, v], dim=interleave)
    torch.testing.assert_close(m(q, kv_layer=kv, qkv_interleave_dim=interleave, **kw), expected)
    assert "unfused" in m.explain(qkv_layer=packed, qkv_interleave_dim=interleave, **kw)
    # GQA: kv_layer holds the KV heads beside a query of H heads
    gqa_kv = torch.randn(*lead, *((2, H_KV, D) if interleave == -3 else (H_KV, 2, D)))
    k, v = gqa_kv.unbind(interleave)
    expected = reference_attention(q.contiguous(), k.contiguous(), v.contiguous(), qkv_format=fmt,
                                   attn_mask_type=mask, **kw)
    torch.testing.assert_close(attn(qkv_format=fmt, attn_mask_type=mask)(q, kv_layer=gqa_kv,
                                                                        qkv_interleave_dim=interleave, **kw), expected)


@pytest.mark.parametrize("call, message", [
    (lambda m, x: m(x, qkv_layer=torch.randn(2, 5, 3, H, D)), "qkv_layer replaces"),
    (lambda m, x: m(qkv_layer=torch.randn(2, 5, 2, H, D)), r"qkv_layer must be \[\.\.\., 3, h, d\]"),
    (lambda m, x: m(qkv_layer=torch.randn(2, 5, 3, H, D), qkv_interleave_dim=-1), "qkv_interleave_dim"),
    (lambda m, x: m(x, x, kv_layer=torch.randn(2, 5, 2, H, D)), "kv_layer replaces"),
    (lambda m, x: m(), "query_layer, key_layer and value_layer are required"),
    (lambda m, x: m(qkv_layer=torch.randn(2, 5, 3, H, D), inference_params=object()),
     "cannot be used with inference_params"),
])
def test_packed_inputs_misused_are_refused(call, message):
    m = attn(num_gqa_groups=H)
    with pytest.raises(ValueError, match=message):
        call(m, torch.randn(2, 5, H, D))


def test_a_packed_qkv_layer_needs_as_many_kv_heads_as_query_heads():
    """A GQA module given qkv_layer was told that key_layer (which the user never passed) has the wrong head
    count."""
    m = attn(num_gqa_groups=H_KV)
    message = rf"qkv_layer packs as many key / value heads as query heads, but this module has num_gqa_groups={H_KV}"
    with pytest.raises(ValueError, match=message):
        m(qkv_layer=torch.randn(2, 5, 3, H, D))
    with pytest.raises(ValueError, match=message):
        m.explain(qkv_layer=torch.randn(2, 5, 3, H, D))


def test_explain_refuses_a_cache_without_a_step_as_forward_does():
    """explain() named a backend for a cache step that forward refuses (no pre_step yet)."""
    from inference import InferenceParams

    cache = InferenceParams(2, 16, H, D, torch.float32, device="cpu")
    cache.allocate_memory(1)
    q = torch.randn(2, 1, H, D)
    m = attn(num_gqa_groups=H, attn_mask_type="padding_causal", layer_number=1)
    for run in (m, m.explain):
        with pytest.raises(ValueError, match="inference_params has no step: call inference_params.pre_step"):
            run(q, q, q, inference_params=cache)


def test_explain_refuses_what_forward_would_not_take():
    """An unknown keyword named the private method explain() hands its arguments to."""
    q = torch.randn(2, 5, H, D)
    with pytest.raises(TypeError, match=r"explain\(\) takes forward's arguments; got an unexpected keyword "
                                        r"argument 'bogus'"):
        attn(num_gqa_groups=H).explain(q, q, q, bogus=1)


@pytest.mark.parametrize("softmax_type", ["vanilla", "learnable"])
def test_a_te_checkpoint_loads_strictly(softmax_type):
    """TE's state_dict carries ``_extra_state`` (FP8 metadata): strict loading refused it as an unexpected key."""
    import io

    m = attn(softmax_type=softmax_type)
    state = {**m.state_dict(), "_extra_state": io.BytesIO(b"fp8 metadata")}
    attn(softmax_type=softmax_type).load_state_dict(state, strict=True)
    outer = torch.nn.Sequential(attn(softmax_type=softmax_type))
    outer.load_state_dict({f"0.{key}": value for key, value in state.items()}, strict=True)


def test_inference_params_is_importable_beside_the_module():
    """TE exports InferenceParams next to DotProductAttention; ``attention`` hands out ``inference``'s class on first
    use and imports none of ``inference`` before (its imports run one way)."""
    import subprocess
    import sys

    import inference
    from attention import InferenceParams

    assert InferenceParams is inference.InferenceParams
    code = "import sys, attention; assert 'inference' not in sys.modules; from attention import InferenceParams"
    subprocess.run([sys.executable, "-c", code], check=True)
