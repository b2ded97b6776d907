"""KV-cache steps through ``DotProductAttention`` + ``InferenceParams``, captured once in a CUDA graph
and replayed with new metadata (issue: no host sync in the fused forward).

Four sequences are prefilled eagerly, then run steps of a fixed shape: a decode (one token each) or a
mixed step (sequence 0 brings a 3-token chunk of chunked prefill, the others decode), in bshd, sbhd or
thd. The same driver runs eagerly on CPU (unfused fp32, fused in the interpreter) so its bookkeeping is
checked in CI; on CUDA it captures one step (fused, bf16) and replays it after each ``pre_step`` with
fresh q / k / v written into the captured buffers. Every new token's output is compared with causal
attention over its sequence's whole history. Over FIFO pages handed out in reverse, each sequence's pages descend
through the pool.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from inference import InferenceParams
from tests.cache_steps import step_inputs, step_rows
from tests.reference import reference_one_sequence

HEADS, HEADS_KV, HEAD_DIM = 8, 2, 64
MAX_BATCH, MAX_SEQLEN = 4, 256
PROMPT_LENS = [5, 17, 33, 64]
STEP_SHAPES = {"decode": [1, 1, 1, 1], "mixed": [3, 1, 1, 1]}
STEPS = 4


def run_steps(device: str, dtype: torch.dtype, backend: str, page_size: int | None, capture: bool,
              fmt: str = "bshd", shape: str = "decode", fifo: bool = False) -> tuple[float, str]:
    """Prefill the four sequences eagerly, then ``STEPS`` steps of ``STEP_SHAPES[shape]`` new tokens, with one
    captured graph (``capture``) or eager calls. ``fifo``: pages from TE's FIFO free list, reversed, so that a
    sequence's pages descend through the pool. Returns (the max error against the reference, the backend)."""
    params = InferenceParams(MAX_BATCH, MAX_SEQLEN, HEADS_KV, HEAD_DIM, dtype, is_paged=page_size is not None,
                             page_size=page_size, device=device, qkv_format=fmt,
                             **({"page_allocation": "fifo"} if fifo else {}))
    params.allocate_memory(1)
    if fifo:
        params.cache_manager.allocator.free_pages.reverse()
    attn = DotProductAttention(HEADS, HEAD_DIM, HEADS_KV, qkv_format=fmt, attn_mask_type="padding_causal",
                               layer_number=1, backend=backend)
    history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    worst = 0.0

    def new_tokens(lengths: list[int]) -> dict[int, list[torch.Tensor]]:
        return {seq: [torch.randn(n, h, HEAD_DIM) for h in (HEADS, HEADS_KV, HEADS_KV)]
                for seq, n in enumerate(lengths)}

    def check(new: dict[int, list[torch.Tensor]], out: torch.Tensor) -> None:
        nonlocal worst
        lengths = [tensors[0].shape[0] for tensors in new.values()]
        for seq, rows in zip(new, step_rows(fmt, out.float().cpu(), lengths), strict=True):
            q, k, v = (t.to(dtype).float() for t in new[seq])
            if seq in history:
                k, v = torch.cat([history[seq][0], k]), torch.cat([history[seq][1], v])
            history[seq] = (k, v)
            expected = reference_one_sequence(q, k, v, causal=True, bottom_right=True)
            error = (rows.reshape(expected.shape) - expected).abs().max().item()
            assert math.isfinite(error), f"sequence {seq}: non-finite output"   # (max() would drop a NaN)
            worst = max(worst, error)

    prompt = new_tokens(PROMPT_LENS)
    params.pre_step(OrderedDict(enumerate(PROMPT_LENS)))
    check(prompt, attn(*step_inputs(fmt, prompt, dtype, device), inference_params=params))

    lengths = STEP_SHAPES[shape]
    step = OrderedDict(enumerate(lengths))
    buffers = step_inputs(fmt, new_tokens(lengths), dtype, device)   # a captured graph reads these

    def next_step() -> dict[int, list[torch.Tensor]]:
        params.pre_step(step)             # host bookkeeping; device metadata updated in place
        new = new_tokens(lengths)
        for buffer, values in zip(buffers, step_inputs(fmt, new, dtype, device)):
            buffer.copy_(values)
        return new

    graph = None
    if capture:                           # warm-up: one real eager step on a side stream (Triton compiles)
        new = next_step()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = attn(*buffers, inference_params=params)
        torch.cuda.current_stream().wait_stream(stream)
        check(new, out)
    for _ in range(STEPS):
        new = next_step()
        if capture and graph is None:     # recording launches nothing; the replay below runs this step
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = attn(*buffers, inference_params=params)
        if graph is not None:
            graph.replay()
        else:
            out = attn(*buffers, inference_params=params)
        check(new, out)
    steps_run = STEPS + capture
    assert list(params.sequences.values()) == [n + steps_run * m for n, m in zip(PROMPT_LENS, lengths)]
    if fifo:   # the steps read pages out of the pool's order
        pages = [params.cache_manager.get_page_list(seq) for seq in params.sequences]
        assert any(p != sorted(p) for p in pages), pages
    return worst, attn.last_backend


PAGINGS = {"non-paged": None, "page16": 16}
EAGER_CASES = [pytest.param("unfused", paging, fmt, shape, id=f"unfused-{paging}-{fmt}-{shape}")
               for paging in PAGINGS for fmt in ("bshd", "sbhd", "thd") for shape in STEP_SHAPES]
EAGER_CASES += [pytest.param("fused", paging, fmt, shape, id=f"fused-{paging}-{fmt}-{shape}")   # ~2.5 s each
                for paging, fmt, shape in [("non-paged", "bshd", "decode"), ("page16", "bshd", "decode"),
                                           ("non-paged", "sbhd", "mixed"), ("page16", "thd", "mixed"),
                                           ("page16-fifo", "thd", "decode"), ("page16-fifo", "bshd", "mixed")]]


@pytest.mark.parametrize("backend, paging, fmt, shape", EAGER_CASES)
def test_eager_steps_match_reference(backend, paging, fmt, shape):
    if backend == "fused" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("fused runs on CPU tensors only under TRITON_INTERPRET=1")
    fifo = paging.endswith("-fifo")   # FIFO pages handed out in reverse
    worst, chosen = run_steps("cpu", torch.float32, backend, PAGINGS[paging.removesuffix("-fifo")], capture=False,
                              fmt=fmt, shape=shape, fifo=fifo)
    assert chosen == backend and worst < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 1, 16, 256], ids=["non-paged", "page1", "page16", "page256"])
def test_captured_decode_step_replays_with_new_metadata(page_size):
    worst, backend = run_steps("cuda", torch.bfloat16, "fused", page_size, capture=True)
    assert backend == "fused" and worst < 2.5e-2


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(STEP_SHAPES))
@pytest.mark.parametrize("fmt", ["sbhd", "thd"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["non-paged", "page16"])
def test_captured_steps_in_every_format_replay_with_new_metadata(page_size, fmt, shape):
    worst, backend = run_steps("cuda", torch.bfloat16, "fused", page_size, capture=True, fmt=fmt, shape=shape)
    assert backend == "fused" and worst < 2.5e-2


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16], ids=["non-paged", "page16"])
def test_captured_mixed_bshd_step_replays_with_new_metadata(page_size):
    worst, backend = run_steps("cuda", torch.bfloat16, "fused", page_size, capture=True, shape="mixed")
    assert backend == "fused" and worst < 2.5e-2


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(STEP_SHAPES))
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_captured_steps_over_descending_pages_replay_with_new_metadata(fmt, shape):
    """FIFO pages, reversed: the captured step reads each sequence's pages in descending pool order, through the
    page table that pre_step rewrites in place before each replay."""
    worst, backend = run_steps("cuda", torch.bfloat16, "fused", 16, capture=True, fmt=fmt, shape=shape, fifo=True)
    assert backend == "fused" and worst < 2.5e-2
