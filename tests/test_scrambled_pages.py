"""KV-cache steps over pages that lie out of order in the pool (a FIFO free list reversed or shuffled), through the
fused backend: every new token against the fp32 reference, with decodes, chunks beside them, a window, ALiBi, softmax
sinks, and a random serving trace of joins, finishes and reorders."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from attention.kernels.availability import kernels_interpreted
from inference import InferenceParams, KVCacheFullError
from tests.cache_steps import step_inputs, step_rows
from tests.reference import reference_one_sequence

PAGE = 16
# the fused kernels run on CPU tensors only under the interpreter, which tests/conftest.py turns on where CUDA is absent
interpreted = pytest.mark.skipif(torch.cuda.is_available() and not kernels_interpreted(),
                                 reason="CPU tensors run the fused kernels only under TRITON_INTERPRET=1")


def out_of_order(cache: InferenceParams) -> int:
    """How many of the batch's sequences hold pages that do not ascend through the pool."""
    manager = cache.cache_manager
    return sum(pages != sorted(pages) for pages in map(manager.get_page_list, cache.sequences))


def _scrambled_cache(heads_kv: int, head_dim: int, dtype: torch.dtype, device: str) -> InferenceParams:
    """InferenceParams on FIFO pages, its free list reversed, so that each sequence's pages descend through the
    pool."""
    cache = InferenceParams(2, 256, heads_kv, head_dim, dtype, is_paged=True, page_size=PAGE, total_num_pages=40,
                            page_allocation="fifo", device=device)
    cache.allocate_memory(1)
    cache.cache_manager.allocator.free_pages.reverse()
    return cache


def check_new_rows(history: dict, seq: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, got: torch.Tensor,
                   tolerance: float, **reference: object) -> None:
    """Append a step's new ``k`` / ``v`` of sequence ``seq`` to ``history`` and check ``got``, its new rows of the
    output, against the fp32 causal (bottom-right) reference over the whole history; ``reference``: its window, ALiBi
    slopes and sink logits."""
    if seq in history:
        k, v = torch.cat([history[seq][0], k]), torch.cat([history[seq][1], v])
    history[seq] = (k, v)
    expected = reference_one_sequence(q, k, v, causal=True, bottom_right=True, **reference)
    assert torch.isfinite(got).all(), seq
    torch.testing.assert_close(got.float().reshape(expected.shape), expected, atol=tolerance, rtol=tolerance)


def run_steps(case: str, device: str, dtype: torch.dtype, heads: tuple[int, int], head_dim: int,
              tolerance: float) -> None:
    """Twenty steps after a prefill of 70 and 45 tokens (``mixed``: every third step sequence a brings a 20-token
    chunk beside b's decode; ``learnable`` / ``off-by-one``: that softmax, random sink logits for ``learnable``),
    through the fused backend; every new token checked against the fp32 reference over its logical history."""
    torch.manual_seed(0)
    (heads_q, heads_kv), window = heads, ((40, 0) if case == "window" else None)
    cache = _scrambled_cache(heads_kv, head_dim, dtype, device)
    softmax_type = case if case in ("learnable", "off-by-one") else "vanilla"
    module = DotProductAttention(heads_q, head_dim, num_gqa_groups=heads_kv, qkv_format="bshd",
                                 attn_mask_type="padding_causal", window_size=window, layer_number=1,
                                 backend="fused", softmax_type=softmax_type).to(device)
    sinks = None if softmax_type == "vanilla" else torch.zeros(heads_q, device=device)
    if softmax_type == "learnable":
        sinks = torch.randn(heads_q, device=device)
        with torch.no_grad():
            module.softmax_offset.copy_(sinks)
    slopes = torch.rand(heads_q, device=device) * 0.2 if case == "alibi" else None
    extra = {"core_attention_bias_type": "alibi", "alibi_slopes": slopes} if slopes is not None else {}
    history: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    scrambled = 0
    with torch.no_grad():
        for step in range(21):
            new = (70, 45) if step == 0 else (20 if case == "mixed" and step % 3 == 0 else 1, 1)
            cache.pre_step(OrderedDict(zip("ab", new)))
            scrambled += out_of_order(cache)
            q, new_k, new_v = (torch.randn(2, max(new), h, head_dim, dtype=dtype, device=device)
                               for h in (heads_q, heads_kv, heads_kv))
            out = module(q, new_k, new_v, inference_params=cache, **extra).view(2, max(new), heads_q, head_dim)
            for row, (seq, n) in enumerate(zip("ab", new)):
                check_new_rows(history, seq, q[row, :n], new_k[row, :n], new_v[row, :n], out[row, :n], tolerance,
                               window_size=window or (-1, -1), alibi_slopes=slopes, softmax_offset=sinks)
    assert scrambled > 0   # the steps read pages out of the pool's order


CASES = ["decodes", "mixed", "window", "alibi", "learnable", "off-by-one"]


@interpreted
@pytest.mark.parametrize("case", CASES)
def test_steps_over_scrambled_pages_match_the_reference(case):
    """Decodes, chunks beside them, a window, ALiBi, sinks (CPU, the Triton interpreter)."""
    run_steps(case, "cpu", torch.float16, (4, 2), 16, 2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_steps_over_scrambled_pages_match_the_reference_on_the_gpu(case):
    """The same on CUDA, bf16, GQA 32/8, d128: the GPU's decode kernels (Hopper's on sm90) and its mixed launches."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    run_steps(case, "cuda", torch.bfloat16, (32, 8), 128, 2e-2)


def random_trace(seed: int, fmt: str, device: str, dtype: torch.dtype, heads: tuple[int, int], head_dim: int,
                 tolerance: float, steps: int) -> int:
    """A serving trace over a scrambled FIFO pool through the fused backend: sequences join (prompts of 1-80
    tokens, anywhere in the batch), decode a token a step or bring a chunk of 2-40, finish; the batch order
    shuffled now and then, a step the pool cannot hold retried without its joins. Every new token is checked
    against the fp32 reference over its sequence's history. Returns how many steps held a sequence whose pages do
    not ascend through the pool."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    (heads_q, heads_kv), max_batch, max_seqlen = heads, 5, 192
    cache = InferenceParams(max_batch, max_seqlen, heads_kv, head_dim, dtype, is_paged=True, page_size=PAGE,
                            total_num_pages=40, page_allocation="fifo", device=device, qkv_format=fmt)
    cache.allocate_memory(1)
    free = cache.cache_manager.allocator.free_pages
    shuffled = list(free)
    rng.shuffle(shuffled)
    free.clear()
    free.extend(shuffled)
    module = DotProductAttention(heads_q, head_dim, num_gqa_groups=heads_kv, qkv_format=fmt,
                                 attn_mask_type="padding_causal", layer_number=1, backend="fused").to(device)
    history: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    live: dict[str, int] = {}
    scrambled, joined = 0, 0
    with torch.no_grad():
        for _ in range(steps):
            order = [seq for seq in live if rng.random() > 0.1 and live[seq] < max_seqlen - 40]
            if rng.random() < 0.3:
                rng.shuffle(order)
            step = OrderedDict((seq, 1 if rng.random() < 0.75 else rng.randint(2, 40)) for seq in order)
            for _ in range(rng.randint(0, max_batch - len(step))):
                items = list(step.items())
                items.insert(rng.randint(0, len(items)), (f"s{joined}", rng.randint(1, 80)))
                step, joined = OrderedDict(items), joined + 1
            for attempt in (step, OrderedDict((seq, n) for seq, n in step.items() if seq in live)):
                try:
                    cache.pre_step(attempt)
                    break
                except KVCacheFullError:
                    continue
            else:   # not even the live ones fit: the longest finishes
                longest = max(live, key=live.get)
                attempt = OrderedDict((seq, n) for seq, n in step.items() if seq in live and seq != longest)
                cache.pre_step(attempt)
            live = {seq: live.get(seq, 0) + n for seq, n in attempt.items()}
            if not attempt:
                continue
            scrambled += int(out_of_order(cache) > 0)
            new = {seq: [torch.randn(n, h, head_dim) for h in (heads_q, heads_kv, heads_kv)]
                   for seq, n in attempt.items()}
            out = module(*step_inputs(fmt, new, dtype, device), inference_params=cache)
            for seq, got in zip(new, step_rows(fmt, out.cpu(), list(attempt.values())), strict=True):
                check_new_rows(history, seq, *(t.to(dtype) for t in new[seq]), got, tolerance)
    return scrambled


@interpreted
def test_a_random_trace_over_scrambled_pages_matches_the_reference():
    """Joins, finishes, reorders, chunks beside decodes over a scrambled FIFO pool (CPU, the interpreter)."""
    assert random_trace(0, "thd", "cpu", torch.float16, (4, 2), 16, 2e-3, steps=12) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_random_trace_over_scrambled_pages_matches_the_reference_on_the_gpu(seed, fmt):
    """The same on CUDA, bf16, GQA 32/8, d128: the GPU's decode and mixed kernels."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert random_trace(seed, fmt, "cuda", torch.bfloat16, (32, 8), 128, 2e-2, steps=40) > 0
