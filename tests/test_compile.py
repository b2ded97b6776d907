"""``torch.compile(fullgraph=True)`` of ``DotProductAttention.forward``: no graph break, eager results.

``fullgraph=True`` raises on any graph break, so each compiled call here is the check. CPU: the
unfused backend (bshd causal, thd padding_causal, GQA, KV-cache decode through InferenceParams),
selection under compile (env switches, use_backends, the no-backend error), the fused kernel as
the custom op ``dpa::fused_attention_forward`` running in the Triton interpreter, and ``opcheck``
of every op (flash ops against a fake flash-attn package). GPU: fused in bf16, prefill and decode.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict

import pytest
import torch
from torch._dynamo.utils import counters

from attention import DotProductAttention, custom_ops, selection, use_backends
from attention.backends import flash_probe
from inference import InferenceParams

# The interpreter converts 0-d arrays with int(); numpy deprecates that, harmlessly here.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),  # opcheck
]

HEADS, HEADS_KV, HEAD_DIM = 4, 2, 16


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch (and never hits the recompile limit of another test's graphs)."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _attention(**kwargs) -> DotProductAttention:
    base = {"num_attention_heads": HEADS, "kv_channels": HEAD_DIM, "num_gqa_groups": HEADS_KV, "backend": "unfused"}
    return DotProductAttention(**{**base, **kwargs})


def _compiled(module: DotProductAttention):
    return torch.compile(module, fullgraph=True, dynamic=False)


def _qkv(shape_q, shape_kv, dtype=torch.float32, device="cpu"):
    return (torch.randn(*shape_q, dtype=dtype, device=device),
            torch.randn(*shape_kv, dtype=dtype, device=device),
            torch.randn(*shape_kv, dtype=dtype, device=device))


# ------------------------------------------------------------------------------------------------
# unfused on CPU
# ------------------------------------------------------------------------------------------------

def test_bshd_causal_has_no_graph_break():
    attn = _attention(qkv_format="bshd", attn_mask_type="causal")
    q, k, v = _qkv((2, 8, HEADS, HEAD_DIM), (2, 8, HEADS_KV, HEAD_DIM))
    explanation = torch._dynamo.explain(attn)(q, k, v)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    torch.testing.assert_close(_compiled(attn)(q, k, v), attn(q, k, v))


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd"])
def test_gqa_cross_lengths(qkv_format):
    attn = _attention(num_attention_heads=8, qkv_format=qkv_format, attn_mask_type="causal_bottom_right")
    q, k, v = _qkv((2, 3, 8, HEAD_DIM), (2, 11, HEADS_KV, HEAD_DIM))
    if qkv_format == "sbhd":
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    out = _compiled(attn)(q, k, v)
    assert attn.last_backend == "unfused"
    torch.testing.assert_close(out, attn(q, k, v))


def test_new_shapes_specialise_under_automatic_dynamic():
    """Shapes feed selection, so each new sequence length is one more graph (no error, no break)."""
    attn = _attention(qkv_format="bshd", attn_mask_type="causal")
    compiled = torch.compile(attn, fullgraph=True)   # dynamic=None: the second shape is traced symbolic
    counters.clear()
    for s in (8, 12, 16, 12):
        q, k, v = _qkv((2, s, HEADS, HEAD_DIM), (2, s, HEADS_KV, HEAD_DIM))
        torch.testing.assert_close(compiled(q, k, v), attn(q, k, v))
    assert counters["stats"]["unique_graphs"] == 3


@pytest.mark.parametrize("mask_type, window", [("padding", (-1, 0)), ("causal", (4, 2))])
def test_a_normalised_window_warns_eagerly_and_compiles_without_a_break(mask_type, window):
    """A window the mask type rewrites warns in an eager call; under compile the warning (which dynamo cannot
    trace) is left out rather than failing fullgraph=True."""
    attn = _attention(qkv_format="bshd", attn_mask_type=mask_type)
    q, k, v = _qkv((2, 8, HEADS, HEAD_DIM), (2, 8, HEADS_KV, HEAD_DIM))
    with pytest.warns(UserWarning, match=r"window_size=.* using"):
        expected = attn(q, k, v, window_size=window)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        torch.testing.assert_close(_compiled(attn)(q, k, v, window_size=window), expected)


def test_thd_padding_causal_with_cu_seqlens():
    attn = _attention(qkv_format="thd", attn_mask_type="padding_causal")
    lengths = [5, 1, 7]
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    q, k, v = _qkv((sum(lengths), HEADS, HEAD_DIM), (sum(lengths), HEADS_KV, HEAD_DIM))
    kwargs = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "max_seqlen_q": max(lengths), "max_seqlen_kv": max(lengths)}
    out = _compiled(attn)(q, k, v, **kwargs)
    torch.testing.assert_close(out, attn(q, k, v, **kwargs))
    # New cu_seqlens contents with the same shapes reuse the graph (they are tensors, not constants).
    cu2 = torch.tensor([0, 2, 9, 13], dtype=torch.int32)
    kwargs2 = dict(kwargs, cu_seqlens_q=cu2, cu_seqlens_kv=cu2)
    torch.testing.assert_close(_compiled(attn)(q, k, v, **kwargs2), attn(q, k, v, **kwargs2))


def _cache_call(q, k, v, ip: InferenceParams, qkv_format: str, lengths: list[int]):
    """Forward arguments for one step: thd tokens as they are, bshd left-aligned rows."""
    if qkv_format == "thd":
        return (q, k, v), {"cu_seqlens_q": ip.cu_seqlens_q, "cu_seqlens_kv": ip.cu_seqlens_kv,
                               "max_seqlen_q": max(lengths), "max_seqlen_kv": ip.max_sequence_length,
                               "inference_params": ip}
    rows = [torch.nn.utils.rnn.pad_sequence(list(t.split(lengths)), batch_first=True) for t in (q, k, v)]
    return tuple(rows), {"inference_params": ip}


def _cache_pair(paged: bool, **kwargs) -> list[InferenceParams]:
    """Two like caches with layer 1 allocated (pages of 4 tokens when ``paged``): one for the compiled module, one
    for the eager one."""
    paging = {"is_paged": True, "page_size": 4} if paged else {}
    caches = [InferenceParams(num_heads_kv=HEADS_KV, head_dim_k=HEAD_DIM, dtype=torch.float32, device="cpu",
                              **paging, **kwargs) for _ in range(2)]
    for ip in caches:
        ip.allocate_memory(1)
    return caches


def _decode_run(module, compiled, paged: bool, qkv_format: str, steps: int = 3):
    """Prefill two caches eagerly, then decode ``steps`` tokens: one cache through ``compiled``, the
    other through ``module`` (eager); outputs and caches must agree."""
    caches = _cache_pair(paged, max_batch_size=2, max_sequence_length=16, qkv_format=qkv_format)
    lengths = [3, 5]
    q, k, v = _qkv((sum(lengths), HEADS, HEAD_DIM), (sum(lengths), HEADS_KV, HEAD_DIM))
    for ip in caches:
        ip.pre_step(OrderedDict(zip(("a", "b"), lengths)))
        args, kwargs = _cache_call(q, k, v, ip, qkv_format, lengths)
        module(*args, **kwargs)
    for _ in range(steps):
        q, k, v = _qkv((2, HEADS, HEAD_DIM), (2, HEADS_KV, HEAD_DIM))
        outs = []
        for ip, run in zip(caches, (compiled, module)):
            ip.pre_step(OrderedDict([("a", 1), ("b", 1)]))
            args, kwargs = _cache_call(q, k, v, ip, qkv_format, [1, 1])
            outs.append(run(*args, **kwargs))
        torch.testing.assert_close(outs[0], outs[1])
    for compiled_cache, eager_cache in zip(caches[0].cache_manager.layer_cache(1),
                                           caches[1].cache_manager.layer_cache(1)):
        torch.testing.assert_close(compiled_cache, eager_cache)


@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
def test_kv_cache_decode_step(paged, qkv_format):
    attn = _attention(qkv_format=qkv_format, attn_mask_type="padding_causal")
    counters.clear()
    _decode_run(attn, _compiled(attn), paged, qkv_format, steps=4)
    assert counters["stats"]["unique_graphs"] == 1   # every decode step replays one graph: no recompilation


@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
def test_kv_cache_steps_of_any_lengths_replay_one_graph(paged):
    """thd steps with a fixed query size (8 rows) but a new split of lengths each step: the step's lengths live in
    device buffers, so one graph serves them all (the append's host checks of the lengths tied the graph to each
    split, a recompile a step until the limit)."""
    attn = _attention(qkv_format="thd", attn_mask_type="padding_causal")
    compiled = _compiled(attn)
    caches = _cache_pair(paged, max_batch_size=2, max_sequence_length=48, qkv_format="thd", max_ctx_len=8)
    counters.clear()
    for step, lengths in enumerate([(1, 1), (3, 1), (1, 6), (4, 4), (2, 5)]):
        q, k, v = _qkv((8, HEADS, HEAD_DIM), (8, HEADS_KV, HEAD_DIM))
        outs = []
        for ip, run in zip(caches, (compiled, attn)):
            ip.pre_step(OrderedDict(zip((f"a{step}", f"b{step}"), lengths)))
            outs.append(run(q, k, v, cu_seqlens_q=ip.cu_seqlens_q, cu_seqlens_kv=ip.cu_seqlens_kv, max_seqlen_q=8,
                            max_seqlen_kv=ip.max_sequence_length, inference_params=ip))
        torch.testing.assert_close(outs[0], outs[1])
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("backend", ["unfused", "fused"])
@pytest.mark.parametrize("paged", [False, True], ids=["non-paged", "paged"])
def test_a_batch_padded_to_max_batch_size_replays_one_graph(paged, backend):
    """TE's CUDA-graph recipe under torch.compile: bshd decode steps at max_batch_size rows while sequences join
    and leave. The batch check of a traced call reads only max_batch_size (reading batch_size guarded on it: a
    recompile per live batch size). The fused backend runs the rows as thd, its kernel zeroing the padding rows."""
    if backend == "fused" and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("the fused kernel on CPU tensors: Triton interpreter on CPU only")
    attn = _attention(qkv_format="bshd", attn_mask_type="padding_causal", backend=backend)
    compiled = _compiled(attn)
    caches = _cache_pair(paged, max_batch_size=4, max_sequence_length=32)
    counters.clear()
    for live in ({"a": 1, "b": 1}, {"a": 1, "b": 1, "c": 1}, {"a": 1, "c": 1}, {"a": 1, "c": 1, "d": 1, "e": 1}):
        q, k, v = _qkv((4, 1, HEADS, HEAD_DIM), (4, 1, HEADS_KV, HEAD_DIM))
        outs = []
        for ip, run in zip(caches, (compiled, attn)):
            ip.pre_step(OrderedDict(live))
            outs.append(run(q, k, v, inference_params=ip))
        torch.testing.assert_close(outs[0], outs[1])
        assert outs[0][len(live):].eq(0).all()
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("change", ["window_size", "num_splits", "attention_dropout"])
def test_changed_selection_inputs_recompile_under_automatic_dynamic(change):
    """Dynamo traces a value it has seen change as symbolic; selection takes constants, so the values it reads are
    specialised (a new graph each) instead of failing the compile. ``dynamic=True`` compiles too."""
    backend = "fused" if change == "num_splits" else "unfused"   # the unfused backend refuses num_splits > 1
    if backend == "fused" and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("the fused kernel on CPU tensors: Triton interpreter on CPU only")
    attn = _attention(qkv_format="bshd", attn_mask_type="causal", backend=backend, attention_dropout=0.1)
    attn.train(change == "attention_dropout")
    compiled = torch.compile(attn, fullgraph=True)   # dynamic=None
    q, k, v = _qkv((2, 8, HEADS, HEAD_DIM), (2, 8, HEADS_KV, HEAD_DIM))
    for value in (1, 2, 3):
        if change == "attention_dropout":
            attn.attention_dropout = value / 10
            assert compiled(q, k, v).shape == (2, 8, HEADS * HEAD_DIM)
        elif change == "window_size":
            torch.testing.assert_close(compiled(q, k, v, window_size=(value, 0)), attn(q, k, v, window_size=(value, 0)))
        else:   # the fused kernel in the Triton interpreter
            torch.testing.assert_close(compiled(q, k, v, num_splits=value), attn(q, k, v, num_splits=value))
    dynamic = torch.compile(attn.eval(), fullgraph=True, dynamic=True)
    torch.testing.assert_close(dynamic(q, k, v), attn(q, k, v))


# ------------------------------------------------------------------------------------------------
# selection under compile
# ------------------------------------------------------------------------------------------------

def test_env_switch_recompiles(monkeypatch):
    """NVTE_* are read with os.environ.get in the traced code, so Dynamo guards them (torch 2.13: only
    the variables set at trace time)."""
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "1")
    attn = DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=HEADS_KV, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = _qkv((1, 4, HEADS, HEAD_DIM), (1, 4, HEADS_KV, HEAD_DIM), dtype=torch.float64)  # unfused only
    compiled = _compiled(attn)
    compiled(q, k, v)
    assert attn.last_backend == "unfused"
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    # Dynamo wraps the ValueError raised at trace time (InternalTorchDynamoError); the text is kept.
    with pytest.raises(Exception, match="ValueError: No dot product attention backend is available"):
        compiled(q, k, v)


def test_use_backends_around_compiled_call():
    attn = DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=HEADS_KV, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = _qkv((1, 4, HEADS, HEAD_DIM), (1, 4, HEADS_KV, HEAD_DIM))
    with use_backends("unfused"):
        out = _compiled(attn)(q, k, v)
    assert attn.last_backend == "unfused"
    torch.testing.assert_close(out, attn(q, k, v))


def test_explicit_backend_that_cannot_run_raises_under_compile():
    attn = _attention(backend="flash2", qkv_format="bshd", attn_mask_type="causal")
    q, k, v = _qkv((1, 4, HEADS, HEAD_DIM), (1, 4, HEADS_KV, HEAD_DIM))
    with pytest.raises(Exception, match="ValueError: Backend flash2 was requested"):
        _compiled(attn)(q, k, v)


def test_selection_runs_once_per_compilation(monkeypatch):
    calls = []
    original = selection.select
    monkeypatch.setattr(selection, "select", lambda *a: calls.append(a) or original(*a))
    attn = _attention(qkv_format="bshd", attn_mask_type="causal")
    compiled = _compiled(attn)
    q, k, v = _qkv((2, 8, HEADS, HEAD_DIM), (2, 8, HEADS_KV, HEAD_DIM))
    for _ in range(3):
        compiled(q, k, v)
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------
# fused: the custom op (Triton interpreter on CPU)
# ------------------------------------------------------------------------------------------------

def _fused_reason() -> str | None:
    return selection.registry()["fused"].availability_reason()


needs_triton = pytest.mark.skipif(_fused_reason() is not None, reason=f"fused unavailable: {_fused_reason()}")
on_cpu_interpreter = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1", reason="Triton interpreter on CPU only"
)


@needs_triton
@on_cpu_interpreter
def test_fused_interpreter_compiles_through_the_custom_op():
    attn = _attention(backend="fused", qkv_format="bshd", attn_mask_type="causal")
    q, k, v = _qkv((2, 8, HEADS, HEAD_DIM), (2, 8, HEADS_KV, HEAD_DIM))
    explanation = torch._dynamo.explain(attn)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "dpa.fused_attention_forward" in str(explanation.graphs[0].code)
    out = _compiled(attn)(q, k, v)
    torch.testing.assert_close(out, _attention(qkv_format="bshd", attn_mask_type="causal")(q, k, v),
                               atol=1e-4, rtol=1e-4)


@needs_triton
@on_cpu_interpreter
@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
def test_fused_interpreter_kv_cache_decode(qkv_format):
    attn = _attention(backend="fused", qkv_format=qkv_format, attn_mask_type="padding_causal")
    _decode_run(attn, _compiled(attn), paged=True, qkv_format=qkv_format, steps=2)


@needs_triton
@on_cpu_interpreter
def test_fused_op_opcheck():
    q, k, v = _qkv((2, 5, HEADS, HEAD_DIM), (2, 7, HEADS_KV, HEAD_DIM))
    out = torch.zeros(2, 5, HEADS, HEAD_DIM)
    cu_q = torch.tensor([0, 5, 8], dtype=torch.int32)
    cu_kv = torch.tensor([0, 7, 12], dtype=torch.int32)
    args = (q, k, v, out, cu_q, cu_kv, None, None, None, "bshd", "bshd", 2, 5, 7, 10, 0.25, True, -1, 0, True,
            None, None)
    torch.library.opcheck(torch.ops.dpa.fused_attention_forward.default, args)


# ------------------------------------------------------------------------------------------------
# flash ops: schema, fake implementation, compile, against a fake flash-attn 2 package (CPU)
# ------------------------------------------------------------------------------------------------

class _FakeFlash:
    """flash-attn's output contract only (shape, dtype, a fresh tensor): values are irrelevant here."""

    def flash_attn_func(self, q, k, v, **kwargs):
        return (q[..., :1] * v.sum() + torch.zeros(*q.shape[:-1], v.shape[-1]), None)

    def flash_attn_varlen_func(self, q, k, v, **kwargs):
        return q[..., :1] * v.sum() + torch.zeros(*q.shape[:-1], v.shape[-1])

    flash_attn_with_kvcache = flash_attn_varlen_func


@pytest.fixture
def fake_flash(monkeypatch):
    package = flash_probe.FlashPackage(2, module=_FakeFlash(), version=(9, 9, 9), version_text="9.9.9")
    monkeypatch.setattr(flash_probe, "probe", lambda generation: package)


def test_flash_ops_opcheck(fake_flash):
    q, k, v = _qkv((2, 5, HEADS, HEAD_DIM), (2, 7, HEADS_KV, 8))
    torch.library.opcheck(torch.ops.dpa.flash_attn_func.default, (q, k, v, 2, 0.25, True),
                          {"window_size": [3, 0], "dropout_p": 0.0})
    cu_q = torch.tensor([0, 5, 10], dtype=torch.int32)
    cu_kv = torch.tensor([0, 7, 14], dtype=torch.int32)
    q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
    torch.library.opcheck(torch.ops.dpa.flash_attn_varlen_func.default, (q, k, v, cu_q, cu_kv, 5, 7, 2, 0.25, True),
                          {"seqused_k": torch.tensor([7, 7], dtype=torch.int32)})
    torch.library.opcheck(torch.ops.dpa.flash_attn_with_kvcache.default,
                          (q, k.view(2, 7, HEADS_KV, 8), v.view(2, 7, HEADS_KV, 8), cu_kv.diff(), None, cu_q, 5, 3,
                           0.25, True), {"num_splits": 0})


def test_flash_op_compiles_without_graph_break(fake_flash):
    def attend(q, k, v):
        return custom_ops.dispatch("flash_attn_func")(q, k, v, 2, 0.25, True, window_size=[-1, 0]) * 2

    q, k, v = _qkv((2, 5, HEADS, HEAD_DIM), (2, 7, HEADS_KV, HEAD_DIM))
    explanation = torch._dynamo.explain(attend)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "dpa.flash_attn_func" in str(explanation.graphs[0].code)
    torch.testing.assert_close(torch.compile(attend, fullgraph=True)(q, k, v), attend(q, k, v))


def test_eager_calls_skip_the_op_dispatch():
    """The eager hot path calls the plain functions (a custom-op dispatch costs ~13 us of CPU)."""
    assert custom_ops.dispatch("fused_attention_forward") is custom_ops.fused_attention_forward
    assert custom_ops.dispatch("flash_attn_varlen_func") is custom_ops.flash_attn_varlen_func


# ------------------------------------------------------------------------------------------------
# GPU: fused in bf16
# ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_fused_bf16_cuda_prefill_and_decode():
    if _fused_reason() is not None:
        pytest.skip(f"fused unavailable: {_fused_reason()}")
    device, dtype = "cuda", torch.bfloat16
    attn = _attention(backend="fused", num_attention_heads=8, kv_channels=64, qkv_format="bshd",
                      attn_mask_type="causal").to(device)
    reference = _attention(backend="unfused", num_attention_heads=8, kv_channels=64, qkv_format="bshd",
                           attn_mask_type="causal").to(device)
    q, k, v = _qkv((2, 128, 8, 64), (2, 128, HEADS_KV, 64), dtype=dtype, device=device)
    compiled = _compiled(attn)
    out = compiled(q, k, v)
    assert attn.last_backend == "fused"
    torch.testing.assert_close(out, reference(q, k, v), atol=1e-2, rtol=1e-2)

    # Decode with a paged cache: prefill eagerly, then compiled single-token steps vs unfused eager.
    attn_cache = _attention(backend="fused", num_attention_heads=8, kv_channels=64, qkv_format="thd",
                            attn_mask_type="padding_causal").to(device)
    ref_cache = _attention(backend="unfused", num_attention_heads=8, kv_channels=64, qkv_format="thd",
                           attn_mask_type="padding_causal").to(device)
    caches = []
    for _ in range(2):
        ip = InferenceParams(max_batch_size=2, max_sequence_length=256, num_heads_kv=HEADS_KV, head_dim_k=64,
                             dtype=dtype, is_paged=True, page_size=16, qkv_format="thd", device=device)
        ip.allocate_memory(1)
        caches.append(ip)
    prompt = [37, 90]
    q, k, v = _qkv((sum(prompt), 8, 64), (sum(prompt), HEADS_KV, 64), dtype=dtype, device=device)
    for ip, module in zip(caches, (attn_cache, ref_cache)):
        ip.pre_step(OrderedDict(zip(("a", "b"), prompt)))
        module(q, k, v, cu_seqlens_q=ip.cu_seqlens_q, cu_seqlens_kv=ip.cu_seqlens_kv, max_seqlen_q=max(prompt),
               max_seqlen_kv=256, inference_params=ip)
    compiled = _compiled(attn_cache)
    for _ in range(4):
        q, k, v = _qkv((2, 8, 64), (2, HEADS_KV, 64), dtype=dtype, device=device)
        outs = []
        for ip, module in zip(caches, (compiled, ref_cache)):
            ip.pre_step(OrderedDict([("a", 1), ("b", 1)]))
            outs.append(module(q, k, v, cu_seqlens_q=ip.cu_seqlens_q, cu_seqlens_kv=ip.cu_seqlens_kv, max_seqlen_q=1,
                               max_seqlen_kv=256, inference_params=ip))
        assert attn_cache.last_backend == "fused"
        torch.testing.assert_close(outs[0], outs[1], atol=1e-2, rtol=1e-2)


# ------------------------------------------------------------------------------------------------
# flash backends' forward traced whole (fake packages: flash needs CUDA, so selection can't pick it here)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("layout", ["bshd-causal", "thd", "thd-paged-decode"])
def test_flash_backend_forward_has_no_graph_break(generation, layout, monkeypatch):
    from attention.selection import registry
    from tests.flash_cases import FlashCase, build_call
    from tests.flash_fakes import install_fake

    install_fake(monkeypatch, generation)
    page_size = 256 if generation == 2 else 16
    case = {"bshd-causal": FlashCase("bshd", attn_mask_type="causal"), "thd": FlashCase("thd"),
            "thd-paged-decode": FlashCase("thd", kv_cache="paged", page_size=page_size, s_q=1,
                                          s_kv=2 * page_size)}[layout]
    call, expected = build_call(case, param_dtype=torch.bfloat16)
    backend = registry()[f"flash{generation}"]
    explanation = torch._dynamo.explain(backend.forward)(call)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "dpa.flash_attn" in "".join(str(g.code) for g in explanation.graphs)
    torch.testing.assert_close(torch.compile(backend.forward, fullgraph=True)(call).float(), expected,
                               atol=1e-5, rtol=1e-5)
