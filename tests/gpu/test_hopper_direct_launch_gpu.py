"""The Hopper kernels' later calls (attention.kernels.launch's direct path, descriptors encoded once per address), on
an H100 / H200: a plan runs three batches of one geometry at other addresses and with other contents, and each
output matches the reference; the calls after the first launched directly and kept one encoded descriptor a
distinct address."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attention.kernels import attention_forward
from attention.kernels import attention_fwd as launcher
from tests.test_kernels import AttentionCase, build_inputs, check_output

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm90 GPU (H100 / H200)"),
]

C = AttentionCase
GQA = dict(heads=(32, 8), d_qk=128, d_v=128, dtype=torch.bfloat16, causal=True, bottom_right=True)
DECODES_Q, DECODES_KV = (1,) * 12, (1, 17, 64, 65, 300, 1000, 1024, 2047, 2500, 4096, 31, 128)
CASES = {
    "DecodeHopperPlan": C(DECODES_Q, DECODES_KV, layout="paged", page_size=16, **GQA),
    "split DecodeHopperPlan": C((1,), (8192,), layout="paged", page_size=16, num_splits=None, **GQA),
    "HopperPlan": C((300, 129, 1000, 64, 0, 700), (700, 129, 1000, 65, 0, 1500), layout="paged", page_size=64,
                    **GQA),
    # mixed: the longest sequence has at least 8x the average queries (configs.mixed_batch)
    "MixedHopperPlan": C(DECODES_Q + (300, 700), DECODES_KV + (300, 2900), layout="paged", page_size=16, **GQA),
}


@pytest.mark.parametrize("name", list(CASES))
def test_later_calls_launch_directly_at_new_addresses(name: str) -> None:
    launcher._plans.clear()
    kept = []  # every batch stays allocated: three distinct addresses
    for seed in (0, 1, 2):
        case = dataclasses.replace(CASES[name], seed=seed)
        inputs = build_inputs(case, "cuda")
        kept.append(inputs)
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
        torch.cuda.synchronize()
        check_output(case, inputs)
    plans = list(launcher._plans.values())
    assert [type(plan).__name__ for plan in plans] == [name.split()[-1]], f"planned {plans}"
    launched = [plans[0], *([plans[0].heavy_plan] if getattr(plans[0], "heavy_plan", None) else [])]
    for plan in launched:  # a mixed batch without total_kv: both tiles launch, the device's lengths picking one
        (kernel_launch,) = plan.launches.values()
        assert kernel_launch._direct, "the later calls went through Triton"
        assert [len(by_address) for _, by_address in kernel_launch._encoded] == [2] * len(kernel_launch.descriptors)
