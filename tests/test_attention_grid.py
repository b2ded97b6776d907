"""Cross-backend grids through the public module: every backend that can run a case is compared with
the fp32 oracle (``tests.reference.reference_attention``) at the backend's own tolerance.

Each grid is a short list of :class:`Case` objects built around one concern (masks x heads x shapes,
thd packing, padding sources, head dims, windows, ALiBi, bias tensors, softmax types, arbitrary
masks). Every case is parametrised over all backend names; a backend that cannot run a case is
skipped with the reasons ``DotProductAttention.explain`` gives. Slow backends (the Triton
interpreter on CPU) get a thinned, tiny subset (see :func:`thin`).

The helpers here (``Case``, ``make_inputs``, ``check_case``, ``grid_params``) are shared with
``tests/gpu/test_attention_grid_gpu.py``.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import pytest
import torch

from attention import DotProductAttention
from attention.selection import registry
from tests.reference import reference_attention

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

BACKENDS = ["unfused", "fused", "flash2", "flash3", "flash4"]
MASKS = ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"]
HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (4, 1)}
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def is_causal(mask: str) -> bool:
    return "causal" in mask


def is_padding(mask: str) -> bool:
    return "padding" in mask


@dataclass(frozen=True)
class Case:
    """One attention call. ``padding``: how ragged lengths reach the module for bshd/sbhd
    (``"none"`` = full lengths, ``"cu"`` = cu_seqlens, ``"mask"`` = TE's ``[b,1,1,s]`` bool masks);
    thd is always ragged (``pad_between`` adds 0-3 gap tokens after each sequence).
    ``alibi``: ``"default"`` slopes, ``"h"`` = given ``[h]``, ``"bh"`` = given ``[b, h]``.
    ``arbitrary``: shape tag of the explicit bool mask (``b1ss``, ``1hss``, ``bhss``, ``11ss``)."""

    fmt: str = "bshd"
    b: int = 2
    s_q: int = 8
    s_kv: int = 8
    h: int = 4
    h_kv: int = 4
    d_qk: int = 16
    d_v: int = 16
    mask: str = "no_mask"
    window: tuple[int, int] | None = None
    bottom_right: bool | None = None
    bias: str = "no_bias"
    bias_shape: str | None = None
    alibi: str | None = None
    softmax: str = "vanilla"
    padding: str = "none"
    pad_between: bool = False
    arbitrary: str | None = None
    dtype: torch.dtype = torch.float32

    @property
    def id(self) -> str:
        parts = [self.fmt, f"b{self.b}", f"s{self.s_q}x{self.s_kv}", f"h{self.h}x{self.h_kv}",
                 f"d{self.d_qk}x{self.d_v}", self.mask, _DTYPE_NAMES[self.dtype]]
        if self.window is not None:
            parts.append(f"w{self.window[0]}_{self.window[1]}")
        if self.bottom_right is not None:
            parts.append("br" if self.bottom_right else "tl")
        if self.bias != "no_bias":
            parts.append(self.bias + (f"-{self.bias_shape}" if self.bias_shape else "")
                         + (f"-{self.alibi}" if self.alibi else ""))
        if self.softmax != "vanilla":
            parts.append(self.softmax)
        if self.padding != "none":
            parts.append(f"pad-{self.padding}")
        if self.pad_between:
            parts.append("pad_between")
        if self.arbitrary:
            parts.append(f"mask-{self.arbitrary}")
        return "-".join(parts)

    @property
    def ragged(self) -> bool:
        return self.fmt == "thd" or self.padding in ("cu", "mask")

    @property
    def cross(self) -> bool:
        return self.s_q != self.s_kv


def make_inputs(case: Case, device: str | torch.device = "cpu") -> dict:
    """Deterministic random tensors for ``case`` (seeded by its id), plus the module's constructor
    kwargs, the forward kwargs and the reference kwargs."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.id.encode()))

    def randn(*shape, dtype=case.dtype):
        return torch.randn(*shape, generator=gen, device=device).to(dtype=dtype)

    def randint(low: int, high: int, n: int) -> list[int]:
        return torch.randint(low, high, (n,), generator=gen, device=device).tolist()

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    def lengths(s: int) -> list[int]:
        ls = randint(1, s + 1, case.b)
        ls[randint(0, case.b, 1)[0]] = s   # one full-length sequence
        return ls

    b, h, h_kv = case.b, case.h, case.h_kv
    lens_q = lens_kv = None
    if case.ragged:
        lens_q = lengths(case.s_q)
        lens_kv = lens_q if not case.cross else lengths(case.s_kv)

    def cu(ls: list[int]) -> torch.Tensor:
        return torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32, device=device)

    fwd: dict = {}
    ref: dict = {}
    if case.fmt == "thd":
        cu_q, cu_kv = cu(lens_q), cu(lens_kv)
        fwd.update(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
        tq, tkv = sum(lens_q), sum(lens_kv)
        if case.pad_between:
            gaps_q = randint(0, 4, b)
            gaps_kv = gaps_q if not case.cross else randint(0, 4, b)
            cu_qp = cu([l + g for l, g in zip(lens_q, gaps_q)])
            cu_kvp = cu([l + g for l, g in zip(lens_kv, gaps_kv)])
            fwd.update(cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp)
            tq, tkv = int(cu_qp[-1]), int(cu_kvp[-1])
        q = randn(tq, h, case.d_qk)
        k = randn(tkv, h_kv, case.d_qk)
        v = randn(tkv, h_kv, case.d_v)
        ref.update({name: t.cpu() for name, t in fwd.items()})
    else:
        def shape(s: int, heads: int, d: int) -> tuple[int, ...]:
            return (b, s, heads, d) if case.fmt == "bshd" else (s, b, heads, d)

        q = randn(*shape(case.s_q, h, case.d_qk))
        k = randn(*shape(case.s_kv, h_kv, case.d_qk))
        v = randn(*shape(case.s_kv, h_kv, case.d_v))
        if case.ragged:
            cu_q, cu_kv = cu(lens_q), cu(lens_kv)
            ref.update(cu_seqlens_q=cu_q.cpu(), cu_seqlens_kv=cu_kv.cpu())
            if case.padding == "cu":
                fwd.update(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
            else:   # TE's [b, 1, 1, s] padding masks, True = padded
                def pad_mask(ls: list[int], s: int) -> torch.Tensor:
                    return (torch.arange(s)[None, :] >= torch.tensor(ls)[:, None]).view(b, 1, 1, s).to(device)

                mq = pad_mask(lens_q, case.s_q)
                fwd["attention_mask"] = mq if not case.cross else (mq, pad_mask(lens_kv, case.s_kv))

    if case.bias in ("post_scale_bias", "pre_scale_bias"):
        sizes = {"11ss": (1, 1, case.s_q, case.s_kv), "1hss": (1, h, case.s_q, case.s_kv),
                 "b1ss": (b, 1, case.s_q, case.s_kv), "bhss": (b, h, case.s_q, case.s_kv),
                 "111s": (1, 1, 1, case.s_kv)}[case.bias_shape]
        bias = randn(*sizes)
        fwd.update(core_attention_bias_type=case.bias, core_attention_bias=bias)
        ref.update(bias_type=case.bias, bias=bias.cpu())
    elif case.bias == "alibi":
        fwd["core_attention_bias_type"] = "alibi"
        ref["bias_type"] = "alibi"
        if case.alibi in ("h", "bh"):
            shape = (h,) if case.alibi == "h" else (b, h)
            slopes = rand(*shape) * 0.9 + 0.1
            fwd["alibi_slopes"] = slopes
            ref["alibi_slopes"] = slopes.cpu()

    if case.arbitrary is not None:
        sizes = {"11ss": (1, 1), "1hss": (1, h), "b1ss": (b, 1), "bhss": (b, h)}[case.arbitrary]
        amask = rand(*sizes, case.s_q, case.s_kv) < 0.3
        fwd["attention_mask"] = amask
        ref["attention_mask"] = amask.cpu()

    if case.window is not None:
        fwd["window_size"] = case.window
        ref["window_size"] = case.window
    if case.bottom_right is not None:
        fwd["bottom_right_diagonal"] = case.bottom_right
        ref["bottom_right_diagonal"] = case.bottom_right

    module_kwargs = {
        "num_attention_heads": h,
        "kv_channels": case.d_qk if case.d_qk == case.d_v else (case.d_qk, case.d_v),
        "num_gqa_groups": h_kv,
        "qkv_format": case.fmt,
        "attn_mask_type": case.mask,
        "softmax_type": case.softmax,
        "attention_type": "cross" if case.cross else "self",
    }
    softmax_offset = None
    if case.softmax == "learnable":
        softmax_offset = randn(h, dtype=torch.float32).cpu()
    elif case.softmax == "off-by-one":
        softmax_offset = torch.zeros(h)
    ref.update(qkv_format=case.fmt, attn_mask_type=case.mask, softmax_offset=softmax_offset)
    return {"q": q, "k": k, "v": v, "module_kwargs": module_kwargs, "fwd": fwd, "ref": ref,
            "softmax_offset": softmax_offset}


def make_module(case: Case, inputs: dict, backend: str | None,
                device: str | torch.device = "cpu") -> DotProductAttention:
    module = DotProductAttention(**inputs["module_kwargs"], backend=backend).to(device)
    if case.softmax == "learnable":
        with torch.no_grad():
            module.softmax_offset.copy_(inputs["softmax_offset"].to(device))
    return module


def reference_output(inputs: dict) -> torch.Tensor:
    """The fp32 oracle, computed on the inputs' device (the reference builds its helper tensors on
    the default device)."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    ref = dict(inputs["ref"])
    with torch.device(q.device):
        ref = {n: (t.to(q.device) if isinstance(t, torch.Tensor) else t) for n, t in ref.items()}
        return reference_attention(q, k, v, **ref)


def skip_reasons(text: str) -> str:
    """The reason lines of an ``explain()`` text, joined for a skip message."""
    reasons = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("- ")]
    return "; ".join(reasons) or text.splitlines()[0]


_last: dict = {}


def cached_inputs(case: Case, device: str | torch.device) -> dict:
    """``make_inputs`` for the last case only (the grids run case-major, so the backends of one case
    share the inputs and the oracle's output, which ``check_case`` adds when first needed)."""
    key = (case, str(device))
    if key not in _last:
        _last.clear()
        _last[key] = make_inputs(case, device)
    return _last[key]


def check_case(case: Case, backend: str, device: str | torch.device = "cpu") -> None:
    """Run ``case`` through ``DotProductAttention(backend=backend)`` and compare with the oracle at
    ``registry()[backend].capabilities.tolerances[dtype]``; skip with the reasons if it cannot run."""
    inputs = cached_inputs(case, device)
    module = make_module(case, inputs, backend, device)
    q, k, v, fwd = inputs["q"], inputs["k"], inputs["v"], inputs["fwd"]
    with torch.no_grad():   # forward grids: inference, so forward-only backends are eligible
        text = module.explain(q, k, v, **fwd)
        if not text.startswith(f"Selected backend: {backend}"):
            pytest.skip(f"{backend} cannot run {case.id}: {skip_reasons(text)}")
        out = module(q, k, v, **fwd)
    assert module.last_backend == backend
    if "expected" not in inputs:
        inputs["expected"] = reference_output(inputs)
    expected = inputs["expected"]
    assert out.shape == expected.shape, f"{backend}: output shape {tuple(out.shape)} != {tuple(expected.shape)}"
    assert out.dtype == q.dtype
    atol, rtol = registry()[backend].capabilities.tolerances[case.dtype]
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol, msg=lambda m: f"{backend} {case.id}: {m}")


# ------------------------------------------------------------------------------------------------
# Thinning for slow backends
# ------------------------------------------------------------------------------------------------

#: Backends too slow here to run every case: on CPU the Triton kernels run in the interpreter.
SLOW_BACKENDS = frozenset() if torch.cuda.is_available() else frozenset({"fused"})
#: The interpreter's bf16 ``tl.dot`` is wrong, and it is slow: fp16/fp32, tiny shapes only.
SLOW_DTYPES = (torch.float16, torch.float32)
SLOW_MAX_HEAD_DIM = 32
SLOW_MAX_SEQLEN = 24


def slow_ok(case: Case) -> bool:
    return (case.dtype in SLOW_DTYPES and max(case.d_qk, case.d_v) <= SLOW_MAX_HEAD_DIM
            and max(case.s_q, case.s_kv) <= SLOW_MAX_SEQLEN)


def thin(cases: list[Case], backend: str, keep: int) -> list[Case]:
    """All of ``cases`` for a fast backend; for a slow one, at most ``keep`` of the tiny ones: those whose ids
    hash lowest (crc32, stable across Python versions), in grid order. An even stride would alias with the grids'
    innermost loops (five format / heads / dtype variants a mask and shape): a stride of five kept only one."""
    if backend not in SLOW_BACKENDS or keep >= len(cases):
        return cases
    small = [c for c in cases if slow_ok(c)]
    if len(small) <= keep:
        return small
    kept = sorted(range(len(small)), key=lambda i: zlib.crc32(small[i].id.encode()))[:keep]
    return [small[i] for i in sorted(kept)]


def grid_params(cases: list[Case], keep_slow: int = 10, backends: list[str] = BACKENDS) -> list:
    """``pytest.param(backend, case)`` for every backend, thinned for slow backends."""
    seen = set()
    unique = [c for c in cases if not (c in seen or seen.add(c))]
    kept = {name: set(thin(unique, name, keep_slow)) for name in backends}
    return [pytest.param(name, case, id=f"{name}-{case.id}")
            for case in unique for name in backends if case in kept[name]]


# ------------------------------------------------------------------------------------------------
# The grids
# ------------------------------------------------------------------------------------------------

SHAPES = [(8, 8), (6, 10), (10, 6), (1, 9)]   # self, cross (s_q < s_kv), s_q > s_kv, decode


def _padding_for(mask: str) -> str:
    return "cu" if is_padding(mask) else "none"


FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

MASK_CASES = [
    # bshd: every mask x MHA/GQA/MQA x shape in fp32, plus GQA in fp16; sbhd: GQA in fp32
    Case(fmt=fmt, s_q=sq, s_kv=skv, h=h, h_kv=hk, mask=mask, padding=_padding_for(mask), dtype=dtype)
    for mask in MASKS
    for (sq, skv) in SHAPES
    for (fmt, (h, hk), dtype) in (("bshd", HEADS["mha"], FP32), ("bshd", HEADS["gqa"], FP32),
                                  ("bshd", HEADS["mqa"], FP32), ("bshd", HEADS["gqa"], FP16),
                                  ("sbhd", HEADS["gqa"], FP32))
]

THD_CASES = [
    Case(fmt="thd", b=3, s_q=sq, s_kv=skv, h=4, h_kv=hk, mask=mask, pad_between=pb, window=w, dtype=dtype)
    for mask in ("padding", "padding_causal", "padding_causal_bottom_right")
    for pb in (False, True)
    for (sq, skv) in ((8, 8), (6, 11))
    for w in (None, (2, 2))
    for (hk, dtype) in ((2, FP32), (1 if pb else 4, FP16))
]

PADDING_CASES = [
    Case(fmt=fmt, b=3, s_q=sq, s_kv=skv, h=4, h_kv=hk, mask=mask, padding=padding, dtype=dtype)
    for padding in ("cu", "mask")
    for mask in ("padding", "padding_causal", "padding_causal_bottom_right")
    for (sq, skv) in ((9, 9), (5, 12))
    for (fmt, hk, dtype) in (("bshd", 4, FP32), ("bshd", 1, FP16), ("bshd", 2, BF16), ("sbhd", 2, FP32))
]

HEAD_DIM_CASES = [
    Case(fmt=fmt, d_qk=dqk, d_v=dv, h_kv=2, mask=mask, padding=_padding_for(mask) if fmt != "thd" else "none",
         s_q=sq, s_kv=skv, dtype=dtype)
    for (dqk, dv) in ((16, 16), (32, 16), (16, 32), (8, 24), (24, 24))
    for (fmt, mask) in (("bshd", "no_mask"), ("bshd", "causal"), ("bshd", "padding_causal_bottom_right"),
                        ("thd", "padding_causal"))
    for (sq, skv, dtype) in ((8, 8, FP32), (5, 9, FP16))
]

WINDOWS_NON_CAUSAL = [(2, 2), (0, 0), (3, 1), (0, 4)]
WINDOWS_CAUSAL = [(3, 0), (0, 0), (2, 2), (1, 5), (-1, 0)]   # right != 0 is forced to 0 for causal masks
WINDOW_CASES = [
    Case(fmt="bshd", s_q=sq, s_kv=skv, h_kv=2, mask=mask, window=w, bottom_right=br,
         padding=_padding_for(mask), dtype=FP32 if i % 2 == 0 else FP16)
    for mask in MASKS
    for i, w in enumerate(WINDOWS_CAUSAL if is_causal(mask) else WINDOWS_NON_CAUSAL)
    for (sq, skv) in ((8, 8), (5, 11), (11, 5))
    for br in ((None,) if is_causal(mask) else (True, False))
    if (sq, skv) != (11, 5) or br is not False
]

ALIBI_MASKS = ("no_mask", "padding", "causal", "causal_bottom_right", "padding_causal_bottom_right")
ALIBI_CASES = [
    Case(fmt="bshd", s_q=sq, s_kv=skv, h=h, h_kv=h, mask=mask, bias="alibi", alibi=alibi, bottom_right=br,
         padding=_padding_for(mask), dtype=dtype)
    for mask in ALIBI_MASKS
    for br in ((True, False) if not is_causal(mask) else (None,))
    for (sq, skv) in ((8, 8), (5, 10))
    for (h, alibi, dtype) in ((4, "default", FP32), (4, "h", FP32), (4, "bh", FP32), (6, "default", FP32),
                              (4, "bh", FP16))
    if dtype == FP32 or (sq, skv) == (5, 10)
] + [
    # sbhd with cu_seqlens and thd with gaps, GQA, windows
    Case(fmt=fmt, b=3, s_q=sq, s_kv=skv, h=4, h_kv=2, mask=mask, bias="alibi", alibi=alibi,
         window=(3, 1) if (sq, skv) == (6, 10) else None,
         pad_between=fmt == "thd", padding="cu" if fmt == "sbhd" else "none", dtype=FP16)
    for fmt in ("sbhd", "thd")
    for mask in ("padding", "padding_causal", "padding_causal_bottom_right")
    for alibi in ("default", "bh")
    for (sq, skv) in ((8, 8), (6, 10))
]

BIAS_SHAPES = ["11ss", "1hss", "b1ss", "bhss", "111s"]
BIAS_CASES = [
    Case(fmt="bshd", s_q=sq, s_kv=skv, h_kv=2, mask=mask, bias=bias, bias_shape=shape,
         padding=_padding_for(mask), dtype=FP32)
    for bias in ("post_scale_bias", "pre_scale_bias")
    for shape in BIAS_SHAPES
    for mask in ("no_mask", "causal", "padding_causal_bottom_right")
    for (sq, skv) in ((8, 8), (5, 10))
] + [
    Case(fmt=fmt, s_q=5, s_kv=10, h_kv=2, mask=mask, bias=bias, bias_shape=shape, padding=_padding_for(mask),
         dtype=dtype)
    for bias in ("post_scale_bias", "pre_scale_bias")
    for shape in BIAS_SHAPES
    for (fmt, mask, dtype) in (("bshd", "no_mask", FP16), ("sbhd", "padding_causal_bottom_right", BF16))
]

SOFTMAX_CASES = [
    Case(fmt=fmt, b=3, s_q=sq, s_kv=skv, h_kv=2, mask=mask, window=w, softmax=softmax,
         padding=_padding_for(mask) if fmt != "thd" else "none", pad_between=fmt == "thd", dtype=dtype)
    for softmax in ("vanilla", "off-by-one", "learnable")
    for fmt in ("bshd", "thd")
    for (mask, w) in ((("no_mask", None), ("causal", None), ("padding", None),
                       ("padding_causal_bottom_right", (4, 0))) if fmt != "thd" else
                      (("padding", None), ("padding_causal", None), ("padding_causal_bottom_right", (4, 0))))
    for (sq, skv, dtype) in ((8, 8, FP32), (5, 10, FP16))
]

ARBITRARY_CASES = [
    Case(fmt=fmt, s_q=sq, s_kv=skv, h_kv=2, mask="arbitrary", arbitrary=shape, window=w, bottom_right=br,
         bias="alibi" if alibi else "no_bias", alibi="h" if alibi else None, dtype=dtype)
    for shape in ("b1ss", "1hss", "bhss", "11ss")
    for (sq, skv) in ((8, 8), (5, 10))
    for (w, br, alibi) in ((None, None, False), ((2, 2), True, False), ((2, 2), False, True))
    for (fmt, dtype) in ((("bshd", FP32), ("sbhd", FP16)) if w is None else (("bshd", FP32),))
]


#: How many tiny cases of each grid the slow (interpreted) backends run.
KEEP_SLOW = {
    "MASK_CASES": 24, "THD_CASES": 16, "PADDING_CASES": 12, "HEAD_DIM_CASES": 12, "WINDOW_CASES": 20,
    "ALIBI_CASES": 20, "BIAS_CASES": 0, "SOFTMAX_CASES": 14, "ARBITRARY_CASES": 0,   # fused: no bias, no arbitrary
}
GRIDS = {name: globals()[name] for name in KEEP_SLOW}


@pytest.mark.parametrize("backend,case", grid_params(MASK_CASES, keep_slow=KEEP_SLOW["MASK_CASES"]))
def test_masks_heads_shapes(backend, case):
    """Six mask types x MHA/GQA/MQA x self/cross/decode shapes, bshd and sbhd (padding masks ragged)."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(THD_CASES, keep_slow=KEEP_SLOW["THD_CASES"]))
def test_thd(backend, case):
    """thd with and without pad tokens between sequences (cu_seqlens_*_padded), self and cross."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(PADDING_CASES, keep_slow=KEEP_SLOW["PADDING_CASES"]))
def test_padding_sources(backend, case):
    """Ragged lengths given as cu_seqlens or as TE's [b,1,1,s] masks; padded query rows are zero."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(HEAD_DIM_CASES, keep_slow=KEEP_SLOW["HEAD_DIM_CASES"]))
def test_head_dims(backend, case):
    """d_qk == d_v and d_qk != d_v (MLA shapes)."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(WINDOW_CASES, keep_slow=KEEP_SLOW["WINDOW_CASES"]))
def test_sliding_windows(backend, case):
    """Windows with every mask type and both alignments (causal masks force right = 0)."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(ALIBI_CASES, keep_slow=KEEP_SLOW["ALIBI_CASES"]))
def test_alibi(backend, case):
    """ALiBi: default, [h] and [b, h] slopes; top-left and bottom-right alignment."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(BIAS_CASES, keep_slow=KEEP_SLOW["BIAS_CASES"]))
def test_bias_tensors(backend, case):
    """post_scale_bias / pre_scale_bias of shapes 11ss, 1hss, b1ss, bhss, 111s."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(SOFTMAX_CASES, keep_slow=KEEP_SLOW["SOFTMAX_CASES"]))
def test_softmax_types(backend, case):
    """vanilla, off-by-one and learnable (random offsets) softmax."""
    check_case(case, backend)


@pytest.mark.parametrize("backend,case", grid_params(ARBITRARY_CASES, keep_slow=KEEP_SLOW["ARBITRARY_CASES"]))
def test_arbitrary_mask(backend, case):
    """An explicit bool mask (True = masked) of shapes b1ss, 1hss, bhss, 11ss, with windows and ALiBi."""
    check_case(case, backend)


# ------------------------------------------------------------------------------------------------
# Properties the grids rely on
# ------------------------------------------------------------------------------------------------


def test_grids_are_sized_for_ci():
    """The unfused grid stays a few hundred cases; the interpreter's share stays small and tiny."""
    total = sum(len(set(cases)) for cases in GRIDS.values())
    assert 300 <= total <= 650, total
    if "fused" in SLOW_BACKENDS:
        fused = [c for name, cases in GRIDS.items() for c in thin(list(dict.fromkeys(cases)), "fused", KEEP_SLOW[name])]
        assert all(slow_ok(c) for c in fused)
        assert len(fused) <= 150


def test_padded_query_rows_are_zero():
    """bshd with ragged lengths: positions past each query length come back as exact zeros."""
    case = Case(b=3, s_q=9, s_kv=9, mask="padding_causal", padding="mask")
    inputs = make_inputs(case)
    module = make_module(case, inputs, "unfused")
    out = module(inputs["q"], inputs["k"], inputs["v"], **inputs["fwd"])
    lens = inputs["ref"]["cu_seqlens_q"].diff().tolist()
    assert any(n < 9 for n in lens)
    for i, n in enumerate(lens):
        assert out[i, n:].eq(0).all()
        assert out[i, :n].ne(0).any()


def test_thd_gap_tokens_are_zero():
    """thd with pad tokens between sequences: the gap rows of the output are zeros."""
    case = Case(fmt="thd", b=3, s_q=8, s_kv=8, mask="padding", pad_between=True)
    for seed_case in (case, dataclasses.replace(case, b=4)):
        inputs = make_inputs(seed_case)
        out = make_module(seed_case, inputs, "unfused")(inputs["q"], inputs["k"], inputs["v"], **inputs["fwd"])
        cu, cu_p = inputs["fwd"]["cu_seqlens_q"], inputs["fwd"]["cu_seqlens_q_padded"]
        valid = torch.zeros(out.shape[0], dtype=torch.bool)
        for i in range(seed_case.b):
            valid[int(cu_p[i]) : int(cu_p[i]) + int(cu[i + 1] - cu[i])] = True
        assert out[~valid].eq(0).all()


def test_automatic_choice_on_cpu_is_a_backend_that_can_run():
    """Without backend=, the module picks the first eligible backend by priority and reports it."""
    case = Case(mask="causal", dtype=torch.float16)
    inputs = make_inputs(case)
    module = make_module(case, inputs, None)
    with torch.no_grad():
        text = module.explain(inputs["q"], inputs["k"], inputs["v"])
        module(inputs["q"], inputs["k"], inputs["v"])
    assert text.startswith(f"Selected backend: {module.last_backend}")
    assert module.last_backend in BACKENDS


EMPTY_CASES = {   # (q shape, k / v shape, forward kwargs): no query, no key, or every key sequence empty
    "bshd s_q=0": ((2, 0, 4, 16), (2, 5, 2, 16), {}),
    "bshd s_kv=0": ((2, 5, 4, 16), (2, 0, 2, 16), {}),
    "thd no key": ((5, 4, 16), (3, 2, 16), {"cu_seqlens_q": [0, 2, 5], "cu_seqlens_kv": [0, 0, 0],
                                            "max_seqlen_q": 3, "max_seqlen_kv": 0}),
}


@pytest.mark.parametrize("backend", ["unfused", "fused"])
@pytest.mark.parametrize("name", list(EMPTY_CASES))
def test_empty_queries_or_keys(backend, name):
    """Nothing to attend to gives zeros, nothing to compute an empty output (the reference's answers),
    not an error from inside torch."""
    q_shape, kv_shape, kwargs = EMPTY_CASES[name]
    fmt = "thd" if len(q_shape) == 3 else "bshd"
    kwargs = {key: torch.tensor(value, dtype=torch.int32) if isinstance(value, list) else value
              for key, value in kwargs.items()}
    q, k, v = torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format=fmt, attention_type="cross",
                                 attn_mask_type="padding" if fmt == "thd" else "no_mask", backend=backend)
    reasons = module.explain(q, k, v, **kwargs)
    if not reasons.startswith(f"Selected backend: {backend}"):
        pytest.skip(skip_reasons(reasons))
    cu = {key: value for key, value in kwargs.items() if key.startswith("cu_")}
    expected = reference_attention(q, k, v, qkv_format=fmt, attn_mask_type="padding" if fmt == "thd" else "no_mask",
                                   **cu)
    torch.testing.assert_close(module(q, k, v, **kwargs), expected)


@pytest.mark.parametrize("backend", ["unfused", "fused"])
def test_thd_self_attention_keys_take_the_queries_padded_offsets(backend):
    """Self-attention given only cu_seqlens_q and cu_seqlens_q_padded: k / v hold the queries' tokens, so the keys
    sit at the same padded offsets (they were read at the unpadded ones)."""
    q, k, v = torch.randn(8, 4, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16)
    cu, padded = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 4, 7], dtype=torch.int32)
    module = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="thd", attn_mask_type="padding_causal",
                                 backend=backend)
    reasons = module.explain(q, k, v, cu_seqlens_q=cu, cu_seqlens_q_padded=padded)
    if not reasons.startswith(f"Selected backend: {backend}"):
        pytest.skip(skip_reasons(reasons))
    expected = reference_attention(q, k, v, qkv_format="thd", attn_mask_type="padding_causal", cu_seqlens_q=cu,
                                   cu_seqlens_kv=cu, cu_seqlens_q_padded=padded, cu_seqlens_kv_padded=padded)
    torch.testing.assert_close(module(q, k, v, cu_seqlens_q=cu, cu_seqlens_q_padded=padded), expected,
                               atol=1e-4, rtol=1e-4)
