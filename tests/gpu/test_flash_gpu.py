"""flash2/flash3/flash4 on a real GPU against the fp32 reference (``tests/reference.py``).

Each installed generation runs its grid (``tests/flash_cases.py::cases_for``): formats, masks,
GQA, windows, ALiBi and MLA zero-padding (v2), padding between thd sequences (v3/v4), paged caches
(page 256 for v2; 1/16/64 for v3; 16/128 for v4), non-paged caches and sink softmax (v4), in bf16
and fp16. A generation that is not importable skips with its install hint (or, for flash-attn-4,
with the note that flash-attn 2 overwrote its ``flash_attn/cute``); a case the installed release
cannot run skips with the adapter's reasons (run ``pytest -rs`` to see them).
"""

from __future__ import annotations

import pytest
import torch

from attention.backends.flash import Flash2Backend, Flash3Backend, Flash4Backend
from tests.flash_cases import GRADIENT_CASES, FlashCase, build_call, cases_for, check_gradients

pytestmark = pytest.mark.gpu

BACKENDS = {2: Flash2Backend(), 3: Flash3Backend(), 4: Flash4Backend()}

GRID = [(g, case) for g in (2, 3, 4) for case in cases_for(g, gpu=True)]
DTYPES = [torch.bfloat16, torch.float16]


def _backend_or_skip(generation: int):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    backend = BACKENDS[generation]
    reason = backend.availability_reason()
    if reason:
        pytest.skip(f"{backend.name}: {reason}")
    return backend


def _call_or_skip(backend, case: FlashCase, dtype: torch.dtype):
    call, expected = build_call(case, dtype=dtype, device="cuda",
                                compute_capability=torch.cuda.get_device_capability())
    reasons = backend.support_reasons(call.params)
    if reasons:
        pytest.skip(f"{backend.name} {backend.version()}: " + "; ".join(reasons))
    return call, expected


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("generation, case", GRID, ids=[f"flash{g}-{c.id()}" for g, c in GRID])
def test_matches_reference(generation: int, case: FlashCase, dtype: torch.dtype) -> None:
    backend = _backend_or_skip(generation)
    call, expected = _call_or_skip(backend, case, dtype)
    out = backend.forward(call)
    torch.cuda.synchronize()
    assert out.shape == expected.shape and out.dtype == dtype
    atol, rtol = backend.capabilities.tolerances[dtype]
    torch.testing.assert_close(out.float().cpu(), expected, atol=atol, rtol=rtol)


DECODE_CASES = {
    2: FlashCase("bshd", "padding_causal_bottom_right", batch=4, s_q=1, s_kv=512, kv_cache="paged", page_size=256),
    3: FlashCase("thd", "padding_causal_bottom_right", batch=4, s_q=2, s_kv=512, kv_cache="paged", page_size=16),
    4: FlashCase("sbhd", "padding_causal_bottom_right", batch=4, s_q=1, s_kv=512, kv_cache="non_paged"),
}


@pytest.mark.parametrize("generation", [2, 3, 4])
def test_decode_step_replays_in_a_cuda_graph(generation: int) -> None:
    """No host synchronisation in the adapter: a captured decode step replays to the same output."""
    backend = _backend_or_skip(generation)
    call, expected = _call_or_skip(backend, DECODE_CASES[generation], torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):   # warm-up (and flash-attn-4's JIT) outside the capture
            eager = backend.forward(call)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backend.forward(call)
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager)
    atol, rtol = backend.capabilities.tolerances[torch.bfloat16]
    torch.testing.assert_close(captured.float().cpu(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("qkv_format, mask_type, lengths, padded", GRADIENT_CASES, ids=str)
def test_gradients_through_the_module_match_the_reference(generation, qkv_format, mask_type, lengths, padded) -> None:
    """dq / dk / dv through DotProductAttention and the installed package's backward (bf16, d=64); a case the
    installed release cannot run skips with the adapter's reasons."""
    _backend_or_skip(generation)
    try:
        check_gradients(generation, qkv_format, mask_type, lengths, padded, device="cuda", head_dim=64)
    except ValueError as error:
        if "cannot run these inputs" not in str(error):
            raise
        pytest.skip(str(error).split("Backends tried")[-1].strip())
