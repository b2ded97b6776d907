"""The backend contract: a capability sheet (data), reasons (strings) and a forward.

Selection asks every backend ``support_reasons(params)``; an empty list means it can run the call.
The generic reasons come from the sheet; a backend adds its own in ``extra_reasons``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from attention.params import AttentionParams

ALL_MASKS = frozenset(
    {"no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
     "arbitrary"}
)


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports, as data. Feeds selection, ``explain()``, docs and tests."""

    dtypes: frozenset[torch.dtype]
    device_types: frozenset[str] = frozenset({"cuda"})
    min_compute_capability: tuple[int, int] | None = None   # CUDA only
    compute_capabilities: frozenset[tuple[int, int]] | None = None  # exact list, when not a lower bound
    qkv_formats: frozenset[str] = frozenset({"bshd", "sbhd", "thd"})
    mask_types: frozenset[str] = ALL_MASKS
    max_head_dim: int | None = None
    head_dim_multiple: int = 1
    mla: bool = True                      # d_qk != d_v
    bias_types: frozenset[str] = frozenset({"no_bias", "pre_scale_bias", "post_scale_bias", "alibi"})
    sliding_window: bool = True
    softmax_types: frozenset[str] = frozenset({"vanilla", "off-by-one", "learnable"})
    dropout: bool = True
    backward: bool = True
    pad_between_seqs: bool = True
    kv_cache: frozenset[str] = frozenset({"non_paged", "paged"})
    page_size_multiple: int = 1           # paged caches: page_size % this == 0
    cuda_graphs: bool = False             # a decode step can be captured and replayed
    deterministic: bool = True
    num_splits: bool = False              # takes an explicit split-KV count (num_splits != 1)
    return_max_logit: bool = False        # also returns the per-head max logit (fp32 [h])
    tolerances: dict[torch.dtype, tuple[float, float]] = field(default_factory=dict)  # dtype -> (atol, rtol)


@dataclass(slots=True)   # slots: built on every call, ~0.2 µs faster than with a __dict__
class AttentionCall:
    """The tensors of one normalised call, as the module hands them to a backend.

    ``query`` keeps the caller's format (``q_format``); ``key``/``value`` are either in ``kv_format``
    (no cache), the non-paged cache ``[b_max, s_max, h_kv, d]`` or the paged cache
    ``[pages, page_size, h_kv, d]`` (``kv_format`` = ``"bshd"``/``"paged"`` with ``kv_cache`` set).
    ``cu_seqlens_*`` are int32 ``[b+1]`` real lengths (always present); ``*_padded`` give thd offsets.
    ``DotProductAttention`` passes the fields positionally: keep their order (add new ones last).
    """

    params: AttentionParams
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor | None
    cu_seqlens_kv_padded: torch.Tensor | None
    max_seqlen_q: int
    max_seqlen_kv: int
    softmax_scale: float
    dropout_p: float = 0.0
    attention_mask: torch.Tensor | None = None      # arbitrary masks: bool, True = masked out
    core_attention_bias: torch.Tensor | None = None
    alibi_slopes: torch.Tensor | None = None        # fp32 [h] or [b, h]
    softmax_offset: torch.Tensor | None = None      # fp32 [h] sink logits
    page_table: torch.Tensor | None = None          # int32 [b, max_pages] (paged cache)
    inference_params: Any = None
    layer_number: int | None = None
    step_rows: int | None = None                    # cache step's query rows (host; thd: tokens, else sequences)
    eager: bool | None = None                       # neither compiled nor captured (None: not known)
    launches: dict | None = None                    # the backend's memo under this call's choice (call_plans)


class Backend:
    """Base class. Subclasses set ``name``, ``capabilities`` and implement ``forward``."""

    name: ClassVar[str] = "base"
    capabilities: ClassVar[Capabilities]

    def availability_reason(self) -> str | None:
        """Why the backend cannot run at all here (missing package, no GPU), or None."""
        return None

    def support_reasons(self, params: AttentionParams) -> list[str]:
        """Every reason this backend cannot run ``params``; empty when it can."""
        missing = self.availability_reason()
        reasons = [missing] if missing else []
        # on a machine without CUDA the availability reason says so: "needs a cuda device, got cpu" would repeat it
        check_device = not (missing and self.capabilities.device_types == {"cuda"} and not torch.cuda.is_available())
        return reasons + capability_reasons(self.capabilities, params, check_device) + self.extra_reasons(params)

    def extra_reasons(self, params: AttentionParams) -> list[str]:
        return []

    def forward(self, call: AttentionCall) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The output in the query's format, ``[..., h, d_v]``; ``(out, max_logit)`` (fp32 ``[h]``) when
        ``call.params.return_max_logit`` (only backends whose sheet says ``return_max_logit``)."""
        raise NotImplementedError

    def forward_flat(self, call: AttentionCall) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``forward`` with heads flattened, ``[..., h * d_v]`` (what ``DotProductAttention`` returns);
        a backend that can write that layout directly overrides it."""
        result = self.forward(call)
        if call.params.return_max_logit:
            out, max_logit = result
            return out.flatten(-2), max_logit
        return result.flatten(-2)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _fmt_dtypes(dtypes: frozenset[torch.dtype]) -> str:
    return ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes))


def capability_reasons(caps: Capabilities, p: AttentionParams, check_device: bool = True) -> list[str]:
    """The reasons that follow from the capability sheet alone (``check_device=False``: not the device type's)."""
    r: list[str] = []
    if check_device and p.device_type not in caps.device_types:
        r.append(f"needs a {'/'.join(sorted(caps.device_types))} device, got {p.device_type}")
    elif p.device_type == "cuda" and p.compute_capability is not None:
        cc = p.compute_capability
        if caps.min_compute_capability and cc < caps.min_compute_capability:
            need = "sm%d%d" % caps.min_compute_capability
            r.append(f"needs compute capability {need} or newer, got sm{cc[0]}{cc[1]}")
        if caps.compute_capabilities and cc not in caps.compute_capabilities:
            allowed = ", ".join("sm%d%d" % c for c in sorted(caps.compute_capabilities))
            r.append(f"runs only on {allowed}, got sm{cc[0]}{cc[1]}")
    if p.dtype not in caps.dtypes:
        r.append(f"dtype {str(p.dtype).replace('torch.', '')} not supported (supports {_fmt_dtypes(caps.dtypes)})")
    if p.qkv_format not in caps.qkv_formats:
        r.append(f"qkv_format {p.qkv_format!r} not supported (supports {sorted(caps.qkv_formats)})")
    if p.attn_mask_type not in caps.mask_types:
        r.append(f"attn_mask_type {p.attn_mask_type!r} not supported")
    for name, dim in (("head_dim_qk", p.head_dim_qk), ("head_dim_v", p.head_dim_v)):
        if caps.max_head_dim is not None and dim > caps.max_head_dim:
            r.append(f"{name}={dim} exceeds the maximum {caps.max_head_dim}")
        if dim % caps.head_dim_multiple:
            r.append(f"{name}={dim} is not a multiple of {caps.head_dim_multiple}")
    if p.is_mla and not caps.mla:
        r.append(f"head_dim_qk != head_dim_v ({p.head_dim_qk} vs {p.head_dim_v}) not supported")
    if p.core_attention_bias_type not in caps.bias_types:
        r.append(f"core_attention_bias_type {p.core_attention_bias_type!r} not supported")
    if p.window_size[0] != -1 or p.window_size[1] not in (-1, 0):
        if not caps.sliding_window:
            r.append(f"sliding window {p.window_size} not supported")
    if p.softmax_type not in caps.softmax_types:
        r.append(f"softmax_type {p.softmax_type!r} not supported")
    if p.attention_dropout > 0 and not caps.dropout:
        r.append("dropout not supported")
    if p.requires_grad and not caps.backward:
        r.append("no backward pass (inputs require grad, carry forward-mode tangents or run under torch.func); "
                 "use it for inference")
    if p.pad_between_seqs and not caps.pad_between_seqs:
        r.append("padding between thd sequences (cu_seqlens_*_padded) not supported")
    if p.kv_cache != "none" and p.kv_cache not in caps.kv_cache:
        r.append(f"{p.kv_cache.replace('_', '-')} KV cache not supported")
    if p.kv_cache == "paged" and p.page_size is not None and p.page_size % caps.page_size_multiple:
        r.append(f"page_size={p.page_size} is not a multiple of {caps.page_size_multiple}")
    if p.cuda_graph_capture and not caps.cuda_graphs:
        r.append("cannot be captured in a CUDA graph")
    if p.num_splits != 1 and not caps.num_splits:
        r.append("num_splits != 1 not supported")
    if p.return_max_logit and not caps.return_max_logit:
        r.append("return_max_logit not supported")
    if p.deterministic and not caps.deterministic:
        r.append("not deterministic (NVTE_ALLOW_NONDETERMINISTIC_ALGO=0)")
    return r
