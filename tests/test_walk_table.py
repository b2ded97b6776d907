"""PagedKVCacheManager.walk_table: each decoding sequence's pages ascending but the last, kept last, step after step;
and the fused backend reads it only where the order of the keys does not matter."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from attention.backends import fused
from attention.kernels.availability import interpreter_enabled
from inference import InferenceParams, KVCacheFullError, PagedKVCacheManager
from inference.paged_cache_manager import WALK_MIN_PAGE_SIZE, WALK_TAIL_FRACTION, SequenceWalk, walk_after_growth
from tests.cache_steps import step_inputs, step_rows
from tests.reference import reference_one_sequence

PAGE = 16
# the fused kernels run on CPU tensors only under the interpreter, which tests/conftest.py turns on where CUDA is absent
interpreted = pytest.mark.skipif(torch.cuda.is_available() and not interpreter_enabled(),
                                 reason="CPU tensors run the fused kernels only under TRITON_INTERPRET=1")


def manager(allocation: str, total_num_pages: int = 48, max_batch_size: int = 4,
            page_size: int = PAGE) -> PagedKVCacheManager:
    return PagedKVCacheManager(total_num_pages=total_num_pages, page_size=page_size, num_heads=1, head_dim_k=8,
                               dtype=torch.float16, max_batch_size=max_batch_size, max_seqlen=256,
                               page_allocation=allocation)


def is_walk_of(row: list[int], pages: list[int]) -> bool:
    """Whether ``row`` is a walk of ``pages`` from first principles: ``sorted(pages[:m]) + pages[m:-1] + pages[-1:]``
    for an ``m`` that leaves at most ``m // WALK_TAIL_FRACTION`` pages out of order (the ones gained since the sort)."""
    if row[-1:] != pages[-1:]:
        return False
    body, rest = row[:-1], pages[:-1]
    for m in range(len(rest), -1, -1):
        if len(rest) - m > m // WALK_TAIL_FRACTION:
            return False
        if body[m:] == rest[m:] and body[:m] == sorted(rest[:m]):
            return True
    return False


def assert_walk_table(m: PagedKVCacheManager) -> None:
    """walk_table against the batch: a one-token step's row a walk of its pages, another row its pages as they are,
    zeros past each row's pages and past the batch."""
    table = m.walk_table.tolist()
    for row, (seq_id, step_len) in enumerate(zip(m.sequences, m.step_lens)):
        pages = m.get_page_list(seq_id)
        held, padding = table[row][: len(pages)], table[row][len(pages):]
        assert (is_walk_of(held, pages) if step_len == 1 else held == pages), (row, held, pages)
        assert not any(padding), row
    assert not any(any(row) for row in table[len(m.sequences):])


def churn(m: PagedKVCacheManager, rng: random.Random) -> None:
    """Steps of other requests until the free list is shuffled: pages come back in the order requests end."""
    live: dict[str, int] = {}
    for step in range(40):
        for seq_id in rng.sample(sorted(live), k=len(live) // 3):
            del live[seq_id]
        while len(live) < m.max_batch_size and rng.random() < 0.7:
            live[f"old{step}-{len(live)}"] = rng.randint(1, 60)
        try:
            m.pre_step(OrderedDict((seq_id, n if seq_id not in m.sequences else rng.randint(1, 20))
                                   for seq_id, n in live.items()))
        except (KVCacheFullError, ValueError):
            live.clear()
            m.pre_step(OrderedDict())
    m.pre_step(OrderedDict())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_walk_table_follows_the_batch_step_after_step(seed):
    rng = random.Random(seed)
    m = manager("fifo")
    churn(m, rng)
    live: dict[str, int] = {}   # seq_id -> tokens
    sorted_rows_seen = 0
    for step in range(120):
        if live and rng.random() < 0.1:   # a sequence finishes: the rows after it move up
            del live[rng.choice(sorted(live))]
        if len(live) < m.max_batch_size and rng.random() < 0.2:
            live[f"s{step}"] = 0
        steps = OrderedDict()
        for seq_id, tokens in live.items():   # prefills, chunks of chunked prefill, decodes and verify steps
            steps[seq_id] = rng.choice([1, 1, 1, 1, 3, 20]) if tokens else rng.randint(1, 70)
        try:
            m.pre_step(steps)
        except (KVCacheFullError, ValueError):
            continue
        for seq_id, n in steps.items():
            live[seq_id] += n
        assert_walk_table(m)
        sorted_rows_seen += int(not torch.equal(m.walk_table, m.page_table))
    assert sorted_rows_seen > 0   # FIFO after churn: walks differ from the page table


@pytest.mark.parametrize("seed", [0, 1])
def test_a_walk_grows_with_its_sequence(seed):
    """A sequence's walk a page a step from 1 to 300 pages (and by several at once): always a walk of its pages,
    and unchanged before the column grow() names."""
    rng = random.Random(seed)
    pool = rng.sample(range(10_000), 400)
    walk, pages = SequenceWalk(pool[:1]), pool[:1]
    sorted_columns = 0
    while len(pages) < 300:
        before = walk.row(pages)
        pages = pool[: len(pages) + rng.choice([1, 1, 1, 3])]
        first_changed = walk.grow(pages)
        after = walk.row(pages)
        assert is_walk_of(after, pages)
        assert after[:first_changed] == before[:first_changed]
        assert walk.row(pages, first_changed) == after[first_changed:]
        sorted_columns = max(sorted_columns, len(walk.head))
    assert sorted_columns >= 250 and len(walk.tail) <= len(walk.head) // WALK_TAIL_FRACTION


@pytest.mark.parametrize("prompt, length", [(1, 40), (37, 600), (512, 4096), (1000, 4000)])
def test_walk_after_growth_is_the_walk_pre_step_keeps(prompt, length):
    """benchmarks.cells.Inputs.walk_table builds the FIFO cells' walks with walk_after_growth: it must equal the row
    pre_step keeps for a sequence prefilled with ``prompt`` tokens, then decoded a token a step to ``length``."""
    m = PagedKVCacheManager(total_num_pages=400, page_size=PAGE, num_heads=1, head_dim_k=8, dtype=torch.float16,
                            max_batch_size=1, max_seqlen=4096, page_allocation="fifo")
    m.pre_step(OrderedDict(old=250 * PAGE))   # a request that ends, so that its pages come back
    free = m.allocator.free_pages
    shuffled = list(free)
    random.Random(prompt).shuffle(shuffled)
    free.clear()
    free.extend(shuffled)
    m.pre_step(OrderedDict(a=prompt))
    for _ in range(length - prompt):
        m.pre_step(OrderedDict(a=1))
    pages = m.get_page_list("a")
    first_held = -(-(prompt + 1) // PAGE)
    assert m.walk_table[0, : len(pages)].tolist() == walk_after_growth(pages, min(len(pages), first_held))


def test_refused_step_leaves_the_walk_table_as_it_was():
    m = manager("fifo", total_num_pages=8)
    m.pre_step(OrderedDict(a=40, b=40))
    for _ in range(10):
        m.pre_step(OrderedDict(a=1, b=1))
    before = m.walk_table.clone()
    with pytest.raises(KVCacheFullError):
        m.pre_step(OrderedDict(a=1, b=1, c=200))
    assert torch.equal(m.walk_table, before)
    m.pre_step(OrderedDict(a=1, b=1))
    assert_walk_table(m)


class OwnSteps(PagedKVCacheManager):
    def pre_step(self, step_dict):
        return super().pre_step(step_dict)


class OwnTable(PagedKVCacheManager):
    def _write_page_table(self):
        super()._write_page_table()


class OwnAppend(PagedKVCacheManager):
    def step(self, *args):
        return super().step(*args)


def test_who_keeps_a_walk_table():
    fifo = manager("fifo")
    # the fused backend's launch plans key on page_table's metadata and serve the walk: the two must share it
    walk, table = fifo.walk_table, fifo.page_table
    assert (walk.shape, walk.stride(), walk.dtype, walk.device) == (table.shape, table.stride(), table.dtype,
                                                                    table.device)
    assert manager("runs").walk_table is None   # runs read about as fast, and the host is spared the walk
    assert manager("fifo", page_size=WALK_MIN_PAGE_SIZE // 2).walk_table is None


@pytest.mark.parametrize("subclass, keeps", [(OwnSteps, False), (OwnTable, False), (OwnAppend, True)])
def test_a_subclass_with_its_own_steps_keeps_no_walk_table(subclass, keeps):
    """A subclass's own pre_step or page-table writer would not keep the walk in step; other overrides leave it."""
    own = subclass(total_num_pages=8, page_size=PAGE, num_heads=1, head_dim_k=8, dtype=torch.float16,
                   max_batch_size=2, max_seqlen=64, page_allocation="fifo")
    assert (own.walk_table is not None) == keeps


def test_reset_clears_the_walk_table():
    m = manager("fifo")
    m.pre_step(OrderedDict(a=50))
    m.pre_step(OrderedDict(a=1))
    m.reset()
    assert not m.walk_table.any()
    m.pre_step(OrderedDict(b=20))
    assert_walk_table(m)


# ------------------------------------------------------------------------------------------------
# The module over a FIFO cache whose decodes read the walk
# ------------------------------------------------------------------------------------------------

def _scrambled_cache(heads_kv: int, head_dim: int, dtype: torch.dtype, device: str) -> InferenceParams:
    """InferenceParams on FIFO pages, its free list reversed by requests that end in turn, so decodes' pages descend."""
    cache = InferenceParams(2, 256, heads_kv, head_dim, dtype, is_paged=True, page_size=PAGE, total_num_pages=40,
                            page_allocation="fifo", device=device)
    cache.allocate_memory(1)
    for count in range(1, 9):   # eight requests of 1..8 pages end in turn, each freed page back to the list
        cache.pre_step(OrderedDict({f"old{count}": count * PAGE}))
    cache.pre_step(OrderedDict())
    return cache


def check_new_rows(history: dict, seq: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, got: torch.Tensor,
                   tolerance: float, **reference: object) -> None:
    """Append a step's new ``k`` / ``v`` of sequence ``seq`` to ``history`` and check ``got``, its new rows of the
    output, against the fp32 causal (bottom-right) reference over the whole history; ``reference``: its window and
    ALiBi slopes."""
    if seq in history:
        k, v = torch.cat([history[seq][0], k]), torch.cat([history[seq][1], v])
    history[seq] = (k, v)
    expected = reference_one_sequence(q, k, v, causal=True, bottom_right=True, **reference)
    assert torch.isfinite(got).all(), seq
    torch.testing.assert_close(got.float().reshape(expected.shape), expected, atol=tolerance, rtol=tolerance)


def run_steps(case: str, device: str, dtype: torch.dtype, heads: tuple[int, int], head_dim: int,
              tolerance: float) -> None:
    """Twenty steps after a prefill of 70 and 45 tokens (``mixed``: every third step sequence a brings a 20-token
    chunk beside b's decode, its row then in logical order), through the fused backend; every new token checked
    against the fp32 reference over its logical history."""
    torch.manual_seed(0)
    (heads_q, heads_kv), window = heads, ((40, 0) if case == "window" else None)
    cache = _scrambled_cache(heads_kv, head_dim, dtype, device)
    module = DotProductAttention(heads_q, head_dim, num_gqa_groups=heads_kv, qkv_format="bshd",
                                 attn_mask_type="padding_causal", window_size=window, layer_number=1,
                                 backend="fused").to(device)
    slopes = torch.rand(heads_q, device=device) * 0.2 if case == "alibi" else None
    extra = {"core_attention_bias_type": "alibi", "alibi_slopes": slopes} if slopes is not None else {}
    history: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    walked = 0
    with torch.no_grad():
        for step in range(21):
            new = (70, 45) if step == 0 else (20 if case == "mixed" and step % 3 == 0 else 1, 1)
            cache.pre_step(OrderedDict(zip("ab", new)))
            manager_ = cache.cache_manager
            walked += int(not torch.equal(manager_.walk_table[:2], manager_.page_table[:2]))
            q, new_k, new_v = (torch.randn(2, max(new), h, head_dim, dtype=dtype, device=device)
                               for h in (heads_q, heads_kv, heads_kv))
            out = module(q, new_k, new_v, inference_params=cache, **extra).view(2, max(new), heads_q, head_dim)
            for row, (seq, n) in enumerate(zip("ab", new)):
                check_new_rows(history, seq, q[row, :n], new_k[row, :n], new_v[row, :n], out[row, :n], tolerance,
                               window_size=window or (-1, -1), alibi_slopes=slopes)
    assert walked > 0   # the steps read pages out of order in the walk


CASES = ["decodes", "mixed", "window", "alibi"]


@interpreted
@pytest.mark.parametrize("case", CASES)
def test_steps_through_the_walk_match_the_reference(case):
    """Over scrambled pages the fused backend reads walk_table without a window or ALiBi and page_table with them (a
    position matters there): the outputs match the reference either way (CPU, the Triton interpreter)."""
    run_steps(case, "cpu", torch.float16, (4, 2), 16, 2e-3)


@interpreted
def test_mixed_steps_launch_over_the_walk(monkeypatch):
    """A mixed step (a chunk beside a decode) launches over the walk: the chunk's row is in logical order there."""
    mixed_launches = []
    choose = fused._walked_page_table

    def spy(call):
        table = choose(call)
        if call.max_seqlen_q > 1:
            mixed_launches.append(table is not call.page_table)
        return table

    monkeypatch.setattr(fused, "_walked_page_table", spy)
    run_steps("mixed", "cpu", torch.float16, (4, 2), 16, 2e-3)
    assert len(mixed_launches) == 7 and all(mixed_launches)   # the prefill, then every third step


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_steps_through_the_walk_match_the_reference_on_the_gpu(case):
    """The same on CUDA, bf16, GQA 32/8, d128: the GPU's decode kernels (Hopper's on sm90) and its mixed launches
    through the walk."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    run_steps(case, "cuda", torch.bfloat16, (32, 8), 128, 2e-2)


@interpreted
@pytest.mark.parametrize("qkv_format, attn_mask_type", [("bshd", "padding_causal"), ("thd", "padding")])
@pytest.mark.parametrize("softmax_type", ["vanilla", "learnable", "off-by-one"])
def test_decodes_read_the_walk_and_match_the_page_table_order(qkv_format, attn_mask_type, softmax_type, monkeypatch):
    """The fused backend launches over the walk for these decodes (sinks included: they carry no position), and the
    outputs match the same steps read through the page table."""
    launched_walks = []
    choose = fused._walked_page_table

    def spy(call):
        table = choose(call)
        launched_walks.append(table is not call.page_table)
        return table

    monkeypatch.setattr(fused, "_walked_page_table", spy)
    outputs = []
    for keep_walk in (True, False):
        torch.manual_seed(0)
        cache = _scrambled_cache(2, 16, torch.float16, "cpu")
        if not keep_walk:
            cache.cache_manager.walk_table = None   # (none kept from here: the backend reads page_table)
        module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format=qkv_format, attn_mask_type=attn_mask_type,
                                     layer_number=1, backend="fused", softmax_type=softmax_type)
        if softmax_type == "learnable":
            with torch.no_grad():
                module.softmax_offset.copy_(torch.randn_like(module.softmax_offset))
        steps = []
        with torch.no_grad():
            for step in range(12):
                new = (70, 45) if step == 0 else (1, 1)
                cache.pre_step(OrderedDict(zip("ab", new)))
                shape = (2, max(new)) if qkv_format == "bshd" else (sum(new),)
                q, k, v = (torch.randn(*shape, h, 16, dtype=torch.float16) for h in (4, 2, 2))
                steps.append(module(q, k, v, inference_params=cache))
        outputs.append(steps)
    assert any(launched_walks)
    for walked, logical in zip(*outputs):
        torch.testing.assert_close(walked, logical, atol=2e-3, rtol=2e-3)


def random_trace(seed: int, fmt: str, device: str, dtype: torch.dtype, heads: tuple[int, int], head_dim: int,
                 tolerance: float, steps: int) -> int:
    """A serving trace over a scrambled FIFO pool through the fused backend: sequences join (prompts of 1-80
    tokens, anywhere in the batch), decode a token a step or bring a chunk of 2-40, finish; the batch order
    shuffled now and then, a step the pool cannot hold retried without its joins. Every new token is checked
    against the fp32 reference over its sequence's history. Returns how many steps launched over a walk that
    differs from the page table (rows of the batch)."""
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
    walked, joined = 0, 0
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
            manager_ = cache.cache_manager
            rows = len(attempt)
            walked += int(not torch.equal(manager_.walk_table[:rows], manager_.page_table[:rows]))
            new = {seq: [torch.randn(n, h, head_dim) for h in (heads_q, heads_kv, heads_kv)]
                   for seq, n in attempt.items()}
            out = module(*step_inputs(fmt, new, dtype, device), inference_params=cache)
            for seq, got in zip(new, step_rows(fmt, out.cpu(), list(attempt.values())), strict=True):
                check_new_rows(history, seq, *(t.to(dtype) for t in new[seq]), got, tolerance)
    return walked


@interpreted
def test_a_random_trace_through_the_walk_matches_the_reference():
    """Joins, finishes, reorders, chunks beside decodes over a scrambled FIFO pool (CPU, the interpreter)."""
    assert random_trace(0, "thd", "cpu", torch.float16, (4, 2), 16, 2e-3, steps=12) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_random_trace_through_the_walk_matches_the_reference_on_the_gpu(seed, fmt):
    """The same on CUDA, bf16, GQA 32/8, d128: the GPU's decode and mixed kernels over the walk."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert random_trace(seed, fmt, "cuda", torch.bfloat16, (32, 8), 128, 2e-2, steps=40) > 0
