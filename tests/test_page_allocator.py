"""The page allocators: TE's FIFO free list and the run allocator (a sequence's pages in runs of neighbouring ids)."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
import torch

from inference import InferenceParams, KVCacheFullError, PageAllocator, RunPageAllocator
from inference import page_allocator as page_allocator_module
from inference.page_allocator import run_pages_for


def runs_spanned(pages: list[int], run_pages: int) -> int:
    return len({page // run_pages for page in pages})


def lockstep_decode(allocator: PageAllocator, sequences: int, prompt_pages: int, pages: int) -> dict[int, list[int]]:
    """Admit ``sequences`` prompts of ``prompt_pages`` pages, then grow them a page at a time side by side (a
    batch of decodes) to ``pages`` pages each."""
    for seq in range(sequences):
        allocator.allocate(seq, prompt_pages)
    for _ in range(prompt_pages, pages):
        for seq in range(sequences):
            allocator.allocate(seq, 1)
    return {seq: allocator.pages_of(seq) for seq in range(sequences)}


def test_runs_keep_a_decode_batch_s_pages_together():
    run_pages = 8
    runs = lockstep_decode(RunPageAllocator(256, run_pages), sequences=6, prompt_pages=3, pages=24)
    fifo = lockstep_decode(PageAllocator(256), sequences=6, prompt_pages=3, pages=24)
    for seq, pages in runs.items():
        assert runs_spanned(pages, run_pages) == 3, (seq, pages)   # 24 pages: three whole runs
        assert all(b - a == 1 for a, b in zip(pages, pages[1:]) if a // run_pages == b // run_pages)
    # FIFO deals the decodes' pages round-robin: after the prompts every page lands in another run
    assert all(runs_spanned(pages, run_pages) >= 12 for pages in fifo.values())


def test_runs_prefer_own_run_then_whole_runs_then_any_free_page():
    allocator = RunPageAllocator(10, run_pages=4)     # runs [0-3] [4-7] [8-9]
    allocator.allocate("a", 2)
    assert allocator.pages_of("a") == [0, 1]
    allocator.allocate("b", 1)
    assert allocator.pages_of("b") == [4]             # a wholly free run, not a's
    allocator.allocate("a", 3)
    assert allocator.pages_of("a") == [0, 1, 2, 3, 8]  # a's run, then the next whole one
    allocator.allocate("c", 4)
    assert allocator.pages_of("c") == [5, 6, 7, 9]    # no whole run left: the lowest with a free page
    assert allocator.num_free == 0
    allocator.free("b")
    allocator.allocate("d", 1)
    assert allocator.pages_of("d") == [4]


def test_a_freed_run_is_handed_out_whole_again():
    allocator = RunPageAllocator(12, run_pages=4)
    allocator.allocate("a", 4)
    allocator.allocate("b", 4)
    allocator.free("a")
    allocator.allocate("c", 1)
    allocator.allocate("d", 1)
    assert allocator.pages_of("c") == [0] and allocator.pages_of("d") == [8]


@pytest.mark.parametrize("make", [lambda: PageAllocator(7), lambda: RunPageAllocator(7, run_pages=3)],
                         ids=["fifo", "runs"])
def test_a_refused_allocation_changes_nothing(make):
    allocator = make()
    allocator.allocate("a", 5)
    before = (list(allocator.free_pages), {k: list(v) for k, v in allocator.allocated_pages.items()})
    with pytest.raises(KVCacheFullError) as error:
        allocator.allocate("b", 3)
    assert (error.value.pages_needed, error.value.pages_free) == (3, 2)
    assert (list(allocator.free_pages), allocator.allocated_pages) == before
    allocator.allocate("b", 2)   # every free page can still be handed out
    assert allocator.num_free == 0


@pytest.mark.parametrize("run_pages", [1, 3, 8])
def test_random_traffic_keeps_the_books(run_pages):
    """Random admissions, growth and finishes: no page shared or lost, the count of free pages right, the run
    heaps bounded by the number of runs."""
    rng = random.Random(run_pages)
    total = 40
    allocator = RunPageAllocator(total, run_pages)
    for _ in range(2000):
        live = list(allocator.allocated_pages)
        if live and rng.random() < 0.25:
            allocator.free(rng.choice(live))
        else:
            seq = rng.choice(live) if live and rng.random() < 0.7 else rng.randrange(10**6)
            want = rng.randint(1, 4)
            if want <= allocator.num_free:
                allocator.allocate(seq, want)
            else:
                with pytest.raises(KVCacheFullError):
                    allocator.allocate(seq, want)
        owned = [page for pages in allocator.allocated_pages.values() for page in pages]
        assert len(owned) == len(set(owned))
        assert sorted(owned + allocator.free_pages) == list(range(total))
        assert allocator.num_free == total - len(owned)
        runs = -(-total // run_pages)
        assert len(allocator._ranked) <= 4 * runs + 65
    allocator.reset()
    assert allocator.num_free == total and allocator.allocated_pages == {}


class _ScanningRuns:
    """RunPageAllocator's rule by a scan of every run at each page (the reference for its heap)."""

    def __init__(self, total: int, run_pages: int) -> None:
        self.run_pages, self.total = run_pages, total
        self.free = [set(range(r, min(r + run_pages, total))) for r in range(0, total, run_pages)]
        self.pages: dict[int, list[int]] = {}

    def allocate(self, seq: int, count: int) -> None:
        pages = self.pages.setdefault(seq, [])
        for _ in range(count):
            run = pages[-1] // self.run_pages if pages else -1
            if run < 0 or not self.free[run]:
                sizes = [min(self.run_pages, self.total - r * self.run_pages) for r in range(len(self.free))]
                run = min((len(f) < size, -len(f), r) for r, (f, size) in enumerate(zip(self.free, sizes)) if f)[2]
            page = min(self.free[run])
            self.free[run].remove(page)
            pages.append(page)

    def release(self, seq: int) -> None:
        for page in self.pages.pop(seq, ()):
            self.free[page // self.run_pages].add(page)


@pytest.mark.parametrize("run_pages", [1, 3, 8])
def test_random_traffic_hands_out_the_pages_the_rule_names(run_pages):
    """Under random admissions, growth and finishes, each sequence gets exactly the pages a scan of every run by
    the class's rule would give it (its heap of ranked runs is only a faster way to the same answer)."""
    rng = random.Random(100 + run_pages)
    total = 40
    allocator, reference = RunPageAllocator(total, run_pages), _ScanningRuns(total, run_pages)
    for _ in range(3000):
        live = list(allocator.allocated_pages)
        if live and rng.random() < 0.3:
            seq = rng.choice(live)
            allocator.free(seq)
            reference.release(seq)
        else:
            seq = rng.choice(live) if live and rng.random() < 0.7 else rng.randrange(10**6)
            want = rng.randint(1, 4)
            if want <= allocator.num_free:
                allocator.allocate(seq, want)
                reference.allocate(seq, want)
        assert allocator.allocated_pages == reference.pages


def test_run_pages_for_a_cache_page():
    assert run_pages_for(16 * 8 * 128 * 2) == 64       # 32 KiB pages
    assert run_pages_for(256 * 32 * 128 * 2) == 1      # 2 MiB pages: one a run
    assert run_pages_for(4 << 20) == 1


@pytest.mark.parametrize("page_allocation, expected", [(None, RunPageAllocator), ("runs", RunPageAllocator),
                                                       ("fifo", PageAllocator)])
def test_inference_params_picks_the_allocator(page_allocation, expected):
    params = InferenceParams(2, 4096, num_heads_kv=8, head_dim_k=128, dtype=torch.bfloat16, is_paged=True,
                             page_size=16, page_allocation=page_allocation, device="cpu")
    allocator = params.cache_manager.allocator
    assert type(allocator) is expected
    if expected is RunPageAllocator:
        assert allocator.run_pages == 64                # 2 MiB of 16-token pages of 8 heads x d128 (bf16)


def test_page_allocation_is_checked():
    with pytest.raises(ValueError, match="page_allocation must be one of"):
        InferenceParams(2, 64, num_heads_kv=2, head_dim_k=8, dtype=torch.float32, is_paged=True, page_size=4,
                        page_allocation="lifo", device="cpu")
    with pytest.raises(ValueError, match="page_allocation is for is_paged=True only"):
        InferenceParams(2, 64, num_heads_kv=2, head_dim_k=8, dtype=torch.float32, page_allocation="runs",
                        device="cpu")


def test_a_decode_batch_through_inference_params_reads_runs(monkeypatch):
    """Through InferenceParams and its page table: prompts, then decodes side by side; each sequence's pages fill
    runs of their own (runs of 4 pages here: the translation span shrunk to fit the tiny cache)."""
    monkeypatch.setattr(page_allocator_module, "TRANSLATION_BYTES", 4 * 4 * 2 * 8 * 4)  # 4 pages of 256 B
    params = InferenceParams(3, 64, num_heads_kv=2, head_dim_k=8, dtype=torch.float32, is_paged=True, page_size=4,
                             device="cpu")
    params.allocate_memory(1)
    assert params.cache_manager.allocator.run_pages == 4
    steps = [OrderedDict({seq: 6 for seq in "abc"})] + [OrderedDict({seq: 1 for seq in "abc"})] * 26
    for step in steps:
        params.pre_step(step)
    table = params.cache_manager.page_table
    for row, seq in enumerate("abc"):
        pages = params.cache_manager.get_page_list(seq)
        assert len(pages) == 8 and table[row, :8].tolist() == pages
        assert runs_spanned(pages, 4) <= 3, pages
