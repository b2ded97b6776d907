"""The Triton cache-append / re-index kernels on a CUDA GPU, and a CUDA-graph captured step."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from inference import InferenceParams, append_to_kv_cache, reindex_kv_cache

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_triton_append_matches_torch(dtype, qkv_format, page_size):
    device = torch.device("cuda")
    heads_kv, head_dim_k, head_dim_v, max_batch_size, max_seqlen = 8, 128, 64, 16, 1024
    max_pages_per_seq = max_seqlen // page_size
    total_num_pages = max_batch_size * max_pages_per_seq
    new_lens = torch.randint(1, 40, (12,)).tolist()
    lengths_after = [n + int(torch.randint(0, max_seqlen - 40, ())) for n in new_lens]
    pad = [0] * (max_batch_size - len(new_lens))
    cu_q = torch.tensor([0, *torch.tensor(new_lens + pad).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_kv = torch.tensor([0, *torch.tensor(lengths_after + pad).cumsum(0).tolist()], dtype=torch.int32, device=device)
    shape = {"bshd": (len(new_lens), max(new_lens)), "sbhd": (max(new_lens), len(new_lens)),
             "thd": (sum(new_lens),)}[qkv_format]
    new_k = torch.randn(*shape, heads_kv, head_dim_k, device=device).to(dtype)
    new_v = torch.randn(*shape, heads_kv, head_dim_v, device=device).to(dtype)
    page_table = torch.randperm(total_num_pages, device=device).view(max_batch_size, max_pages_per_seq).to(torch.int32)
    caches = {}
    for implementation in ("torch", "triton"):
        k_cache = torch.zeros(total_num_pages, page_size, heads_kv, head_dim_k, dtype=dtype, device=device)
        v_cache = torch.zeros(total_num_pages, page_size, heads_kv, head_dim_v, dtype=dtype, device=device)
        append_to_kv_cache(new_k, new_v, k_cache, v_cache, page_table, cu_q, cu_kv, qkv_format,
                           implementation=implementation)
        caches[implementation] = (k_cache, v_cache)
    assert torch.equal(caches["torch"][0], caches["triton"][0])
    assert torch.equal(caches["torch"][1], caches["triton"][1])
    assert caches["triton"][0].abs().sum() > 0


def test_triton_reindex_compacts_rows():
    k_cache = torch.randn(8, 512, 4, 128, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn(8, 512, 4, 64, device="cuda", dtype=torch.bfloat16)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    destination, source = [1, 2, 3, 4], [2, 3, 5, 7]
    expected_k[destination, :300] = k_cache[source, :300]
    expected_v[destination, :300] = v_cache[source, :300]
    reindex_kv_cache(k_cache, v_cache, destination, source, num_tokens=300, implementation="triton")
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("is_paged", [False, True])
def test_decode_step_replays_in_a_cuda_graph(is_paged):
    """Capture one decode step.append at max_batch_size, then replay it after fresh pre_steps."""
    max_batch_size, heads_kv, head_dim = 4, 2, 64
    params = InferenceParams(max_batch_size, 64, heads_kv, head_dim, torch.bfloat16, is_paged=is_paged,
                             page_size=16 if is_paged else None, device="cuda")
    params.allocate_memory(1)
    params.pre_step(OrderedDict((seq_id, 8) for seq_id in range(max_batch_size)))  # warm-up prefill
    params.step(1, *(torch.randn(max_batch_size, 8, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16),) * 2,
                "bshd")
    new_k = torch.zeros(max_batch_size, 1, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    new_v = torch.zeros_like(new_k)
    params.pre_step(OrderedDict((seq_id, 1) for seq_id in range(max_batch_size)))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        params.step(1, new_k, new_v, "bshd")  # warm-up (Triton compiles here)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        params.step(1, new_k, new_v, "bshd")
    for _ in range(3):
        params.pre_step(OrderedDict((seq_id, 1) for seq_id in range(max_batch_size)))
        new_k.copy_(torch.randn_like(new_k))
        new_v.copy_(torch.randn_like(new_v))
        graph.replay()
        k_rows, v_rows = params.convert_paged_to_nonpaged(1)
        for row, length in enumerate(params.sequences.values()):
            assert torch.equal(k_rows[row, length - 1], new_k[row, 0])
            assert torch.equal(v_rows[row, length - 1], new_v[row, 0])


@pytest.mark.parametrize("is_paged", [True, False])
def test_pre_step_metadata_copies_stay_in_stream_order(is_paged):
    """pre_step's copies do not make the host wait, so the host rewrites its bookkeeping while earlier
    copies are still queued behind GPU work (a spin kernel here). Every step's device metadata, read
    in stream order, must equal what a CPU InferenceParams computes for the same steps."""
    steps = [{0: 40, 1: 7}, {0: 1, 1: 1}, {1: 1, 2: 33}, {1: 1, 2: 1, 3: 17}, {2: 1, 3: 1}, {3: 1, 4: 5}]
    options = {"is_paged": is_paged, "page_size": 16 if is_paged else None}
    on_gpu = InferenceParams(4, 128, 2, 16, torch.float16, device="cuda", **options)
    on_cpu = InferenceParams(4, 128, 2, 16, torch.float16, device="cpu", **options)
    snapshots = []
    for step in steps:
        torch.cuda._sleep(2_000_000)   # keep the stream busy: the copy below waits in the queue
        on_gpu.pre_step(OrderedDict(step))
        on_cpu.pre_step(OrderedDict(step))
        tensors = [on_gpu.cu_seqlens_q, on_gpu.cu_seqlens_kv, on_gpu.pre_step_seqlens]
        expected = [on_cpu.cu_seqlens_q, on_cpu.cu_seqlens_kv, on_cpu.pre_step_seqlens]
        if is_paged:
            tensors.append(on_gpu.cache_manager.page_table)
            expected.append(on_cpu.cache_manager.page_table)
        snapshots.append(([t.clone() for t in tensors], [t.clone() for t in expected]))
    torch.cuda.synchronize()
    for number, (got, want) in enumerate(snapshots):
        for g, w in zip(got, want):
            assert torch.equal(g.cpu(), w), f"step {number}"
