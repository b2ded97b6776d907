"""The cache-append and re-index operations: torch and Triton (interpreter) against a loop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference import append_to_kv_cache, reindex_kv_cache

NUM_HEADS_KV, HEAD_DIM_K, HEAD_DIM_V = 2, 8, 4


def make_step(qkv_format: str, new_lens: list[int], lengths_after: list[int], max_batch_size: int, dtype):
    """Random new K/V holding ``new_lens`` tokens per row, plus int32 cu_seqlens buffers."""
    batch = len(new_lens)
    pad = [0] * (max_batch_size - batch)
    cu_q = torch.tensor([0, *torch.tensor(new_lens + pad).cumsum(0).tolist()], dtype=torch.int32)
    cu_kv = torch.tensor([0, *torch.tensor(lengths_after + pad).cumsum(0).tolist()], dtype=torch.int32)
    s = max(new_lens) + 1  # one padding slot per row that must not be written
    shapes = {"bshd": (batch, s), "sbhd": (s, batch), "thd": (sum(new_lens) + 3,)}[qkv_format]
    new_k = torch.randn(*shapes, NUM_HEADS_KV, HEAD_DIM_K).to(dtype)
    new_v = torch.randn(*shapes, NUM_HEADS_KV, HEAD_DIM_V).to(dtype)
    return new_k, new_v, cu_q, cu_kv


def loop_append(new, cache, page_table, cu_q, cu_kv, qkv_format):
    """The definition, one token at a time."""
    page_size = cache.shape[1]
    rows = {"bshd": new.shape[0], "sbhd": new.shape[1], "thd": cu_q.numel() - 1}[qkv_format]
    for row in range(rows):
        new_len = int(cu_q[row + 1] - cu_q[row])
        total = int(cu_kv[row + 1] - cu_kv[row])
        for j in range(new_len):
            token = {"bshd": lambda: new[row, j], "sbhd": lambda: new[j, row],
                     "thd": lambda: new[int(cu_q[row]) + j]}[qkv_format]()
            position = total - new_len + j
            page = int(page_table[row, position // page_size])
            cache[page, position % page_size] = token


def run_append(implementation, monkeypatch, *args):
    if implementation == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    append_to_kv_cache(*args, implementation=implementation)


@pytest.mark.parametrize("implementation", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_paged_append_matches_loop(implementation, dtype, qkv_format, page_size, monkeypatch):
    max_batch_size, max_pages_per_seq = 4, -(-40 // page_size)
    total_num_pages = max_batch_size * max_pages_per_seq + 2
    new_lens, lengths_after = [3, 1, 7], [3, 20, 33]
    new_k, new_v, cu_q, cu_kv = make_step(qkv_format, new_lens, lengths_after, max_batch_size, dtype)
    # Pages shuffled so that a page-table bug cannot hide behind an identity mapping.
    page_table = torch.randperm(total_num_pages)[: max_batch_size * max_pages_per_seq]
    page_table = page_table.view(max_batch_size, max_pages_per_seq).to(torch.int32)
    k_cache = torch.randn(total_num_pages, page_size, NUM_HEADS_KV, HEAD_DIM_K).to(dtype)
    v_cache = torch.randn(total_num_pages, page_size, NUM_HEADS_KV, HEAD_DIM_V).to(dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    loop_append(new_k, expected_k, page_table, cu_q, cu_kv, qkv_format)
    loop_append(new_v, expected_v, page_table, cu_q, cu_kv, qkv_format)
    run_append(implementation, monkeypatch, new_k, new_v, k_cache, v_cache, page_table, cu_q, cu_kv, qkv_format)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("implementation", ["torch", "triton"])
@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd", "thd"])
def test_non_paged_append_is_one_page_per_row(implementation, qkv_format, monkeypatch):
    max_batch_size, max_seqlen = 3, 12
    new_lens, lengths_after = [2, 5], [9, 5]
    new_k, new_v, cu_q, cu_kv = make_step(qkv_format, new_lens, lengths_after, max_batch_size, torch.float32)
    k_cache = torch.zeros(max_batch_size, max_seqlen, NUM_HEADS_KV, HEAD_DIM_K)
    v_cache = torch.zeros(max_batch_size, max_seqlen, NUM_HEADS_KV, HEAD_DIM_V)
    row_table = torch.arange(max_batch_size, dtype=torch.int32).view(-1, 1)
    run_append(implementation, monkeypatch, new_k, new_v, k_cache, v_cache, row_table, cu_q, cu_kv, qkv_format)
    tokens = {"bshd": lambda r: new_k[r], "sbhd": lambda r: new_k[:, r],
              "thd": lambda r: new_k[int(cu_q[r]):]}[qkv_format]
    assert torch.equal(k_cache[0, 7:9], tokens(0)[:2])
    assert torch.equal(k_cache[1, 0:5], tokens(1)[:5])
    assert k_cache[0, :7].abs().sum() == 0 and k_cache[0, 9:].abs().sum() == 0
    assert k_cache[2].abs().sum() == 0


@pytest.mark.parametrize("implementation", ["torch", "triton"])
def test_non_contiguous_new_tokens_are_read_through_strides(implementation, monkeypatch):
    k_cache, v_cache = torch.zeros(2, 4, NUM_HEADS_KV, HEAD_DIM_K), torch.zeros(2, 4, NUM_HEADS_KV, HEAD_DIM_K)
    qkv = torch.randn(1, 3, 3, NUM_HEADS_KV, HEAD_DIM_K)  # a packed [b, s, 3, h, d] buffer
    new_k = qkv[:, :, 1]
    new_v = torch.randn(3, 1, NUM_HEADS_KV, HEAD_DIM_K).transpose(0, 1)  # V with other strides than K
    cu = torch.tensor([0, 3], dtype=torch.int32)
    run_append(implementation, monkeypatch, new_k, new_v, k_cache, v_cache, torch.tensor([[1]], dtype=torch.int32),
               cu, cu, "bshd")
    assert torch.equal(k_cache[1, :3], new_k[0]) and torch.equal(v_cache[1, :3], new_v[0])


@pytest.mark.parametrize("implementation", ["torch", "triton"])
@pytest.mark.parametrize(
    "destination_rows, source_rows",
    [([1, 2], [2, 3]), ([0, 1, 2], [3, 1, 2]), ([0, 1], [1, 0])],  # compaction, gap, swap
    ids=["compaction", "move-to-front", "swap"],
)
def test_reindex_moves_rows(implementation, destination_rows, source_rows, monkeypatch):
    if implementation == "triton":
        pytest.importorskip("triton")
        from attention.kernels.availability import interpreter_numpy_conflict

        if conflict := interpreter_numpy_conflict():   # the re-index takes its loop bound from an argument
            pytest.skip(conflict)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    k_cache = torch.randn(4, 10, NUM_HEADS_KV, HEAD_DIM_K)
    v_cache = torch.randn(4, 10, NUM_HEADS_KV, HEAD_DIM_V)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for destination, source in zip(destination_rows, source_rows):
        expected_k[destination, :6] = k_cache[source, :6]
        expected_v[destination, :6] = v_cache[source, :6]
    reindex_kv_cache(k_cache, v_cache, destination_rows, source_rows, num_tokens=6, implementation=implementation)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


# Triton imported for the GPU first (the attention kernels' import), the interpreter switched on afterwards: what a
# CPU test meets on a CUDA host. The append's kernels are jitted per mode; Triton's own jitted library (tl.sum,
# tl.zeros) is not, and the interpreter refuses to call it (23 tests failed on an H100 host, 2026-12-06).
_APPEND_AFTER_A_GPU_IMPORT = """
import os
import torch
import attention.kernels.attention_fwd
os.environ["TRITON_INTERPRET"] = "1"
from inference import append_to_kv_cache
k_cache, v_cache = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
cu_q, cu_kv = torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([0, 5, 7], dtype=torch.int32)
new = torch.randn(3, 2, 8)
append_to_kv_cache(new, new, k_cache, v_cache, table, cu_q, cu_kv, "thd", implementation="triton")
# positions 3, 4 of the first sequence (pages 2, 0 of 4 tokens), 1 of the second (page 1)
assert torch.equal(k_cache[2, 3], new[0]) and torch.equal(k_cache[0, 0], new[1]) and torch.equal(k_cache[1, 1], new[2])
new = torch.randn(2, 1, 2, 8)
cu_q, cu_kv = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 6, 9], dtype=torch.int32)
append_to_kv_cache(new, new, k_cache, v_cache, table, cu_q, cu_kv, "bshd", implementation="triton")
assert torch.equal(k_cache[0, 1], new[0, 0]) and torch.equal(k_cache[1, 2], new[1, 0])
print("appended")
"""


def _run_without_a_gpu(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python process at the repository root, no GPU visible, TRITON_INTERPRET unset."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {
        "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_append_runs_in_the_interpreter_after_triton_was_imported_for_the_gpu():
    pytest.importorskip("triton")
    result = _run_without_a_gpu(_APPEND_AFTER_A_GPU_IMPORT)
    assert result.returncode == 0 and result.stdout.strip() == "appended", result.stderr[-3000:]


# The other way round: the kernels' modules imported under the interpreter (a CPU test), the append then compiled for
# the GPU (a GPU test in the same process). Its combine function, made by triton.jit while the interpreter was on,
# was the interpreter's, which the compiler refuses to reference (17 serving-simulation tests failed so on an H100
# host, 2026-12-06). Compiled here for sm90, which needs no GPU.
_COMPILE_AFTER_AN_INTERPRETER_IMPORT = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import attention.kernels.attention_fwd
import inference.kv_append_triton
del os.environ["TRITON_INTERPRET"]
from tests.sm90_compile import _private_api_missing, compile_for_sm90, recorded_launches
missing = _private_api_missing()
if missing:
    print("SKIP", missing)
else:
    for label, fn, args, constexprs, warps, stages in recorded_launches([]):
        compile_for_sm90(fn, args, constexprs, warps, stages)
        print("ok", label)
"""


def test_the_append_compiles_for_the_gpu_after_an_import_under_the_interpreter():
    pytest.importorskip("triton")
    result = _run_without_a_gpu(_COMPILE_AFTER_AN_INTERPRETER_IMPORT)
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", "KV", "append", "thd", "ok", "KV", "append", "bshd",
                                     "ok", "KV", "append", "sbhd"], result.stdout


def test_reindex_on_cpu_tensors_outside_the_interpreter_names_its_kernel(monkeypatch):
    """The re-index launches through KernelLaunch, so its errors are the attention kernels' (Triton's own name
    neither the kernel nor the cause); the cache is untouched."""
    pytest.importorskip("triton")
    from attention.kernels import launch

    monkeypatch.setattr(launch, "_compiles_for_a_gpu", lambda fn: True)   # as where Triton compiles for a GPU
    k_cache, v_cache = torch.randn(4, 10, NUM_HEADS_KV, HEAD_DIM_K), torch.randn(4, 10, NUM_HEADS_KV, HEAD_DIM_V)
    before = k_cache.clone(), v_cache.clone()
    with pytest.raises(ValueError, match=r"^_reindex_kernel got CPU tensors, .*\(TRITON_INTERPRET=1"):
        reindex_kv_cache(k_cache, v_cache, [1, 2], [2, 3], num_tokens=6, implementation="triton")
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_reindex_rejects_mismatched_row_lists():
    cache = torch.zeros(2, 4, 1, 2)
    with pytest.raises(ValueError, match="destination_rows"):
        reindex_kv_cache(cache, cache, [0], [1, 0], num_tokens=2)


def test_unknown_implementation_is_refused():
    cache = torch.zeros(2, 4, 1, 2)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="implementation"):
        append_to_kv_cache(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), cache, cache,
                           torch.zeros(1, 1, dtype=torch.int32), cu, cu, "bshd", implementation="cuda")


def test_a_managers_append_numbers_its_buffers_once_and_again_for_new_ones(monkeypatch):
    """A cache manager keys its Triton append by the number of its buffers' layout (``cache_layout``), made once
    per layer while the same tensor objects come back, and made again for other ones; the writes stay right."""
    pytest.importorskip("triton")
    from collections import OrderedDict

    from inference import InferenceParams, cache_manager, kv_append

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kv_append, "_use_triton", lambda cache, implementation: implementation != "torch")
    numbered = []

    def counting_layout(*tensors):
        numbered.append(tensors)
        return kv_append.cache_layout(*tensors)

    monkeypatch.setattr(cache_manager, "cache_layout", counting_layout)
    params = InferenceParams(2, 64, NUM_HEADS_KV, HEAD_DIM_K, torch.float32, is_paged=True, page_size=4,
                             device="cpu")   # (a CUDA host's default is its GPU)
    params.allocate_memory(1)
    params.pre_step(OrderedDict({"a": 5, "b": 3}))
    prefill = [torch.randn(2, 5, NUM_HEADS_KV, HEAD_DIM_K) for _ in range(2)]
    params.step(1, *prefill, "bshd")
    for _ in range(2):
        params.pre_step(OrderedDict({"a": 1, "b": 1}))
        params.step(1, *(torch.randn(2, 1, NUM_HEADS_KV, HEAD_DIM_K) for _ in range(2)), "bshd")
    assert len(numbered) == 1   # three steps, one layout
    manager = params.cache_manager
    other_cu_q = params.cu_seqlens_q.clone()   # equal metadata, another object: numbered again, to the same number
    new_k, new_v = (torch.randn(2, 1, NUM_HEADS_KV, HEAD_DIM_K) for _ in range(2))
    params.pre_step(OrderedDict({"a": 1, "b": 1}))
    manager.step(1, new_k, new_v, other_cu_q, params.cu_seqlens_kv, "bshd")
    assert len(numbered) == 2
    assert kv_append.cache_layout(*numbered[0]) == kv_append.cache_layout(*numbered[1])
    k_cache, _ = manager.layer_cache(1)
    table = manager.page_table
    for row, position in enumerate((7, 5)):   # the step's token at its position (8 and 6 tokens now), paged
        assert torch.equal(k_cache[table[row, position // 4], position % 4], new_k[row, 0])
    assert torch.equal(k_cache[table[0, 0], 0], prefill[0][0, 0])


def test_a_cache_layout_stands_for_the_cache_sides_metadata(monkeypatch):
    """append_to_kv_cache(cache_layout=N) keys its launch by N for the cache side; the new tokens' own metadata still
    counts (a launch kept for the first new_k's strides would misread the second's), and the writes match the
    loop's."""
    pytest.importorskip("triton")
    from inference import kv_append

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k_cache, v_cache = torch.zeros(3, 4, NUM_HEADS_KV, HEAD_DIM_K), torch.zeros(3, 4, NUM_HEADS_KV, HEAD_DIM_V)
    table = torch.tensor([[2], [0]], dtype=torch.int32)
    cu_q, cu_kv = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 3, 4], dtype=torch.int32)
    monkeypatch.setattr(kv_append, "_use_triton", lambda cache, implementation: True)
    number = kv_append.cache_layout(k_cache, v_cache, table, cu_q, cu_kv)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    # the second new_k: a view with another batch stride
    for new_k in (torch.randn(2, 1, NUM_HEADS_KV, HEAD_DIM_K), torch.randn(2, 3, NUM_HEADS_KV, HEAD_DIM_K)[:, :1]):
        new_v = torch.randn(2, 1, NUM_HEADS_KV, HEAD_DIM_V)
        loop_append(new_k, expected_k, table, cu_q, cu_kv, "bshd")
        loop_append(new_v, expected_v, table, cu_q, cu_kv, "bshd")
        append_to_kv_cache(new_k, new_v, k_cache, v_cache, table, cu_q, cu_kv, "bshd", implementation="triton",
                           cache_layout=number)
        assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
