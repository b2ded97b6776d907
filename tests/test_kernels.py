"""Fused Triton attention forward vs the fp32 reference, tiny shapes, Triton interpreter on CPU.

On a machine with CUDA the same cases run on the GPU (the interpreter is only forced without one).
The case builder here (`AttentionCase`, `build_inputs`, `run_and_check`) is shared with
tests/gpu/test_kernels_gpu.py.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton`

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from attention import DotProductAttention
from attention.kernels import attention_forward, attention_fwd, launch, triton_available
from attention.kernels.configs import ForwardConfig, choose_num_splits, select_forward_config
from tests.reference import reference_one_sequence

# The interpreter converts 0-d arrays with int(); numpy deprecates that, harmlessly here.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
SENTINEL = 7.0  # out rows the kernel must not write keep this value
UNUSED_PAGE = 1 << 20  # page-table entries past a sequence's pages: a read would fault


@dataclass(frozen=True)
class AttentionCase:
    """One call: per-sequence (q_len, kv_len), heads, dims, layout and mask options.

    layout: "bshd" | "sbhd" | "thd" (dense q and k/v, padded starts for thd), "cache" (thd q,
    dense non-paged [B, S_max, H_kv, D] k/v cache), "paged" (thd q, paged k/v cache).
    """

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    heads: tuple[int, int] = (2, 2)
    d_qk: int = 16
    d_v: int = 16
    dtype: torch.dtype = torch.float32
    layout: str = "bshd"
    page_size: int = 16
    causal: bool = False
    bottom_right: bool = False
    window: tuple[int, int] = (-1, -1)
    alibi: str | None = None  # None | "h" | "bh"
    sink: bool = False
    num_splits: int | None = 1
    seed: int = 0
    num_pages: int | None = None  # paged cache capacity (default: just enough + 2)
    max_pages: int | None = None  # page-table width (default: just enough + 1)
    score_drift: float = 0.0  # scores rise (alternate 24-query blocks: fall) this much (log2 units) every 128 keys

    def __str__(self) -> str:
        parts = [self.layout, f"q{list(self.q_lens)}", f"kv{list(self.kv_lens)}", f"h{self.heads[0]}/{self.heads[1]}",
                 f"d{self.d_qk}" + (f"-{self.d_v}" if self.d_v != self.d_qk else ""), str(self.dtype)[6:]]
        if self.layout == "paged":
            parts.append(f"ps{self.page_size}")
        if self.causal:
            parts.append("causal-br" if self.bottom_right else "causal-tl")
        elif self.bottom_right:
            parts.append("br")
        if self.window != (-1, -1):
            parts.append(f"win{self.window[0]},{self.window[1]}")
        if self.alibi:
            parts.append(f"alibi-{self.alibi}")
        if self.sink:
            parts.append("sink")
        parts.append(f"splits{self.num_splits}")
        if self.score_drift:
            parts.append(f"drift{self.score_drift:g}")
        return "-".join(parts)


def _cu(lengths: list[int], device: str) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist(),
                        dtype=torch.int32, device=device)


def _dense_strided(batch: list[torch.Tensor], layout: str, pad: int, gap: int, generator, dtype, device):
    """Place per-sequence [len, H, D] tensors in a 4-D strided view; return (view, starts, base).

    Garbage (random) values fill every position that belongs to no sequence.
    """
    heads, dim = batch[0].shape[1], batch[0].shape[2]
    num_seqs = len(batch)
    max_len = max(t.shape[0] for t in batch) + pad
    if layout in ("bshd", "sbhd"):
        shape = (max_len, num_seqs, heads, dim) if layout == "sbhd" else (num_seqs, max_len, heads, dim)
        base = torch.randn(shape, generator=generator).to(dtype).to(device)
        view = base.transpose(0, 1) if layout == "sbhd" else base
        for b, t in enumerate(batch):
            view[b, : t.shape[0]] = t
        return view, None, base
    starts, position = [], 0  # thd: `gap` garbage tokens before every sequence (padded starts)
    for t in batch:
        position += gap
        starts.append(position)
        position += t.shape[0]
    base = torch.randn(position + pad, heads, dim, generator=generator).to(dtype).to(device)
    for start, t in zip(starts, batch):
        base[start: start + t.shape[0]] = t
    view = base.unsqueeze(0).expand(num_seqs, -1, -1, -1)
    return view, torch.tensor(starts, dtype=torch.int32, device=device), base


def _paged_cache(ks, vs, case: AttentionCase, generator, device):
    """Scatter per-sequence k/v into a randomly permuted paged cache (other slots NaN); return
    (k, v, page_table)."""
    ps = case.page_size
    h_kv = case.heads[1]
    pages_per_seq = [-(-n // ps) for n in case.kv_lens]
    num_pages = case.num_pages or sum(pages_per_seq) + 2
    max_pages = case.max_pages or max(max(pages_per_seq), 1) + 1
    permutation = torch.randperm(num_pages, generator=generator)
    page_table = torch.full((len(ks), max_pages), UNUSED_PAGE, dtype=torch.int32)
    # Slots no sequence owns hold NaN: a kernel that lets one reach its output fails the check.
    k = torch.full((num_pages * ps, h_kv, case.d_qk), float("nan"), dtype=case.dtype)
    v = torch.full((num_pages * ps, h_kv, case.d_v), float("nan"), dtype=case.dtype)
    next_page = 0
    for b, n in enumerate(case.kv_lens):
        pages = permutation[next_page: next_page + pages_per_seq[b]]
        next_page += pages_per_seq[b]
        page_table[b, : pages.numel()] = pages.to(torch.int32)
        positions = torch.arange(n)
        slots = pages[positions // ps] * ps + positions % ps
        k[slots], v[slots] = ks[b], vs[b]
    return (k.view(num_pages, ps, h_kv, case.d_qk).to(device), v.view(num_pages, ps, h_kv, case.d_v).to(device),
            page_table.to(device))


def _drift_scores(qs: list[torch.Tensor], ks: list[torch.Tensor], drift: float,
                  scale: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Add a shared direction to q and k so that a query's scores (log2 units) rise by ``drift`` every 128 keys, or
    fall for alternate blocks of 24 queries: a kernel's running row max then moves tile after tile (a rescale of the
    rows' outputs) or stays on the first keys, in different rows of one query tile."""
    dim = qs[0].shape[-1]
    direction = torch.ones(dim) / math.sqrt(dim)
    q_part = 4.0
    k_step = drift / (128 * scale * math.log2(math.e) * q_part)
    qs = [q + torch.where(torch.arange(q.shape[0]) // 24 % 2 == 0, q_part, -q_part)[:, None, None] * direction
          for q in qs]
    ks = [k + (k_step * torch.arange(k.shape[0]))[:, None, None] * direction for k in ks]
    return qs, ks


def build_inputs(case: AttentionCase, device: str = DEVICE) -> dict:
    """Random per-sequence q/k/v, the kernel's arguments for `case`, and the expected rows.

    The expected rows come from tests/reference.py::reference_one_sequence, evaluated on `device`
    (so GPU tests can afford realistic shapes).
    """
    generator = torch.Generator().manual_seed(case.seed)
    h_q, h_kv = case.heads
    num_seqs = len(case.q_lens)
    dtype = case.dtype
    qs = [torch.randn(n, h_q, case.d_qk, generator=generator) for n in case.q_lens]
    ks = [torch.randn(n, h_kv, case.d_qk, generator=generator) for n in case.kv_lens]
    if case.score_drift:
        qs, ks = _drift_scores(qs, ks, case.score_drift, 1.0 / math.sqrt(case.d_qk))
    qs = [t.to(dtype) for t in qs]
    ks = [t.to(dtype) for t in ks]
    vs = [torch.randn(n, h_kv, case.d_v, generator=generator).to(dtype) for n in case.kv_lens]

    q_layout = case.layout if case.layout in ("bshd", "sbhd", "thd") else "thd"
    gap = 2 if case.layout == "thd" else 0
    q, q_start, _ = _dense_strided([t.to(device) for t in qs], q_layout, 1, gap, generator, dtype, device)
    out_batch = [torch.zeros(n, h_q, case.d_v, dtype=dtype) for n in case.q_lens]
    out, _, out_base = _dense_strided(out_batch, q_layout, 1, gap, generator, dtype, device)
    out_base.fill_(SENTINEL)

    kwargs: dict = {}
    if case.layout == "paged":
        k, v, kwargs["page_table"] = _paged_cache(ks, vs, case, generator, device)
    else:
        kv_layout = "bshd" if case.layout == "cache" else case.layout
        k, kv_start, _ = _dense_strided([t.to(device) for t in ks], kv_layout, 2, gap, generator, dtype, device)
        v, _, _ = _dense_strided([t.to(device) for t in vs], kv_layout, 2, gap, generator, dtype, device)
        if kv_start is not None:
            kwargs["kv_start"] = kv_start
    if q_start is not None:
        kwargs["q_start"] = q_start
    alibi = None
    if case.alibi == "h":
        alibi = torch.rand(h_q, generator=generator) * 0.5 + 0.1
    elif case.alibi == "bh":
        alibi = torch.rand(num_seqs, h_q, generator=generator) * 0.5 + 0.1
    sink = torch.randn(h_q, generator=generator) if case.sink else None
    scale = 1.0 / math.sqrt(case.d_qk)

    expected = []
    with torch.device(device):  # the reference's own aranges/constants follow the inputs' device
        for b in range(num_seqs):
            slopes = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[b]).to(device)
            expected.append(reference_one_sequence(
                qs[b].to(device), ks[b].to(device), vs[b].to(device), softmax_scale=scale, causal=case.causal,
                window_size=case.window, bottom_right=case.bottom_right, alibi_slopes=slopes,
                softmax_offset=None if sink is None else sink.to(device)))
    return dict(
        q=q, k=k, v=v, out=out, out_base=out_base, expected=expected, q_start=q_start,
        call=dict(
            cu_seqlens_q=_cu(list(case.q_lens), device), cu_seqlens_kv=_cu(list(case.kv_lens), device),
            max_seqlen_q=max(case.q_lens), max_seqlen_kv=max(case.kv_lens),
            total_q=q.shape[1] if q.stride(0) == 0 else None, softmax_scale=scale, causal=case.causal,
            window_size=case.window, bottom_right=case.bottom_right, num_splits=case.num_splits,
            alibi_slopes=None if alibi is None else alibi.to(device),
            softmax_offset=None if sink is None else sink.to(device), **kwargs),
    )


def load_inputs_into(captured: dict, moved: dict) -> None:
    """Copy ``moved``'s tensors into ``captured``'s (build_inputs of two cases of one shape: a CUDA graph captured
    on the first replays on the second) and refill captured's output with SENTINEL. Thd q is a batch-expanded view
    of one [T, H, D] tensor: its first batch entry is copied."""
    captured["q"][0].copy_(moved["q"][0])
    for name in ("k", "v"):
        captured[name].copy_(moved[name])
    for name, value in captured["call"].items():  # cu_seqlens, q_start, the page table
        if isinstance(value, torch.Tensor):
            value.copy_(moved["call"][name])
    captured["out_base"].fill_(SENTINEL)


def check_output(case: AttentionCase, inputs: dict, tolerance: float | None = None) -> None:
    """Real rows match the reference; every other row of `out` still holds the sentinel."""
    out = inputs["out"]
    tol = TOLERANCE[case.dtype] if tolerance is None else tolerance
    written = torch.zeros(out.shape[:2], dtype=torch.bool, device=out.device)
    starts = [0] * len(case.q_lens) if inputs["q_start"] is None else inputs["q_start"].tolist()
    for b, expected in enumerate(inputs["expected"]):
        got = out[b, starts[b]: starts[b] + case.q_lens[b]].float()
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol, msg=lambda m: f"{case} seq {b}: {m}")
        written[b, starts[b]: starts[b] + case.q_lens[b]] = True
    untouched = out.float()[~written] if out.stride(0) != 0 else out[0].float()[~written.any(0)]
    assert bool((untouched == SENTINEL).all()), f"{case}: rows of padding tokens were written"


def run_and_check(case: AttentionCase, device: str = DEVICE, tolerance: float | None = None) -> None:
    inputs = build_inputs(case, device)
    result = attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"])
    assert result is inputs["out"]
    check_output(case, inputs, tolerance)


def interpreted_config(case: AttentionCase, **fields) -> ForwardConfig:
    """The interpreter's untuned launch configuration for `case`, with `fields` replaced."""
    base = select_forward_config(head_dim_qk=case.d_qk, head_dim_v=case.d_v, group_size=case.heads[0] // case.heads[1],
                                 max_seqlen_q=max(case.q_lens), interpret=True, tuned=False)
    return replace(base, **fields)


def check_with_config(case: AttentionCase, config: ForwardConfig, split_counts: tuple[int | None, ...] = (None,),
                      after_each: Callable[[], None] | None = None) -> None:
    """Run `case` with `config` once per split count (None: the case's own), restoring the sentinel
    rows before each call, and check every output (then `after_each`)."""
    inputs = build_inputs(case)
    for num_splits in split_counts:
        inputs["out_base"].fill_(SENTINEL)
        call = inputs["call"] if num_splits is None else {**inputs["call"], "num_splits": num_splits}
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **call, config=config)
        check_output(case, inputs)
        if after_each is not None:
            after_each()


C = AttentionCase
MIXED_Q, MIXED_KV = (1, 5, 1, 9), (13, 5, 21, 17)  # decode, prefill, decode, chunked prefill
CASES = [
    # dense layouts x masks
    *[C((5, 11, 3), (5, 11, 3), layout=layout, causal=causal, dtype=dtype)
      for layout in ("bshd", "sbhd", "thd") for causal, dtype in ((False, torch.float32), (True, torch.float16))],
    C((5, 11, 3), (9, 7, 20), layout="thd", causal=True, bottom_right=True),
    C((6, 11, 3), (9, 7, 20), layout="bshd", causal=True),  # top-left, s_q != s_kv
    C((12, 3), (5, 9), layout="sbhd", causal=True, bottom_right=True),  # kv shorter than q: rows with no key
    # dense KV cache (q shorter than kv): decode, chunked prefill, mixed, zero-length tails
    C((1, 1, 1), (17, 1, 33), layout="cache", causal=True, bottom_right=True, heads=(4, 2)),
    C((7, 4), (30, 12), layout="cache", causal=True, bottom_right=True),
    C(MIXED_Q, MIXED_KV, layout="cache", causal=True, bottom_right=True, heads=(4, 1), dtype=torch.float16),
    C((3, 2, 0, 0), (3, 9, 0, 0), layout="cache", causal=True, bottom_right=True),
    # paged: page sizes 1, 3, 16; mixed batches; split-KV on and off
    *[C(MIXED_Q, MIXED_KV, layout="paged", page_size=ps, causal=True, bottom_right=True, heads=(4, 2),
        num_splits=splits, dtype=dtype)
      for ps, splits, dtype in ((1, 1, torch.float32), (3, 3, torch.float32), (16, 1, torch.float16),
                                (16, 3, torch.float32), (3, 1, torch.float16))],
    C((1, 2, 0), (40, 6, 0), layout="paged", page_size=3, causal=True, bottom_right=True, num_splits=3),
    C((0, 0, 3), (0, 4, 5), layout="paged", page_size=1, bottom_right=True),  # zero-length heads
    # GQA packing, d_qk != d_v
    C((3, 8), (10, 8), heads=(4, 2), d_qk=32, d_v=16, layout="thd", causal=True, bottom_right=True),
    C((3, 8), (10, 8), heads=(4, 1), d_qk=8, d_v=32, layout="paged", page_size=3, dtype=torch.float16),
    C((3, 8), (10, 8), heads=(2, 2), d_qk=16, d_v=8, layout="bshd", num_splits=3),
    # windows, both alignments
    C((9, 16), (9, 16), window=(2, 0), layout="thd"),
    C((9, 16), (9, 16), window=(3, 1), layout="bshd", heads=(4, 2), dtype=torch.float16),
    C((4, 6), (19, 25), window=(5, -1), bottom_right=True, layout="paged", page_size=3, num_splits=3),
    C((4, 6), (19, 25), window=(4, 4), causal=True, bottom_right=True, layout="cache", heads=(4, 2)),
    C((10,), (40,), window=(-1, 2), layout="sbhd"),  # top-left, right window only
    # ALiBi and sinks
    C((5, 9), (5, 12), alibi="h", causal=True, bottom_right=True, layout="thd", heads=(4, 2)),
    C((5, 9), (5, 12), alibi="bh", layout="paged", page_size=3, num_splits=3),
    C((4, 1), (4, 30), sink=True, causal=True, bottom_right=True, layout="cache", heads=(4, 1)),
    C((4, 1), (4, 30), sink=True, causal=True, bottom_right=True, layout="paged", page_size=16,
      heads=(4, 1), num_splits=3, dtype=torch.float16),
    C((6, 2), (3, 2), sink=True, causal=True, bottom_right=True, num_splits=3),  # sinks on rows with no key
    # split-KV forced on: decode / long kv, heuristic choice (None)
    C((1, 1), (37, 40), layout="cache", heads=(4, 2), num_splits=3, window=(9, 0), bottom_right=True),
    C((1, 3), (37, 40), layout="paged", page_size=16, heads=(4, 2), num_splits=None, causal=True, bottom_right=True),
    # scores rising steeply along the keys in some rows, falling in others: running maxes that move every tile, splits
    # whose maxes differ by hundreds of log2 units
    C((30, 5), (30, 70), layout="thd", heads=(4, 2), causal=True, bottom_right=True, score_drift=200.0),
    C((30, 5), (40, 70), layout="paged", page_size=3, heads=(4, 2), num_splits=3, dtype=torch.float16,
      score_drift=300.0),
]


@pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_attention_forward_matches_reference(case: AttentionCase) -> None:
    run_and_check(case)


@pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))
def test_out_of_range_tile_programs_exit_and_total_q_bound() -> None:
    """A tight total_q (== real tokens) still covers every tile; a loose bound changes nothing."""
    case = C((3, 0, 5, 1), (3, 0, 8, 6), layout="cache", heads=(4, 2), causal=True, bottom_right=True)
    for total_q in (9, 40):
        inputs = build_inputs(case)
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"],
                          **{**inputs["call"], "total_q": total_q})
        check_output(case, inputs)


def _bad_call(**overrides):
    inputs = build_inputs(C((2, 3), (2, 3), layout="bshd"))
    args = {"q": inputs["q"], "k": inputs["k"], "v": inputs["v"], "out": inputs["out"], **inputs["call"]}
    args.update(overrides)
    return lambda: attention_forward(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("out"), **args)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int64)), "cu_seqlens_q"),
        (dict(cu_seqlens_kv=torch.tensor([0, 2], dtype=torch.int32)), "cu_seqlens_kv"),
        (dict(window_size=(-2, 0)), "window_size"),
        (dict(num_splits=0), "num_splits"),
        (dict(alibi_slopes=torch.ones(3)), "alibi_slopes"),
        (dict(softmax_offset=torch.ones(2, dtype=torch.float64)), "softmax_offset"),
        (dict(page_table=torch.zeros(2, 1, dtype=torch.int64)), "page_table"),
        (dict(q=torch.zeros(2, 3, 2, 12)), "head dim"),
        (dict(k=torch.zeros(2, 5, 3, 16), v=torch.zeros(2, 5, 3, 16)), "H_q"),
        (dict(v=torch.zeros(2, 3, 2, 16, dtype=torch.float16)), "dtype"),
        (dict(out=lambda device: torch.zeros(2, 3, 2, 32, device=device)[..., ::2]), "contiguous last dimension"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_bad_arguments_raise_value_error(overrides: dict, message: str) -> None:
    overrides = {key: value.to(DEVICE) if isinstance(value, torch.Tensor)
                 else value(DEVICE) if callable(value) else value
                 for key, value in overrides.items()}
    with pytest.raises(ValueError, match=message):
        _bad_call(**overrides)()


@pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))
def test_cpu_tensors_outside_the_interpreter_are_refused_naming_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """attention_forward's first launch names its kernel and the interpreter (tests/test_launch.py has the rule)."""
    monkeypatch.setattr(launch, "_compiles_for_a_gpu", lambda fn: True)   # as where Triton compiles for a GPU
    q = torch.zeros(1, 3, 2, 16, dtype=torch.float16)
    k = v = torch.zeros(1, 5, 1, 16, dtype=torch.float16)
    seqlens = {"cu_seqlens_q": torch.tensor([0, 3], dtype=torch.int32),
               "cu_seqlens_kv": torch.tensor([0, 5], dtype=torch.int32)}
    with pytest.raises(ValueError, match=r"^attention_fwd_kernel got CPU tensors, .*\(TRITON_INTERPRET=1"):
        attention_forward(q, k, v, torch.empty_like(q), **seqlens, max_seqlen_q=3, max_seqlen_kv=5, softmax_scale=0.25)


@pytest.mark.parametrize(
    "sizes, expected",
    [
        (dict(num_seqs=1, num_kv_heads=8, total_q=1, max_seqlen_q=1, max_seqlen_kv=32768), 64),  # long decode
        (dict(num_seqs=8, num_kv_heads=8, total_q=8, max_seqlen_q=1, max_seqlen_kv=4096), 8),  # small batch
        (dict(num_seqs=64, num_kv_heads=8, total_q=64, max_seqlen_q=1, max_seqlen_kv=4096), 1),  # full GPU
        # ~2 per SM: fill, a power of 2
        (dict(num_seqs=32, num_kv_heads=8, total_q=32, max_seqlen_q=1, max_seqlen_kv=2048), 2),
        (dict(num_seqs=64, num_kv_heads=8, total_q=64, max_seqlen_q=1, max_seqlen_kv=32768), 8),  # ragged: balance
        (dict(num_seqs=32, num_kv_heads=8, total_q=128, max_seqlen_q=4, max_seqlen_kv=4096), 2),  # verify 4 tokens
        (dict(num_seqs=1, num_kv_heads=8, total_q=1, max_seqlen_q=1, max_seqlen_kv=256), 1),  # <= 4 tiles
        (dict(num_seqs=8, num_kv_heads=32, total_q=16384, max_seqlen_q=2048, max_seqlen_kv=2048), 1),  # prefill
    ],
)
def test_split_heuristic(sizes: dict, expected: int) -> None:
    assert choose_num_splits(**sizes, block_q=4, block_n=64, num_sms=132) == expected


def test_mqa_decode_splits_half_as_often() -> None:
    """A 32-row MQA decode tile writes twice the partial outputs of a 16-row one per split (H200: 64x4k
    MQA 32/1, 4 splits 59.2 µs against 8 splits 65.3)."""
    sizes = dict(num_seqs=64, num_kv_heads=1, total_q=64, max_seqlen_q=1, max_seqlen_kv=4096, block_q=1, block_n=64,
                 num_sms=132)
    assert choose_num_splits(**sizes, block_m=32) == 4
    assert choose_num_splits(**sizes) == 8


@pytest.mark.parametrize("group_size, max_seqlen_q, d, block_m", [(4, 1, 128, 16), (8, 4, 128, 32),
                                                                   (4, 2048, 128, 128), (4, 2048, 256, 128),
                                                                   (64, 1, 64, 64), (7, 1, 128, 16)])
def test_config_packs_group_into_rows(group_size: int, max_seqlen_q: int, d: int, block_m: int) -> None:
    config = select_forward_config(head_dim_qk=d, head_dim_v=d, group_size=group_size,
                                   max_seqlen_q=max_seqlen_q, interpret=False)
    assert config.block_m == block_m and config.block_q == max(1, block_m // group_size)
    assert config.block_q * group_size <= config.block_m


def test_case_ids_are_unique() -> None:
    assert len({str(case) for case in CASES}) == len(CASES)



def test_config_override_matches_the_default_and_rejects_misfits() -> None:
    """`config=` (tuning sweeps) computes the same attention; a tile that cannot hold a query token's
    heads is refused, naming the group size."""
    case = C((1, 3), (40, 70), heads=(4, 2), layout="paged", page_size=8, causal=True, bottom_right=True,
             num_splits=None)
    check_with_config(case, interpreted_config(case, block_n=32))
    inputs = build_inputs(case)
    with pytest.raises(ValueError, match="group size 2"):
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **inputs["call"],
                          config=interpreted_config(case, block_m=16, block_q=16))


def test_ragged_decode_with_balance_splits() -> None:
    """One long sequence among short ones: the balance rule splits every sequence's range evenly."""
    lengths = (4500, 3, 17, 64, 200)
    assert choose_num_splits(num_seqs=5, num_kv_heads=2, total_q=5, max_seqlen_q=1, max_seqlen_kv=4500,
                             block_q=8, block_n=16, num_sms=4) == 2  # the interpreter's SM count
    run_and_check(C((1,) * len(lengths), lengths, heads=(4, 2), layout="paged", page_size=16, causal=True,
                    bottom_right=True, num_splits=None, dtype=torch.float16))


@pytest.mark.parametrize("scalar_ids, prefetch", [(True, False), (False, True), (True, True)],
                         ids=["scalar-ids", "prefetch", "scalar-ids+prefetch"])
@pytest.mark.parametrize("page_size, window", [(16, (-1, 0)), (32, (7, 0)), (3, (-1, 0)), (8, (5, 0))],
                         ids=["page16", "page32-window", "page3", "page8-window"])
def test_paged_addressing_variants_match_the_reference(scalar_ids, prefetch, page_size, window) -> None:
    """The opt-in page-table variants (benchmarks/sweep.py measures them) compute the same attention:
    a decode, a chunk over a prefix and a short prefill in one launch, with and without splits."""
    case = C(MIXED_Q, MIXED_KV, heads=(4, 2), layout="paged", page_size=page_size, causal=True,
             bottom_right=True, window=window, num_splits=None, dtype=torch.float16)
    check_with_config(case, interpreted_config(case, paged_scalar_ids=scalar_ids, prefetch_page_ids=prefetch),
                      split_counts=(1, 3))


@pytest.mark.parametrize("prefetch", [False, True], ids=["ids-per-tile", "ids-prefetched"])
@pytest.mark.parametrize("page_size, block_n, window, dtype", [
    (4, 16, (-1, 0), torch.float16), (8, 32, (5, 0), torch.float32), (1, 16, (-1, 0), torch.float16),
    (16, 32, (-1, -1), torch.float16)], ids=["page4", "page8-window", "page1", "page16-full"])
def test_page_granular_tiles_match_the_reference(prefetch, page_size, block_n, window, dtype) -> None:
    """page_granular_tiles: KV tiles of several whole pages read as [page, slot, D], one page id per page:
    a mixed batch (ragged last pages, masked edges) with and without splits, fp16 and fp32."""
    case = C(MIXED_Q, MIXED_KV, heads=(4, 2), layout="paged", page_size=page_size, causal=window != (-1, -1),
             bottom_right=True, window=window, num_splits=None, dtype=dtype, d_qk=16, d_v=8)
    check_with_config(case, interpreted_config(case, block_n=block_n, page_granular_tiles=True,
                                               prefetch_page_ids=prefetch), split_counts=(1, 3))


@pytest.mark.parametrize("options", [
    dict(causal=True, bottom_right=True),
    dict(causal=True, bottom_right=True, window=(6, 0), alibi="h"),
    dict(sink=True, num_splits=3),
    dict(causal=True, bottom_right=True, layout="cache"),
], ids=["causal", "window-alibi", "sink-splits", "non-paged"])
def test_small_tile_for_short_sequences_in_a_mixed_batch(options: dict) -> None:
    """small_block_m: decodes and short steps run a 16-row tile, longer sequences the 32-row tile,
    all in one launch (the small tile holds 8 tokens of group 2: q lens 1, 5 and 8 take it)."""
    fields = dict(layout="paged", page_size=8, num_splits=1, dtype=torch.float16) | options
    case = C((1, 17, 5, 8, 9), (13, 40, 5, 30, 17), heads=(4, 2), **fields)
    check_with_config(case, interpreted_config(case, block_m=32, block_q=16, small_block_m=16))


@pytest.mark.parametrize("layout, prefetch", [("cache", False), ("thd", False), ("paged", True)])
@pytest.mark.parametrize("window", [(-1, 0), (20, 0)], ids=["causal", "window"])
def test_rotated_kv_walk_matches_the_reference(layout: str, prefetch: bool, window: tuple[int, int]) -> None:
    """rotate_kv_tiles (opt-in): the fully visible tiles in a program-dependent order, same attention."""
    case = C(MIXED_Q, (70, 45, 90, 66), heads=(4, 2), layout=layout, page_size=8, causal=True,
             bottom_right=True, window=window, num_splits=None, dtype=torch.float16)
    check_with_config(case, interpreted_config(case, rotate_kv_tiles=True, prefetch_page_ids=prefetch),
                      split_counts=(1, 2))


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "thd", "cache", "paged"])
@pytest.mark.parametrize("options", [dict(causal=True, bottom_right=True), dict(window=(9, 3), d_qk=24),
                                     dict(causal=True, num_splits=3, alibi="bh")],
                         ids=["causal", "window-d24", "splits-alibi"])
def test_tma_descriptors_match_the_reference(layout: str, options: dict) -> None:
    """config.tma (opt-in): K/V through tensor descriptors; non-paged ones zero rows past each
    sequence, paged ones (a page per tile) read stale slots, which the kernel must zero (NaN here)."""
    fields = dict(layout=layout, dtype=torch.float16) | options
    case = C(MIXED_Q, MIXED_KV if fields.get("bottom_right") or layout == "cache" else (1, 5, 3, 9), heads=(4, 2),
             **fields)
    check_with_config(case, interpreted_config(case, tma=True))


@pytest.mark.parametrize("options", [
    dict(layout="paged", page_size=8, causal=True, bottom_right=True),
    dict(layout="cache", causal=True, bottom_right=True, window=(20, 0), alibi="h"),
    dict(layout="thd", sink=True),
], ids=["paged-causal", "cache-window-alibi", "thd-sink"])
def test_fused_combine_merges_in_the_last_split(options: dict) -> None:
    """fused_combine: the last split of each (q tile, KV head) merges the workspace, no combine launch;
    its arrival counters are zeros again afterwards, so a second call computes the same."""
    from attention.kernels import combine

    case = C(MIXED_Q, (70, 45, 90, 66) if options.get("bottom_right") else (1, 5, 1, 9), heads=(4, 2),
             num_splits=None, dtype=torch.float16, **options)

    def counters_are_zero() -> None:
        assert all(not counters.any() for counters in combine._split_counters.values())

    check_with_config(case, interpreted_config(case, fused_combine=True), split_counts=(3, 3, 1),
                      after_each=counters_are_zero)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="patches a kernel global: interpreter only")
def test_fused_combine_merges_splits_over_several_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused combine reads a row's partials MERGE_FLOATS // BLOCK_DV splits per load: with a budget
    of two splits per load (interpreter: the global is read at call time), 7 splits take four loads."""
    import triton.language as tl

    from attention.kernels import attention_fwd_kernel, combine

    monkeypatch.setattr(attention_fwd_kernel, "MERGE_FLOATS", tl.constexpr(32))  # BLOCK_DV 16
    case = C((1, 3, 1), (120, 70, 9), layout="paged", page_size=8, causal=True, bottom_right=True, heads=(4, 2),
             num_splits=None, dtype=torch.float16, sink=True)
    check_with_config(case, interpreted_config(case, fused_combine=True), split_counts=(7, 2))
    assert all(not counters.any() for counters in combine._split_counters.values())


def test_fused_combine_covers_every_split_count() -> None:
    """A row's LSEs are one load of MERGE_SPLITS: every split count attention_forward allows fits."""
    from attention.kernels.attention_fwd_kernel import MERGE_SPLITS
    from attention.kernels.configs import MAX_NUM_SPLITS

    assert MERGE_SPLITS.value == MAX_NUM_SPLITS


@pytest.mark.parametrize("layout", ["paged", "cache", "thd"])
def test_32_bit_offsets_match_the_reference(layout: str) -> None:
    """int32_offsets: per-key offsets in 32 bits (they fit at test sizes); the default is 64-bit."""
    case = C(MIXED_Q, (70, 45, 90, 66), heads=(4, 2), layout=layout, page_size=8, causal=True, bottom_right=True,
             num_splits=None, dtype=torch.float16)
    check_with_config(case, interpreted_config(case, int32_offsets=True))


@pytest.mark.parametrize("layout", ["paged", "cache", "thd"])
def test_transposed_k_loads_match_the_reference(layout: str) -> None:
    """transposed_k_loads: K tiles read as [D, keys], masked keys and padded head dims included."""
    case = C(MIXED_Q, (70, 45, 90, 66), heads=(4, 2), d_qk=40, d_v=40, layout=layout, page_size=8, causal=True,
             bottom_right=True, num_splits=None, dtype=torch.float16)
    check_with_config(case, interpreted_config(case, transposed_k_loads=True))


@pytest.mark.parametrize("fields", [dict(runtime_page_size=True), dict(runtime_page_size=True, prefetch_page_ids=True),
                                    dict(runtime_page_size=True, paged_scalar_ids=True, block_n=16)])
@pytest.mark.parametrize("page_size", [1, 8, 16])
def test_runtime_page_size_matches_the_reference(fields: dict, page_size: int) -> None:
    """runtime_page_size: the page size as a kernel argument, not a compile-time constant."""
    case = C(MIXED_Q, (70, 45, 90, 66), heads=(4, 2), layout="paged", page_size=page_size, causal=True,
             bottom_right=True, num_splits=None, dtype=torch.float16)
    check_with_config(case, interpreted_config(case, **fields), split_counts=(1, 3))


@pytest.mark.parametrize("layout", ["paged", "thd"])
def test_heavy_tiles_first_matches_the_reference(layout: str) -> None:
    """heavy_tiles_first: each sequence's q tiles in reverse order (ragged lengths, so some programs
    have no tile), with splits and with the small second tile of mixed batches."""
    case = C((1, 37, 1, 20), (70, 45, 90, 66), heads=(4, 2), layout=layout, page_size=8, causal=True,
             bottom_right=True, num_splits=None, dtype=torch.float16)
    check_with_config(case, interpreted_config(case, heavy_tiles_first=True), split_counts=(1, 3))
    check_with_config(case, interpreted_config(case, heavy_tiles_first=True, block_m=32, block_q=16, small_block_m=16))


@pytest.mark.parametrize("heavy", [False, True])
@pytest.mark.parametrize("q_lens", [(37, 37, 37), (37, 20, 0, 37)], ids=["equal", "shorter"])
def test_sequence_major_grid_matches_the_reference(q_lens: tuple[int, ...], heavy: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequences of max_seqlen_q queries get a sequence-major grid of several q tiles each (no search);
    with total_q a loose bound (num_seqs x max_seqlen_q) shorter and empty sequences leave programs idle."""
    from attention.kernels import attention_fwd

    monkeypatch.setattr(attention_fwd, "_plans", {})
    case = C(q_lens, (45, 60, 7, 37)[:len(q_lens)], heads=(4, 2), layout="thd", causal=True, bottom_right=True,
             num_splits=None, dtype=torch.float16)
    config = interpreted_config(case, heavy_tiles_first=heavy)
    inputs = build_inputs(case)
    call = {**inputs["call"], "total_q": len(q_lens) * max(q_lens)}
    for num_splits in (1, 3):
        inputs["out_base"].fill_(SENTINEL)
        attention_forward(inputs["q"], inputs["k"], inputs["v"], inputs["out"], **{**call, "num_splits": num_splits},
                          config=config)
        check_output(case, inputs)
    for plan in attention_fwd._plans.values():
        launch = plan.attention
        assert launch.constexprs["SEQ_GRID"] and launch.scalars[1] == -(-max(q_lens) // config.block_q) > 1


def test_offsets_fit_int32_counts_the_largest_offset() -> None:
    from attention.kernels.attention_fwd import _offsets_fit_int32

    assert _offsets_fit_int32(torch.empty(0, 4))
    class Strided:  # shape and strides of tensors too large to allocate here
        def __init__(self, shape, strides):
            self.shape, self._strides = shape, strides

        def stride(self):
            return self._strides

    assert _offsets_fit_int32(Strided((2, 1 << 30), (1 << 30, 1)))  # the last offset is 2^31 - 1
    assert not _offsets_fit_int32(Strided((3, 1 << 30), (1 << 30, 1)))
    assert not _offsets_fit_int32(Strided((2, 2), (1 << 31, 1)))


@pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))
def test_launch_plans_serve_sixteen_decode_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode over a growing paged cache (kv 14..35, split-KV by the heuristic): every step is right,
    and steps share a launch plan while max_seqlen_kv stays in one 16-key quantum (14-16, 17-32, 33-35)."""
    from attention.kernels import attention_fwd

    monkeypatch.setattr(attention_fwd, "_plans", {})
    for kv_len in range(14, 36):
        run_and_check(C((1, 1), (kv_len - 3, kv_len), layout="paged", page_size=4, heads=(4, 2), num_splits=None,
                        causal=True, bottom_right=True, num_pages=24, max_pages=10, seed=kv_len))
    assert len(attention_fwd._plans) == 3


@pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))
def test_a_new_alignment_or_dtype_gets_its_own_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors that differ only in their 16-byte alignment (Triton specializes pointers on it) or in
    dtype get a plan of their own; a call whose arguments no longer validate still raises."""
    from attention.kernels import attention_fwd

    monkeypatch.setattr(attention_fwd, "_plans", {})
    case = C((3, 2), (5, 7), layout="bshd", causal=True, bottom_right=True)
    inputs = build_inputs(case)
    call = lambda q, **extra: attention_forward(q, inputs["k"], inputs["v"], inputs["out"],
                                                **{**inputs["call"], **extra})
    call(inputs["q"])
    check_output(case, inputs)
    shifted = torch.empty(inputs["q"].numel() + 1, dtype=inputs["q"].dtype, device=DEVICE)[1:]
    shifted = shifted.view(inputs["q"].shape).copy_(inputs["q"])
    inputs["out_base"].fill_(SENTINEL)
    call(shifted)
    check_output(case, inputs)
    assert len(attention_fwd._plans) == 2
    with pytest.raises(ValueError, match="dtype"):
        call(inputs["q"].half())
    with pytest.raises(ValueError, match="softmax_scale"):
        call(inputs["q"], softmax_scale=float("nan"))
    assert len(attention_fwd._plans) == 2


def test_every_kernel_switch_is_part_of_the_plan_key() -> None:
    """A launch plan is kept per value of every variable the kernels read while planning: a variable left out of
    PLAN_ENVIRONMENT would go unread by calls that already have a plan (set mid-process, an A/B's second variant)."""
    import importlib
    import pkgutil

    import attention.kernels
    from attention.kernels.attention_fwd import PLAN_ENVIRONMENT

    read = set()
    for module_info in pkgutil.iter_modules(attention.kernels.__path__):
        module = importlib.import_module(f"attention.kernels.{module_info.name}")
        read |= {value for name, value in vars(module).items()
                 if name.endswith("_ENV") and isinstance(value, str) and value.startswith("ATTN_FUSED_")}
    assert len(read) >= 20
    assert read <= set(PLAN_ENVIRONMENT), sorted(read - set(PLAN_ENVIRONMENT))


@pytest.mark.parametrize("name", [name for name in attention_fwd.PLAN_ENVIRONMENT if name != "TRITON_INTERPRET"])
def test_a_bad_kernel_variable_is_refused_on_any_device(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sm90 kernels' plans read their variables on sm90 GPUs only: each is also read when any plan is made, so a
    typo fails a CPU (interpreter) run as it would fail on the H200."""
    attention_fwd.check_plan_environment()   # none set here
    monkeypatch.setenv(name, "")
    attention_fwd.check_plan_environment()   # empty counts as unset
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ValueError, match=name):
        attention_fwd.check_plan_environment()
    attn = DotProductAttention(2, 16, qkv_format="bshd", backend="fused")
    q = torch.randn(1, 4, 2, 16, device=DEVICE, dtype=torch.float16 if DEVICE == "cuda" else torch.float32)
    with pytest.raises(ValueError, match=name):   # through the module (in the interpreter on a CPU)
        attn(q, q, q)
