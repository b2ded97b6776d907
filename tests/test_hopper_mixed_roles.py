"""Host side of the Gluon sm90 mixed-batch kernel with one role a program (attention/kernels/hopper_mixed_roles.py)
on CPU: when it is planned, and the launch a plan makes, with the kernel stubbed (it runs in
tests/gpu/test_hopper_mixed_roles_gpu.py and compiles for sm90 in tests/sm90_compile.py)."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import hopper_forward, hopper_mixed_roles
from attention.kernels.hopper_forward import plan_hopper_forward
from attention.kernels.hopper_mixed import MixedHopperPlan
from attention.kernels.hopper_mixed_roles import (
    MIXED_ROLES_ENV,
    MIXED_ROLES_SPLITS_ENV,
    MixedRolesPlan,
    mixed_roles_unsupported_reason,
)
from tests.test_hopper_forward import _RecordedLaunch
from tests.test_hopper_mixed import _paged_mixed_batch


def _plan(num_decodes: int = 64, page_size: int = 16):
    q, k, total = _paged_mixed_batch(num_decodes, page_size)
    plan = plan_hopper_forward(q, k, k, q, num_seqs=num_decodes + 1, max_seqlen_q=2048, max_seqlen_kv=16384,
                               total_q=total, softmax_scale=0.1, window=(-1, 0), bottom_right=True,
                               page_size=page_size, alibi=False, sink=False, has_q_start=False, has_kv_start=False,
                               num_sms=132)
    return plan, q, k, total


@pytest.mark.parametrize("switch, page_size, planned", [
    # opt-in: not faster than the mixed kernel on M2 when built (docs/benchmarks_log.md, thirty-fourth session)
    (None, 16, MixedHopperPlan),
    ("0", 16, MixedHopperPlan),
    ("1", 16, MixedRolesPlan),
    ("1", 64, MixedRolesPlan),
    ("1", 256, MixedRolesPlan),
    ("1", 192, MixedHopperPlan),  # a multiple of the mixed kernel's 64-key tile, not of this kernel's 128
])
def test_the_switch_and_the_pages(monkeypatch: pytest.MonkeyPatch, switch: str | None, page_size: int,
                                  planned: type) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is not None:
        monkeypatch.setenv(MIXED_ROLES_ENV, switch)
    assert type(_plan(page_size=page_size)[0]) is planned


@pytest.mark.parametrize("name", ["ATTN_FUSED_HOPPER_MIXED", "ATTN_FUSED_HOPPER_MIXED_ROLES"])
def test_an_on_off_switch_refuses_other_values(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """"yes" or "false" read as on or off by accident before: an A/B run could compare the default with itself."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setenv(name, "false")
    with pytest.raises(ValueError, match=f"environment variable {name} must be 0 or 1"):
        _plan(page_size=16)


def test_refusals_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert MIXED_ROLES_ENV in mixed_roles_unsupported_reason(128, 16)
    monkeypatch.setenv(MIXED_ROLES_ENV, "1")
    assert "pages of 16, 32 or 64 tokens" in mixed_roles_unsupported_reason(128, 192)
    assert mixed_roles_unsupported_reason(128, 0) is None


@pytest.mark.parametrize("value", ["0", "-2", "three"])
def test_a_bad_split_count_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setenv(MIXED_ROLES_ENV, "1")
    monkeypatch.setenv(MIXED_ROLES_SPLITS_ENV, value)
    with pytest.raises(ValueError, match=MIXED_ROLES_SPLITS_ENV):
        _plan()


@pytest.mark.parametrize("splits", [1, 3])
def test_a_plan_launches_one_program_per_sm_with_half_tile_boxes(monkeypatch: pytest.MonkeyPatch,
                                                                 splits: int) -> None:
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setenv(MIXED_ROLES_ENV, "1")
    monkeypatch.setenv(MIXED_ROLES_SPLITS_ENV, str(splits))
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_mixed_roles, "attention_mixed_roles_hopper_kernel", kernel)
    plan, q, k, total = _plan(page_size=256)
    cu = torch.zeros(66, dtype=torch.int32)
    plan(q, k, k, q, cu, cu, None, None, torch.zeros(65, 64, dtype=torch.int32))
    (grid, args, kwargs), = kernel.calls
    assert grid == (132, 1, 1)
    q_desc, k_desc, v_desc, k_half_desc, v_half_desc = args[:5]
    assert list(q_desc.block_shape) == [64, 128]
    assert list(k_desc.block_shape) == list(v_desc.block_shape) == [128, 128]  # the prefill kernel's tiles
    assert list(k_half_desc.block_shape) == list(v_half_desc.block_shape) == [64, 128]  # a decode tile: half a stage
    partial_out, partial_lse, counters = args[7:10]
    if splits > 1:  # each split's rows and log-sum-exp, merged by the last split to arrive
        assert partial_out.shape == (splits, total, 32, 128) and partial_lse.shape == (splits, total, 32)
        assert counters.numel() >= total * 32 and counters.dtype == torch.int32
    else:  # no partials and no counters: placeholders
        assert partial_out is partial_lse is counters is q
    assert (kwargs["PREFILL_SPLITS"], kwargs["SPLITS_BLOCK"]) == (splits, max(2, 1 << (splits - 1).bit_length()))
    assert (kwargs["BLOCK_N"], kwargs["STAGES"], kwargs["CONSUMER_REGISTERS"], kwargs["maxnreg"]) == (128, 2, 240, 168)
    assert kwargs["DECODE_ROWS"] == 8 and kwargs["PAGE_SIZE"] == 256
