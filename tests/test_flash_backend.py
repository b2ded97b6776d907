"""flash2/flash3/flash4 adapters without flash-attn: gates with a monkeypatched probe, and the
format/cache plumbing against fake packages that compute flash semantics with the fp32 reference.

The cases (``tests/flash_cases.py``) are the ones ``tests/gpu/test_flash_gpu.py`` runs through the
real packages.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from attention.backends import flash_probe
from attention.backends.flash import Flash2Backend, Flash3Backend, Flash4Backend
from attention.params import AttentionParams
from tests.flash_cases import FlashCase, build_call, cases_for
from tests.reference import reference_one_sequence

BACKENDS = {2: Flash2Backend(), 3: Flash3Backend(), 4: Flash4Backend()}


# ------------------------------------------------------------------------------------------------
# Fake packages: flash semantics (bottom-right alignment, varlen, block/page tables), via the
# fp32 reference; rows the real kernels would not write are NaN so the adapter must zero them.
# ------------------------------------------------------------------------------------------------

def _attend(q, k, v, scale, causal, window, slopes, sink=None):
    return reference_one_sequence(q.float(), k.float(), v.float(), softmax_scale=scale, causal=causal,
                                  window_size=tuple(window), bottom_right=True, alibi_slopes=slopes,
                                  softmax_offset=sink).to(q.dtype)


def _slopes(alibi, i):
    return None if alibi is None else (alibi if alibi.dim() == 1 else alibi[i])


def _paged_rows(cache, table_row, length):
    return cache[table_row.long()].flatten(0, 1)[:length]


class FakeFlash2:
    """flash-attn 2.8.3.post2's Python signatures and the argument checks of its ``flash_api.cpp``
    (``mha_fwd`` / ``mha_varlen_fwd``): int32 contiguous ``cu_seqlens`` of exactly ``batch + 1``,
    ``block_table`` int32 ``[batch, n]`` with a contiguous last dim and pages of a multiple of 256,
    ALiBi fp32 ``[h]`` or exactly ``[batch, h]``, ``d_qk == d_v <= 256``, the ``max_seqlen_q == 1``
    GQA swap (which reshapes q to ``[batch, ...]``). Returns ``out`` (a tuple only with
    ``return_attn_probs``)."""

    @staticmethod
    def _check_common(q, k, v, alibi_slopes, batch, window_size):
        for x in (q, k, v):
            assert x.stride(-1) == 1, "Input tensor must have contiguous last dimension"
        assert q.shape[-1] == k.shape[-1] == v.shape[-1], "flash-attn 2 needs one head dim (CHECK_SHAPE)"
        assert q.shape[-1] + (-q.shape[-1]) % 8 <= 256, "FlashAttention forward only supports head dimension at most 256"
        assert q.shape[-2] % k.shape[-2] == 0, "Number of heads in key/value must divide number of heads in query"
        assert isinstance(window_size, (tuple, list)) and len(window_size) == 2
        assert all(isinstance(x, int) for x in window_size), "window_size holds ints (-1 = unbounded)"
        if alibi_slopes is not None:
            assert alibi_slopes.dtype == torch.float32, "ALiBi slopes must have dtype fp32"
            assert alibi_slopes.stride(-1) == 1
            h = q.shape[-2]
            assert tuple(alibi_slopes.shape) in ((h,), (batch, h)), "alibi_slopes must be [h] or [batch, h]"

    def flash_attn_func(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
        batch = q.shape[0]
        self._check_common(q, k, v, alibi_slopes, batch, window_size)
        assert k.shape[0] == v.shape[0] == batch and k.shape[1] == v.shape[1]
        out = torch.stack([_attend(q[i], k[i], v[i], softmax_scale, causal, window_size, _slopes(alibi_slopes, i))
                           for i in range(batch)])
        return (out, None, None) if return_attn_probs else out

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        batch = cu_seqlens_q.numel() - 1
        self._check_common(q, k, v, alibi_slopes, batch, window_size)
        for cu in (cu_seqlens_q, cu_seqlens_k):
            assert cu.dtype == torch.int32, "cu_seqlens must have dtype int32"
            assert cu.is_contiguous()
            assert tuple(cu.shape) == (batch + 1,), "CHECK_SHAPE(cu_seqlens, batch_size + 1)"
        if block_table is not None:
            assert block_table.dtype == torch.int32, "block_table must have dtype torch.int32"
            assert block_table.stride(-1) == 1, "block_table must have contiguous last dimension"
            assert k.dim() == 4 and k.shape[1] % 256 == 0, "Paged KV cache block size must be divisible by 256"
            assert block_table.dim() == 2 and block_table.shape[0] == batch, "CHECK_SHAPE(block_table, batch, n)"
        else:
            assert k.dim() == 3
        left, right = window_size
        if max_seqlen_q == 1 and alibi_slopes is None:
            causal = False
        if causal:
            right = 0
        if (max_seqlen_q == 1 and q.shape[1] > k.shape[-2] and left < 0 and right < 0 and dropout_p == 0.0
                and alibi_slopes is None):
            # seqlenq_ngroups_swapped: q.reshape({batch_size, num_heads_k, ngroups, head_size}) needs total_q == batch
            assert q.shape[0] == batch, "seqlen_q/ngroups swap reshapes q to [batch, ...]: total_q must equal batch"
        out = torch.full(q.shape[:2] + (v.shape[-1],), float("nan"), dtype=q.dtype)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(batch):
            n = ck[i + 1] - ck[i]
            if block_table is not None:
                kk, vv = _paged_rows(k, block_table[i], n), _paged_rows(v, block_table[i], n)
            else:
                kk, vv = k[ck[i] : ck[i + 1]], v[ck[i] : ck[i + 1]]
            if cq[i + 1] > cq[i]:
                out[cq[i] : cq[i + 1]] = _attend(q[cq[i] : cq[i + 1]], kk, vv, softmax_scale, causal, window_size,
                                                 _slopes(alibi_slopes, i))
        return (out, None, None) if return_attn_probs else out


class FakeFlash3:
    def flash_attn_func(self, q, k, v, softmax_scale=None, causal=False, qv=None, window_size=(-1, -1),
                        deterministic=False):
        out = torch.stack([_attend(q[i], k[i], v[i], softmax_scale, causal, window_size, None)
                           for i in range(q.shape[0])])
        return out, None   # older hopper builds return (out, lse)

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                               seqused_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                               deterministic=False):
        out = torch.full(q.shape[:2] + (v.shape[-1],), float("nan"), dtype=q.dtype)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(len(cq) - 1):
            nq = int(seqused_q[i]) if seqused_q is not None else cq[i + 1] - cq[i]
            nk = int(seqused_k[i]) if seqused_k is not None else ck[i + 1] - ck[i]
            if nq:
                out[cq[i] : cq[i] + nq] = _attend(q[cq[i] : cq[i] + nq], k[ck[i] : ck[i] + nk],
                                                  v[ck[i] : ck[i] + nk], softmax_scale, causal, window_size, None)
        return out

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, qv=None, cache_seqlens=None,
                                page_table=None, cu_seqlens_q=None, max_seqlen_q=None, softmax_scale=None,
                                causal=False, window_size=(-1, -1), num_splits=0, return_softmax_lse=False):
        batch = cu_seqlens_q.numel() - 1
        assert (page_table.shape[0] if page_table is not None else k_cache.shape[0]) == batch
        out = torch.full(q.shape[:2] + (v_cache.shape[-1],), float("nan"), dtype=q.dtype)
        cq = cu_seqlens_q.tolist()
        for i in range(batch):
            n = int(cache_seqlens[i])
            if page_table is not None:
                kk, vv = _paged_rows(k_cache, page_table[i], n), _paged_rows(v_cache, page_table[i], n)
            else:
                kk, vv = k_cache[i, :n], v_cache[i, :n]
            if cq[i + 1] > cq[i]:
                out[cq[i] : cq[i + 1]] = _attend(q[cq[i] : cq[i + 1]], kk, vv, softmax_scale, causal, window_size, None)
        return out


_V4_PAGED_IRREGULAR = "Paged KV does not support irregular head dim"


def _fake_tile_size_fwd_sm90(head_dim, head_dim_v, is_causal, is_local, sparse_block_size_q=None):
    """flash-attn-4 4.0.0b36's sm90 forward tile (m, n): what decides TMA (page == n) vs cp.async pages."""
    if head_dim <= 64:
        n = 128
    elif head_dim <= 96:
        n = 128 if (is_causal or is_local) else 144
    elif head_dim <= 128:
        n = 128
    elif head_dim <= 192:
        n = 96 if is_local else (128 if head_dim_v <= 128 else 112)
    else:
        n = 64 if is_local else 80
    return SimpleNamespace(m_block_size=128, n_block_size=n)


def _fake_validate_head_dims(head_dim, head_dim_v, compute_capability, alignment):
    """4.0.0b36's ``_validate_head_dims`` (compute_capability is the major)."""
    aligned = head_dim % alignment == 0 and head_dim_v % alignment == 0
    if compute_capability == 9:
        assert 8 <= head_dim <= 256 and 8 <= head_dim_v <= 256 and aligned, (
            f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM90.")
    elif compute_capability in (10, 11):
        ok = ((8 <= head_dim <= 128 and 8 <= head_dim_v <= 128) or (head_dim, head_dim_v) in ((192, 128), (256, 256))
              or ((head_dim == 64 or head_dim == head_dim_v) and head_dim_v == 512))
        assert ok and aligned, f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM100/SM110."


class FakeFlash4:
    """flash-attn-4 4.0.0b36 (``flash_attn.cute.interface``) as the sm90 build sees it: its public
    signatures, ``(out, lse)`` returns and the checks of ``_flash_attn_fwd``: ``page_table`` int32
    ``[batch, n]``, contiguous, never with ``cu_seqlens_k``; batched K ``[batch, s_k, h_kv, d]`` when
    neither is given; int32 contiguous ``cu_seqlens_*`` ``[batch + 1]`` / ``seqused_*`` ``[batch]``;
    ``learnable_sink`` ``[h]``; window bounds ``None`` (not -1) for unbounded; no split-KV on sm90;
    pages other than the KV tile only for head dims that are multiples of 16."""

    _validate_head_dims = staticmethod(_fake_validate_head_dims)
    _tile_size_fwd_sm90 = staticmethod(_fake_tile_size_fwd_sm90)

    class FlashAttentionForwardSm90:
        def __init__(self, head_dim, head_dim_v, paged_kv_non_tma=False):
            assert not paged_kv_non_tma or (head_dim % 16 == 0 and head_dim_v % 16 == 0), (
                "Paged KV does not support irregular head dim")

    class FlashAttentionBackwardSm90:
        def __init__(self, dtype, head_dim, head_dim_v, qhead_per_kvhead, causal, is_local=False,
                     deterministic=False):
            pass

    @staticmethod
    def _flash_attn_bwd(q, k, v, learnable_sink=None):
        assert learnable_sink is None, "SM100 backward with head_dim=256 does not support learnable_sink"

    @staticmethod
    def _window(causal, window_size):
        """``_resolve_causal_local_window``: -> the reference's (left, right) with -1 unbounded."""
        left, right = window_size
        for bound in (left, right):
            assert bound is None or isinstance(bound, int)
        if left is not None and right is not None and left < 0 and right < 0:
            left = right = None
        assert (left is None or left >= 0) and (right is None or right >= 0), (
            f"window_size {window_size}: flash-attn-4 spells an unbounded side None; -1 next to a real bound "
            "would be taken as a local window with a negative bound")
        if causal:
            right = 0
        return (-1 if left is None else left, -1 if right is None else right)

    def _check(self, q, k, v, batch, learnable_sink, num_splits, page_size=None, causal=False, window=(-1, -1)):
        num_head, head_dim = q.shape[-2:]
        assert num_head % v.shape[-2] == 0, "num_head must be divisible by num_head_kv"
        _fake_validate_head_dims(head_dim, v.shape[-1], 9, 8)
        assert num_splits == 1, "SplitKV not supported on SM 9.0"
        if learnable_sink is not None:
            assert tuple(learnable_sink.shape) == (num_head,)
            assert learnable_sink.dtype in (torch.float16, torch.bfloat16, torch.float32)
        if page_size is not None:
            local = window != (-1, -1) and not (window[0] < 0 and window[1] == 0)
            tile_n = _fake_tile_size_fwd_sm90(head_dim, v.shape[-1], causal and not local, local).n_block_size
            self.FlashAttentionForwardSm90(head_dim, v.shape[-1], paged_kv_non_tma=page_size != tile_n)

    def flash_attn_func(self, q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                        window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                        deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                        aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False,
                        gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
        window = self._window(causal, window_size)
        batch = q.shape[0]
        self._check(q, k, v, batch, learnable_sink, num_splits)
        assert k.shape[:3] == v.shape[:3] and k.shape[0] == batch
        out = torch.stack([_attend(q[i], k[i], v[i], softmax_scale, False, window, None, learnable_sink)
                           for i in range(batch)])
        return out, None

    def flash_attn_varlen_func(self, q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                               gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
                               pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                               block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                               scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
                               gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
        assert cu_seqlens_q is not None, "the adapter always passes a thd query"
        window = self._window(causal, window_size)
        batch = cu_seqlens_q.shape[0] - 1
        for t in (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
            if t is not None:
                assert t.dtype == torch.int32, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be int32"
                assert t.stride(0) == 1, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be contiguous"
        assert tuple(cu_seqlens_q.shape) == (batch + 1,), "cu_seqlens_q must have shape (batch_size + 1,)"
        assert seqused_q is None or tuple(seqused_q.shape) == (batch,), "seqused_q must have shape (batch_size,)"
        assert seqused_k is None or tuple(seqused_k.shape) == (batch,), "seqused_k must have shape (batch_size,)"
        page_size = None
        if page_table is not None:
            assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
            assert page_table.dtype == torch.int32, "page_table must be int32"
            assert page_table.stride(-1) == 1, "page_table must be contiguous in the last dimension"
            assert page_table.dim() == 2 and page_table.shape[0] == batch
            assert k.dim() == 4 and k.shape[:3] == v.shape[:3]
            page_size = v.shape[1]
        elif cu_seqlens_k is None:
            assert k.dim() == 4 and k.shape[0] == batch and k.shape[:3] == v.shape[:3], (
                "batched K must be [batch, seqlen_k, h_kv, d]")
        else:
            assert k.dim() == 3 and tuple(cu_seqlens_k.shape) == (batch + 1,)
        self._check(q, k, v, batch, learnable_sink, num_splits, page_size, causal, window)
        out = torch.full(q.shape[:2] + (v.shape[-1],), float("nan"), dtype=q.dtype)
        cq = cu_seqlens_q.tolist()
        for i in range(batch):
            nq = int(seqused_q[i]) if seqused_q is not None else cq[i + 1] - cq[i]
            if page_table is not None:
                n = int(seqused_k[i])
                kk, vv = _paged_rows(k, page_table[i], n), _paged_rows(v, page_table[i], n)
            elif cu_seqlens_k is not None:
                start = int(cu_seqlens_k[i])
                n = int(seqused_k[i]) if seqused_k is not None else int(cu_seqlens_k[i + 1]) - start
                kk, vv = k[start : start + n], v[start : start + n]
            else:
                n = int(seqused_k[i]) if seqused_k is not None else k.shape[1]
                kk, vv = k[i, :n], v[i, :n]
            if nq:
                out[cq[i] : cq[i] + nq] = _attend(q[cq[i] : cq[i] + nq], kk, vv, softmax_scale, False, window, None,
                                                  learnable_sink)
        return out, None


FAKES = {2: FakeFlash2, 3: FakeFlash3, 4: FakeFlash4}


@pytest.fixture
def install(monkeypatch):
    """``install(generation, version="9.9.9", module=None)``: make the probe report an installed package."""
    def _install(generation: int, version: str = "9.9.9", module=None):
        package = flash_probe.FlashPackage(generation, module=module if module is not None else FAKES[generation](),
                                           version=flash_probe.parse_version(version), version_text=version)
        original = flash_probe.probe
        monkeypatch.setattr(flash_probe, "probe", lambda g: package if g == generation else original(g))
        return BACKENDS[generation]
    return _install


def P(**overrides) -> AttentionParams:
    base = dict(dtype=torch.bfloat16, device_type="cuda", compute_capability=(9, 0), num_heads=8, num_gqa_groups=2,
                head_dim_qk=128, head_dim_v=128, attn_mask_type="padding_causal_bottom_right", window_size=(-1, 0))
    base.update(overrides)
    return AttentionParams(**base)


# ------------------------------------------------------------------------------------------------
# Availability and versions
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", [2, 3, 4])
def test_missing_package_gives_install_hint(generation, monkeypatch):
    monkeypatch.setattr(flash_probe, "cuda_available", lambda: True)
    monkeypatch.setattr(flash_probe, "_looks_installed", lambda g: False)
    monkeypatch.setattr(flash_probe.importlib.util, "find_spec", lambda name: None)
    flash_probe.probe.cache_clear()
    try:
        reasons = BACKENDS[generation].support_reasons(P())
    finally:
        flash_probe.probe.cache_clear()
    assert reasons[0] == flash_probe.INSTALL_HINTS[generation]
    assert BACKENDS[generation].version() is None


@pytest.mark.parametrize("generation", [2, 3, 4])
def test_no_cuda_says_needs_cuda(generation, monkeypatch):
    monkeypatch.setattr(flash_probe, "cuda_available", lambda: False)
    flash_probe.probe.cache_clear()
    try:
        reason = BACKENDS[generation].availability_reason()
    finally:
        flash_probe.probe.cache_clear()
    assert reason.startswith("needs CUDA")


def test_broken_install_reports_the_import_error(monkeypatch):
    def broken(name):
        raise OSError("undefined symbol: _ZN3c10")
    monkeypatch.setattr(flash_probe.importlib, "import_module", broken)
    module, reason = flash_probe._import_interface(2)
    assert module is None and "fails to import" in reason and "undefined symbol" in reason


def test_importing_the_adapter_imports_no_flash_package():
    assert not any(name == "flash_attn" or name.startswith(("flash_attn.", "flash_attn_interface"))
                   for name in sys.modules)


@pytest.mark.parametrize("text, parsed", [("2.8.3", (2, 8, 3)), ("2.8.3.post1", (2, 8, 3)), ("4.0.0b36", (4, 0, 0)),
                                          ("v3.0.0", (3, 0, 0)), ("unknown", None), (None, None)])
def test_parse_version(text, parsed):
    assert flash_probe.parse_version(text) == parsed


@pytest.mark.parametrize("generation", [2, 3, 4])
def test_installed_reports_version_and_no_upper_cap(generation, install):
    backend = install(generation, "99.1.0")
    assert backend.version() == "99.1.0"
    assert backend.support_reasons(P()) == []


@pytest.mark.parametrize("version, params, fragment", [
    ("2.0.9", P(), "older than the minimum 2.1.1"),
    ("2.2.0", P(attn_mask_type="padding", window_size=(4, 4)), "sliding window needs flash-attn >= 2.3"),
    ("2.3.5", P(core_attention_bias_type="alibi"), "ALiBi needs flash-attn >= 2.4"),
    ("2.4.0", P(deterministic=True, requires_grad=True), "deterministic backward needs flash-attn >= 2.4.1"),
    ("2.4.2", P(kv_cache="paged", page_size=256), "KV cache (block_table) needs flash-attn >= 2.5"),
    ("2.6.3", P(compute_capability=(10, 0)), "needs >= 2.7.3 on sm100"),
])
def test_v2_version_lower_bounds(version, params, fragment, install):
    reasons = install(2, version).support_reasons(params)
    assert any(fragment in r for r in reasons), reasons
    assert install(2, "2.8.3").support_reasons(params) == []


def test_v2_unknown_version_falls_back_to_feature_probes(install):
    old = SimpleNamespace(flash_attn_func=lambda q, k, v, dropout_p=0.0, softmax_scale=None, causal=False: None,
                          flash_attn_varlen_func=lambda q, k, v: None)
    backend = install(2, "unknown", module=old)
    reasons = backend.support_reasons(P(attn_mask_type="padding", window_size=(4, 4), kv_cache="paged", page_size=256))
    assert any("no 'window_size' argument" in r for r in reasons)
    assert any("no 'block_table' argument" in r for r in reasons)


# ------------------------------------------------------------------------------------------------
# Gates from the capability sheets and extra_reasons
# ------------------------------------------------------------------------------------------------

def _check(backend, params, fragment):
    reasons = backend.support_reasons(params)
    if fragment is None:
        assert reasons == [], reasons
    else:
        assert any(fragment in r for r in reasons), reasons


@pytest.mark.parametrize("generation, params, fragment", [
    # architectures
    (2, P(compute_capability=(7, 5)), "sm80 or newer"),
    (2, P(compute_capability=(8, 6)), None),
    (3, P(compute_capability=(8, 0)), "runs only on sm90"),
    (3, P(compute_capability=(10, 0)), "runs only on sm90"),
    (4, P(compute_capability=(8, 0)), "runs only on"),
    (4, P(compute_capability=(12, 0)), "runs only on"),
    (4, P(compute_capability=(10, 0)), None),
    (2, P(device_type="cpu", compute_capability=None), "needs a cuda device"),
    # dtypes
    (2, P(dtype=torch.float32), "dtype float32 not supported"),
    (3, P(dtype=torch.float32), "dtype float32 not supported"),
    (4, P(dtype=torch.float16), None),
    # head dims
    (2, P(head_dim_qk=264, head_dim_v=264), "exceeds the maximum 256"),
    (2, P(head_dim_qk=100, head_dim_v=100), "not a multiple of 8"),
    (2, P(head_dim_qk=192, head_dim_v=128), None),
    (2, P(head_dim_qk=256, head_dim_v=256, compute_capability=(8, 6)), "> 192 needs sm80/sm90/sm100/sm120"),
    (3, P(head_dim_qk=192, head_dim_v=128), None),
    (3, P(head_dim_qk=64, head_dim_v=512), None),
    (3, P(head_dim_qk=128, head_dim_v=96), "not a flash-attn 3 MLA pair"),
    (3, P(head_dim_qk=264, head_dim_v=264), "maximum 256"),
    (3, P(head_dim_qk=36, head_dim_v=36), "not a multiple of 8"),
    (4, P(head_dim_qk=256, head_dim_v=256), None),
    (4, P(head_dim_qk=192, head_dim_v=192, compute_capability=(10, 0)), "is not supported on SM100"),
    (4, P(head_dim_qk=192, head_dim_v=128, compute_capability=(10, 0)), None),
    (4, P(head_dim_qk=264, head_dim_v=264), "is not supported on SM90"),
    (4, P(head_dim_qk=192, head_dim_v=128), None),
    # masks and alignment
    (2, P(attn_mask_type="arbitrary", window_size=(-1, -1)), "'arbitrary' not supported"),
    (4, P(attn_mask_type="arbitrary", window_size=(-1, -1)), "'arbitrary' not supported"),
    (2, P(attn_mask_type="causal", max_seqlen_q=64), "top-left 'causal'"),
    (3, P(attn_mask_type="padding_causal", max_seqlen_q=64), "top-left 'padding_causal'"),
    (4, P(attn_mask_type="causal", max_seqlen_q=64), "top-left 'causal'"),
    (3, P(attn_mask_type="causal"), None),
    (3, P(attn_mask_type="causal_bottom_right", max_seqlen_q=64), None),
    (2, P(attn_mask_type="padding", window_size=(8, 8), max_seqlen_q=64, bottom_right_diagonal=False),
     "needs bottom-right alignment"),
    (2, P(attn_mask_type="padding", window_size=(8, 8), max_seqlen_q=64), None),
    # 4.0.0b36 has no sliding-window limit at head dim 256 on sm100 (hd256 runs local windows)
    (4, P(attn_mask_type="padding", window_size=(8, 8), head_dim_qk=256, head_dim_v=256, compute_capability=(10, 0)),
     None),
    (2, P(num_heads=6, num_gqa_groups=4), "multiple of num_gqa_groups"),
    # bias, softmax, dropout
    (2, P(core_attention_bias_type="alibi"), None),
    (2, P(core_attention_bias_type="alibi", attn_mask_type="padding", window_size=(-1, -1), max_seqlen_q=64,
          bottom_right_diagonal=False), "ALiBi with max_seqlen_q != max_seqlen_kv needs bottom-right"),
    (3, P(core_attention_bias_type="alibi"), "'alibi' not supported"),
    (4, P(core_attention_bias_type="alibi"), "'alibi' not supported"),
    (2, P(core_attention_bias_type="post_scale_bias"), "'post_scale_bias' not supported"),
    (2, P(softmax_type="off-by-one"), "'off-by-one' not supported"),
    (3, P(softmax_type="learnable"), "'learnable' not supported"),
    (4, P(softmax_type="learnable"), None),
    (4, P(softmax_type="off-by-one", requires_grad=True), None),
    (4, P(softmax_type="learnable", requires_grad=True, head_dim_qk=256, head_dim_v=256, compute_capability=(10, 0)),
     "head dim 256 has no learnable sink"),
    (2, P(attention_dropout=0.1), None),
    (3, P(attention_dropout=0.1), "dropout not supported"),
    (4, P(attention_dropout=0.1), "dropout not supported"),
    # thd padding between sequences
    (2, P(qkv_format="thd", kv_format="thd", pad_between_seqs=True), "padding between thd sequences"),
    (3, P(qkv_format="thd", kv_format="thd", pad_between_seqs=True), None),
    (4, P(qkv_format="thd", kv_format="thd", pad_between_seqs=True), None),
    # determinism and backward
    (3, P(deterministic=True, requires_grad=True, head_dim_qk=256, head_dim_v=256), "deterministic backward"),
    (4, P(deterministic=True, requires_grad=True), None),   # 4.0.0b36's sm90 backward takes deterministic
    (2, P(requires_grad=True), None),
])
def test_gates(generation, params, fragment, install):
    _check(install(generation), params, fragment)


@pytest.mark.parametrize("generation, params, fragment", [
    (2, P(kv_cache="paged", page_size=256, max_seqlen_kv=4096), None),
    (2, P(kv_cache="paged", page_size=512, max_seqlen_kv=4096), None),
    (2, P(kv_cache="paged", page_size=16, max_seqlen_kv=4096), "page_size=16 is not a multiple of 256"),
    (2, P(kv_cache="non_paged", max_seqlen_kv=512), None),
    (2, P(kv_cache="non_paged", max_seqlen_kv=300), "must be a multiple of 256"),
    (3, P(kv_cache="paged", page_size=1, max_seqlen_kv=300), None),
    (3, P(kv_cache="non_paged", max_seqlen_kv=300), None),
    (4, P(kv_cache="paged", page_size=16, max_seqlen_kv=300), None),
    (4, P(kv_cache="non_paged", max_seqlen_kv=300), None),
    (3, P(kv_cache="paged", page_size=16, requires_grad=True), "no backward pass"),
    (4, P(kv_cache="paged", page_size=16, qkv_format="thd", pad_between_seqs=True), "not supported with a KV cache"),
])
def test_kv_cache_gates(generation, params, fragment, install):
    _check(install(generation), params, fragment)


def test_v3_kv_cache_needs_varlen_query_build(install):
    old_build = SimpleNamespace(flash_attn_with_kvcache=lambda q, k_cache, v_cache, cache_seqlens=None: None)
    _check(install(3, module=old_build), P(kv_cache="paged", page_size=16), "takes no cu_seqlens_q")


def _fwd_without_paged_sm90(q, k, v, page_table=None):
    assert page_table is None, "paged KV not supported on SM 9.0"


def test_v4_paged_on_sm90_probes_the_installed_source(install):
    old = SimpleNamespace(_flash_attn_fwd=_fwd_without_paged_sm90)
    backend = install(4, "4.0.0b1", module=old)
    _check(backend, P(kv_cache="paged", page_size=16), "no paged KV cache on sm90")
    _check(backend, P(kv_cache="paged", page_size=16, compute_capability=(10, 0)), None)
    _check(backend, P(kv_cache="non_paged"), None)


def test_v4_defers_to_the_package_head_dim_validator(install):
    def validator(head_dim, head_dim_v, compute_capability, alignment):
        assert head_dim <= 96, f"({head_dim}, {head_dim_v}) is not supported on SM{compute_capability}0"
    backend = install(4, module=SimpleNamespace(_validate_head_dims=validator))
    _check(backend, P(head_dim_qk=64, head_dim_v=64), None)
    _check(backend, P(head_dim_qk=128, head_dim_v=128), "is not supported on SM90")


def test_v4_head_dim_rules_without_a_validator(install):
    backend = install(4, module=SimpleNamespace())
    _check(backend, P(head_dim_qk=256, head_dim_v=256), None)
    _check(backend, P(head_dim_qk=264, head_dim_v=264), "flash-attn-4 does not take")
    _check(backend, P(head_dim_qk=192, head_dim_v=192, compute_capability=(10, 0)), "flash-attn-4 does not take")


def test_v4_feature_probes_on_an_older_release(install):
    """A release whose sm90 backward takes no ``deterministic`` and whose functions take no ``learnable_sink``."""
    class FlashAttentionBackwardSm90:
        def __init__(self, dtype, head_dim, head_dim_v, qhead_per_kvhead, causal):
            pass

    old = SimpleNamespace(FlashAttentionBackwardSm90=FlashAttentionBackwardSm90,
                          flash_attn_varlen_func=lambda q, k, v, cu_seqlens_q=None, page_table=None: None)
    backend = install(4, "4.0.0b1", module=old)
    _check(backend, P(deterministic=True, requires_grad=True), "no deterministic backward on sm90")
    _check(backend, P(deterministic=True, requires_grad=True, compute_capability=(10, 0)), None)
    _check(backend, P(softmax_type="learnable"), "takes no learnable_sink")
    _check(backend, P(softmax_type="off-by-one"), "takes no learnable_sink")


@pytest.mark.parametrize("params, fragment", [
    (P(kv_cache="paged", page_size=16, head_dim_qk=40, head_dim_v=40), "only for head dims that are multiples of 16"),
    (P(kv_cache="paged", page_size=128, head_dim_qk=40, head_dim_v=40), None),   # = the sm90 KV tile: TMA
    (P(kv_cache="paged", page_size=16, head_dim_qk=48, head_dim_v=48), None),
    (P(kv_cache="paged", page_size=16, head_dim_qk=200, head_dim_v=200), "multiples of 16"),
    (P(kv_cache="paged", page_size=80, head_dim_qk=200, head_dim_v=200, attn_mask_type="padding",
       window_size=(-1, -1)), None),                                                # = the d=200 tile (80)
    (P(kv_cache="paged", page_size=64, head_dim_qk=200, head_dim_v=200, attn_mask_type="padding",
       window_size=(8, 8)), None),                                                  # local: tile 64
    (P(kv_cache="non_paged", head_dim_qk=40, head_dim_v=40), None),
])
def test_v4_paged_pages_off_the_tile_need_head_dims_of_16(params, fragment, install):
    _check(install(4), params, fragment)


@pytest.mark.parametrize("generation", [2, 3, 4])
def test_capability_sheet(generation):
    caps = BACKENDS[generation].capabilities
    assert caps.dtypes == {torch.float16, torch.bfloat16}
    sinks = {"vanilla", "off-by-one", "learnable"} if generation == 4 else {"vanilla"}
    assert caps.cuda_graphs and "arbitrary" not in caps.mask_types and caps.softmax_types == sinks
    assert caps.tolerances == {torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}


# ------------------------------------------------------------------------------------------------
# Plumbing: formats, padding, caches, MLA padding, through the fake packages
# ------------------------------------------------------------------------------------------------

PLUMBING = [(g, case) for g in (2, 3, 4) for case in cases_for(g)]


@pytest.mark.parametrize("generation, case", PLUMBING, ids=[f"flash{g}-{c.id()}" for g, c in PLUMBING])
def test_forward_plumbing_with_fake_package(generation, case, install):
    backend = install(generation)
    call, expected = build_call(case, param_dtype=torch.bfloat16)
    assert backend.support_reasons(call.params) == []
    out = backend.forward(call)
    assert out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected, atol=1e-5, rtol=1e-5)


def test_forward_without_package_raises_with_the_reason(monkeypatch):
    missing = flash_probe.FlashPackage(2, reason=flash_probe.INSTALL_HINTS[2])
    monkeypatch.setattr(flash_probe, "probe", lambda g: missing)
    call, _ = build_call(FlashCase())
    with pytest.raises(RuntimeError, match="pip install flash-attn"):
        BACKENDS[2].forward(call)


def test_paged_cache_with_short_page_table_is_a_value_error(install):
    backend = install(3)
    call, _ = build_call(FlashCase("bshd", kv_cache="paged", page_size=16, s_q=2, s_kv=32))
    call = replace(call, page_table=call.page_table[:1])
    with pytest.raises(ValueError, match="page_table"):
        backend.forward(call)


def test_v2_alibi_table_is_fitted_to_the_batch(install):
    """flash-attn 2 takes ALiBi slopes ``[h]`` or exactly ``[batch, h]``: a longer per-sequence table is cut."""
    backend = install(2)
    case = FlashCase("bshd", "causal", s_q=8, s_kv=8, alibi=True)
    call, expected = build_call(case, param_dtype=torch.bfloat16)
    table = torch.cat([call.alibi_slopes[None].expand(case.batch, -1), torch.full((2, case.heads), 7.0)])
    out = backend.forward(replace(call, alibi_slopes=table))
    torch.testing.assert_close(out.float(), expected, atol=1e-5, rtol=1e-5)
    varlen = replace(case, qkv_format="thd", attn_mask_type="padding_causal_bottom_right", s_q=4)
    call, expected = build_call(varlen, param_dtype=torch.bfloat16)
    table = call.alibi_slopes[None].expand(case.batch + 2, -1).contiguous()
    out = backend.forward(replace(call, alibi_slopes=table))
    torch.testing.assert_close(out.float(), expected, atol=1e-5, rtol=1e-5)


def test_v2_fake_enforces_the_decode_gqa_swap():
    """flash-attn 2 reshapes q to ``[batch, ...]`` when max_seqlen_q == 1 with GQA: thd filler rows break it."""
    fa = FakeFlash2()
    q, k = torch.randn(4, 4, 8), torch.randn(6, 2, 8)
    cu_q, cu_k = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 3, 6], dtype=torch.int32)
    with pytest.raises(AssertionError, match="total_q must equal batch"):
        fa.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 1, 3, causal=True)
    fa.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 2, 3, causal=True)


def test_v4_interface_overwritten_by_flash_attn_2_is_a_reason(tmp_path, monkeypatch):
    """flash-attn 2.8.x ships an old flash_attn/cute: installed after flash-attn-4 it replaces its interface.py."""
    import base64
    import hashlib

    installed = b"flash-attn-4 interface"
    on_disk = tmp_path / "interface.py"
    on_disk.write_bytes(b"flash-attn 2's old cute interface")
    digest = base64.urlsafe_b64encode(hashlib.sha256(installed).digest()).rstrip(b"=").decode()

    class RecordEntry:   # importlib.metadata.PackagePath: str() is the path, .hash, .locate()
        hash = SimpleNamespace(mode="sha256", value=digest)

        def __str__(self):
            return "flash_attn/cute/interface.py"

        def locate(self):
            return on_disk

    def distribution(name):
        if name != "flash-attn-4":
            raise flash_probe.importlib.metadata.PackageNotFoundError(name)
        return SimpleNamespace(files=[RecordEntry()])

    monkeypatch.setattr(flash_probe.importlib.metadata, "distribution", distribution)
    reason = flash_probe.overwritten_reason(4)
    assert reason and "overwritten" in reason and "--force-reinstall" in reason
    on_disk.write_bytes(installed)
    assert flash_probe.overwritten_reason(4) is None
    assert flash_probe.overwritten_reason(2) is None
