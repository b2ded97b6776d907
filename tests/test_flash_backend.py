"""flash2/flash3/flash4 adapters without flash-attn: gates with a monkeypatched probe, and the
format/cache plumbing against fake packages that compute flash semantics with the fp32 reference.

The cases (``tests/flash_cases.py``) are the ones ``tests/gpu/test_flash_gpu.py`` runs through the
real packages.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from attention import DotProductAttention
from attention.backends import flash_probe
from attention.backends.flash import Flash2Backend, Flash3Backend, Flash4Backend
from attention.params import AttentionParams
from tests.fake_device import FakeCurrentDevice
from tests.flash_cases import GRADIENT_CASES, FlashCase, build_call, cases_for, check_gradients
from tests.flash_fakes import FAKES, FakeFlash2, FakeFlash4, install_fake, run_fake_on_cpu
from tests.reference import reference_attention

BACKENDS = {2: Flash2Backend(), 3: Flash3Backend(), 4: Flash4Backend()}


@pytest.fixture
def install(monkeypatch):
    """``install(generation, version="9.9.9", module=None)``: make the probe report an installed package."""
    def _install(generation: int, version: str = "9.9.9", module=None):
        install_fake(monkeypatch, generation, version, module)
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


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("machine_has_cuda", [False, True])
def test_cpu_inputs_without_cuda_are_refused_once(generation, machine_has_cuda, monkeypatch):
    # without CUDA the availability reason says it; the inputs' device is a second reason only where CUDA exists
    monkeypatch.setattr(flash_probe, "cuda_available", lambda: machine_has_cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: machine_has_cuda)
    monkeypatch.setattr(flash_probe, "_looks_installed", lambda g: False)
    monkeypatch.setattr(flash_probe.importlib.util, "find_spec", lambda name: None)
    flash_probe.probe.cache_clear()
    try:
        reasons = BACKENDS[generation].support_reasons(P(device_type="cpu", compute_capability=None))
    finally:
        flash_probe.probe.cache_clear()
    device_reasons = [r for r in reasons if "cuda" in r.lower()]
    if machine_has_cuda:
        assert reasons[:2] == [flash_probe.INSTALL_HINTS[generation], "needs a cuda device, got cpu"]
    else:
        assert len(device_reasons) == 1 and device_reasons[0].startswith("needs CUDA"), reasons
        assert flash_probe.INSTALL_HINTS[generation] in device_reasons[0]


def test_broken_install_reports_the_import_error(monkeypatch):
    def broken(name):
        raise OSError("undefined symbol: _ZN3c10")
    monkeypatch.setattr(flash_probe.importlib, "import_module", broken)
    module, reason = flash_probe._import_interface(2)
    assert module is None and "fails to import" in reason and "undefined symbol" in reason


def test_importing_the_adapter_imports_no_flash_package():
    """In a fresh interpreter: in this one a GPU test may have loaded flash-attn already."""
    check = ("import sys, attention, attention.backends.flash; "
             "print([name for name in sys.modules if name == 'flash_attn' "
             "or name.startswith(('flash_attn.', 'flash_attn_interface'))])")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


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
    ("2.4.2", P(kv_cache="paged", page_size=256), "KV cache (block_table) needs flash-attn >= 2.5.7"),
    # 2.5.0-2.5.6: block tables in flash_attn_with_kvcache only, not in the flash_attn_varlen_func this adapter calls
    ("2.5.6", P(kv_cache="paged", page_size=256), "KV cache (block_table) needs flash-attn >= 2.5.7"),
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


def test_v2_built_forward_only_is_refused_for_training_only(install, monkeypatch):
    """A forward-only build's backward raises at the first backward pass, long after the forward ran: training
    calls pick another backend at selection, inference keeps flash-attn 2."""
    backend = install(2, "2.8.3")
    monkeypatch.setattr(flash_probe, "v2_without_backward", lambda: True)
    _check(backend, P(requires_grad=True), "this flash-attn 2 (2.8.3) was built without its backward pass")
    _check(backend, P(), None)
    monkeypatch.setattr(flash_probe, "v2_without_backward", lambda: False)
    _check(backend, P(requires_grad=True), None)


@pytest.mark.parametrize("contents, forward_only", [
    (flash_probe.V2_NO_BACKWARD_MESSAGE + flash_probe.V2_FORWARD_KERNEL, True),   # scripts/build_flash_attn2.sh's
    (flash_probe.V2_FORWARD_KERNEL, True),                      # the macro given to nvcc alone: no backward kernel
    (flash_probe.V2_FORWARD_KERNEL + b"\0_Z45" + flash_probe.V2_BACKWARD_KERNEL + b"_seqk_parallel_kernelI", False),
    (b"", False),                                                # names no kernel (stripped): counted as whole
], ids=["refusal", "no-backward-kernel", "whole", "stripped"])
def test_v2_without_backward_reads_the_extension_bytes(contents, forward_only, tmp_path):
    extension = tmp_path / "flash_attn_2_cuda.so"
    extension.write_bytes(b"\x7fELF" + b"\0" * 4096 + contents + b"\0")
    assert flash_probe.v2_without_backward(str(extension)) is forward_only


def test_binary_mentions_without_a_file_is_false(tmp_path):
    assert not flash_probe.binary_mentions(str(tmp_path / "absent.so"), flash_probe.V2_NO_BACKWARD_MESSAGE)
    assert not flash_probe.binary_mentions(None, flash_probe.V2_NO_BACKWARD_MESSAGE)


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
    (2, P(head_dim_qk=192, head_dim_v=128, kv_cache="paged", page_size=256), "zero-pad a copy of the whole cache"),
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
    (3, P(requires_grad=True, head_dim_qk=64, head_dim_v=512), "head_dim_v=512 > 256 (MLA) has no backward"),
    (3, P(head_dim_qk=64, head_dim_v=512), None),
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


class _Hd256Forward:
    """A release's dedicated sm100 forward kernel for head dims (256, 256) and its asserts."""

    def __init__(self, is_local=False, is_split_kv=False, paged_kv_non_tma=False):
        assert not is_local, "SM100 forward with head_dim=256 does not support local attention yet"
        assert not is_split_kv, "SM100 forward with head_dim=256 does not support SplitKV"
        assert not paged_kv_non_tma, "SM100 hd256 2CTA supports TMA paged KV only (page_size must equal tile_n=128)"


def _hd256_fwd(q, k, v, seqused_q=None, seqused_k=None, learnable_sink=None):
    assert learnable_sink is None, "SM100 forward with head_dim=256 does not support learnable_sink"
    assert seqused_q is None and seqused_k is None, (
        "SM100 forward with head_dim=256 does not support seqused_q/seqused_k")


class _Hd256Backward:
    def __init__(self, is_local=False):
        assert not is_local, "SM100 backward with head_dim=256 does not support local attention"


def _hd256(**kwargs):
    return P(head_dim_qk=256, head_dim_v=256, compute_capability=(10, 0), **kwargs)


_HD256_RELEASE = SimpleNamespace(
    _flash_attn_fwd=_hd256_fwd, BlackwellFusedMultiHeadAttentionForward=_Hd256Forward,
    BlackwellFusedMultiHeadAttentionBackward=_Hd256Backward, _flash_attn_bwd=lambda q, k, v, learnable_sink=None: None,
    flash_attn_varlen_func=lambda q, k, v, learnable_sink=None, num_splits=1: None)


@pytest.mark.parametrize("params, fragment", [
    (_hd256(), None),
    (_hd256(kv_cache="paged", page_size=128, max_seqlen_kv=4096), "seqused_k), which a KV-cache step passes"),
    (_hd256(kv_cache="non_paged", max_seqlen_kv=4096), "seqused_k), which a KV-cache step passes"),
    (_hd256(kv_cache="paged", page_size=16, max_seqlen_kv=4096), "pages of 16 tokens (only 128"),
    (_hd256(qkv_format="thd", kv_format="thd", pad_between_seqs=True), "which thd with pad_between_seqs passes"),
    (_hd256(softmax_type="learnable"), "do not support a sink softmax"),
    (_hd256(attn_mask_type="padding", window_size=(8, 8)), "do not support a sliding window"),
    (_hd256(num_splits=4), "num_splits != 1 (split-KV)"),
    # other head dims, and sm90, run the generic kernels
    (P(compute_capability=(10, 0), kv_cache="paged", page_size=16, max_seqlen_kv=4096, num_splits=4), None),
    (P(head_dim_qk=256, head_dim_v=256, kv_cache="paged", page_size=16, max_seqlen_kv=4096), None),
])
def test_v4_head_dim_256_on_sm100_refuses_what_its_dedicated_kernel_asserts(params, fragment, install):
    """A release whose (256, 256) kernels on sm100 refuse per-sequence lengths, sinks, windows, split-KV and pages
    other than 128 tokens: the adapter passes seqused_k in every KV-cache step, so those calls crashed in the
    library where they should fall back."""
    _check(install(4, module=_HD256_RELEASE), params, fragment)


def test_v4_head_dim_256_backward_on_sm100_refuses_a_window(install):
    """4.0.0b36 runs (256, 256) windows forward on sm100, but its dedicated backward asserts on them."""
    release = SimpleNamespace(BlackwellFusedMultiHeadAttentionBackward=_Hd256Backward)
    windowed = P(attn_mask_type="padding", window_size=(8, 8), head_dim_qk=256, head_dim_v=256,
                 compute_capability=(10, 0))
    backend = install(4, module=release)
    _check(backend, windowed, None)
    _check(backend, replace(windowed, requires_grad=True), "do not support a sliding window in the backward pass")


def test_v4_sm90_backward_limits_of_older_releases(install):
    """Releases whose sm90 backward asserts on windows and varlen inputs: training calls that need them fall back
    (inference keeps flash-attn-4)."""
    def _flash_attn_bwd(q, k, v, window_size_left=None, window_size_right=None, cu_seqlens_q=None):
        assert window_size_left is None and window_size_right is None, "local not supported yet on 9.x"
        assert cu_seqlens_q is None, "varlen backward is not yet supported on sm90"

    backend = install(4, "4.0.0b5", module=SimpleNamespace(_flash_attn_bwd=_flash_attn_bwd))
    windowed = P(attn_mask_type="causal_bottom_right", window_size=(8, 0), requires_grad=True)
    _check(backend, windowed, "sm90 backward has no sliding window")
    _check(backend, replace(windowed, requires_grad=False), None)
    _check(backend, replace(windowed, compute_capability=(10, 0)), None)
    _check(backend, P(qkv_format="thd", kv_format="thd", requires_grad=True), "sm90 backward has no varlen")
    _check(backend, P(attn_mask_type="padding", window_size=(-1, -1), requires_grad=True), "has no varlen")
    _check(backend, P(attn_mask_type="causal_bottom_right", requires_grad=True), None)   # bshd, no padding: dense


@pytest.mark.parametrize("generation", [3, 4])
def test_num_splits_above_256_is_refused(generation, install):
    """flash-attn 3 and 4 combine at most 256 splits (a TORCH_CHECK / an assert at the call)."""
    cc = {"compute_capability": (10, 0)} if generation == 4 else {}
    _check(install(generation), P(num_splits=300, **cc), "num_splits=300 exceeds")
    assert not any("exceeds" in r for r in install(generation).support_reasons(P(num_splits=256, **cc)))


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


def test_v4_without_a_sink_gradient_is_refused_for_training_a_learnable_sink(install):
    """A release whose forward takes learnable_sink but whose backward returns no gradient for it: the sink would
    never train, so a learnable sink that needs one is refused (inference and off-by-one sinks still run)."""
    class Older(FAKES[4]):
        @staticmethod
        def _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=None, causal=False):
            return None

    backend = install(4, "4.0.0b20", module=Older())
    _check(backend, P(softmax_type="learnable", requires_grad=True), "backward has no learnable-sink gradient")
    _check(backend, P(softmax_type="learnable"), None)
    _check(backend, P(softmax_type="off-by-one", requires_grad=True), None)


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


@pytest.mark.parametrize("generation", [3, 4])
def test_v3_v4_read_padded_offsets_under_a_false_hint(generation, monkeypatch):
    """thd with gapped cu_seqlens_*_padded and pad_between_seqs=False, as on a GPU where nothing reads the values to
    refuse the hint (ATTN_CHECK_SEQLENS=0): flash-attn 3 / 4 take the padded offsets (seqused), as fused and unfused
    do; flash-attn 2 has no way to and relies on the promise."""
    from attention import selection

    run_fake_on_cpu(monkeypatch, generation)
    monkeypatch.setenv("ATTN_CHECK_SEQLENS", "0")
    q, k, v = (torch.randn(8, heads, 16, dtype=torch.bfloat16) for heads in (4, 2, 2))
    offsets = {"cu_seqlens_q": torch.tensor([0, 3, 5], dtype=torch.int32),
               "cu_seqlens_kv": torch.tensor([0, 3, 5], dtype=torch.int32),
               "cu_seqlens_q_padded": torch.tensor([0, 4, 8], dtype=torch.int32),
               "cu_seqlens_kv_padded": torch.tensor([0, 4, 8], dtype=torch.int32)}
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="thd",
                                 attn_mask_type="padding_causal_bottom_right", backend=f"flash{generation}")
    out = module(q, k, v, pad_between_seqs=False, **offsets)
    expected = reference_attention(q.float(), k.float(), v.float(), qkv_format="thd",
                                   attn_mask_type="padding_causal_bottom_right", **offsets)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    selection.clear_cache()


class _Hd256LengthsRelease(FakeFlash4):
    """A release whose (256, 256) sm100 forward asserts on seqused_q / seqused_k (its source says so, and so does the
    call here: the fake runs its sm90 math on CPU)."""

    _flash_attn_fwd = staticmethod(_hd256_fwd)

    @functools.wraps(FakeFlash4.flash_attn_varlen_func)   # the adapter probes the signature
    def flash_attn_varlen_func(self, q, k, v, *args, **kwargs):
        if q.shape[-1] == 256:
            _hd256_fwd(q, k, v, seqused_q=kwargs.get("seqused_q"), seqused_k=kwargs.get("seqused_k"))
        return FakeFlash4.flash_attn_varlen_func(self, q, k, v, *args, **kwargs)


class _Hd256BackwardLengthsRelease(FakeFlash4):
    """A release whose (256, 256) sm100 backward, but not its forward, asserts on seqused_q / seqused_k."""

    class BlackwellFusedMultiHeadAttentionBackward:
        def __init__(self, seqused_q=None, seqused_k=None):
            assert seqused_q is None and seqused_k is None, (
                "SM100 backward with head_dim=256 does not support seqused_q/seqused_k")


def test_v4_head_dim_256_offsets_of_its_own_under_a_false_hint_are_refused_at_the_call(install):
    """thd with offsets of its own (cu_seqlens_*_padded) under pad_between_seqs=False: flash4 reads them through
    seqused_q / seqused_k, which the (256, 256) sm100 kernels of some releases assert on. The gate sees no padding
    between sequences in the params, so the call itself is refused with a way out, before the library's assert."""
    case = FlashCase("thd", "padding", s_q=8, s_kv=8, pad_between_seqs=True, d_qk=256, d_v=256)
    call, expected = build_call(case, param_dtype=torch.bfloat16, compute_capability=(10, 0))
    hinted = replace(call, params=replace(call.params, pad_between_seqs=False))
    assert hinted.cu_seqlens_q_padded is not None and hinted.cu_seqlens_kv_padded is not None

    backend = install(4, module=_Hd256LengthsRelease())
    _check(backend, call.params, "which thd with pad_between_seqs passes")
    _check(backend, hinted.params, None)
    with pytest.raises(ValueError, match=r"seqused_q / seqused_k.*pass pad_between_seqs=True"):
        backend.forward(hinted)

    backend = install(4, module=_Hd256BackwardLengthsRelease())
    _check(backend, replace(hinted.params, requires_grad=True), None)
    with pytest.raises(ValueError, match="head dims \\(256, 256\\) do not support per-sequence lengths"):
        backend.forward(replace(hinted, params=replace(hinted.params, requires_grad=True)))
    out = backend.forward(hinted)   # inference: only the backward asserts
    torch.testing.assert_close(out.float(), expected, atol=1e-5, rtol=1e-5)

    out = install(4).forward(hinted)   # a release whose (256, 256) kernels take seqused reads the offsets
    torch.testing.assert_close(out.float(), expected, atol=1e-5, rtol=1e-5)


class _Bf16SinkRelease(FakeFlash4):
    """A release from before flash-attention's fp16/fp32 sink change: ``_flash_attn_fwd`` asserts a bf16
    learnable_sink whatever the inputs' dtype (flash_attn/cute/interface.py at 004b1a2)."""

    @staticmethod
    def _flash_attn_fwd(q, k, v, learnable_sink=None):
        if learnable_sink is not None:
            assert learnable_sink.shape == (q.shape[-2],)
            assert learnable_sink.dtype == torch.bfloat16, "learnable_sink must be bfloat16"

    def _check(self, q, k, v, batch, learnable_sink, *args, **kwargs):
        self._flash_attn_fwd(q, k, v, learnable_sink)
        super()._check(q, k, v, batch, learnable_sink, *args, **kwargs)


SINK_CASES = [case for case in cases_for(4) if case.softmax_type != "vanilla"]


@pytest.mark.parametrize("release, sink_dtype", [(FakeFlash4, torch.float32), (_Bf16SinkRelease, torch.bfloat16)],
                         ids=["4.0.0b36", "bf16-sink-only"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", SINK_CASES, ids=FlashCase.id)
def test_v4_learnable_sink_in_the_dtype_the_release_takes(case, dtype, release, sink_dtype, install):
    """learnable_sink goes as fp32 where the release takes it (4.0.0b36), as bf16 where its source asserts bf16, with
    fp16 inputs too (the assert is on the sink alone)."""
    passed = []

    class Recording(release):
        def _check(self, q, k, v, batch, learnable_sink, *args, **kwargs):
            passed.append(learnable_sink.dtype)
            super()._check(q, k, v, batch, learnable_sink, *args, **kwargs)

    backend = install(4, module=Recording())
    call, expected = build_call(case, dtype=dtype)
    assert backend.support_reasons(call.params) == []
    out = backend.forward(call)
    assert passed and set(passed) == {sink_dtype}
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_v4_forward_with_a_sink_compiles_without_graph_break(install):
    """The call-time source probes (the sink's dtype, the (256, 256) seqused check) are constants to torch.compile."""
    backend = install(4, module=_Bf16SinkRelease())
    case = FlashCase("thd", "padding_causal_bottom_right", pad_between_seqs=True, softmax_type="learnable")
    call, expected = build_call(case, param_dtype=torch.bfloat16, compute_capability=(10, 0))
    call = replace(call, params=replace(call.params, head_dim_qk=256, head_dim_v=256))   # the seqused check runs
    explanation = torch._dynamo.explain(backend.forward)(call)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch.testing.assert_close(torch.compile(backend.forward, fullgraph=True)(call).float(), expected,
                               atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------------------
# Gradients through the fake packages (which keep their output for backward, as flash-attn does)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("qkv_format, mask_type, lengths, padded", GRADIENT_CASES, ids=str)
def test_gradients_through_the_module_match_the_reference(generation, qkv_format, mask_type, lengths, padded,
                                                          monkeypatch):
    """dq / dk / dv of DotProductAttention(backend="flash<g>") against autograd through tests/reference.py.
    flash-attn saves its output for the backward pass (flash-attn 2 returns a view of it): the adapter must not
    write into it in place (thd's rows outside the sequences are zeroed out of place when gradients are needed)."""
    run_fake_on_cpu(monkeypatch, generation)
    if generation == 2 and padded:
        with pytest.raises(ValueError, match="padding between thd sequences"):
            check_gradients(generation, qkv_format, mask_type, lengths, padded, device="cpu", head_dim=16)
        return
    check_gradients(generation, qkv_format, mask_type, lengths, padded, device="cpu", head_dim=16)


def test_v4_learnable_sink_trains_through_a_release_that_takes_bf16_only(monkeypatch):
    """The sink parameter (fp32) reaches a bf16-only release through a cast, and its gradient comes back in fp32."""
    run_fake_on_cpu(monkeypatch, 4, module=_Bf16SinkRelease())
    torch.manual_seed(0)
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal",
                                 softmax_type="learnable", backend="flash4")
    with torch.no_grad():
        module.softmax_offset.copy_(torch.randn(4))
    q, k, v = (torch.randn(2, 6, h, 16, dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2))
    out = module(q, k, v)
    grad_out = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad_out)
    sink = module.softmax_offset.detach().clone().requires_grad_()
    inputs = [x.detach().float().requires_grad_() for x in (q, k, v)]
    expected = reference_attention(*inputs, qkv_format="bshd", attn_mask_type="causal", softmax_offset=sink)
    expected.backward(grad_out.float())
    torch.testing.assert_close(out.float(), expected.detach(), atol=2e-2, rtol=2e-2)
    assert module.softmax_offset.grad is not None and module.softmax_offset.grad.dtype == torch.float32
    torch.testing.assert_close(module.softmax_offset.grad, sink.grad, atol=3e-2, rtol=3e-2)
    for got, want in zip((q, k, v), inputs):
        torch.testing.assert_close(got.grad.float(), want.grad, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
def test_v3_num_splits_reaches_the_package(qkv_format, monkeypatch):
    """num_splits > 1 is passed to flash-attn 3 (flash_attn_func / flash_attn_varlen_func take it): the call runs
    and matches the reference."""
    run_fake_on_cpu(monkeypatch, 3)
    seen = []
    fake = flash_probe.probe(3).module
    def spy(function):
        @functools.wraps(function)   # the adapter probes the signature for num_splits
        def wrapper(*args, **kwargs):
            seen.append(kwargs.get("num_splits"))
            return function(*args, **kwargs)
        return wrapper

    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        monkeypatch.setattr(fake, name, spy(getattr(fake, name)))
    lead = (2, 6) if qkv_format == "bshd" else (12,)
    q, k, v = (torch.randn(*lead, h, 16, dtype=torch.bfloat16) for h in (4, 2, 2))
    cu = torch.tensor([0, 6, 12], dtype=torch.int32)
    lengths = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu) if qkv_format == "thd" else {}
    mask = "padding_causal" if qkv_format == "thd" else "causal"
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format=qkv_format, attn_mask_type=mask,
                                 backend="flash3", layer_number=1)
    out = module(q, k, v, num_splits=2, **lengths)
    assert seen == [2]
    expected = reference_attention(q.float(), k.float(), v.float(), qkv_format=qkv_format, attn_mask_type=mask,
                                   **lengths)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_a_call_on_a_gpu_other_than_the_current_one_runs_with_that_gpu_current(monkeypatch):
    """flash-attn-4 launches on the current device's stream: the adapter makes the query's GPU current around the
    call and gives the current device back. Devices are numbers here (no GPU)."""
    from attention import devices

    current, seen = FakeCurrentDevice(), []

    class Stop(Exception):
        pass

    def interface(self):
        seen.append(current.index)
        raise Stop

    monkeypatch.setattr(devices, "current_device_index", current.read)
    monkeypatch.setattr(devices.torch.cuda, "device", current.device)
    monkeypatch.setattr(Flash4Backend, "_interface", interface)
    query = SimpleNamespace(is_cuda=True, get_device=lambda: 1, device=torch.device("cuda", 1))
    with pytest.raises(Stop):
        Flash4Backend().forward(SimpleNamespace(query=query))
    assert seen == [1] and current.index == 0
    query.get_device = lambda: 0   # already current: no guard
    with pytest.raises(Stop):
        Flash4Backend().forward(SimpleNamespace(query=query))
    assert seen == [1, 0]


def test_the_flash_ops_run_with_the_query_gpu_current(monkeypatch):
    """Under torch.compile the flash adapter's own guard is not traced; the custom ops' bodies, which a compiled
    graph runs as called, make the query's GPU current themselves (flash-attn-4 takes the current device's stream).
    Devices are numbers here (no GPU)."""
    from attention import custom_ops, devices

    current, seen = FakeCurrentDevice(), []

    def record(*args, **kwargs):
        seen.append(current.index)
        return "out", None

    package = SimpleNamespace(flash_attn_func=record, flash_attn_varlen_func=record, flash_attn_with_kvcache=record)
    monkeypatch.setattr(custom_ops, "_flash_module", lambda generation: package)
    monkeypatch.setattr(devices, "current_device_index", current.read)
    monkeypatch.setattr(devices.torch.cuda, "device", current.device)
    q = SimpleNamespace(is_cuda=True, get_device=lambda: 1, device=torch.device("cuda", 1))
    assert custom_ops.flash_attn_func(q, None, None, 4, 1.0, False) == "out"
    custom_ops.flash_attn_varlen_func(q, None, None, None, None, 1, 1, 4, 1.0, False)
    custom_ops.flash_attn_with_kvcache(q, None, None, None, None, None, 1, 3, 1.0, False)
    assert seen == [1, 1, 1] and current.index == 0
