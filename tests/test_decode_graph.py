"""A decode step through ``DotProductAttention`` + ``InferenceParams``, captured once in a CUDA graph
and replayed with new metadata (issue: no host sync in the fused forward).

The same driver runs eagerly on CPU (unfused, fp32) so its bookkeeping is checked in CI; on CUDA it
captures the step (fused, bf16) and replays it after each ``pre_step`` with fresh q/k/v.
Every replayed output is compared with causal attention over each sequence's whole history.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from inference import InferenceParams
from tests.reference import reference_one_sequence

HEADS, HEADS_KV, HEAD_DIM = 8, 2, 64
MAX_BATCH, MAX_SEQLEN = 4, 256
PROMPT_LENS = [5, 17, 33, 64]
DECODE_STEPS = 4


def run_decode_steps(device: str, dtype: torch.dtype, backend: str, page_size: int | None, capture: bool):
    """Prefill the four sequences eagerly, then decode ``DECODE_STEPS`` tokens each, with one
    captured graph (``capture``) or eager calls. Returns the max error against the reference."""
    params = InferenceParams(MAX_BATCH, MAX_SEQLEN, HEADS_KV, HEAD_DIM, dtype, is_paged=page_size is not None,
                             page_size=page_size, device=device)
    params.allocate_memory(1)
    attn = DotProductAttention(HEADS, HEAD_DIM, HEADS_KV, qkv_format="bshd", attn_mask_type="padding_causal",
                               layer_number=1, backend=backend)

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    history_k = [randn(n, HEADS_KV, HEAD_DIM) for n in PROMPT_LENS]
    history_v = [randn(n, HEADS_KV, HEAD_DIM) for n in PROMPT_LENS]
    longest = max(PROMPT_LENS)
    padded = [torch.zeros(MAX_BATCH, longest, HEADS_KV, HEAD_DIM, device=device, dtype=dtype) for _ in range(2)]
    for row, n in enumerate(PROMPT_LENS):
        padded[0][row, :n], padded[1][row, :n] = history_k[row], history_v[row]
    params.pre_step(OrderedDict(enumerate(PROMPT_LENS)))
    attn(randn(MAX_BATCH, longest, HEADS, HEAD_DIM), padded[0], padded[1], inference_params=params)

    q, k, v = randn(MAX_BATCH, 1, HEADS, HEAD_DIM), randn(MAX_BATCH, 1, HEADS_KV, HEAD_DIM), randn(MAX_BATCH, 1, HEADS_KV, HEAD_DIM)
    decode = OrderedDict((row, 1) for row in range(MAX_BATCH))
    worst, decoded = 0.0, 0

    def check(out: torch.Tensor) -> None:
        nonlocal worst, decoded
        decoded += 1
        for row in range(MAX_BATCH):
            history_k[row] = torch.cat([history_k[row], k[row]])
            history_v[row] = torch.cat([history_v[row], v[row]])
            expected = reference_one_sequence(q[row], history_k[row], history_v[row], causal=True, bottom_right=True)
            got = out[row, 0].float().reshape(HEADS, HEAD_DIM)
            worst = max(worst, (got - expected[0]).abs().max().item())
        assert list(params.sequences.values()) == [n + decoded for n in PROMPT_LENS]

    def next_step() -> None:
        params.pre_step(decode)           # host bookkeeping; device metadata updated in place
        for buffer in (q, k, v):          # new tokens written into the captured input buffers
            buffer.copy_(randn(*buffer.shape))

    graph = None
    if capture:                           # warm-up: one real eager step on a side stream (Triton compiles)
        next_step()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = attn(q, k, v, inference_params=params)
        torch.cuda.current_stream().wait_stream(stream)
        check(out)
    for _ in range(DECODE_STEPS):
        next_step()
        if capture and graph is None:     # recording launches nothing; the replay below runs this step
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = attn(q, k, v, inference_params=params)
        if graph is not None:
            graph.replay()
        else:
            out = attn(q, k, v, inference_params=params)
        check(out)
    return worst, attn.last_backend


@pytest.mark.parametrize("backend", ["unfused", "fused"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["non-paged", "page16"])
def test_eager_decode_steps_match_reference(backend, page_size):
    if backend == "fused" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("fused runs on CPU tensors only under TRITON_INTERPRET=1")
    worst, chosen = run_decode_steps("cpu", torch.float32, backend, page_size, capture=False)
    assert chosen == backend and worst < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 1, 16, 256], ids=["non-paged", "page1", "page16", "page256"])
def test_captured_decode_step_replays_with_new_metadata(page_size):
    worst, backend = run_decode_steps("cuda", torch.bfloat16, "fused", page_size, capture=True)
    assert backend == "fused" and worst < 2.5e-2
