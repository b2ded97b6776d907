"""DotProductAttention's call plans: checks and the backend choice made once per call signature.

A repeat call skips the checks and the selection only while nothing they read has changed: the
tests change one thing at a time (shapes, dtype, mode, grad, switches, use_backends, clear_cache,
the step's sequence lengths) and watch the checks or the selection run again, and the outputs
stay right (against tests/reference.py).
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import attention
from attention import call_plans, inputs, selection
from inference import InferenceParams
from tests.reference import reference_attention

HEADS, GROUPS, DIM = 4, 2, 16


def _module(**kwargs):
    kwargs.setdefault("qkv_format", "bshd")
    kwargs.setdefault("attn_mask_type", "causal")
    return attention.DotProductAttention(HEADS, DIM, num_gqa_groups=GROUPS, **kwargs)


def _qkv(batch=2, seqlen=8, dtype=torch.float32, requires_grad=False):
    q = torch.randn(batch, seqlen, HEADS, DIM, dtype=dtype, requires_grad=requires_grad)
    k, v = (torch.randn(batch, seqlen, GROUPS, DIM, dtype=dtype) for _ in range(2))
    return q, k, v


@pytest.fixture
def counted(monkeypatch):
    """How often the checks (check_qkv) and the selection (select) ran, and with which params."""
    counts = {"checks": 0, "selected": []}
    check_qkv, select = inputs.check_qkv, selection.select

    def counting_check(*args, **kwargs):
        counts["checks"] += 1
        return check_qkv(*args, **kwargs)

    def counting_select(params, requested=None):
        counts["selected"].append(params)
        return select(params, requested)

    monkeypatch.setattr(inputs, "check_qkv", counting_check)
    monkeypatch.setattr(selection, "select", counting_select)
    return counts


def _reference(q, k, v):
    return reference_attention(q, k, v, qkv_format="bshd", attn_mask_type="causal")


def test_a_repeat_call_reuses_the_checks_and_the_choice_and_stays_right(counted):
    attn = _module()
    for _ in range(3):
        q, k, v = _qkv()
        out = attn(q, k, v)
        torch.testing.assert_close(out, _reference(q, k, v), atol=1e-5, rtol=1e-5)
    assert counted["checks"] == 1
    assert len(counted["selected"]) == 1


@pytest.mark.parametrize("change", ["seqlen", "batch", "dtype", "format"])
def test_a_new_signature_is_checked_and_chosen_again(counted, change):
    attn = _module()
    attn(*_qkv())
    if change == "format":
        q, k, v = (x.transpose(0, 1) for x in _qkv())
        attn(q, k, v, qkv_format="sbhd")
    else:
        attn(*_qkv(**{"seqlen": {"seqlen": 12}, "batch": {"batch": 3}, "dtype": {"dtype": torch.float64}}[change]))
    assert counted["checks"] == 2
    assert len(counted["selected"]) == 2


def test_bad_input_is_refused_after_a_planned_call():
    attn = _module()
    q, k, v = _qkv()
    attn(q, k, v)
    with pytest.raises(ValueError, match="share a dtype"):
        attn(q, k.double(), v)
    with pytest.raises(ValueError, match="key_layer must have num_gqa_groups=2"):
        attn(q, torch.randn(2, 8, 3, DIM), torch.randn(2, 8, 3, DIM))
    with pytest.raises(ValueError, match="num_splits must be an int >= 1"):
        attn(q, k, v, num_splits=0)
    with pytest.raises(ValueError, match="attn_mask_type"):
        attn(q, k, v, attn_mask_type="sideways")


def test_mode_and_grad_are_part_of_the_signature(counted):
    attn = _module(attention_dropout=0.1)
    attn.eval()
    attn(*_qkv())
    attn.train()
    attn(*_qkv())
    attn.eval()
    with torch.no_grad():
        attn(*_qkv(requires_grad=True))
    attn(*_qkv(requires_grad=True)).sum().backward()
    # eval, train, eval again (the first plan), no_grad (no backward: the first plan), a backward
    dropout = [p.attention_dropout for p in counted["selected"]]
    grads = [p.requires_grad for p in counted["selected"]]
    assert dropout == [0.0, 0.1, 0.0]
    assert grads == [False, False, True]


def test_setting_a_planned_attribute_plans_again(counted):
    attn = _module()
    q, k, v = _qkv()
    attn(q, k, v)
    attn.attn_mask_type = "no_mask"   # a changed attribute the checks read: checked and chosen again
    out = attn(q, k, v)
    torch.testing.assert_close(out, reference_attention(q, k, v, qkv_format="bshd", attn_mask_type="no_mask"),
                               atol=1e-5, rtol=1e-5)
    attn.layer_number = 3   # not one of them: the plan stands
    attn(q, k, v)
    attn.backend = ("unfused",)
    attn(q, k, v)
    assert counted["checks"] == 3
    assert len(counted["selected"]) == 3
    assert attn.last_backend == "unfused"


def test_switches_use_backends_and_clear_cache_still_apply(monkeypatch, counted):
    attn = _module()
    q, k, v = _qkv()
    attn(q, k, v)   # planned with no switch set, outside use_backends
    switches = ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN")
    for switch in switches:
        monkeypatch.setenv(switch, "0")
    with pytest.raises(ValueError, match="No dot product attention backend"):
        attn(q, k, v)
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "1")
    attn(q, k, v)
    assert attn.last_backend == "unfused"
    for switch in switches:
        monkeypatch.delenv(switch)
    with selection.use_backends("flash"), pytest.raises(ValueError, match="cannot run these inputs"):
        attn(q, k, v)
    selected = len(counted["selected"])
    attn(q, k, v)   # the first plan again
    assert len(counted["selected"]) == selected
    attention.clear_cache()
    attn(q, k, v)
    assert len(counted["selected"]) == selected + 1


def test_unhashable_arguments_take_the_full_path(counted):
    attn = _module(attn_mask_type="causal")
    q, k, v = _qkv()
    for _ in range(2):
        attn(q, k, v, window_size=[-1, 0])
    assert counted["checks"] == 2


def test_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(call_plans, "MAX_PLANS", 3)
    attn = _module()
    for seqlen in range(1, 8):
        attn(*_qkv(seqlen=seqlen))
        assert len(attn._call_plans) <= 3


def test_lengths_read_from_cu_seqlens_get_their_own_params_within_a_plan(counted):
    """thd without max_seqlen_q/kv: one signature, but the lengths read from cu_seqlens differ."""
    attn = _module(qkv_format="thd", attn_mask_type="padding_causal")
    q, k, v = torch.randn(8, HEADS, DIM), torch.randn(8, GROUPS, DIM), torch.randn(8, GROUPS, DIM)
    for lengths in ((5, 3), (2, 6), (3, 5), (4, 4)):
        cu = torch.tensor([0, lengths[0], 8], dtype=torch.int32)
        out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        want = reference_attention(q, k, v, qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                   attn_mask_type="padding_causal")
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert counted["checks"] == 1
    assert [p.max_seqlen_q for p in counted["selected"]] == [5, 6, 4]


def test_kv_cache_steps_reuse_one_plan_and_stay_right(counted):
    """thd through a paged KV cache, prefill then decodes then a chunk: one signature (the new
    tokens padded to 8), every step right against the reference over the whole history, one
    params per distinct step length."""
    attn = _module(qkv_format="thd", attn_mask_type="padding_causal")
    cache = InferenceParams(2, 64, GROUPS, DIM, torch.float32, is_paged=True, page_size=4, device="cpu")
    cache.allocate_memory(1)
    history = {"k": [[], []], "v": [[], []], "q": [[], []]}
    for lengths in ((5, 3), (1, 1), (1, 1), (4, 2)):
        total = sum(lengths)
        q = torch.randn(8, HEADS, DIM)   # the same shape every step: padded to 8 tokens
        k, v = torch.randn(8, GROUPS, DIM), torch.randn(8, GROUPS, DIM)
        cache.pre_step(OrderedDict(enumerate(lengths)))
        cu = torch.tensor([0, lengths[0], total], dtype=torch.int32)
        out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, inference_params=cache)
        start = 0
        for seq, length in enumerate(lengths):
            for name, x in (("q", q), ("k", k), ("v", v)):
                history[name][seq].append(x[start:start + length])
            start += length
        for seq, length in enumerate(lengths):
            keys = torch.cat(history["k"][seq])
            values = torch.cat(history["v"][seq])
            n = keys.shape[0]
            want = reference_attention(history["q"][seq][-1], keys, values, qkv_format="thd",
                                       cu_seqlens_q=torch.tensor([0, length], dtype=torch.int32),
                                       cu_seqlens_kv=torch.tensor([0, n], dtype=torch.int32),
                                       attn_mask_type="padding_causal_bottom_right")
            got = out[cu[seq]:cu[seq] + length]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert counted["checks"] == 1
    assert [p.max_seqlen_q for p in counted["selected"]] == [5, 1, 4]   # read from cu_seqlens_q each step


def test_a_thd_cache_step_takes_its_query_length_from_the_host(monkeypatch, counted):
    """thd with a KV cache and no max_seqlen_q: the step's longest new-token count comes from
    InferenceParams (``longest_step``), not from reading cu_seqlens_q on the host (a sync per layer).
    The cu_seqlens too come from the cache: passing them is optional (here: only on the last step)."""
    attn = _module(qkv_format="thd", attn_mask_type="padding_causal", backend="unfused")
    cache = InferenceParams(2, 64, GROUPS, DIM, torch.float32, is_paged=True, page_size=4, device="cpu")
    cache.allocate_memory(1)
    for lengths in ((5, 3), (1, 1), (1, 2)):
        cache.pre_step(OrderedDict(enumerate(lengths)))
        total = sum(lengths)
        q, k, v = torch.randn(total, HEADS, DIM), torch.randn(total, GROUPS, DIM), torch.randn(total, GROUPS, DIM)
        cu = torch.tensor([0, lengths[0], total], dtype=torch.int32) if lengths == (1, 2) else None
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "diff", lambda *a, **k: pytest.fail("cu_seqlens read on the host"))
            out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, inference_params=cache)
        assert out.shape == (total, HEADS * DIM)
    assert [p.max_seqlen_q for p in counted["selected"]] == [5, 1, 2]


@pytest.mark.parametrize("backend", ["fused", "unfused"])
def test_a_module_copies_and_pickles_after_its_calls(backend):
    """The kept plans hold compiled kernels (with locks and TMA descriptors on a GPU): a module that had run the fused
    backend could not be deep-copied, pickled or saved whole. A copy starts without plans and gives the same output."""
    import copy
    import io
    import pickle

    from attention.backends.fused import FusedBackend

    dtype = torch.float16
    if backend == "fused" and FusedBackend().availability_reason() is not None:
        pytest.skip(FusedBackend().availability_reason())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    attn = _module(backend=backend).to(device)
    q, k, v = (x.to(device) for x in _qkv(dtype=dtype))
    with torch.no_grad():
        out = attn(q, k, v)
        assert len(attn._call_plans) == 1
        buffer = io.BytesIO()
        torch.save(attn, buffer)
        buffer.seek(0)
        copies = [copy.deepcopy(attn), pickle.loads(pickle.dumps(attn)), torch.load(buffer, weights_only=False)]
        for copied in copies:
            assert len(copied._call_plans) == 0 and len(attn._call_plans) == 1
            torch.testing.assert_close(copied(q, k, v), out, rtol=0, atol=0)
            assert copied.last_backend == backend
