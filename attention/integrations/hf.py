"""Hugging Face transformers integration: every attention layer of a model runs through
:class:`attention.DotProductAttention`.

Usage::

    from attention.integrations.hf import register
    register()                                              # the name "dpa"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="dpa")
    model.set_attn_implementation("dpa")                    # or switch a loaded model

``register(name)`` puts one attention function and one mask function under ``name`` in
transformers' ``AttentionInterface`` and ``AttentionMaskInterface``. The pair works like this:

* The mask function (:func:`dpa_mask`) returns ``None`` only for a plain causal mask with no
  padding whose queries are the last tokens of the keys (the usual prefill and decode steps); the
  attention function then runs ``causal_bottom_right``. Every other case gets HF's exact 4-D
  boolean mask (``True`` = attend), materialised by ``sdpa_mask`` without any of its skips.
* The attention function (:func:`dpa_attention_forward`) turns a 4-D mask into the cheapest exact
  description our module takes, checked element by element against the mask once per mask tensor
  (every layer of a forward shares it): no padding -> ``bshd`` with ``causal_bottom_right`` (plus
  the sliding window); left or right padding (one contiguous run of real keys per row, as
  ``generate()`` and tokenizers make) -> ``thd`` with ``cu_seqlens``, ``cu_seqlens_*_padded`` offsets
  and ``padding_causal_bottom_right`` (``padding_causal`` for right padding, whose pad queries HF
  lets see the real keys); anything else (packed sequences, image blocks, per-head masks)
  -> ``attn_mask_type="arbitrary"``. Each choice reproduces the mask exactly, so fp32 logits match
  ``attn_implementation="eager"``; only the arbitrary case is limited to the unfused backend.

HF's inputs are ``[b, h, s, d]`` (key/value with the KV heads: GQA); the output is
``[b, s_q, h, d_v]`` contiguous, as ``sdpa_attention_forward`` returns. One
``DotProductAttention`` is kept per (heads, KV heads, head dims, scale, dropout, backend).
transformers is imported lazily: importing this module does not need it, ``register`` does.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from attention import selection
from attention.dot_product_attention import DotProductAttention
from attention.formats import cu_seqlens_from_lengths

__all__ = ["cached_modules", "dpa_attention_forward", "dpa_mask", "register"]

_MAX_MODULES = 64
_MODULES: OrderedDict[tuple, DotProductAttention] = OrderedDict()
_LAYOUTS: WeakIdKeyDictionary = WeakIdKeyDictionary()   # mask -> {(shape, window_left): (version, _Layout)}
_MASK_TYPES = {  # (padding, causal alignment) -> attn_mask_type
    (False, ""): "no_mask", (False, "bottom_right"): "causal_bottom_right", (False, "top_left"): "causal",
    (True, ""): "padding", (True, "bottom_right"): "padding_causal_bottom_right", (True, "top_left"): "padding_causal",
}
_UNSUPPORTED_KWARGS = {
    "softcap": "logit soft-capping (softcap)",
    "s_aux": "attention sinks (s_aux)",
    "position_bias": "a position_bias tensor",
}


def register(name: str = "dpa", *, backend: str | Sequence[str] | None = None) -> str:
    """Register DotProductAttention with transformers under ``name``; returns ``name``.

    ``backend`` is passed to every ``DotProductAttention`` made for this name (a backend name or
    a priority list, e.g. ``"unfused"``); ``None`` selects automatically per call.

    Raises ``ImportError`` (with the install hint) when transformers is missing and
    ``ValueError`` for an unknown backend name.
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "attention.integrations.hf needs transformers>=4.56: pip install 'dpa-attention[hf]'"
        ) from error
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string; got {name!r}")
    backends = selection.expand_names(backend, "backend") if backend is not None else None

    def attention_function(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           sliding_window=None, **kwargs):
        return dpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                     sliding_window=sliding_window, backend=backends, **kwargs)

    attention_function.__name__ = attention_function.__qualname__ = f"dpa_attention_forward_{name}"
    AttentionInterface.register(name, attention_function)
    AttentionMaskInterface.register(name, dpa_mask)
    return name


def cached_modules() -> dict[tuple, DotProductAttention]:
    """The ``DotProductAttention`` modules made so far, by configuration key (read ``.last_backend``)."""
    return dict(_MODULES)


def dpa_mask(
    batch_size: int,
    q_length: int | None = None,
    kv_length: int | None = None,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    use_vmap: bool = False,
    device: torch.device | str = "cpu",
    cache_position: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """transformers mask function: ``None`` for plain bottom-right causal attention without padding,
    else the exact 4-D bool mask ``[b, 1, q_length, kv_length]`` (True = attend). transformers before
    5.4 give the queries' ``cache_position`` instead of ``q_length`` / ``q_offset`` (and take it back)."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    if cache_position is not None:
        q_length, q_offset = cache_position.shape[0], cache_position[0]
        device = cache_position.device
    mask_function = mask_function or causal_mask_function
    # allow_is_causal_skip=False: the model adds to the mask itself (Falcon's ALiBi, Doge), so it must get one
    if (kwargs.get("allow_is_causal_skip", True) and mask_function is causal_mask_function
            and int(q_offset) + q_length == kv_offset + kv_length):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None or bool(padding[:, kv_offset : kv_offset + kv_length].all()):
            return None
    queries = {"cache_position": cache_position} if cache_position is not None else {
        "q_length": q_length, "q_offset": q_offset}
    return sdpa_mask(
        batch_size=batch_size,
        kv_length=kv_length,
        kv_offset=kv_offset,
        **queries,
        mask_function=mask_function,
        attention_mask=attention_mask,
        local_size=local_size,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
        use_vmap=use_vmap,
        device=device,
    )


def dpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    backend: tuple[str, ...] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function. ``query [b, h, s_q, d]``, ``key/value [b, h_kv, s_kv, d]``
    -> ``([b, s_q, h, d_v], None)``. ``sliding_window`` follows HF: query ``i`` sees key ``j`` when
    ``i - sliding_window < j <= i``. Unknown keyword arguments are ignored; ``softcap``, ``s_aux`` and
    ``position_bias`` raise ``ValueError`` rather than being dropped."""
    for kwarg, what in _UNSUPPORTED_KWARGS.items():
        if kwargs.get(kwarg) is not None:
            raise ValueError(f"DotProductAttention through transformers does not support {what}; "
                             "use attn_implementation='eager' for this model")
    if kwargs.get("output_attentions"):   # (the model's `attentions` would come back empty, silently)
        warnings.warn("DotProductAttention through transformers returns no attention weights "
                      "(output_attentions=True); use attn_implementation='eager' for them", UserWarning, stacklevel=2)
    b, h, s_q, d_qk = query.shape
    h_kv, s_kv, d_v = key.shape[1], key.shape[2], value.shape[-1]
    attn = _module(h, h_kv, d_qk, d_v, scaling, dropout, backend)
    attn.train(dropout > 0)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)   # bshd views
    left = sliding_window - 1 if sliding_window else None

    if attention_mask is None:
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else causal
        if not causal and left is not None:
            raise ValueError("a bidirectional sliding window needs a 4-D attention_mask (got None)")
        out = attn(q, k, v, qkv_format="bshd", attn_mask_type="causal_bottom_right" if causal else "no_mask",
                   window_size=(-1 if left is None else left, 0) if causal else (-1, -1))
        return out.reshape(b, s_q, h, d_v).contiguous(), None

    mask = attention_mask[..., :s_kv] if attention_mask.shape[-1] > s_kv else attention_mask
    if mask.dim() == 4 and mask.shape[-2] == 1 and s_q > 1:   # one row for every query, as eager broadcasts it
        mask = mask.expand(-1, -1, s_q, -1)
    if mask.dim() != 4 or mask.shape[-2:] != (s_q, s_kv) or mask.shape[0] not in (1, b):
        raise ValueError(f"attention_mask must be [b|1, 1|h, s_q|1, s_kv] = [{b}, 1, {s_q}, {s_kv}]; "
                         f"got {tuple(attention_mask.shape)}")
    if mask.dtype != torch.bool:
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool((blocked | (mask == 0)).all()):   # a real additive bias, not just a mask
            out = attn(q, k, v, qkv_format="bshd", attn_mask_type="no_mask",
                       core_attention_bias_type="post_scale_bias", core_attention_bias=mask)
            return out.reshape(b, s_q, h, d_v).contiguous(), None
        mask = ~blocked
    layout = _layout(mask.expand(b, -1, -1, -1), left, key=attention_mask)
    if layout.mask_type == "arbitrary":
        out = attn(q, k, v, qkv_format="bshd", attn_mask_type="arbitrary", attention_mask=layout.blocked)
    elif layout.cu_seqlens_q is None:
        out = attn(q, k, v, qkv_format="bshd", attn_mask_type=layout.mask_type, window_size=layout.window)
    else:
        out = attn(
            q.reshape(b * s_q, h, d_qk), k.reshape(b * s_kv, h_kv, d_qk), v.reshape(b * s_kv, h_kv, d_v),
            qkv_format="thd", attn_mask_type=layout.mask_type, window_size=layout.window,
            cu_seqlens_q=layout.cu_seqlens_q, cu_seqlens_kv=layout.cu_seqlens_kv,
            cu_seqlens_q_padded=layout.cu_seqlens_q_padded, cu_seqlens_kv_padded=layout.cu_seqlens_kv_padded,
            max_seqlen_q=layout.max_seqlen_q, max_seqlen_kv=layout.max_seqlen_kv,
        )
    return out.reshape(b, s_q, h, d_v).contiguous(), None


def _module(h: int, h_kv: int, d_qk: int, d_v: int, scaling: float | None, dropout: float,
            backend: tuple[str, ...] | None) -> DotProductAttention:
    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(d_qk)
    key = (h, h_kv, d_qk, d_v, scale, float(dropout), backend)
    attn = _MODULES.get(key)
    if attn is None:
        attn = DotProductAttention(h, (d_qk, d_v), num_gqa_groups=h_kv, attention_dropout=float(dropout),
                                   qkv_format="bshd", attn_mask_type="no_mask", softmax_scale=scale,
                                   backend=backend)
        _MODULES[key] = attn
        if len(_MODULES) > _MAX_MODULES:
            _MODULES.popitem(last=False)
    else:
        _MODULES.move_to_end(key)
    return attn


@dataclass(frozen=True)
class _Layout:
    """How to hand one 4-D mask to DotProductAttention exactly."""

    mask_type: str
    window: tuple[int, int] = (-1, -1)
    blocked: torch.Tensor | None = None          # arbitrary: True = masked out
    cu_seqlens_q: torch.Tensor | None = None     # thd: real lengths ...
    cu_seqlens_kv: torch.Tensor | None = None
    cu_seqlens_q_padded: torch.Tensor | None = None   # ... and where each row's run starts
    cu_seqlens_kv_padded: torch.Tensor | None = None
    max_seqlen_q: int | None = None
    max_seqlen_kv: int | None = None


def _layout(mask: torch.Tensor, window_left: int | None, key: torch.Tensor | None = None) -> _Layout:
    """The layout of ``mask`` (bool ``[b, 1|h, s_q, s_kv]``, True = attend), cached per ``key`` (the mask tensor HF
    hands every layer of a forward, of which ``mask`` is a view; default ``mask``), its version and the shape."""
    key = mask if key is None else key
    per_shape = _LAYOUTS.get(key)
    if per_shape is None:
        per_shape = _LAYOUTS[key] = {}
    cached = per_shape.get((mask.shape, window_left))
    if cached is not None and cached[0] == key._version:
        return cached[1]
    layout = _analyse(mask, window_left)
    per_shape[mask.shape, window_left] = (key._version, layout)
    return layout


def _analyse(mask: torch.Tensor, window_left: int | None) -> _Layout:
    """Find the structured mask that equals ``mask`` element for element, else ``arbitrary``.

    Structured = each batch row has one contiguous run of queries that see something and one of
    keys that are seen, and a query sees the keys of its run causally (bottom-right or top-left
    aligned, optionally within ``window_left``) or all of them. Bottom-right alignment is what HF's
    absolute positions give when both runs end at the same token (left padding, KV-cached decoding);
    top-left when they start together (right padding, where pad queries see the real keys).
    Full runs (no padding) are tried first, so a windowed mask whose oldest keys no query sees
    still runs as dense ``bshd``.
    """
    b, heads, s_q, s_kv = mask.shape
    if heads != 1:
        return _Layout("arbitrary", blocked=~mask)
    m = mask[:, 0]
    device = m.device
    full_q = torch.full((b,), s_q, device=device)
    full_kv = torch.full((b,), s_kv, device=device)
    zeros = torch.zeros(b, dtype=torch.long, device=device)
    match = _match(m, zeros, full_q, zeros, full_kv, window_left)
    if match is not None:
        return _Layout(_MASK_TYPES[False, match[0]], match[1])
    q_valid, kv_valid = m.any(-1), m.any(-2)
    len_q, len_kv = q_valid.sum(-1), kv_valid.sum(-1)
    if bool((len_q > 0).all()):
        start_q, start_kv = q_valid.int().argmax(-1), kv_valid.int().argmax(-1)
        match = _match(m, start_q, len_q, start_kv, len_kv, window_left)
        if match is not None:
            rows = torch.arange(b + 1, device=device, dtype=torch.int32)
            return _Layout(
                _MASK_TYPES[True, match[0]],
                match[1],
                cu_seqlens_q=cu_seqlens_from_lengths(len_q),
                cu_seqlens_kv=cu_seqlens_from_lengths(len_kv),
                cu_seqlens_q_padded=rows * s_q + torch.cat([start_q, start_q.new_zeros(1)]).int(),
                cu_seqlens_kv_padded=rows * s_kv + torch.cat([start_kv, start_kv.new_zeros(1)]).int(),
                max_seqlen_q=int(len_q.max()),
                max_seqlen_kv=int(len_kv.max()),
            )
    return _Layout("arbitrary", blocked=~mask)


def _match(m: torch.Tensor, start_q: torch.Tensor, len_q: torch.Tensor, start_kv: torch.Tensor,
           len_kv: torch.Tensor, window_left: int | None) -> tuple[str, tuple[int, int]] | None:
    """``(causal alignment, window)`` when ``m [b, s_q, s_kv]`` is exactly the mask of these runs, else
    None. The alignment is ``"bottom_right"``, ``"top_left"`` or ``""`` (not causal)."""
    rel_q = torch.arange(m.shape[1], device=m.device)[None, :] - start_q[:, None]
    rel_kv = (torch.arange(m.shape[2], device=m.device)[None, :] - start_kv[:, None])[:, None, :]   # [b, 1, s_kv]
    run_q = (rel_q >= 0) & (rel_q < len_q[:, None])
    run_kv = (rel_kv >= 0) & (rel_kv < len_kv[:, None, None])
    both = run_q[:, :, None] & run_kv
    if torch.equal(both, m):
        return "", (-1, -1)
    for alignment, diagonal in (("bottom_right", rel_q + (len_kv - len_q)[:, None]), ("top_left", rel_q)):
        causal = both & (rel_kv <= diagonal[:, :, None])
        if window_left is not None and torch.equal(causal & (rel_kv >= diagonal[:, :, None] - window_left), m):
            return alignment, (window_left, 0)
        if torch.equal(causal, m):
            return alignment, (-1, 0)
    return None
