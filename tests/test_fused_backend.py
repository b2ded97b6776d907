"""The fused backend's plumbing around the kernel (the kernel itself: tests/test_kernels.py)."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from attention.backends.fused import output_rows_may_be_padding
from attention.params import AttentionParams

PARAMS = AttentionParams(dtype=torch.float16, device_type="cpu")


@pytest.mark.parametrize("fields, q_shape, expected", [
    (dict(kv_cache="paged", qkv_format="bshd"), (8, 1, 4, 16, 8), False),     # decode: every row a real token
    (dict(kv_cache="paged", qkv_format="sbhd"), (1, 8, 4, 16, 8), False),
    (dict(kv_cache="paged", qkv_format="bshd"), (8, 1, 4, 16, 3), True),      # padded up to max_batch_size
    (dict(kv_cache="paged", qkv_format="sbhd"), (1, 8, 4, 16, 3), True),
    (dict(kv_cache="paged", qkv_format="bshd"), (8, 1, 4, 16, None), True),   # captured: replays may bring fewer
    (dict(kv_cache="paged", qkv_format="bshd"), (8, 3, 4, 16, 8), True),      # chunks of unequal length
    (dict(kv_cache="non_paged", qkv_format="thd"), (9, 4, 16, None), True),
    (dict(kv_cache="paged", qkv_format="thd"), (9, 4, 16, 9), False),         # exactly the step's tokens
    (dict(kv_cache="paged", qkv_format="thd"), (9, 4, 16, 7), True),          # 2 rows of padding
    (dict(kv_cache="paged", qkv_format="bshd", pad_between_seqs=True), (8, 1, 4, 16, 8), True),
    (dict(attn_mask_type="padding_causal"), (2, 5, 4, 16, None), True),
    (dict(attn_mask_type="causal"), (2, 5, 4, 16, None), False),
])
def test_fused_output_starts_from_zeros_only_where_rows_can_be_padding(fields, q_shape, expected) -> None:
    """q_shape then the step's query rows (host; None: unknown, as under capture)."""
    *q_shape, step_rows = q_shape
    assert output_rows_may_be_padding(replace(PARAMS, **fields), torch.Size(q_shape), step_rows) is expected


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
    call = SimpleNamespace(inference_params=params, max_seqlen_kv=1 << 16, query=query, eager=None)
    assert split_sizing_kv_length(call) == 257
    call.eager = False   # the module found the call compiled or captured: the capacity
    assert split_sizing_kv_length(call) == 1 << 16
    call.eager = True
    assert split_sizing_kv_length(call) == 257
    no_cache = SimpleNamespace(inference_params=None, max_seqlen_kv=900, query=query, eager=None)
    assert split_sizing_kv_length(no_cache) == 900
    params.reset()
    assert params.longest_sequence == 0


def test_the_fused_backend_hands_the_kernel_the_longest_sequence(monkeypatch, cpu_fused) -> None:
    """Through DotProductAttention: the kernel call of an eager decode step over a 4096-token cache
    holding sequences of 30 and 257 tokens gets max_seqlen_kv 257."""
    from collections import OrderedDict

    from attention import DotProductAttention
    from attention.backends import fused_launches
    from inference import InferenceParams

    seen = []
    monkeypatch.setattr(fused_launches, "packed_attention_forward",
                        lambda *args: seen.append(args[11]))  # args[11]: max_seqlen_kv
    params = InferenceParams(2, 4096, 2, 16, torch.float16, is_paged=True, page_size=16, device="cpu")
    params.allocate_memory(1)
    params.pre_step(OrderedDict({"a": 30, "b": 256}))
    params.pre_step(OrderedDict({"a": 1, "b": 1}))
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="fused")
    q, k = torch.randn(2, 1, 4, 16, dtype=torch.float16), torch.randn(2, 1, 2, 16, dtype=torch.float16)
    module(q, k, k.clone(), inference_params=params)
    assert seen == [257]


def test_the_fused_backend_hands_the_kernel_the_steps_kv_tokens(monkeypatch, cpu_fused) -> None:
    """An eager decode step passes the cache's KV tokens (30 + 257 + 1 after this step's) as total_kv, which the
    decode kernel's split rule sizes on; InferenceParams counts them in pre_step and forgets them in reset."""
    from collections import OrderedDict

    from attention import DotProductAttention
    from attention.backends import fused_launches
    from inference import InferenceParams

    seen = []
    monkeypatch.setattr(fused_launches, "packed_attention_forward", lambda *args: seen.append(args[-1]))
    params = InferenceParams(3, 4096, 2, 16, torch.float16, is_paged=True, page_size=16, device="cpu")
    params.allocate_memory(1)
    params.pre_step(OrderedDict({"a": 29, "b": 256}))
    params.pre_step(OrderedDict({"a": 1, "b": 1, "c": 1}))
    assert params.kv_tokens == 30 + 257 + 1
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="fused")
    q, k = torch.randn(3, 1, 4, 16, dtype=torch.float16), torch.randn(3, 1, 2, 16, dtype=torch.float16)
    module(q, k, k.clone(), inference_params=params)
    assert seen == [288]
    params.reset()
    assert params.kv_tokens == 0


@pytest.mark.parametrize("extra_rows", [0, 3])
def test_a_thd_cache_step_starts_from_zeros_only_with_padding_rows(monkeypatch, extra_rows, cpu_fused) -> None:
    """thd over a cache: the output is never zeroed by a memset (the kernel writes every row); with rows past
    the step's tokens the launch is asked to write zeros there (zero_tail). The kernel is replaced by a
    no-op, so what the output holds is what the backend allocated."""
    from collections import OrderedDict

    from attention import DotProductAttention
    from attention.backends import fused_launches
    from inference import InferenceParams

    allocations = []
    monkeypatch.setattr(fused_launches, "packed_attention_forward", lambda *args: allocations.append(args))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: torch.full(a, float("nan"), **k))
    monkeypatch.setattr(torch, "empty_like", lambda x, **k: torch.full_like(x, float("nan"), **k))
    monkeypatch.setattr(torch.Tensor, "new_empty",
                        lambda x, *size, **k: torch.full(size, float("nan"), dtype=x.dtype, device=x.device))
    params = InferenceParams(2, 64, 2, 16, torch.float16, is_paged=True, page_size=16, device="cpu")
    params.allocate_memory(1)
    params.pre_step(OrderedDict({"a": 3, "b": 2}))
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="thd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="fused")
    rows = 5 + extra_rows
    q, k = torch.randn(rows, 4, 16, dtype=torch.float16), torch.randn(rows, 2, 16, dtype=torch.float16)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    module(q, k, k.clone(), cu_seqlens_q=cu, cu_seqlens_kv=cu, inference_params=params)
    (args,) = allocations
    out, zero_tail = args[3], args[-2]
    assert bool(out.isnan().all())
    assert zero_tail is (extra_rows > 0)


@pytest.mark.parametrize("value", ["1", "true", "on"])
def test_cpu_tensors_are_accepted_under_every_spelling_triton_interprets(value, monkeypatch) -> None:
    """TRITON_INTERPRET is read as Triton reads it: "true" interprets as "1" does (before the kernels are defined:
    here as if they were not yet)."""
    from attention.backends.fused import FusedBackend
    from attention.kernels import availability

    monkeypatch.setattr(availability, "_kernels_interpreted", None)
    monkeypatch.setenv("TRITON_INTERPRET", value)
    reasons = FusedBackend().extra_reasons(replace(PARAMS, device_type="cpu", dtype=torch.float32))
    assert not any("TRITON_INTERPRET" in reason for reason in reasons), reasons


def test_triton_interpret_is_the_kernels_mode_once_they_are_defined(monkeypatch) -> None:
    """triton.jit reads TRITON_INTERPRET as it defines a kernel. The choice read it on every call, but its answer
    to "can the kernels run on this CPU" was kept from the first call: setting it (and clear_cache) still said "set
    TRITON_INTERPRET=1", and once the kernels existed, changing it changed the choice but not the kernels."""
    from attention.backends import fused
    from attention.kernels import availability

    # a cache of its own: its answers assume no CUDA device
    monkeypatch.setattr(fused, "_triton_reason_for", functools.cache(fused._triton_reason_for.__wrapped__))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(availability, "_kernels_interpreted", None)   # not defined yet: the variable as it is now
    monkeypatch.setattr(availability, "interpreter_numpy_conflict", lambda: None)   # whatever numpy this host has
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "set TRITON_INTERPRET=1" in fused._triton_reason()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fused._triton_reason() is None
    monkeypatch.setattr(availability, "_kernels_interpreted", False)   # defined without it: setting it now is late
    assert "the kernels were defined without TRITON_INTERPRET=1" in fused._triton_reason()
    reasons = fused.FusedBackend().extra_reasons(replace(PARAMS, device_type="cpu", dtype=torch.float32))
    assert any("float32 runs only under TRITON_INTERPRET=1" in reason for reason in reasons), reasons
    monkeypatch.setattr(availability, "_kernels_interpreted", True)   # defined interpreted: unsetting it is late too
    monkeypatch.delenv("TRITON_INTERPRET")
    assert fused._triton_reason() is None and availability.kernels_interpreted()


@pytest.mark.parametrize("versions, refused", [
    ({"triton": "3.6.0", "numpy": "2.4.1"}, True),
    ({"pytorch-triton": "3.6.0+git5a6c9b1", "numpy": "2.4.0rc1"}, True),   # torch's nightlies name Triton so
    ({"triton": "3.2.0", "numpy": "2.5.0"}, True),
    ({"triton": "3.6.0", "numpy": "2.3.5"}, False),
    ({"triton": "3.7.0", "numpy": "2.4.1"}, False),
    ({"triton": "3.10.0", "numpy": "2.4.1"}, False),
    ({"numpy": "2.4.1"}, False),   # no distribution record: nothing to say
])
def test_the_interpreter_refuses_numpy_2_4_under_triton_before_3_7(versions, refused, monkeypatch) -> None:
    """Triton 3.6's interpreter int()s a loop bound held as a one-element array, which numpy 2.4 refuses: every
    interpreted kernel failed with "only 0-dimensional arrays can be converted to Python scalars" (the device's
    torch 2.11 / Triton 3.6 / numpy 2.4, 2026-12-06). The choice now says so and names both remedies."""
    from attention.backends import fused
    from attention.kernels import availability

    def installed_version(*distributions: str) -> str | None:
        return next((versions[name] for name in distributions if name in versions), None)

    monkeypatch.setattr(availability, "installed_version", installed_version)
    # a cache of its own, for the patched versions
    monkeypatch.setattr(availability, "interpreter_numpy_conflict",
                        functools.cache(availability.interpreter_numpy_conflict.__wrapped__))
    monkeypatch.setattr(fused, "_triton_reason_for", functools.cache(fused._triton_reason_for.__wrapped__))
    monkeypatch.setattr(availability, "_kernels_interpreted", True)
    reason = fused._triton_reason()
    if not refused:
        assert reason is None
        return
    assert reason == availability.interpreter_numpy_conflict()
    assert "numpy 2.4" in reason and "install numpy<2.4 or triton>=3.7" in reason, reason
    assert reason in fused.FusedBackend().support_reasons(replace(PARAMS, device_type="cpu", dtype=torch.float32))
    from attention import DotProductAttention

    module = DotProductAttention(2, 16, qkv_format="bshd", backend="fused")
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(Exception, match=r"install numpy<2\.4 or triton>=3\.7"):
        module(q, q, q)
    monkeypatch.setattr(availability, "_kernels_interpreted", False)   # compiled kernels: numpy plays no part
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    assert fused._triton_reason() is None


@pytest.mark.parametrize("pad_between_seqs", [None, False])
def test_thd_with_padded_offsets_zeroes_the_gaps_whatever_the_hint(monkeypatch, pad_between_seqs, cpu_fused) -> None:
    """Offsets of their own (``cu_seqlens_q_padded``) put the sequences at rows the kernel writes; every other
    row comes back zero, even when ``pad_between_seqs=False`` claims no gaps and nothing reads the values to
    refuse it (``ATTN_CHECK_SEQLENS=0``, as on a GPU). The output starts as NaN, so rows nobody wrote show."""
    from attention import DotProductAttention
    from tests.reference import reference_attention

    monkeypatch.setenv("ATTN_CHECK_SEQLENS", "0")
    new_empty = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda x, *size, **k: new_empty(x, *size, **k).fill_(
        float("nan") if x.is_floating_point() else 0))
    torch.manual_seed(0)
    q, k, v = torch.randn(8, 4, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16)
    lengths = dict(cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32),
                   cu_seqlens_kv=torch.tensor([0, 3, 5], dtype=torch.int32))
    offsets = dict(cu_seqlens_q_padded=torch.tensor([0, 4, 8], dtype=torch.int32),
                   cu_seqlens_kv_padded=torch.tensor([0, 4, 8], dtype=torch.int32))
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="thd", attn_mask_type="padding_causal",
                                 backend="fused")
    out = module(q, k, v, **lengths, **offsets, pad_between_seqs=pad_between_seqs)
    expected = reference_attention(q, k, v, qkv_format="thd", attn_mask_type="padding_causal", **lengths, **offsets)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("empty", ["queries", "keys"])
def test_empty_strided_inputs_run(empty, cpu_fused) -> None:
    """An empty q (or k / v) whose last dim is strided: contiguous() returns an empty view as it is, so the
    backend planned with the strided view and its argument check refused it (a fuzzing helper found it)."""
    from attention import DotProductAttention

    s_q, s_kv = (0, 5) if empty == "queries" else (3, 0)
    q = torch.randn(1, s_q, 2, 32)[..., ::2]
    k, v = (torch.randn(1, s_kv, 2, 32)[..., ::2] for _ in range(2))
    module = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask", attention_type="cross",
                                 backend="fused")
    out = module(q, k, v)
    assert out.shape == (1, s_q, 32) and not out.isnan().any()
    if s_q:
        assert (out == 0).all()   # rows that see no key


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_strided_inputs_run_on_copies(fmt, cpu_fused) -> None:
    """A last dim with stride 2 (a view of every other element) and cu_seqlens at stride 2: the kernels read
    neither, so the backend runs them on contiguous copies. Alternating with contiguous inputs of the same
    shapes checks that no launch planned for one layout is replayed on the other."""
    from attention import DotProductAttention
    from tests.reference import reference_attention

    torch.manual_seed(0)
    lead = (2, 5) if fmt == "bshd" else (9,)
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format=fmt, attn_mask_type="padding_causal",
                                 backend="fused")
    cu = torch.tensor([0, 0, 4, 0, 9, 0], dtype=torch.int32)[::2] if fmt == "thd" else None
    kwargs = {} if cu is None else {"cu_seqlens_q": cu, "cu_seqlens_kv": cu}
    for strided in (True, False, True):
        q, k, v = (torch.randn(*lead, heads, 32)[..., ::2] if strided else torch.randn(*lead, heads, 16)
                   for heads in (4, 2, 2))
        expected = reference_attention(q, k, v, qkv_format=fmt, attn_mask_type="padding_causal", **kwargs)
        torch.testing.assert_close(module(q, k, v, **kwargs), expected, atol=1e-4, rtol=1e-4)
