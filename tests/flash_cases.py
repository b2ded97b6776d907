"""Flash-attention test cases: per-sequence tensors placed into bshd / sbhd / thd / KV caches,
the ``AttentionCall`` that carries them and the expected fp32 output (``tests/reference.py``).

Shared by ``tests/test_flash_backend.py`` (fake packages, CPU) and ``tests/gpu/test_flash_gpu.py``
(the real packages). Positions outside the sequences hold random garbage, so a backend that reads
or returns padding fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from attention.backends.base import AttentionCall
from attention.masks import check_set_window_size, has_padding, is_causal, resolve_bottom_right
from attention.params import AttentionParams
from tests.reference import default_alibi_slopes, reference_one_sequence


@dataclass(frozen=True)
class FlashCase:
    """One call. ``s_kv`` is the cache's max_sequence_length when ``kv_cache`` is set."""

    qkv_format: str = "bshd"
    attn_mask_type: str = "padding_causal_bottom_right"
    batch: int = 3
    s_q: int = 8
    s_kv: int = 8
    heads: int = 4
    kv_heads: int = 2
    d_qk: int = 32
    d_v: int = 32
    window: tuple[int, int] | None = None
    alibi: bool = False
    pad_between_seqs: bool = False
    kv_cache: str = "none"
    page_size: int | None = None
    softmax_type: str = "vanilla"     # off-by-one | learnable: a sink logit per head (flash-attn-4's learnable_sink)

    def id(self) -> str:
        parts = [self.qkv_format, self.attn_mask_type, f"q{self.s_q}kv{self.s_kv}", f"h{self.heads}/{self.kv_heads}",
                 f"d{self.d_qk}" + (f"/{self.d_v}" if self.d_v != self.d_qk else "")]
        if self.window:
            parts.append(f"w{self.window[0]},{self.window[1]}")
        if self.alibi:
            parts.append("alibi")
        if self.pad_between_seqs:
            parts.append("padbetween")
        if self.kv_cache != "none":
            parts.append(self.kv_cache + (f"{self.page_size}" if self.page_size else ""))
        if self.softmax_type != "vanilla":
            parts.append(self.softmax_type)
        return "-".join(parts)


def _lengths(case: FlashCase, gen: torch.Generator) -> tuple[list[int], list[int]]:
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    b = case.batch
    if case.kv_cache != "none":
        lens_q = [case.s_q] + [draw(1, case.s_q) for _ in range(b - 1)]
        return lens_q, [lq + draw(0, case.s_kv - lq) for lq in lens_q]
    if not has_padding(case.attn_mask_type):
        return [case.s_q] * b, [case.s_kv] * b
    lens_q = [case.s_q] + [draw(1, case.s_q) for _ in range(b - 1)]
    if case.attn_mask_type == "padding_causal":  # top-left = bottom-right only when lengths match
        return lens_q, list(lens_q)
    return lens_q, [case.s_kv] + [draw(1, case.s_kv) for _ in range(b - 1)]


def _cu(lengths: list[int], extra_tail: int = 0) -> torch.Tensor:
    values = [0]
    for n in lengths + [0] * extra_tail:
        values.append(values[-1] + n)
    return torch.tensor(values, dtype=torch.int32)


def _place(seqs: list[torch.Tensor], fmt: str, max_len: int, fill: str, offsets: list[int] | None = None,
           total: int | None = None) -> torch.Tensor:
    """Per-sequence ``[len_i, h, d]`` -> one tensor in ``fmt``; positions outside sequences hold
    random garbage (``fill="garbage"``) or zeros."""
    h, d = seqs[0].shape[1:]
    make = torch.randn if fill == "garbage" else torch.zeros
    if fmt == "thd":
        out = make(total, h, d)
        for seq, start in zip(seqs, offsets):
            out[start : start + seq.shape[0]] = seq
        return out
    out = make(len(seqs), max_len, h, d)
    for i, seq in enumerate(seqs):
        out[i, : seq.shape[0]] = seq
    return out.transpose(0, 1).contiguous() if fmt == "sbhd" else out


def _thd_offsets(lengths: list[int], pad_between: bool, gen: torch.Generator) -> tuple[list[int], int]:
    offsets, position = [], 0
    for n in lengths:
        if pad_between:
            position += int(torch.randint(0, 3, (1,), generator=gen))
        offsets.append(position)
        position += n
    return offsets, position + (2 if pad_between else 1)   # a trailing row no sequence owns


def _page_table(case: FlashCase, rows: int, gen: torch.Generator) -> torch.Tensor | None:
    """int32 ``[rows, pages_per_seq]`` of distinct, shuffled page ids (a few pages left spare)."""
    if case.kv_cache != "paged":
        return None
    pages_per_seq = math.ceil(case.s_kv / case.page_size)
    return torch.randperm(rows * pages_per_seq + 3, generator=gen)[: rows * pages_per_seq].view(rows, -1).int()


def _cache(seqs: list[torch.Tensor], case: FlashCase, rows: int, table: torch.Tensor | None) -> torch.Tensor:
    """Non-paged ``[rows, s_kv, h_kv, d]`` or paged ``[pages, page_size, h_kv, d]``; garbage outside sequences."""
    h, d = seqs[0].shape[1:]
    if table is None:
        cache = torch.randn(rows, case.s_kv, h, d)
        for i, seq in enumerate(seqs):
            cache[i, : seq.shape[0]] = seq
        return cache
    pages_per_seq = table.shape[1]
    cache = torch.randn(rows * pages_per_seq + 3, case.page_size, h, d)
    for i, seq in enumerate(seqs):
        flat = torch.randn(pages_per_seq * case.page_size, h, d)
        flat[: seq.shape[0]] = seq
        cache[table[i].long()] = flat.view(pages_per_seq, case.page_size, h, d)
    return cache


def build_call(case: FlashCase, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
               param_dtype: torch.dtype | None = None, device_type: str = "cuda",
               compute_capability: tuple[int, int] | None = (9, 0),
               seed: int = 0) -> tuple[AttentionCall, torch.Tensor]:
    """The call for ``case`` and the expected fp32 output in the query's format, ``[..., h, d_v]``."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mask = case.attn_mask_type
    window = check_set_window_size(mask, case.window)
    bottom_right = resolve_bottom_right(mask, None)
    lens_q, lens_kv = _lengths(case, gen)
    b = case.batch
    qs = [torch.randn(n, case.heads, case.d_qk) for n in lens_q]
    ks = [torch.randn(n, case.kv_heads, case.d_qk) for n in lens_kv]
    vs = [torch.randn(n, case.kv_heads, case.d_v) for n in lens_kv]
    # Round to the run dtype first so the reference sees exactly what the kernel sees.
    qs, ks, vs = ([x.to(dtype).float() for x in group] for group in (qs, ks, vs))
    scale = 1.0 / math.sqrt(case.d_qk)
    slopes = default_alibi_slopes(case.heads) if case.alibi else None
    sink = None
    if case.softmax_type == "off-by-one":
        sink = torch.zeros(case.heads)
    elif case.softmax_type == "learnable":
        sink = torch.randn(case.heads, generator=gen)
    expected_seqs = [
        reference_one_sequence(q, k, v, softmax_scale=scale, causal=is_causal(mask), window_size=window,
                               bottom_right=bottom_right, alibi_slopes=slopes, softmax_offset=sink)
        for q, k, v in zip(qs, ks, vs)
    ]

    tail = 2 if case.kv_cache != "none" else 0   # inference buffers are sized max_batch + 1
    cu_q, cu_kv = _cu(lens_q, tail), _cu(lens_kv, tail)
    cu_q_padded = cu_kv_padded = None
    if case.qkv_format == "thd":
        offsets_q, total_q = _thd_offsets(lens_q, case.pad_between_seqs, gen)
        query = _place(qs, "thd", 0, "garbage", offsets_q, total_q)
        expected = _place(expected_seqs, "thd", 0, "zeros", offsets_q, total_q)
        if case.pad_between_seqs:
            cu_q_padded = torch.tensor(offsets_q + [total_q - 2], dtype=torch.int32)
    else:
        query = _place(qs, case.qkv_format, case.s_q, "garbage")
        expected = _place(expected_seqs, case.qkv_format, case.s_q, "zeros")

    page_table = None
    if case.kv_cache != "none":
        page_table = _page_table(case, b + tail, gen)
        key, value = _cache(ks, case, b + tail, page_table), _cache(vs, case, b + tail, page_table)
        kv_format = "paged" if case.kv_cache == "paged" else "bshd"
        max_kv = case.s_kv
    elif case.qkv_format == "thd":
        offsets_kv, total_kv = _thd_offsets(lens_kv, case.pad_between_seqs, gen)
        key = _place(ks, "thd", 0, "garbage", offsets_kv, total_kv)
        value = _place(vs, "thd", 0, "garbage", offsets_kv, total_kv)
        if case.pad_between_seqs:
            cu_kv_padded = torch.tensor(offsets_kv + [total_kv - 2], dtype=torch.int32)
        kv_format, max_kv = "thd", max(lens_kv)
    else:
        key = _place(ks, case.qkv_format, case.s_kv, "garbage")
        value = _place(vs, case.qkv_format, case.s_kv, "garbage")
        kv_format, max_kv = case.qkv_format, case.s_kv
    max_q = max(lens_q) if case.qkv_format == "thd" else case.s_q

    params = AttentionParams(
        dtype=param_dtype or dtype, device_type=device_type, compute_capability=compute_capability,
        qkv_format=case.qkv_format, kv_format=kv_format, batch_size=b, num_heads=case.heads,
        num_gqa_groups=case.kv_heads, head_dim_qk=case.d_qk, head_dim_v=case.d_v, max_seqlen_q=max_q,
        max_seqlen_kv=max_kv, attn_mask_type=mask, window_size=window, bottom_right_diagonal=bottom_right,
        core_attention_bias_type="alibi" if case.alibi else "no_bias",
        alibi_slopes_shape=(case.heads,) if case.alibi else None, pad_between_seqs=case.pad_between_seqs,
        kv_cache=case.kv_cache, page_size=case.page_size, softmax_type=case.softmax_type,
    )
    move = lambda x: None if x is None else x.to(device)
    call = AttentionCall(
        params=params, query=query.to(device, dtype), key=key.to(device, dtype), value=value.to(device, dtype),
        cu_seqlens_q=move(cu_q), cu_seqlens_kv=move(cu_kv), cu_seqlens_q_padded=move(cu_q_padded),
        cu_seqlens_kv_padded=move(cu_kv_padded), max_seqlen_q=max_q, max_seqlen_kv=max_kv, softmax_scale=scale,
        alibi_slopes=move(slopes), page_table=move(page_table), softmax_offset=move(sink),
    )
    return call, expected


def cases_for(generation: int, gpu: bool = False) -> list[FlashCase]:
    """The grid each generation is checked on (every case should be supported)."""
    cases = []
    s = 128 if gpu else 8
    d = 64 if gpu else 32
    for fmt in ("bshd", "sbhd"):
        for mask in ("no_mask", "causal", "padding", "padding_causal", "padding_causal_bottom_right"):
            cases.append(FlashCase(fmt, mask, s_q=s, s_kv=s))
        cases.append(FlashCase(fmt, "causal_bottom_right", s_q=s // 2, s_kv=s))
        cases.append(FlashCase(fmt, "padding", s_q=s // 2, s_kv=s, kv_heads=1))
    for mask in ("padding", "padding_causal", "padding_causal_bottom_right"):
        cases.append(FlashCase("thd", mask, s_q=s, s_kv=s))
    cases += [
        FlashCase("bshd", "causal", s_q=s, s_kv=s, window=(3, 0)),
        FlashCase("thd", "padding", s_q=s // 2, s_kv=s, window=(2, 1)),
        FlashCase("sbhd", "padding_causal_bottom_right", s_q=s // 2, s_kv=s, window=(4, 0), heads=4, kv_heads=4),
    ]
    if generation == 2:
        cases += [
            FlashCase("bshd", "causal", s_q=s, s_kv=s, alibi=True),
            FlashCase("thd", "padding_causal_bottom_right", s_q=s // 2, s_kv=s, alibi=True),
            FlashCase("bshd", "padding_causal", s_q=s, s_kv=s, d_qk=48, d_v=32),
            FlashCase("thd", "padding", s_q=s, s_kv=s, d_qk=32, d_v=64),
        ]
        for fmt in ("bshd", "sbhd", "thd"):
            cases.append(FlashCase(fmt, "padding_causal_bottom_right", s_q=4, s_kv=512, kv_cache="paged",
                                   page_size=256))
            cases.append(FlashCase(fmt, "padding_causal_bottom_right", s_q=1, s_kv=256, kv_cache="non_paged"))
        cases.append(FlashCase("thd", "padding", s_q=3, s_kv=512, kv_cache="paged", page_size=256, alibi=True))
        return _with_head_dim(cases, d)
    cases += [
        FlashCase("thd", "padding_causal_bottom_right", s_q=s, s_kv=s, pad_between_seqs=True),
        FlashCase("thd", "padding", s_q=s // 2, s_kv=s, pad_between_seqs=True),
    ]
    pages = (16, 128) if generation == 4 else (1, 16, 64)
    for fmt in ("bshd", "sbhd", "thd"):
        for page in pages:
            cases.append(FlashCase(fmt, "padding_causal_bottom_right", s_q=4, s_kv=96 if not gpu else 1000,
                                   kv_cache="paged", page_size=page))
        cases.append(FlashCase(fmt, "padding_causal_bottom_right", s_q=1, s_kv=300 if gpu else 80,
                               kv_cache="non_paged"))
    cases.append(FlashCase("thd", "padding", s_q=5, s_kv=300 if gpu else 70, kv_cache="non_paged", window=(8, 2)))
    if generation == 3:
        cases.append(FlashCase("bshd", "padding_causal_bottom_right", s_q=s, s_kv=s, d_qk=192, d_v=128))
        cases.append(FlashCase("thd", "padding", s_q=s, s_kv=s, d_qk=64, d_v=512))
    else:
        cases.append(FlashCase("thd", "padding_causal_bottom_right", s_q=s, s_kv=s, d_qk=192, d_v=128))
        # sink softmax (learnable_sink), through flash_attn_func, varlen with padding between, a paged cache
        cases += [
            FlashCase("bshd", "causal", s_q=s, s_kv=s, softmax_type="learnable"),
            FlashCase("sbhd", "no_mask", s_q=s, s_kv=s, softmax_type="off-by-one"),
            FlashCase("thd", "padding_causal_bottom_right", s_q=s, s_kv=s, pad_between_seqs=True,
                      softmax_type="learnable"),
            FlashCase("thd", "padding", s_q=s // 2, s_kv=s, window=(2, 1), softmax_type="learnable"),
            FlashCase("bshd", "padding_causal_bottom_right", s_q=4, s_kv=96 if not gpu else 1000, kv_cache="paged",
                      page_size=16, softmax_type="learnable"),
        ]
    return _with_head_dim(cases, d)


def _with_head_dim(cases: list[FlashCase], d: int) -> list[FlashCase]:
    return [replace(c, d_qk=d, d_v=d) if (c.d_qk, c.d_v) == (32, 32) else c for c in cases]


GRADIENT_CASES = [
    ("bshd", "causal", None, False),
    ("sbhd", "padding_causal", [3, 5], False),   # the filler rows of the packed batch read the last, real, position
    ("thd", "padding_causal", [3, 4], False),    # 8 rows: the last is in no sequence
    ("thd", "padding", [2, 5], False),
    ("thd", "padding_causal", [2, 3], True),     # rows 0-1 and 3-5 (cu_seqlens_*_padded [0, 3, 7]): v3 / v4
]
"""(qkv_format, attn_mask_type, sequence lengths or None, a gap after each sequence) of the module-level gradient
checks: batch 2, five positions a sequence in bshd / sbhd, eight rows in thd."""


def check_gradients(generation: int, qkv_format: str, mask_type: str, lengths: list[int] | None, padded: bool, *,
                    device: str, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> None:
    """Run ``DotProductAttention(backend="flash<generation>")`` forward and backward (GQA 4/2) and compare out,
    dq, dk and dv with autograd through ``tests/reference.py`` in fp32 (on CPU)."""
    from attention import DotProductAttention
    from tests.reference import reference_attention

    torch.manual_seed(generation)
    heads, kv_heads, batch, seqlen = 4, 2, 2, 5
    leading = {"thd": (8,), "bshd": (batch, seqlen), "sbhd": (seqlen, batch)}[qkv_format]
    q, k, v = (torch.randn(*leading, h, head_dim, dtype=dtype, device=device, requires_grad=True)
               for h in (heads, kv_heads, kv_heads))
    lengths_kw = {}
    if lengths is not None:
        cu = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32)
        lengths_kw = dict(cu_seqlens_q=cu.to(device), cu_seqlens_kv=cu.to(device))
        if padded:
            starts = torch.tensor([0, lengths[0] + 1, sum(lengths) + 2], dtype=torch.int32, device=device)
            lengths_kw.update(cu_seqlens_q_padded=starts, cu_seqlens_kv_padded=starts)
    module = DotProductAttention(heads, head_dim, num_gqa_groups=kv_heads, qkv_format=qkv_format,
                                 attn_mask_type=mask_type, backend=f"flash{generation}", layer_number=1)
    out = module(q, k, v, **lengths_kw)
    grad_out = torch.randn(out.shape, dtype=out.dtype, device=device)
    out.backward(grad_out)
    reference_inputs = [x.detach().cpu().float().requires_grad_() for x in (q, k, v)]
    expected = reference_attention(*reference_inputs, qkv_format=qkv_format, attn_mask_type=mask_type,
                                   **{name: cu.cpu() for name, cu in lengths_kw.items()})
    expected.backward(grad_out.cpu().float())
    torch.testing.assert_close(out.cpu().float(), expected.detach(), atol=2e-2, rtol=2e-2)
    for name, got, want in zip("qkv", (q, k, v), reference_inputs):
        torch.testing.assert_close(got.grad.cpu().float(), want.grad, atol=3e-2, rtol=3e-2,
                                   msg=lambda m, name=name: f"d{name}: {m}")
