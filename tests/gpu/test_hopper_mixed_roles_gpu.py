"""The Gluon sm90 mixed-batch kernel with one role a program (attention/kernels/attention_mixed_roles_hopper.py)
against the fp32 reference, on an H100 / H200: the mixed kernel's cases (tests/gpu/test_hopper_mixed_gpu.py) with
one, two and three prefill key splits, each checking that it ran (a MixedRolesPlan), the rows against the
reference and that padding rows of out were not written; then launches that reuse the merges' counters."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import attention_forward
from attention.kernels import attention_fwd as launcher
from attention.kernels.hopper_mixed_roles import MIXED_ROLES_ENV, MIXED_ROLES_SPLITS_ENV
from tests.gpu.test_hopper_mixed_gpu import CASES, replay_with_new_lengths
from tests.test_kernels import SENTINEL, AttentionCase, build_inputs, check_output

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm90 GPU (H100 / H200)"),
]

C = AttentionCase
ROLES_CASES = [case for case in CASES if case.layout != "paged" or case.page_size in (16, 32, 64, 256)]
"""The mixed kernel's cases over pages this kernel reads (16, 32 or 64 tokens, or a multiple of 128)."""

CHUNK = C((1,) * 30 + (1000,), (2048,) * 30 + (5000,), heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16,
          layout="paged", page_size=16, causal=True, bottom_right=True)
"""A chunk of 1,000 queries on a 4k prefix beside 30 decodes at 2k (M2's shape, smaller)."""


@pytest.fixture(params=[1, 2, 3], ids=lambda splits: f"splits{splits}")
def roles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv(MIXED_ROLES_ENV, "1")
    monkeypatch.setenv(MIXED_ROLES_SPLITS_ENV, str(request.param))
    return request.param


def _run(inputs: dict) -> None:
    launcher._plans.clear()
    attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    kinds = {type(plan).__name__ for plan in launcher._plans.values()}
    assert kinds == {"MixedRolesPlan"}, f"planned {kinds}"


@pytest.mark.parametrize("case", [*ROLES_CASES, CHUNK], ids=str)
def test_mixed_roles_kernel_matches_the_reference(case: AttentionCase, roles: int) -> None:
    inputs = build_inputs(case, "cuda")
    _run(inputs)
    check_output(case, inputs)


def test_launches_in_a_row_leave_the_counters_at_zero(roles: int) -> None:
    """Every launch leaves the merges' arrival counters at zero: three launches in a row, and a CUDA graph
    replayed on a batch whose prefill moved to another sequence, all match the reference."""
    inputs = build_inputs(CHUNK, "cuda")
    _run(inputs)
    for _ in range(2):
        check_output(CHUNK, inputs)
        inputs["out_base"].fill_(SENTINEL)
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    check_output(CHUNK, inputs)
    replay_with_new_lengths(_run, replays=3)
