"""InferenceParams and the cache managers: bookkeeping, page accounting and refused calls."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping

import pytest
import torch

from inference import (
    InferenceParams,
    KVCacheFullError,
    KVCacheManager,
    NonPagedKVCacheManager,
    PagedKVCacheManager,
)
from inference import inference_params as inference_params_module
from tests.reference import reference_one_sequence

HEADS_KV, HEAD_DIM_K, HEAD_DIM_V = 2, 8, 4


def make_params(paging: str, **overrides) -> InferenceParams:
    """``paging``: "non-paged", "paged" (page 4, full pages) or "oversubscribed" (page 4, 6 pages)."""
    kwargs = dict(max_batch_size=3, max_sequence_length=16, num_heads_kv=HEADS_KV,
                  head_dim_k=HEAD_DIM_K, dtype=torch.float32, head_dim_v=HEAD_DIM_V, device="cpu")
    if paging != "non-paged":
        kwargs.update(is_paged=True, page_size=4)
    if paging == "oversubscribed":
        kwargs.update(total_num_pages=6)
    kwargs.update(overrides)
    params = InferenceParams(**kwargs)
    for layer_number in (1, 2):
        params.allocate_memory(layer_number)
    return params


def new_kv(qkv_format: str, step_lens: list[int], dtype=torch.float32):
    shape = {"bshd": (len(step_lens), max(step_lens)), "sbhd": (max(step_lens), len(step_lens)),
             "thd": (sum(step_lens),)}[qkv_format]
    return torch.randn(*shape, HEADS_KV, HEAD_DIM_K).to(dtype), torch.randn(*shape, HEADS_KV, HEAD_DIM_V).to(dtype)


def run_step(params: InferenceParams, step_dict: dict, qkv_format: str = "bshd"):
    params.pre_step(OrderedDict(step_dict))
    new_k, new_v = new_kv(qkv_format, list(step_dict.values()))
    for layer_number in (1, 2):
        params.step(layer_number, new_k, new_v, qkv_format)
    return new_k, new_v


def snapshot(params: InferenceParams) -> dict:
    """Everything a refused call must leave untouched."""
    manager = params.cache_manager
    state = {
        "caches": {layer: (k.clone(), v.clone()) for layer, (k, v) in manager.cache.items()},
        "sequences": copy.deepcopy((params.sequences, params.sequences_pre_step, manager.sequences)),
        "buffers": [t.clone() for t in (params.cu_seqlens_q, params.cu_seqlens_kv, params.pre_step_seqlens)],
        "batch_size": params.batch_size,
    }
    if params.is_paged:
        state["pages"] = (manager.page_table.clone(), list(manager.allocator.free_pages),
                          copy.deepcopy(manager.allocator.allocated_pages))
    return state


def assert_unchanged(params: InferenceParams, before: dict) -> None:
    after = snapshot(params)
    for layer, (k, v) in before["caches"].items():
        assert torch.equal(after["caches"][layer][0], k) and torch.equal(after["caches"][layer][1], v)
    assert after["sequences"] == before["sequences"]
    for a, b in zip(after["buffers"], before["buffers"]):
        assert torch.equal(a, b)
    assert after["batch_size"] == before["batch_size"]
    if "pages" in before:
        assert torch.equal(after["pages"][0], before["pages"][0])
        assert after["pages"][1:] == before["pages"][1:]


def test_pre_step_writes_te_metadata():
    params = make_params("non-paged")
    params.pre_step(OrderedDict({"a": 5, "b": 2}))
    params.pre_step(OrderedDict({"a": 1, "b": 3, "c": 4}))
    assert params.sequences == OrderedDict({"a": 6, "b": 5, "c": 4})
    assert params.sequences_pre_step == OrderedDict({"a": 5, "b": 2, "c": 0})
    assert params.batch_size == 3
    assert params.cu_seqlens_q.tolist() == [0, 1, 4, 8]
    assert params.cu_seqlens_kv.tolist() == [0, 6, 11, 15]
    assert params.get_seqlens_pre_step().tolist() == [5, 2, 0]
    params.pre_step(OrderedDict({"c": 2}))
    assert params.cu_seqlens_q.tolist() == [0, 2, 2, 2]  # the tail repeats the last value
    assert params.cu_seqlens_q.dtype == torch.int32
    assert params.sequences_pre_step == OrderedDict({"c": 4})   # built on first read, again after each step
    params.reset()
    assert params.sequences_pre_step == OrderedDict()


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("paging", ["non-paged", "paged"])
def test_step_returns_te_tuple(paging, qkv_format):
    params = make_params(paging)
    params.pre_step(OrderedDict({"a": 3, "b": 1}))
    new_k, new_v = new_kv(qkv_format, [3, 1])
    k_cache, v_cache, cu_q, cu_kv, max_len, output_format = params.step(1, new_k, new_v, qkv_format)
    assert cu_q is params.cu_seqlens_q and cu_kv is params.cu_seqlens_kv and max_len == 16
    assert output_format == {"bshd": "bshd", "sbhd": "sbhd_2bshd", "thd": "thd_2bshd"}[qkv_format]
    if paging == "paged":
        assert k_cache.shape == (12, 4, HEADS_KV, HEAD_DIM_K) and v_cache.shape[-1] == HEAD_DIM_V
    else:
        rows = 3 if qkv_format == "thd" else 2
        assert k_cache.shape == (rows, 16, HEADS_KV, HEAD_DIM_K) and v_cache.shape[-1] == HEAD_DIM_V


@pytest.mark.parametrize("paging", ["non-paged", "paged", "oversubscribed"])
def test_caches_hold_each_sequences_history(paging):
    """Finish, admit and chunk sequences, then read every history back through the converter."""
    params = make_params(paging)
    history: dict[str, list[torch.Tensor]] = {}
    for step_dict in ({"a": 5, "b": 2}, {"a": 1, "b": 3, "c": 2}, {"b": 1, "c": 4}, {"c": 1, "d": 3, "b": 2}):
        new_k, _ = run_step(params, step_dict)
        for row, (seq_id, step_len) in enumerate(step_dict.items()):
            history.setdefault(seq_id, []).append(new_k[row, :step_len])
        k_pages, v_pages = params.convert_paged_to_nonpaged(2)
        assert k_pages.shape == (len(step_dict), 16, HEADS_KV, HEAD_DIM_K)
        assert v_pages.shape == (len(step_dict), 16, HEADS_KV, HEAD_DIM_V)
        for row, seq_id in enumerate(step_dict):
            expected = torch.cat(history[seq_id])
            assert torch.equal(k_pages[row, : len(expected)], expected), (seq_id, step_dict)


def check_page_accounting(params: InferenceParams) -> None:
    manager = params.cache_manager
    owned = [page for pages in manager.allocator.allocated_pages.values() for page in pages]
    free = list(manager.allocator.free_pages)
    assert len(set(owned)) == len(owned), "a page is shared"
    assert sorted(owned + free) == list(range(manager.total_num_pages)), "a page leaked"
    for row, (seq_id, length) in enumerate(params.sequences.items()):
        pages = manager.get_page_list(seq_id)
        assert len(pages) == -(-length // manager.page_size)
        assert manager.page_table[row, : len(pages)].tolist() == pages


@pytest.mark.parametrize("page_allocation", ["runs", "fifo"])
def test_the_page_table_is_exactly_the_batch_s_pages_under_random_traffic(page_allocation):
    """Sequences admitted, grown, reordered and finished at random: after every pre_step the device page table is
    row r = the pages of the r-th sequence, zeros after them, and zeros in the rows past the batch (the manager
    rewrites only what changed)."""
    import random

    rng = random.Random(7)
    params = make_params("paged", max_batch_size=6, max_sequence_length=40, page_allocation=page_allocation)
    manager = params.cache_manager
    next_id = 0
    for _ in range(300):
        live = [seq for seq, length in params.sequences.items() if length < 36 and rng.random() < 0.85]
        rng.shuffle(live)
        while len(live) < 6 and rng.random() < 0.4:
            live.append(next_id)
            next_id += 1
        step = OrderedDict((seq, min(rng.choice((1, 1, 1, 3, 5)), 40 - params.sequences.get(seq, 0))) for seq in live)
        params.pre_step(step)
        expected = torch.zeros_like(manager.page_table)
        for row, seq in enumerate(step):
            pages = manager.get_page_list(seq)
            expected[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        assert torch.equal(manager.page_table, expected)


def test_pages_are_allocated_on_demand_and_returned():
    params = make_params("oversubscribed")
    for step_dict in ({"a": 5, "b": 4}, {"a": 4, "b": 1}, {"b": 3, "c": 1}, {"c": 7}, {}):
        params.pre_step(OrderedDict(step_dict))
        check_page_accounting(params)
    assert params.cache_manager.allocator.num_free == 6


def test_kv_cache_full_error_names_the_numbers_and_changes_nothing():
    params = make_params("oversubscribed")
    run_step(params, {"a": 9, "b": 4})  # 3 + 1 pages of 6
    before = snapshot(params)
    with pytest.raises(KVCacheFullError) as error:
        params.pre_step(OrderedDict({"a": 1, "b": 1, "c": 9}))  # needs 1 + 0 + 3
    assert (error.value.pages_needed, error.value.pages_free) == (4, 2)
    assert "4" in str(error.value) and "2" in str(error.value)
    assert_unchanged(params, before)
    params.pre_step(OrderedDict({"a": 1, "c": 5}))  # b finishes: its page pays for c
    check_page_accounting(params)


@pytest.mark.parametrize("paging", ["non-paged", "paged", "oversubscribed"])
@pytest.mark.parametrize(
    "step_dict, message",
    [
        ({"a": 1, "b": 1, "c": 1, "d": 1}, "max_batch_size"),
        ({"a": 12}, "max_sequence_length"),
        ({"a": 0}, ">= 1"),
        ({"a": -2}, ">= 1"),
        ({"a": 1.5}, "int"),
        ({"a": True}, r"step_dict\['a'\] must be an int number of new tokens, got True"),
        ({"a": 1, "z": 17}, "max_sequence_length"),
    ],
    ids=["batch", "too-long", "zero", "negative", "float", "bool", "new-too-long"],
)
def test_refused_pre_step_changes_nothing(paging, step_dict, message):
    params = make_params(paging)
    run_step(params, {"a": 5, "b": 2})
    before = snapshot(params)
    with pytest.raises(ValueError, match=message):
        params.pre_step(OrderedDict(step_dict))
    assert_unchanged(params, before)


class _RepeatingMapping(Mapping):
    """A Mapping whose keys repeat one id (a dict's cannot): pre_step took it as a batch of two with one sequence."""

    def __getitem__(self, seq_id):
        return 1

    def __iter__(self):
        return iter(["a", "a"])

    def __len__(self):
        return 2


@pytest.mark.parametrize("paging", ["non-paged", "paged"])
def test_a_step_listing_a_sequence_twice_is_refused(paging):
    params = make_params(paging)
    run_step(params, {"a": 5, "b": 2})
    before = snapshot(params)
    with pytest.raises(ValueError, match="more than once"):
        params.pre_step(_RepeatingMapping())
    assert_unchanged(params, before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_a_cuda_device_without_cuda_is_refused_by_name():
    """torch's own AssertionError ("Torch not compiled with CUDA enabled") came from deep in the first allocation."""
    with pytest.raises(ValueError, match=r"device='cuda' needs CUDA, and torch.cuda.is_available\(\) is False"):
        InferenceParams(2, 32, 2, 16, torch.float16, device="cuda")


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, "float16"])
def test_the_cache_dtype_must_be_a_floating_point_dtype(dtype):
    """An integer cache was accepted, and the first step's error then blamed key_layer's dtype."""
    with pytest.raises(ValueError, match=rf"dtype must be a floating-point torch.dtype \(the K/V caches' element "
                                         rf"type\), got {dtype!r}"):
        InferenceParams(2, 32, 2, 16, dtype, device="cpu")


def test_step_past_max_ctx_len_is_refused():
    params = make_params("non-paged", max_ctx_len=4)
    with pytest.raises(ValueError, match="max_ctx_len"):
        params.pre_step(OrderedDict({"a": 5}))


@pytest.mark.parametrize("paging", ["non-paged", "paged"])
@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown-layer", "layer_number=7"),
        ("dtype", "dtype"),
        ("heads", "heads"),
        ("head-dim-k", "head dim"),
        ("head-dim-v", "head dim"),
        ("too-few-positions", "token positions"),
        ("too-few-rows", "batch size"),
        ("format", "qkv_format"),
        ("ndim", "4-D"),
        ("not-a-tensor", "new_v must be a torch.Tensor"),
        ("device", "new_k is on meta"),
        ("k-v-disagree", "must agree on all dims but the last"),
    ],
)
def test_refused_step_changes_nothing(paging, case, message):
    params = make_params(paging)
    run_step(params, {"a": 5, "b": 2})
    params.pre_step(OrderedDict({"a": 3, "b": 1}))
    new_k, new_v = new_kv("bshd", [3, 1])
    layer_number, qkv_format = 1, "bshd"
    if case == "unknown-layer":
        layer_number = 7
    elif case == "dtype":
        new_k, new_v = new_k.half(), new_v.half()
    elif case == "heads":
        new_k = torch.randn(2, 3, HEADS_KV + 1, HEAD_DIM_K)
    elif case == "head-dim-k":
        new_k = torch.randn(2, 3, HEADS_KV, HEAD_DIM_K + 1)
    elif case == "head-dim-v":
        new_v = torch.randn(2, 3, HEADS_KV, HEAD_DIM_V * 2)
    elif case == "too-few-positions":
        new_k, new_v = new_k[:, :2], new_v[:, :2]
    elif case == "too-few-rows":
        new_k, new_v = new_k[:1], new_v[:1]
    elif case == "format":
        qkv_format = "bhsd"
    elif case == "ndim":
        new_k, new_v = new_k[0], new_v[0]
    elif case == "not-a-tensor":
        new_v = new_v.tolist()
    elif case == "device":
        new_k = new_k.to("meta")
    elif case == "k-v-disagree":
        new_v = torch.randn(2, 4, HEADS_KV, HEAD_DIM_V)
    before = snapshot(params)
    with pytest.raises(ValueError, match=message):
        params.step(layer_number, new_k, new_v, qkv_format)
    assert_unchanged(params, before)


def test_thd_step_must_hold_every_new_token():
    params = make_params("paged")
    params.pre_step(OrderedDict({"a": 3, "b": 2}))
    new_k, new_v = new_kv("thd", [3, 1])
    with pytest.raises(ValueError, match="5"):
        params.step(1, new_k, new_v, "thd")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_batch_size=0), "max_batch_size"),
        (dict(head_dim_k=2.0), "head_dim_k"),
        (dict(num_heads_kv=True), "num_heads_kv"),
        (dict(max_ctx_len="4"), "max_ctx_len"),
        (dict(is_paged=True, page_size=2, total_num_pages=-1), "total_num_pages"),
        (dict(dtype="float32"), "dtype"),
        (dict(qkv_format="bsd"), "qkv_format"),
        (dict(is_paged=True), "page_size"),
        (dict(is_paged=True, page_size=0), "page_size"),
        (dict(custom_cache_manager=dict), "custom_cache_manager"),
        (dict(device="tpu"), "device must be a torch.device or its name"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, message):
    base = dict(max_batch_size=2, max_sequence_length=8, num_heads_kv=1, head_dim_k=4, dtype=torch.float32)
    with pytest.raises(ValueError, match=message):
        InferenceParams(**{**base, **kwargs})


def test_paging_sizes_are_ignored_without_paging():
    """TE ignores page_size / total_num_pages when is_paged=False (a config that turns paging off keeps passing
    them): so do we, with a warning."""
    with pytest.warns(UserWarning, match="total_num_pages and page_size are ignored with is_paged=False") as record:
        params = InferenceParams(2, 8, 1, 4, torch.float32, page_size=4, total_num_pages=4, device="cpu")
    assert record[0].filename == __file__
    assert (params.is_paged, params.page_size, params.total_num_pages) == (False, None, None)
    assert not hasattr(params.cache_manager, "page_table")


def test_a_cache_manager_written_for_te_builds_and_runs():
    """TE's KVCacheManager.__init__ takes no arguments: a subclass written for TE calls super().__init__() and keeps
    its sizes itself. It builds here too, and a decode through DotProductAttention reads what it wrote."""
    from attention import DotProductAttention

    class Simple(KVCacheManager):
        def __init__(self, max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v=None):
            super().__init__()
            self.shape = (max_batch_size, max_seqlen, num_heads)
            self.head_dims = (head_dim_k, head_dim_v or head_dim_k)

        def allocate_memory(self, layer_number):
            self.cache[layer_number] = tuple(torch.zeros(*self.shape, d) for d in self.head_dims)

        def pre_step(self, step_dict):
            self.sequences = OrderedDict((seq, self.sequences.get(seq, 0) + n) for seq, n in step_dict.items())
            return self.sequences

        def step(self, layer_number, new_k, new_v, cu_new_seqlens, cu_cached_seqlens, qkv_format):
            k_cache, v_cache = self.cache[layer_number]
            for row in range(len(self.sequences)):
                n = int(cu_new_seqlens[row + 1] - cu_new_seqlens[row])
                end = int(cu_cached_seqlens[row + 1] - cu_cached_seqlens[row])
                k_cache[row, end - n : end], v_cache[row, end - n : end] = new_k[row, :n], new_v[row, :n]
            return k_cache[: new_k.shape[0]], v_cache[: new_k.shape[0]]

    params = InferenceParams(1, 16, 2, 8, torch.float32, custom_cache_manager=Simple, device="cpu")
    params.allocate_memory(1)
    module = DotProductAttention(4, 8, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="unfused")
    keys, values = [], []
    for n in (3, 1):
        params.pre_step(OrderedDict(a=n))
        q, k, v = torch.randn(1, n, 4, 8), torch.randn(1, n, 2, 8), torch.randn(1, n, 2, 8)
        keys.append(k[0])
        values.append(v[0])
        with torch.no_grad():
            out = module(q, k, v, inference_params=params)
    expected = reference_one_sequence(q[0], torch.cat(keys), torch.cat(values), causal=True, bottom_right=True)
    torch.testing.assert_close(out[0].reshape(expected.shape), expected)


@pytest.mark.parametrize("layer_number", ["1", 1.0, -1, True, None])
def test_allocate_memory_takes_int_layer_numbers_only(layer_number):
    """A module's layer_number is an int >= 0: a cache kept under "1" or 1.0 was allocated silently and never found."""
    params = InferenceParams(2, 8, 1, 4, torch.float32)
    with pytest.raises(ValueError, match="layer_number must be an int >= 0"):
        params.allocate_memory(layer_number)
    assert not params.cache_manager.cache
    params.allocate_memory(0)
    assert list(params.cache_manager.cache) == [0]


def test_numpy_step_lengths_are_taken_as_ints():
    """Step lengths a scheduler computed with numpy (or as 0-d tensors) run the step they say, stored as ints."""
    numpy = pytest.importorskip("numpy")
    params, plain = make_params("paged"), make_params("paged")
    for step in ({"a": 5, "b": 2}, {"a": 1, "b": 3}):
        params.pre_step(OrderedDict({"a": numpy.int64(step["a"]), "b": torch.tensor(step["b"])}))
        plain.pre_step(OrderedDict(step))
        assert params.step_dict == plain.step_dict and params.step_tokens == plain.step_tokens
        assert all(type(n) is int for n in (*params.step_dict.values(), params.step_tokens, params.longest_step))
        torch.testing.assert_close(params.cu_seqlens_q, plain.cu_seqlens_q)
        torch.testing.assert_close(params.cu_seqlens_kv, plain.cu_seqlens_kv)
    assert params.sequences == plain.sequences


def test_numpy_integer_sizes_are_taken_as_ints():
    """Sizes computed with numpy (a scheduler's arithmetic) build the same cache, and are stored as Python ints."""
    numpy = pytest.importorskip("numpy")
    params = InferenceParams(*map(numpy.int64, (2, 10, 1, 4)), torch.float32, is_paged=True,
                             page_size=numpy.int32(4), total_num_pages=numpy.int64(6), max_ctx_len=numpy.int64(5))
    sizes = (params.max_batch_size, params.max_sequence_length, params.num_heads_kv, params.head_dim_k,
             params.head_dim_v, params.page_size, params.total_num_pages, params.max_ctx_len)
    assert sizes == (2, 10, 1, 4, 4, 4, 6, 5) and all(type(size) is int for size in sizes)
    assert params.cache_manager.page_table.shape == (2, 3)


def test_defaults_follow_te():
    params = InferenceParams(2, 10, 1, 4, torch.float16, is_paged=True, page_size=4)
    assert params.total_num_pages == 2 * 3 and params.head_dim_v == 4
    assert params.cache_manager.page_table.shape == (2, 3)
    assert params.max_ctx_len == 10
    assert params.device == (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                             else torch.device("cpu"))
    assert isinstance(params.cache_manager, PagedKVCacheManager)
    assert isinstance(InferenceParams(2, 10, 1, 4, torch.float16).cache_manager, NonPagedKVCacheManager)


def test_custom_cache_manager_class_is_used():
    class CountingManager(NonPagedKVCacheManager):
        pre_steps = 0

        def pre_step(self, step_dict):
            CountingManager.pre_steps += 1
            return super().pre_step(step_dict)

    params = InferenceParams(2, 8, 1, 4, torch.float32, custom_cache_manager=CountingManager)
    params.pre_step(OrderedDict({0: 2}))
    assert CountingManager.pre_steps == 1 and isinstance(params.cache_manager, KVCacheManager)


@pytest.mark.parametrize("paging", ["non-paged", "paged"])
def test_a_step_is_validated_once(paging, monkeypatch):
    """InferenceParams validated each step (with max_ctx_len) and its manager validated it again (~9 µs of a
    64-sequence pre_step's ~90 on the CPU): ours now take the validated lengths. A manager whose pre_step takes only
    the step still validates it itself, and every refusal still comes first."""
    from inference import cache_manager, non_paged_cache_manager, paged_cache_manager

    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return cache_manager.validate_step_dict(*args, **kwargs)

    for module in (non_paged_cache_manager, paged_cache_manager):
        monkeypatch.setattr(module, "validate_step_dict", counted)
    monkeypatch.setattr(inference_params_module, "validate_step_dict", counted)
    params = make_params(paging, max_ctx_len=4)
    params.pre_step(OrderedDict({"a": 3, "b": 1}))
    params.pre_step(OrderedDict({"a": 1, "b": 1, "c": 4}))
    assert len(calls) == 2
    assert params.sequences == OrderedDict({"a": 4, "b": 2, "c": 4})
    before = snapshot(params)
    with pytest.raises(ValueError, match="exceeds max_ctx_len = 4"):
        params.pre_step(OrderedDict({"a": 5}))
    assert_unchanged(params, before)
    params.cache_manager.pre_step(OrderedDict({"a": 1}))   # driven directly: it validates the step itself
    assert len(calls) == 4


def test_a_paged_manager_keeps_its_host_copies_on_the_cpu_under_another_default_device():
    """A TE-style paged manager is built under InferenceParams' device as torch's default device: its host page
    table must stay on the CPU (pinned for the upload on CUDA), and pre_step's host metadata too."""
    class TEStylePagedManager(PagedKVCacheManager):
        def __init__(self, total_num_pages, page_size, num_heads, head_dim_k, dtype, max_batch_size, max_seqlen,
                     head_dim_v=None, page_allocation="runs"):
            super().__init__(total_num_pages, page_size, num_heads, head_dim_k, dtype, max_batch_size, max_seqlen,
                             head_dim_v, page_allocation=page_allocation)

    params = InferenceParams(2, 16, 1, 4, torch.float32, is_paged=True, page_size=4, device="meta",
                             custom_cache_manager=TEStylePagedManager)
    assert params.cache_manager.page_table.device.type == "meta"
    assert params.cache_manager._host_table.device.type == "cpu"
    with torch.device("meta"):   # torch.set_default_device("cuda") in a serving process
        params.pre_step(OrderedDict({"a": 5, "b": 2}))
    assert params.cache_manager._host_table.device.type == "cpu"


def test_a_custom_manager_with_tes_constructor_gets_the_device_afterwards():
    """TE builds its cache managers without a device argument: such a subclass builds (it was a TypeError) and
    allocates on InferenceParams' device."""
    class TEStyleManager(NonPagedKVCacheManager):
        def __init__(self, max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v=None):
            super().__init__(max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v)

    with torch.device("meta"):   # a default device other than InferenceParams' (as cuda with device="cpu")
        params = InferenceParams(2, 8, 1, 4, torch.float32, custom_cache_manager=TEStyleManager, device="cpu")
    params.allocate_memory(1)
    assert params.cache_manager.device == torch.device("cpu") and params.cache_manager.cache[1][0].device.type == "cpu"
    params.pre_step(OrderedDict({0: 2}))
    k_cache, _ = params.step(1, torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4), "bshd")[:2]
    assert k_cache[0, :2].eq(1).all()


def test_reset_frees_everything_in_place():
    params = make_params("oversubscribed")
    run_step(params, {"a": 5, "b": 2})
    buffers = (params.cu_seqlens_q.data_ptr(), params.cache_manager.page_table.data_ptr())
    params.reset()
    assert params.sequences == OrderedDict() and params.batch_size == 0
    assert params.cache_manager.allocator.num_free == 6
    assert (params.cu_seqlens_q.data_ptr(), params.cache_manager.page_table.data_ptr()) == buffers
    run_step(params, {"a": 5})  # reusable after reset
    check_page_accounting(params)


def test_non_paged_rows_are_compacted_when_sequences_finish():
    params = make_params("non-paged")
    first_k, _ = run_step(params, {0: 4, 1: 4, 2: 4})
    params.pre_step(OrderedDict({0: 1, 2: 1, 3: 2}))  # 1 finishes: row 2 moves to row 1
    k_cache, _ = params.cache_manager.cache[1]
    assert torch.equal(k_cache[0, :4], first_k[0, :4])
    assert torch.equal(k_cache[1, :4], first_k[2, :4])


def test_an_instance_keeps_fewer_than_30_attributes():
    """CPython (3.11-3.12) keeps an instance's attributes inline, read ~15 % faster, only while it has fewer than 30;
    the decode step reads InferenceParams' attributes many times (the thirtieth cost the CPU proxy's bshd step)."""
    params = make_params("paged")
    run_step(params, {"a": 5, "b": 2})
    assert len(vars(params)) < 30, sorted(vars(params))


@pytest.mark.parametrize("paging", ["non-paged", "paged"])
@pytest.mark.parametrize("rows, message", [
    (4, r"rows=4 exceeds max_batch_size=3"),
    (-1, r"rows must be an int >= 0; got -1"),
    (1.5, r"rows must be an int >= 0; got 1.5"),
])
def test_converting_more_rows_than_the_caches_hold_is_refused(paging, rows, message):
    """``rows`` past max_batch_size read a reshape error (paged) or came back short (non-paged); -1 read one row
    less, a float a slice error."""
    params = make_params(paging)
    run_step(params, {"a": 3, "b": 1})
    with pytest.raises(ValueError, match=message):
        params.convert_paged_to_nonpaged(1, rows)
    k_rows, _ = params.convert_paged_to_nonpaged(1, 3)   # up to max_batch_size: a batch padded as TE's graphs do
    assert k_rows.shape[0] == 3


@pytest.mark.parametrize("layer_number", [[1], 3, "1"])
def test_an_unknown_layer_number_names_the_allocated_layers(layer_number):
    """An unhashable layer number read ``TypeError: unhashable type: 'list'``."""
    params = make_params("paged")
    params.pre_step(OrderedDict({"a": 3}))
    new_k, new_v = new_kv("thd", [3])
    with pytest.raises(ValueError, match=r"has no KV cache; allocated layers: \[1, 2\]"):
        params.step(layer_number, new_k, new_v, "thd")
    with pytest.raises(ValueError, match=r"has no KV cache; allocated layers: \[1, 2\]"):
        params.convert_paged_to_nonpaged(layer_number)
