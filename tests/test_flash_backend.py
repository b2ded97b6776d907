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

def _attend(q, k, v, scale, causal, window, slopes):
    return reference_one_sequence(q.float(), k.float(), v.float(), softmax_scale=scale, causal=causal,
                                  window_size=tuple(window), bottom_right=True, alibi_slopes=slopes).to(q.dtype)


def _slopes(alibi, i):
    return None if alibi is None else (alibi if alibi.dim() == 1 else alibi[i])


def _paged_rows(cache, table_row, length):
    return cache[table_row.long()].flatten(0, 1)[:length]


class FakeFlash2:
    def flash_attn_func(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        alibi_slopes=None, deterministic=False, return_attn_probs=False):
        assert q.shape[-1] == k.shape[-1] == v.shape[-1], "flash-attn 2 needs one head dim"
        return torch.stack([_attend(q[i], k[i], v[i], softmax_scale, causal, window_size, _slopes(alibi_slopes, i))
                            for i in range(q.shape[0])])

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
                               deterministic=False, return_attn_probs=False, block_table=None):
        assert q.shape[-1] == k.shape[-1] == v.shape[-1], "flash-attn 2 needs one head dim"
        assert cu_seqlens_q.numel() == cu_seqlens_k.numel() and cu_seqlens_q.dtype == torch.int32
        batch = cu_seqlens_q.numel() - 1
        if (max_seqlen_q == 1 and q.shape[1] > k.shape[-2] and window_size == (-1, -1) and alibi_slopes is None
                and dropout_p == 0.0):
            # flash-attn 2 then swaps seqlen and head groups, assuming one query row per sequence.
            lengths = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
            assert q.shape[0] == batch and lengths == [1] * batch, "seqlen_q/ngroups swap needs total_q == batch"
        out = torch.full(q.shape[:2] + (v.shape[-1],), float("nan"), dtype=q.dtype)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(len(cq) - 1):
            n = ck[i + 1] - ck[i]
            if block_table is not None:
                assert k.shape[1] % 256 == 0, "paged KV needs block size % 256 == 0"
                kk, vv = _paged_rows(k, block_table[i], n), _paged_rows(v, block_table[i], n)
            else:
                kk, vv = k[ck[i] : ck[i + 1]], v[ck[i] : ck[i + 1]]
            if cq[i + 1] > cq[i]:
                out[cq[i] : cq[i + 1]] = _attend(q[cq[i] : cq[i + 1]], kk, vv, softmax_scale, causal, window_size,
                                                 _slopes(alibi_slopes, i))
        return out


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


class FakeFlash4:
    @staticmethod
    def _window(causal, window_size):
        left, right = window_size
        if causal:
            right = 0
        if left is not None and right is not None and left + right < 0:
            left = right = None
        return (-1 if left is None else left, -1 if right is None else right)

    def flash_attn_func(self, q, k, v, softmax_scale=None, causal=False, window_size=(None, None),
                        deterministic=False):
        window = self._window(causal, window_size)
        out = torch.stack([_attend(q[i], k[i], v[i], softmax_scale, False, window, None) for i in range(q.shape[0])])
        return out, None

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, seqused_q=None, seqused_k=None, page_table=None,
                               softmax_scale=None, causal=False, window_size=(None, None), deterministic=False):
        assert cu_seqlens_q is not None, "the adapter always passes a thd query"
        assert page_table is None or cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
        window = self._window(causal, window_size)
        batch = cu_seqlens_q.numel() - 1
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
                assert k.shape[0] == batch, "batched K must have one row per sequence"
                n = int(seqused_k[i]) if seqused_k is not None else k.shape[1]
                kk, vv = k[i, :n], v[i, :n]
            if nq:
                out[cq[i] : cq[i] + nq] = _attend(q[cq[i] : cq[i] + nq], kk, vv, softmax_scale, False, window, None)
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
    (4, P(head_dim_qk=192, head_dim_v=192, compute_capability=(10, 0)), "flash-attn-4 does not take"),
    (4, P(head_dim_qk=192, head_dim_v=128, compute_capability=(10, 0)), None),
    (4, P(head_dim_qk=264, head_dim_v=264), "flash-attn-4 does not take"),
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
    (4, P(attn_mask_type="padding", window_size=(8, 8), head_dim_qk=256, head_dim_v=256, compute_capability=(10, 0)),
     "no sliding window with head dim 256"),
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
    (4, P(softmax_type="learnable"), "'learnable' not supported"),
    (2, P(attention_dropout=0.1), None),
    (3, P(attention_dropout=0.1), "dropout not supported"),
    (4, P(attention_dropout=0.1), "dropout not supported"),
    # thd padding between sequences
    (2, P(qkv_format="thd", kv_format="thd", pad_between_seqs=True), "padding between thd sequences"),
    (3, P(qkv_format="thd", kv_format="thd", pad_between_seqs=True), None),
    (4, P(qkv_format="thd", kv_format="thd", pad_between_seqs=True), None),
    # determinism and backward
    (3, P(deterministic=True, requires_grad=True, head_dim_qk=256, head_dim_v=256), "deterministic backward"),
    (4, P(deterministic=True, requires_grad=True), "deterministic backward needs sm100"),
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


@pytest.mark.parametrize("generation", [2, 3, 4])
def test_capability_sheet(generation):
    caps = BACKENDS[generation].capabilities
    assert caps.dtypes == {torch.float16, torch.bfloat16}
    assert caps.cuda_graphs and "arbitrary" not in caps.mask_types and caps.softmax_types == {"vanilla"}
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
