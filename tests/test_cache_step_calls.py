"""DotProductAttention calls over a KV cache that are refused: a clear error, and the cache, page table and
sequence state as they were (nothing is appended before every check has passed)."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from inference import InferenceParams
from tests.cpu_fused import skip_without_cpu_fused
from tests.test_inference_params import assert_unchanged, snapshot

H, H_KV, D = 4, 2, 16
STEP = {"a": 3, "b": 2}   # a 3-token and a 2-token chunk


def _cache(paged: bool, dtype: torch.dtype = torch.float32) -> InferenceParams:
    kwargs = dict(is_paged=True, page_size=4) if paged else {}
    params = InferenceParams(2, 16, H_KV, D, dtype, device="cpu", **kwargs)
    params.allocate_memory(1)
    params.pre_step(OrderedDict(STEP))
    return params


def _inputs(fmt: str, dtype: torch.dtype = torch.float32, tokens: int | None = None,
            positions: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of the step: thd holds ``tokens`` (5, the step's) rows, bshd ``positions`` (3, the longest)."""
    lead = (5 if tokens is None else tokens,) if fmt == "thd" else (2, positions)
    q = torch.randn(*lead, H, D, dtype=dtype)
    return q, torch.randn(*lead, H_KV, D, dtype=dtype), torch.randn(*lead, H_KV, D, dtype=dtype)


def _module(fmt: str, backend: str = "unfused", head_dim: int = D) -> DotProductAttention:
    """The module of these tests' CPU caches (the fused backend's cases are the CPU suite's: they skip where CPU
    tensors cannot run it, as on a GPU host without TRITON_INTERPRET=1)."""
    if backend == "fused":
        skip_without_cpu_fused()
    return DotProductAttention(H, head_dim, num_gqa_groups=H_KV, qkv_format=fmt, attn_mask_type="padding_causal",
                               layer_number=1, backend=backend)


REFUSED = [
    pytest.param("bshd", dict(core_attention_bias_type="post_scale_bias",
                              core_attention_bias=torch.zeros(1, 1, 3, 3)),
                 r"core_attention_bias must end in \[s_q, s_kv\] = \[3, 16\]", id="bias shape"),
    pytest.param("bshd", dict(core_attention_bias_type="alibi", alibi_slopes=torch.ones(7)),
                 r"alibi_slopes must have shape \[h\] = \[4\]", id="alibi shape"),
    pytest.param("bshd", dict(num_splits=2), "Backend unfused was requested", id="num_splits on unfused"),
    pytest.param("bshd", dict(window_size=(-1, 3)),   # the mask as given, not the bottom-right one a cache makes
                 r"window_size for mask 'padding_causal' must be", id="window"),
    pytest.param("thd", dict(max_seqlen_q=2),
                 r"max_seqlen_q=2 is less than this step's longest sequence, 3 new tokens", id="thd max_seqlen_q"),
    pytest.param("thd", dict(pad_between_seqs=True),
                 r"pad_between_seqs=True cannot be honoured with inference_params: a thd KV-cache step reads its "
                 r"query tokens back to back", id="thd pad_between_seqs"),
]


@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
@pytest.mark.parametrize("fmt, kwargs, message", REFUSED)
def test_a_refused_call_appends_nothing(paged: bool, fmt: str, kwargs: dict, message: str) -> None:
    params = _cache(paged)
    before = snapshot(params)
    with pytest.raises(ValueError, match=message):
        _module(fmt)(*_inputs(fmt), inference_params=params, **kwargs)
    assert_unchanged(params, before)


@pytest.mark.parametrize("fmt, inputs, message", [
    ("thd", dict(tokens=2), r"query_layer holds 2 tokens \(dim 0 in thd\) but this step brings 5"),
    ("bshd", dict(positions=1), r"query_layer has 1 token positions \(dim 1 in bshd\) but a sequence of this step "
                                r"brings 3 new tokens"),
])
@pytest.mark.parametrize("backend", ["unfused", "fused"])
def test_a_query_short_of_the_step_is_refused(fmt: str, inputs: dict, message: str, backend: str) -> None:
    """k/v hold the whole step but q does not: the kernels would read and write past q's end."""
    dtype = torch.float16 if backend == "fused" else torch.float32
    params = _cache(paged=True, dtype=dtype)
    q, k, v = _inputs(fmt, dtype)
    short_q = _inputs(fmt, dtype, **inputs)[0]
    before = snapshot(params)
    with pytest.raises(ValueError, match=message):
        _module(fmt, backend)(short_q, k, v, inference_params=params)
    assert_unchanged(params, before)
    assert _module(fmt, backend)(q, k, v, inference_params=params).shape[:-1] == q.shape[:-2]


def test_a_call_the_named_backend_cannot_run_appends_nothing() -> None:
    """The fused backend refuses head dim 12 (explain() says why) before the step's k/v reach the cache."""
    params = InferenceParams(2, 16, H_KV, 12, torch.float16, device="cpu", is_paged=True, page_size=4)
    params.allocate_memory(1)
    params.pre_step(OrderedDict(STEP))
    q, k, v = (torch.randn(2, 3, heads, 12, dtype=torch.float16) for heads in (H, H_KV, H_KV))
    before = snapshot(params)
    with pytest.raises(ValueError, match="Backend fused was requested"):
        _module("bshd", "fused", head_dim=12)(q, k, v, inference_params=params)
    assert_unchanged(params, before)


@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
@pytest.mark.parametrize("differentiable", ["query", "value", "tangent"])
def test_a_cache_step_that_would_be_differentiated_is_refused(paged: bool, differentiable: str) -> None:
    """The cache has no backward pass: appending tokens that require grad made the cache buffer part of autograd's
    graph (every later step's output required grad, a second backward failed), and a checkpointed backward read
    the cache as a later step had left it. Generation runs under no_grad; such a step is refused, nothing appended."""
    import torch.autograd.forward_ad as forward_ad

    params = _cache(paged)
    q, k, v = _inputs("bshd")
    before = snapshot(params)
    with forward_ad.dual_level(), pytest.raises(ValueError, match="inference_params: a KV-cache step has no backward"):
        if differentiable == "tangent":
            q = forward_ad.make_dual(q, torch.ones_like(q))
        else:
            (q if differentiable == "query" else v).requires_grad_(True)
        _module("bshd")(q, k, v, inference_params=params)
    assert_unchanged(params, before)
    with torch.no_grad():
        out = _module("bshd")(q.detach(), k, v.detach(), inference_params=params)
    assert not out.requires_grad and not any(t.requires_grad for t in params.cache_manager.cache[1])


def test_a_learnable_sink_alone_does_not_refuse_a_cache_step() -> None:
    """The module's own sink parameter requires grad outside no_grad, but q / k / v do not: the step runs (a cache
    step does not train the sink; the refusal above names only the step's inputs)."""
    params = _cache(paged=True)
    module = DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format="bshd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="unfused", softmax_type="learnable")
    assert module.softmax_offset.requires_grad
    out = module(*_inputs("bshd"), inference_params=params)
    assert out.shape == (2, 3, H * D) and not any(t.requires_grad for t in params.cache_manager.cache[1])


@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_an_empty_step_gives_an_empty_output(paged: bool, fmt: str) -> None:
    """Every sequence finished (pre_step({})): the unfused backend over a paged cache failed reshaping the gathered
    pages of no sequence (convert_paged_to_nonpaged's -1 was ambiguous)."""
    params = _cache(paged)
    _module(fmt)(*_inputs(fmt), inference_params=params)
    params.pre_step(OrderedDict())
    empty = _inputs(fmt, tokens=0) if fmt == "thd" else tuple(t[:0] for t in _inputs(fmt))
    out = _module(fmt)(*empty, inference_params=params)
    assert out.shape == (*empty[0].shape[:-2], H * D)
    k_cache, _ = params.convert_paged_to_nonpaged(1)
    assert k_cache.shape == (0, 16, H_KV, D)


def test_thd_cache_steps_take_per_sequence_slopes_of_the_step() -> None:
    """ALiBi slopes [batch_size, h] for the step's sequences, as bshd takes them: thd refused them, asking for
    [max_batch_size, h] (its cu_seqlens' rows) under the name [b, h]. Both formats now give the same rows."""
    q, k, v = _inputs("bshd")
    slopes = torch.rand(2, H)
    outs = {}
    for fmt in ("bshd", "thd"):
        params = InferenceParams(4, 16, H_KV, D, torch.float32, device="cpu", is_paged=True, page_size=4)
        params.allocate_memory(1)
        params.pre_step(OrderedDict(STEP))
        args = (q, k, v) if fmt == "bshd" else tuple(torch.cat([t[0, :3], t[1, :2]]) for t in (q, k, v))
        outs[fmt] = _module(fmt)(*args, inference_params=params, core_attention_bias_type="alibi",
                                 alibi_slopes=slopes)
    torch.testing.assert_close(outs["thd"], torch.cat([outs["bshd"][0, :3], outs["bshd"][1, :2]]))


@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
@pytest.mark.parametrize("when", ["constructed", "reset"])
def test_a_cache_step_before_pre_step_is_refused(paged: bool, fmt: str, when: str) -> None:
    """Before any pre_step (or after reset) a thd call of padding rows appended nothing and returned zeros, and a
    bshd call blamed its batch size; both now ask for pre_step, and the cache is unchanged."""
    params = _cache(paged)
    if when == "constructed":
        params = InferenceParams(2, 16, H_KV, D, torch.float32, device="cpu",
                                 **(dict(is_paged=True, page_size=4) if paged else {}))
        params.allocate_memory(1)
    else:
        params.reset()
    before = snapshot(params)
    q, k, v = _inputs(fmt, positions=1) if fmt == "bshd" else _inputs(fmt, tokens=4)
    with pytest.raises(ValueError, match=r"inference_params has no step: call inference_params.pre_step"):
        _module(fmt)(q[:1] if fmt == "bshd" else q, k[:1] if fmt == "bshd" else k,
                     v[:1] if fmt == "bshd" else v, inference_params=params)
    with pytest.raises(ValueError, match="pre_step"):
        params.step(1, k, v, fmt)
    assert_unchanged(params, before)
    params.pre_step(OrderedDict(STEP))
    _module(fmt)(*_inputs(fmt), inference_params=params)   # then it runs


def test_cache_side_refusals_say_which_arguments_new_k_and_new_v_are() -> None:
    """InferenceParams.step's messages name its new_k / new_v; through the module they also say that these are
    key_layer and value_layer."""
    params = _cache(False)
    before = snapshot(params)
    q, k, v = _inputs("bshd")
    with pytest.raises(ValueError, match=r"new_k\.dtype .* \(key_layer and value_layer are appended to the cache "
                                         r"as inference_params\.step's new_k and new_v\)"):
        _module("bshd")(q.double(), k.double(), v.double(), inference_params=params)
    assert_unchanged(params, before)


def _poisoned(x: torch.Tensor) -> torch.Tensor:
    return x.fill_(float("nan")) if x.is_floating_point() else x


@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("backend", ["unfused", "fused"])
def test_a_batch_padded_up_to_max_batch_size_runs_as_in_te(paged: bool, fmt: str, backend: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """TE's CUDA-graph recipe captures a step at max_batch_size rows: rows past batch_size bring no tokens. Their
    output rows are zero and the real rows match the step at its own batch (it was refused); past max_batch_size
    it still is, and the cache is unchanged. Uninitialised floating tensors come back NaN-filled, so padding rows
    that no one zeroes show (fresh CPU memory is often zero)."""
    new_empty = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *args, **kwargs: _poisoned(
        new_empty(self, *args, **kwargs)))
    torch.manual_seed(0)
    kwargs = dict(is_paged=True, page_size=4) if paged else {}
    padded, exact = (InferenceParams(4, 16, H_KV, D, torch.float32, device="cpu", **kwargs) for _ in range(2))
    q, k, v = (torch.randn(4, 3, heads, D) for heads in (H, H_KV, H_KV))
    if fmt == "sbhd":
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    rows = (slice(None), slice(0, 2)) if fmt == "sbhd" else (slice(0, 2),)
    outputs = []
    for params, batch in ((padded, 4), (exact, 2)):
        params.allocate_memory(1)
        take = (lambda x: x[:, :batch]) if fmt == "sbhd" else (lambda x: x[:batch])
        decode = (lambda x: x[:1]) if fmt == "sbhd" else (lambda x: x[:, :1])
        for step, inputs in ((STEP, (q, k, v)), ({"a": 1, "b": 1}, (decode(q), decode(k), decode(v)))):
            params.pre_step(OrderedDict(step))
            with torch.no_grad():
                outputs.append(_module(fmt, backend)(*map(take, inputs), inference_params=params))
    for out, expected in zip(outputs[:2], outputs[2:]):   # the chunk step, then a decode step
        torch.testing.assert_close(out[rows], expected, atol=1e-5, rtol=1e-5)
        assert (out[:, 2:] if fmt == "sbhd" else out[2:]).eq(0).all()
    before = snapshot(padded)
    too_many = (lambda x: torch.cat([x, x[:, :1]], 1)) if fmt == "sbhd" else (lambda x: torch.cat([x, x[:1]]))
    with pytest.raises(ValueError, match="or up to max_batch_size=4 with padding rows"):
        _module(fmt, backend)(too_many(q), too_many(k), too_many(v), inference_params=padded)
    assert_unchanged(padded, before)


@pytest.mark.parametrize("fmt, live, packed, launched", [
    ("bshd", 2, True, ("thd", True)),  # padded: the kernels zero the rows of no sequence, out is not zeroed first
    ("sbhd", 2, True, ("thd", True)),
    ("bshd", 4, True, ("bshd", False)),  # every row a token: nothing to zero, the format kept
    ("sbhd", 4, True, ("thd", False)),  # sbhd's rows as the token rows the Hopper decode kernel reads
    ("bshd", 2, False, ("bshd", False)),  # a cache that does not promise packed steps: its format, out zeroed first
])
def test_a_decode_step_of_one_row_a_sequence_runs_as_thd(fmt: str, live: int, packed: bool,
                                                          launched: tuple[str, bool],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step (one query row a sequence) of a cache whose steps are packed (InferenceParams.step_tokens_packed)
    reaches the fused launcher as thd where its rows may be padding, or in sbhd: with zero_tail the kernels zero the
    rows of no sequence, and out is not zeroed first (a memset a layer in a captured graph). The rows themselves:
    test_a_batch_padded_up_to_max_batch_size_runs_as_in_te."""
    from attention.backends import fused_launches

    calls = []
    monkeypatch.setattr(fused_launches, "run", lambda call, q, k, v, out, *args: calls.append(
        (args[5], args[-1], tuple(q.shape), tuple(out.shape))))
    zeroed = []
    new_zeros = torch.Tensor.new_zeros
    monkeypatch.setattr(torch.Tensor, "new_zeros", lambda *args, **kwargs: zeroed.append(1) or new_zeros(*args,
                                                                                                          **kwargs))
    monkeypatch.setattr(InferenceParams, "step_tokens_packed", packed)
    params = InferenceParams(4, 16, H_KV, D, torch.float16, device="cpu", is_paged=True, page_size=4)
    params.allocate_memory(1)
    params.pre_step(OrderedDict((name, 1) for name in "abcd"[:live]))
    q, k, v = (torch.randn(4, 1, heads, D, dtype=torch.float16) for heads in (H, H_KV, H_KV))
    if fmt == "sbhd":
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    out = _module(fmt, "fused")(q, k, v, inference_params=params)
    ((q_format, zero_tail, q_shape, out_shape),) = calls
    assert (q_format, zero_tail) == launched
    assert (q_shape, out_shape) == (((4, H, D), (4, H * D)) if q_format == "thd" else (q.shape, out.shape))
    assert bool(zeroed) is (live < 4 and q_format != "thd")
    assert out.shape == q.shape[:2] + (H * D,)


def test_two_modules_without_layer_number_in_one_step_are_refused() -> None:
    """Built without layer_number, a module caches as layer 1 (TE's default): a model whose layers all left it out
    wrote every layer's K / V into layer 1's cache. The second such append in a step is refused and writes nothing;
    one such module beside modules of layers 2.. runs, step after step."""
    params = _cache(False)
    params.allocate_memory(2)

    def unnamed() -> DotProductAttention:
        return DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format="bshd", attn_mask_type="padding_causal")

    first, second, named = unnamed(), unnamed(), _module("bshd")
    named.layer_number = 2
    for step in (STEP, {"a": 1, "b": 1}):
        params.pre_step(OrderedDict(step))
        inputs = _inputs("bshd", positions=max(step.values()))
        first(*inputs, inference_params=params)
        named(*inputs, inference_params=params)
    before = snapshot(params)
    with pytest.raises(ValueError, match=r"layer 1's cache already took an append in this step from a "
                                         r"DotProductAttention built without layer_number .*layer_number=L\)"):
        second(*inputs, inference_params=params)
    assert_unchanged(params, before)
    params.pre_step(OrderedDict({"a": 1, "b": 1}))
    second(*inputs, inference_params=params)   # a new step: one default-layer append again


@pytest.mark.parametrize("refused", ["short_kv", "dtype"])
def test_a_refused_append_without_layer_number_leaves_the_step_open(refused: str) -> None:
    """A module without layer_number whose append is refused (k / v that do not fit the cache) appended nothing:
    the corrected call in the same step runs, and its output matches the one of a fresh cache."""
    def run(params: InferenceParams, bad: bool) -> torch.Tensor:
        module = DotProductAttention(H, D, num_gqa_groups=H_KV, qkv_format="thd", attn_mask_type="padding_causal",
                                     backend="unfused")
        params.pre_step(OrderedDict({"a": 5}))
        q, k, v = (torch.randn(5, heads, D, generator=torch.Generator().manual_seed(seed))
                   for heads, seed in ((H, 1), (H_KV, 2), (H_KV, 3)))
        if bad:
            before = snapshot(params)
            wrong = (q, k[:4], v[:4]) if refused == "short_kv" else (q.double(), k.double(), v.double())
            with pytest.raises(ValueError, match="new_k"):
                module(*wrong, inference_params=params)
            assert_unchanged(params, before)
        return module(q, k, v, inference_params=params)

    torch.testing.assert_close(run(_cache(True), bad=True), run(_cache(True), bad=False), rtol=0, atol=0)


def test_a_mask_given_to_a_cache_step_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's lengths come from inference_params: a padding mask is not read (as in TE), and a warning says so."""
    from attention import call_setup

    monkeypatch.setattr(call_setup, "_WARNED", set())
    with pytest.warns(UserWarning, match="attention_mask is given but not read: a KV-cache step takes each "
                                         "sequence's lengths from inference_params"):
        _module("bshd")(*_inputs("bshd"), attention_mask=torch.zeros(2, 1, 1, 3, dtype=torch.bool),
                        inference_params=_cache(False))
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    with warnings.catch_warnings():   # once per reason, whatever else the call brings
        warnings.simplefilter("error", UserWarning)
        _module("bshd")(*_inputs("bshd"), attention_mask=torch.zeros(2, 1, 1, 3, dtype=torch.bool),
                        inference_params=_cache(False), cu_seqlens_q=cu, cu_seqlens_kv=cu)


def test_padded_offsets_given_to_a_cache_step_are_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache step reads its query tokens back to back (TE drops the padded offsets): given ones are not read,
    and a warning says so, once."""
    from attention import call_setup

    monkeypatch.setattr(call_setup, "_WARNED", set())
    offsets = torch.tensor([0, 4, 7], dtype=torch.int32)   # a gap after the first sequence: not what q holds
    q, k, v = _inputs("thd")
    expected = _module("thd")(q, k, v, inference_params=_cache(False))
    with pytest.warns(UserWarning, match="cu_seqlens_q_padded / cu_seqlens_kv_padded are given with "
                                         "inference_params but not read"):
        out = _module("thd")(q, k, v, cu_seqlens_q_padded=offsets, inference_params=_cache(False))
    torch.testing.assert_close(out, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _module("thd")(q, k, v, cu_seqlens_kv_padded=offsets, inference_params=_cache(False))   # once


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_pad_between_seqs_is_not_read_by_a_padded_batch_step(fmt: str) -> None:
    """bshd / sbhd have no gaps between sequences: the flag is not read (as without a cache, and in TE)."""
    q, k, v = _inputs("bshd")
    if fmt == "sbhd":
        q, k, v = (x.transpose(0, 1).contiguous() for x in (q, k, v))
    expected = _module(fmt)(q, k, v, inference_params=_cache(False))
    torch.testing.assert_close(_module(fmt)(q, k, v, inference_params=_cache(False), pad_between_seqs=True), expected)


def test_a_bias_that_requires_grad_is_read_detached_by_a_cache_step() -> None:
    """A cache step trains nothing: a learnable bias (as the learnable sink) is read detached, so it neither keeps
    the backends without a backward pass out nor makes the output require grad."""
    bias = torch.nn.Parameter(torch.randn(1, H, 3, 16))
    q, k, v = _inputs("bshd")
    module = _module("bshd")
    kwargs = dict(core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    assert "requires_grad = False" in module.explain(q, k, v, inference_params=_cache(False), **kwargs)
    out = module(q, k, v, inference_params=_cache(False), **kwargs)
    assert not out.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(out, module(q, k, v, inference_params=_cache(False), **kwargs))
