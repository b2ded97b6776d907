"""Serving simulation (TE's test_kv_cache, extended): random arrivals, chunked prefill,
multi-token steps, finishing sequences and a refilled batch, driven through
``DotProductAttention`` + ``InferenceParams``. Every new token of every step is compared with
full causal attention over that sequence's whole history.

Backends: unfused and fused everywhere (fused in Triton's interpreter on CPU), and each flash
generation: on a GPU through the installed package (skipped with the probe's reason when absent),
on CPU through the fake packages of ``tests/flash_fakes.py``, which enforce each package's argument
rules, so the adapters' cache plumbing is checked in CI too.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from attention import selection
from inference import InferenceParams, KVCacheFullError, page_allocator
from inference.scheduler import ContinuousBatchingScheduler
from tests.flash_fakes import run_fake_on_cpu
from tests.reference import reference_one_sequence

attention = pytest.importorskip("attention")

HEADS, HEADS_KV, HEAD_DIM = 4, 2, 16
MAX_BATCH, MAX_SEQLEN = 3, 40
ON_GPU = torch.cuda.is_available()
DTYPE = torch.float16 if ON_GPU else torch.float32
TOLERANCE = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=1e-3, rtol=1e-3)}

PAGINGS = [
    pytest.param(None, False, id="non-paged"),
    *[pytest.param(page_size, False, id=f"page{page_size}") for page_size in (1, 3, 16)],
    *[pytest.param(page_size, True, id=f"page{page_size}-oversubscribed") for page_size in (1, 3, 16)],
]
FORMATS = ["bshd", "sbhd", "thd"]

FLASH_MAX_SEQLEN, FLASH_HEAD_DIM = 512, 64
"""flash-attn 2 drives a non-paged cache as one block per row (max_sequence_length % 256 == 0);
flash-attn-4 on sm90 takes head dims 64 and up."""
FLASH_PAGINGS = {
    # the page sizes each generation's paged path takes (flash-attn 2: multiples of 256 only)
    "flash2": [pytest.param(None, False, id="non-paged"), pytest.param(256, False, id="page256"),
               pytest.param(256, True, id="page256-oversubscribed")],
    "flash3": [pytest.param(None, False, id="non-paged"), pytest.param(16, False, id="page16"),
               pytest.param(1, True, id="page1-oversubscribed")],
    "flash4": [pytest.param(None, False, id="non-paged"), pytest.param(128, False, id="page128"),
               pytest.param(16, True, id="page16-oversubscribed")],
}


def simulation_cases():
    """Every format x paging for unfused; for fused (slow under TRITON_INTERPRET on CPU) a few; for
    each flash generation the page sizes it reads."""
    interpreted = {"bshd": ("non-paged",), "sbhd": ("page16-oversubscribed",), "thd": ("page3", "page1-oversubscribed")}
    for backend in ("unfused", "fused"):
        for qkv_format in FORMATS:
            for paging in PAGINGS:
                tiny = backend == "fused" and not ON_GPU
                if tiny and paging.id not in interpreted[qkv_format]:
                    continue
                yield pytest.param(backend, qkv_format, *paging.values, tiny,
                                   id=f"{backend}-{qkv_format}-{paging.id}")
    for backend, pagings in FLASH_PAGINGS.items():
        for index, qkv_format in enumerate(FORMATS):
            # CPU (fakes): one paging per format; GPU: every combination
            for paging in pagings if ON_GPU else pagings[index:index + 1]:
                yield pytest.param(backend, qkv_format, *paging.values, not ON_GPU,
                                   id=f"{backend}-{qkv_format}-{paging.id}")


def use_flash(backend: str, monkeypatch) -> None:
    """On a GPU: the installed generation or a skip with its reason. On CPU: its fake package, and
    the backend's sheet widened to CPU tensors (the fakes compute on any device)."""
    generation = int(backend[-1])
    if ON_GPU:
        reason = selection.registry()[backend].availability_reason()
        if reason:
            pytest.skip(f"{backend}: {reason}")
        return
    run_fake_on_cpu(monkeypatch, generation)


def pack_new_tokens(tensors: list[torch.Tensor], qkv_format: str) -> torch.Tensor:
    """Per-sequence ``[step_len, h, d]`` tensors -> left-aligned bshd/sbhd or packed thd."""
    if qkv_format == "thd":
        return torch.cat(tensors)
    padded = torch.zeros(len(tensors), max(len(t) for t in tensors), *tensors[0].shape[1:], dtype=tensors[0].dtype)
    for row, tensor in enumerate(tensors):
        padded[row, : len(tensor)] = tensor
    return padded if qkv_format == "bshd" else padded.transpose(0, 1).contiguous()


def new_token_outputs(out: torch.Tensor, qkv_format: str, step_lens: list[int]) -> list[torch.Tensor]:
    """The attention output rows of each sequence's new tokens, ``[step_len, h*d_v]`` each."""
    starts = [0, *torch.tensor(step_lens).cumsum(0).tolist()]
    if qkv_format == "bshd":
        return [out[row, :n] for row, n in enumerate(step_lens)]
    if qkv_format == "sbhd":
        return [out[:n, row] for row, n in enumerate(step_lens)]
    return [out[starts[row] : starts[row] + n] for row, n in enumerate(step_lens)]


def check_pages(params: InferenceParams) -> None:
    manager = params.cache_manager
    owned = [page for pages in manager.allocator.allocated_pages.values() for page in pages]
    assert len(owned) == len(set(owned)), "a page is shared by two sequences"
    assert sorted(owned + list(manager.allocator.free_pages)) == list(range(manager.total_num_pages)), "a page leaked"
    for seq_id, length in params.sequences.items():
        assert manager.get_page_count(seq_id) == -(-length // manager.page_size)


@pytest.mark.parametrize("backend, qkv_format, page_size, oversubscribed, tiny", list(simulation_cases()))
def test_serving_simulation(backend, qkv_format, page_size, oversubscribed, tiny, monkeypatch):
    device = torch.device("cuda" if ON_GPU else "cpu")
    num_requests, max_seqlen = (3, 24) if tiny else (7, MAX_SEQLEN)
    dtype, head_dim = DTYPE, HEAD_DIM
    if backend.startswith("flash"):
        use_flash(backend, monkeypatch)
        num_requests, max_seqlen, dtype, head_dim = (4 if tiny else 7), FLASH_MAX_SEQLEN, torch.float16, FLASH_HEAD_DIM
    page_allocation = None
    if page_size is not None and oversubscribed:  # runs of 3 pages: sequences outgrow theirs and share the rest
        monkeypatch.setattr(page_allocator, "TRANSLATION_BYTES", 3 * page_size * HEADS_KV * head_dim * dtype.itemsize)
    elif page_size == 3:
        page_allocation = "fifo"  # TE's free list
    try:
        _simulate(backend, qkv_format, page_size, oversubscribed, tiny, device, num_requests, max_seqlen, dtype,
                  head_dim, page_allocation)
    finally:
        selection.clear_cache()


def _simulate(backend, qkv_format, page_size, oversubscribed, tiny, device, num_requests, max_seqlen, dtype,
              head_dim, page_allocation):
    max_pages_per_seq = -(-max_seqlen // page_size) if page_size else 0
    params = InferenceParams(
        MAX_BATCH, max_seqlen, HEADS_KV, head_dim, dtype, is_paged=page_size is not None,
        page_size=page_size,
        total_num_pages=(max_pages_per_seq * 3) // 2 if oversubscribed else None,
        max_ctx_len=8, qkv_format=qkv_format, device=device, page_allocation=page_allocation,
    )
    params.allocate_memory(1)
    attn = attention.DotProductAttention(
        HEADS, head_dim, num_gqa_groups=HEADS_KV, qkv_format=qkv_format,
        attn_mask_type="padding_causal", layer_number=1, backend=backend,
    )
    scheduler = ContinuousBatchingScheduler(
        num_requests, MAX_BATCH, max_seqlen, max_prompt_len=max_seqlen // 2, mean_new_tokens=max_seqlen / 4,
        prefill_chunk_size=8, max_decode_tokens=3, arrival_rate=0.7, seed=len(qkv_format) + (page_size or 0),
        max_ctx_len=params.max_ctx_len,
    )
    q_all, k_all, v_all = (
        {r.seq_id: 0.5 * torch.randn(r.total_len, heads, head_dim) for r in scheduler.requests}
        for heads in (HEADS, HEADS_KV, HEADS_KV)
    )
    checked_tokens, multi_token_continuations = 0, 0
    while not scheduler.done:
        step_dict = scheduler.schedule(params.pre_step)
        if page_size is not None:
            check_pages(params)
        if not step_dict:
            scheduler.complete_step()
            continue
        step_lens = list(step_dict.values())
        starts = [params.sequences_pre_step[seq_id] for seq_id in step_dict]
        multi_token_continuations += sum(n > 1 and s > 0 for n, s in zip(step_lens, starts))
        q, k, v = (
            pack_new_tokens([tensors[seq_id][s : s + n] for seq_id, s, n in zip(step_dict, starts, step_lens)],
                            qkv_format).to(device=device, dtype=dtype)
            for tensors in (q_all, k_all, v_all)
        )
        cu_seqlens_q = torch.tensor([0, *torch.tensor(step_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        try:
            out = attn(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_q.clone(),
                       max_seqlen_q=max(step_lens), max_seqlen_kv=max_seqlen, inference_params=params)
        except ValueError as error:
            if str(error).startswith(backend) and checked_tokens == 0:
                pytest.skip(str(error))
            raise
        for seq_id, s, n, got in zip(step_dict, starts, step_lens, new_token_outputs(out, qkv_format, step_lens)):
            expected = reference_one_sequence(
                q_all[seq_id][s : s + n].to(dtype), k_all[seq_id][: s + n].to(dtype), v_all[seq_id][: s + n].to(dtype),
                softmax_scale=1 / math.sqrt(head_dim), causal=True, bottom_right=True,
            )
            torch.testing.assert_close(got.float().cpu(), expected.reshape(n, -1), **TOLERANCE[dtype],
                                       msg=lambda m: f"step {scheduler.time}, seq {seq_id}, tokens {s}..{s + n}: {m}")
            checked_tokens += n
        scheduler.complete_step()
    assert checked_tokens >= sum(r.total_len for r in scheduler.requests)
    if not tiny:
        assert multi_token_continuations > 0, "no chunked-prefill or multi-token step was exercised"
    params.pre_step(OrderedDict())  # everyone finished
    assert params.sequences == OrderedDict()
    if page_size is not None:
        assert params.cache_manager.allocator.num_free == params.total_num_pages


def test_oversubscribed_cache_preempts_and_recovers():
    """A cache of 1.5 sequences' worth of pages forces refused steps; none of them loses data."""
    params = InferenceParams(4, 32, HEADS_KV, HEAD_DIM, torch.float32, is_paged=True, page_size=4,
                             total_num_pages=12, device="cpu")
    scheduler = ContinuousBatchingScheduler(10, 4, 32, max_prompt_len=20, mean_new_tokens=12,
                                            prefill_chunk_size=8, arrival_rate=4.0, seed=3)
    while not scheduler.done:
        scheduler.schedule(params.pre_step)
        check_pages(params)
        scheduler.complete_step()
    assert scheduler.preemptions > 0
    assert all(request.finished for request in scheduler.requests)


def test_a_step_that_cannot_fit_leaves_the_scheduler_as_it_was():
    """A request longer than the whole cache: schedule() preempts the others trying to fit it, gives up and
    raises; the preemptions it tried are undone, so its requests still match what the cache holds."""
    from inference.scheduler import Request

    params = InferenceParams(3, 32, HEADS_KV, HEAD_DIM, torch.float32, is_paged=True, page_size=4,
                             total_num_pages=6, device="cpu")
    scheduler = ContinuousBatchingScheduler(0, 3, 32, max_prompt_len=8, mean_new_tokens=4, prefill_chunk_size=16)
    scheduler.requests = [Request(0, 0, 28, 30), Request(1, 0, 4, 10)]   # 28 tokens: 7 pages of the 6
    with pytest.raises(KVCacheFullError):
        while not scheduler.done:
            scheduler.schedule(params.pre_step)
            scheduler.complete_step()
    assert {r.seq_id: r.processed for r in scheduler.running} == dict(params.sequences) == {0: 16, 1: 4}
    assert scheduler.waiting == [] and scheduler.preemptions == 0


@pytest.mark.parametrize("kwargs", [dict(prefill_chunk_size=16), dict(max_decode_tokens=9)])
def test_the_scheduler_refuses_steps_past_max_ctx_len(kwargs):
    """pre_step refuses a step that brings a sequence more than max_ctx_len tokens: a scheduler told the bound refuses
    chunk sizes or draft lengths past it up front (it knew nothing of it, and pre_step's ValueError ended the run)."""
    with pytest.raises(ValueError, match="exceeds max_ctx_len=8"):
        ContinuousBatchingScheduler(4, 2, 32, max_prompt_len=8, mean_new_tokens=4, max_ctx_len=8,
                                    **{"prefill_chunk_size": 8, **kwargs})
