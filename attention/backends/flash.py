"""flash-attn adapters: v2 (``flash_attn``), v3 (``flash_attn_interface``), v4 (``flash_attn.cute``).

Each generation is a :class:`Backend` named ``flash2``/``flash3``/``flash4``; selection expands the
family name ``flash`` to them. The capability sheets carry the limits that are plain data; the
rest (causal alignment, the v2 256-token block rule, v3's MLA pairs, v4's own head-dim validator,
version lower bounds) are ``extra_reasons``. Packages are imported lazily (``flash_probe``).

Call paths (all produce the query's format, heads not flattened, padded query rows zero):

- bshd/sbhd without padding: ``flash_attn_func`` on bshd (sbhd is a transposed view).
- bshd/sbhd with a padding mask: pack real tokens by index, ``flash_attn_varlen_func``, unpack.
- thd: ``flash_attn_varlen_func`` (v3/v4 take ``cu_seqlens_*_padded`` + ``seqused_*`` for padding
  between sequences); rows owned by no sequence are zeroed.
- KV cache (TE 4.7): the query goes to thd; v2 ``flash_attn_varlen_func(block_table=...)`` (a
  non-paged cache is a table of one whole-row block per sequence), v3 ``flash_attn_with_kvcache``,
  v4 ``flash_attn_varlen_func(seqused_k=..., page_table=...)`` (non-paged: the batched cache).

Return values: flash-attn 2 returns ``out`` (a tuple only with ``return_attn_probs``), flash-attn-4
``(out, lse)``; ``custom_ops`` keeps ``out``. flash-attn-4 spells an unbounded window side ``None`` and
takes the sink softmax (``off-by-one``/``learnable``) as ``learnable_sink`` (``[h]`` logits: fp32, or bf16 for the
releases that assert it).
Checked against flash-attn 2.8.3.post2 and flash-attn-4 4.0.0b36.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from attention import custom_ops
from attention.backends import flash4_source as v4
from attention.backends import flash_probe
from attention.backends.base import ALL_MASKS, AttentionCall, Backend, Capabilities
from attention.backends.flash4_source import (  # by name: torch.compile keeps their results as graph constants
    installed_refuses_seqused,
    installed_sink_dtype,
)
from attention.backends.flash_packing import (
    pack_padded,
    rows_in_sequences,
    unpack_to_padded,
    zero_gradients_outside_sequences,
    zero_rows_outside_sequences,
)
from attention.formats import has_own_offsets
from attention.masks import has_padding, is_causal, is_trivial_window, resolve_bottom_right
from attention.params import AttentionParams

_HALF = frozenset({torch.float16, torch.bfloat16})
_FLASH_MASKS = ALL_MASKS - {"arbitrary"}
_TOLERANCES = {torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}

#: flash-attn 2 lower bounds (TE's install-hint table); never upper caps.
V2_MIN = (2, 1, 1)
V2_WINDOW = (2, 3)
V2_ALIBI = (2, 4)
V2_DETERMINISTIC = (2, 4, 1)
V2_BLOCK_TABLE = (2, 5, 7)   # flash_attn_varlen_func's block_table (Dao-AILab/flash-attention#831); 2.5.0 had it
                              # in flash_attn_with_kvcache only
V2_BLACKWELL = (2, 7, 3)
V2_BLOCK = 256
#: Archs on which flash-attn 2 runs head dims above 192 (TE's list).
V2_LARGE_HEAD_DIM_ARCHS = frozenset({(8, 0), (9, 0), (10, 0), (12, 0)})

#: flash-attn 3 and 4 combine at most this many KV splits (flash_api.cpp's TORCH_CHECK, _flash_attn_fwd_combine).
FLASH_MAX_NUM_SPLITS = 256


def _given(**kwargs: Any) -> dict[str, Any]:
    """Keyword arguments minus the ``None`` ones, so older releases lacking an option still accept the call."""
    return {key: value for key, value in kwargs.items() if value is not None}


def _fit_cu_seqlens(cu_seqlens: Tensor, batch: int) -> Tensor:
    """int32 ``[batch+1]``: truncated, or extended with zero-length tail sequences."""
    cu = cu_seqlens.to(torch.int32)
    if cu.numel() >= batch + 1:
        return cu[: batch + 1].contiguous()
    tail = cu[-1:].expand(batch + 1 - cu.numel())
    return torch.cat([cu, tail]).contiguous()


def _lengths(cu_seqlens: Tensor) -> Tensor:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int32).contiguous()


def _to_bshd(x: Tensor, qkv_format: str) -> Tensor:
    return x.transpose(0, 1) if qkv_format == "sbhd" else x


def _batch_and_seqlen(x: Tensor, qkv_format: str) -> tuple[int, int]:
    return (x.shape[1], x.shape[0]) if qkv_format == "sbhd" else (x.shape[0], x.shape[1])


def _op(name: str, call: AttentionCall) -> Any:
    """The flash entry point ``name`` (``attention.custom_ops``): a custom op under torch.compile unless
    a backward pass follows (the ops have no autograd formula; flash-attn's functions do)."""
    return custom_ops.dispatch(name, differentiable=call.params.requires_grad)


def _window(left: int, right: int) -> list[int]:
    return [left, right]


def _version_older(pkg: flash_probe.FlashPackage, bound: tuple[int, ...]) -> bool:
    return pkg.version is not None and pkg.version < bound


class _FlashBackend(Backend):
    """What the three generations share: gates on alignment and the format plumbing."""

    generation: ClassVar[int]
    label: ClassVar[str]

    # --- availability -----------------------------------------------------------------------

    def package(self) -> flash_probe.FlashPackage:
        return flash_probe.probe(self.generation)

    def availability_reason(self) -> str | None:
        return self.package().reason

    def version(self) -> str | None:
        """The installed release, e.g. ``"2.8.3"`` (None when absent or unknown)."""
        return self.package().version_text

    def _interface(self) -> Any:
        pkg = self.package()
        if pkg.module is None:
            raise RuntimeError(f"{self.name} cannot run: {pkg.reason}")
        return pkg.module

    # --- reasons ----------------------------------------------------------------------------

    def extra_reasons(self, params: AttentionParams) -> list[str]:
        pkg = self.package()
        return _shared_reasons(params) + self._generation_reasons(params, pkg)

    def _generation_reasons(self, params: AttentionParams, pkg: flash_probe.FlashPackage) -> list[str]:
        return []

    # --- forward ----------------------------------------------------------------------------

    def forward(self, call: AttentionCall) -> Tensor:
        """Output in the query's format: bshd ``[b, s_q, h, d_v]``, sbhd ``[s_q, b, h, d_v]``,
        thd ``[t_q, h, d_v]``; padded query rows are zero."""
        with custom_ops.on_query_device(call.query):   # flash-attn-4 launches on the current device's stream
            return self._forward_here(call)

    def _forward_here(self, call: AttentionCall) -> Tensor:
        """``forward`` with the query's GPU current."""
        fa = self._interface()
        p = call.params
        if p.kv_cache != "none":
            return self._forward_with_cache(fa, call)
        if p.qkv_format == "thd" or has_padding(p.attn_mask_type):
            return self._forward_packed(fa, call)
        q = _to_bshd(call.query, p.qkv_format)
        k = _to_bshd(call.key, p.kv_format)
        v = _to_bshd(call.value, p.kv_format)
        out = self._dense(fa, call, q, k, v)
        return out.transpose(0, 1).contiguous() if p.qkv_format == "sbhd" else out

    def _forward_packed(self, fa: Any, call: AttentionCall) -> Tensor:
        p = call.params
        # offsets of their own are read wherever the generation can (v3 / v4), even under a pad_between_seqs=False
        # hint that nothing checked: as fused and unfused read them
        padded_offsets = p.qkv_format == "thd" and (p.pad_between_seqs or (
            self.capabilities.pad_between_seqs and has_own_offsets(
                call.cu_seqlens_q, call.cu_seqlens_kv, call.cu_seqlens_q_padded, call.cu_seqlens_kv_padded)))
        if p.qkv_format == "thd":
            q, cu_q, max_q = call.query, call.cu_seqlens_q, call.max_seqlen_q
        else:
            batch, max_q = _batch_and_seqlen(call.query, p.qkv_format)
            cu_q = call.cu_seqlens_q[: batch + 1]
            q = pack_padded(call.query, cu_q, seq_first=p.qkv_format == "sbhd")
        if p.kv_format == "thd":
            k, v, cu_kv, max_kv = call.key, call.value, call.cu_seqlens_kv, call.max_seqlen_kv
        else:
            batch_kv, max_kv = _batch_and_seqlen(call.key, p.kv_format)
            cu_kv = call.cu_seqlens_kv[: batch_kv + 1]
            k = pack_padded(call.key, cu_kv, seq_first=p.kv_format == "sbhd")
            v = pack_padded(call.value, cu_kv, seq_first=p.kv_format == "sbhd")
        cu_q, cu_kv = cu_q.to(torch.int32).contiguous(), cu_kv.to(torch.int32).contiguous()
        seqused_q = seqused_kv = None
        offsets_q, offsets_kv = cu_q, cu_kv
        if padded_offsets:
            seqused_q, seqused_kv = _lengths(cu_q), _lengths(cu_kv)
            # flash-attn 3/4 take int32 cu_seqlens with stride 1
            offsets_q = (call.cu_seqlens_q_padded if call.cu_seqlens_q_padded is not None else cu_q).to(torch.int32)
            offsets_kv = (call.cu_seqlens_kv_padded if call.cu_seqlens_kv_padded is not None else cu_kv).to(torch.int32)
            offsets_q, offsets_kv = offsets_q.contiguous(), offsets_kv.contiguous()
        owned_q = None
        if p.requires_grad:   # flash-attn's backward leaves the gradients of rows outside the sequences unwritten
            owned_q = rows_in_sequences(q.shape[0], cu_q, offsets_q if padded_offsets else None)
            owned_kv = rows_in_sequences(k.shape[0], cu_kv, offsets_kv if padded_offsets else None)
            q = zero_gradients_outside_sequences(q, owned_q)
            k, v = zero_gradients_outside_sequences(k, owned_kv), zero_gradients_outside_sequences(v, owned_kv)
        out = self._varlen(fa, call, q, k, v, offsets_q, offsets_kv, max_q, max_kv, seqused_q, seqused_kv)
        if p.qkv_format == "thd":
            return zero_rows_outside_sequences(out, cu_q, offsets_q if padded_offsets else None, owned_q)
        batch, s_q = _batch_and_seqlen(call.query, p.qkv_format)
        return unpack_to_padded(out, cu_q, batch, s_q, seq_first=p.qkv_format == "sbhd")

    def _forward_with_cache(self, fa: Any, call: AttentionCall) -> Tensor:
        p = call.params
        if p.qkv_format == "thd":
            q, cu_q, max_q = call.query, call.cu_seqlens_q.to(torch.int32).contiguous(), call.max_seqlen_q
            batch = cu_q.numel() - 1
        else:
            batch, max_q = _batch_and_seqlen(call.query, p.qkv_format)
            cu_q = _fit_cu_seqlens(call.cu_seqlens_q, batch)
            q = pack_padded(call.query, cu_q, seq_first=p.qkv_format == "sbhd")
        cu_kv = _fit_cu_seqlens(call.cu_seqlens_kv, batch)
        page_table = None
        if p.kv_cache == "paged":
            if call.page_table is None or call.page_table.shape[0] < batch:
                got = None if call.page_table is None else tuple(call.page_table.shape)
                raise ValueError(f"page_table must be int32 [>= {batch}, max_pages] for a paged KV cache; got {got}")
            page_table = call.page_table[:batch].to(torch.int32)
        elif call.key.shape[0] < batch:
            raise ValueError(f"key (non-paged cache) has {call.key.shape[0]} rows, fewer than the batch ({batch})")
        out = self._cache_attention(fa, call, q, cu_q, cu_kv, max_q, page_table)
        if p.qkv_format == "thd":
            return zero_rows_outside_sequences(out, cu_q)
        _, s_q = _batch_and_seqlen(call.query, p.qkv_format)
        return unpack_to_padded(out, cu_q, batch, s_q, seq_first=p.qkv_format == "sbhd")

    # --- per generation -----------------------------------------------------------------------

    def _dense(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        raise NotImplementedError

    def _varlen(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_kv: Tensor,
                max_q: int, max_kv: int, seqused_q: Tensor | None, seqused_kv: Tensor | None) -> Tensor:
        raise NotImplementedError

    def _cache_attention(self, fa: Any, call: AttentionCall, q: Tensor, cu_q: Tensor, cu_kv: Tensor, max_q: int,
                         page_table: Tensor | None) -> Tensor:
        raise NotImplementedError


def _shared_reasons(p: AttentionParams) -> list[str]:
    """Rules every flash generation shares and the capability sheet cannot say."""
    reasons = []
    unequal = p.max_seqlen_q != p.max_seqlen_kv
    bottom_right = resolve_bottom_right(p.attn_mask_type, p.bottom_right_diagonal)
    if p.attn_mask_type in ("causal", "padding_causal") and unequal:
        reasons.append(
            f"flash-attn aligns causal masks bottom-right; top-left {p.attn_mask_type!r} with "
            f"max_seqlen_q ({p.max_seqlen_q}) != max_seqlen_kv ({p.max_seqlen_kv}) needs another backend"
        )
    elif not is_trivial_window(p.window_size) and unequal and not bottom_right:
        reasons.append(
            f"sliding window {p.window_size} with max_seqlen_q != max_seqlen_kv needs bottom-right alignment "
            "(flash-attn has no top-left window)"
        )
    if p.num_gqa_groups < 1 or p.num_heads % p.num_gqa_groups:
        reasons.append(f"num_heads ({p.num_heads}) must be a multiple of num_gqa_groups ({p.num_gqa_groups})")
    if p.kv_cache != "none" and p.requires_grad:
        reasons.append("the KV-cache path has no backward pass (inputs require grad)")
    if p.kv_cache != "none" and p.pad_between_seqs:
        reasons.append("padding between thd sequences is not supported with a KV cache")
    return reasons


def _v4_window(call: AttentionCall) -> list[int]:
    """``[left, right]`` with -1 unbounded; ``custom_ops`` hands flash-attn-4 ``None`` for -1 (its spelling:
    -1 would cancel the window)."""
    left, right = call.params.window_size
    if is_causal(call.params.attn_mask_type):
        right = 0 if left >= 0 else -1
    return _window(left, right)


class Flash2Backend(_FlashBackend):
    """flash-attn 2: sm80+, fp16/bf16, dropout, ALiBi, MLA by zero-padding the head dim."""

    name = "flash2"
    generation = 2
    label = "flash-attn 2"
    notes = ("head dim (the larger of d_qk, d_v) a multiple of 8, above 192 only on sm80 / sm90 / sm100 / sm120; no "
             "MLA over a KV cache; a non-paged cache's max_sequence_length a multiple of 256",)
    capabilities = Capabilities(
        dtypes=_HALF,
        min_compute_capability=(8, 0),
        mask_types=_FLASH_MASKS,
        max_head_dim=256,
        bias_types=frozenset({"no_bias", "alibi"}),
        softmax_types=frozenset({"vanilla"}),
        dropout=True,
        pad_between_seqs=False,
        kv_cache=frozenset({"non_paged", "paged"}),
        page_size_multiple=V2_BLOCK,
        cuda_graphs=True,
        tolerances=_TOLERANCES,
    )

    def _generation_reasons(self, p: AttentionParams, pkg: flash_probe.FlashPackage) -> list[str]:
        reasons = []
        found = pkg.version_text
        if _version_older(pkg, V2_MIN):
            reasons.append(f"flash-attn {found} is older than the minimum 2.1.1")
        cc = p.compute_capability
        if cc is not None and cc >= (10, 0) and _version_older(pkg, V2_BLACKWELL):
            reasons.append(f"flash-attn {found} predates Blackwell support (needs >= 2.7.3 on sm{cc[0]}{cc[1]})")
        head_dim = max(p.head_dim_qk, p.head_dim_v)
        if head_dim % 8:
            reasons.append(f"head dim {head_dim} (max of d_qk, d_v after zero-padding) is not a multiple of 8")
        if head_dim > 192 and cc is not None and cc not in V2_LARGE_HEAD_DIM_ARCHS:
            reasons.append(f"head dim {head_dim} > 192 needs sm80/sm90/sm100/sm120, got sm{cc[0]}{cc[1]}")
        if not is_trivial_window(p.window_size):
            reasons += self._feature_reason(pkg, "sliding window", V2_WINDOW, "flash_attn_func", "window_size")
        if p.core_attention_bias_type == "alibi":
            reasons += self._feature_reason(pkg, "ALiBi", V2_ALIBI, "flash_attn_func", "alibi_slopes")
            if (p.max_seqlen_q != p.max_seqlen_kv
                    and not resolve_bottom_right(p.attn_mask_type, p.bottom_right_diagonal)):
                reasons.append("ALiBi with max_seqlen_q != max_seqlen_kv needs bottom-right alignment")
        if p.requires_grad and flash_probe.v2_without_backward():
            reasons.append(f"this flash-attn 2 ({found}) was built without its backward pass "
                           "(FLASHATTENTION_DISABLE_BACKWARD)")
        if p.deterministic and p.requires_grad:
            reasons += self._feature_reason(pkg, "deterministic backward", V2_DETERMINISTIC, "flash_attn_func",
                                            "deterministic")
        if p.kv_cache != "none":
            reasons += self._feature_reason(pkg, "KV cache (block_table)", V2_BLOCK_TABLE, "flash_attn_varlen_func",
                                            "block_table")
            if p.head_dim_qk != p.head_dim_v:
                reasons.append(f"MLA head dims ({p.head_dim_qk}/{p.head_dim_v}) with a KV cache: flash-attn 2 would "
                               "zero-pad a copy of the whole cache to one head dim on every call")
        if p.kv_cache == "non_paged" and p.max_seqlen_kv % V2_BLOCK:
            reasons.append(
                f"a non-paged KV cache runs through flash-attn 2's block table with one block per cache row, so "
                f"max_sequence_length (max_seqlen_kv={p.max_seqlen_kv}) must be a multiple of {V2_BLOCK}"
            )
        return reasons

    @staticmethod
    def _feature_reason(pkg: flash_probe.FlashPackage, feature: str, bound: tuple[int, ...], function: str,
                        keyword: str) -> list[str]:
        if _version_older(pkg, bound):
            return [f"{feature} needs flash-attn >= {flash_probe.format_version(bound)}, found {pkg.version_text}"]
        if pkg.version is None and pkg.module is not None:
            if not flash_probe.accepts_keyword(getattr(pkg.module, function, None), keyword):
                return [f"{feature}: the installed flash-attn's {function} has no {keyword!r} argument"]
        return []

    # head dims: flash-attn 2 needs d_qk == d_v, so MLA zero-pads all three to max(d_qk, d_v)
    @staticmethod
    def _pad_head_dims(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
        d_v = v.shape[-1]
        head_dim = max(q.shape[-1], d_v)
        q, k, v = (x if x.shape[-1] == head_dim else F.pad(x, (0, head_dim - x.shape[-1])) for x in (q, k, v))
        return q, k, v, d_v

    def _common_kwargs(self, fa: Any, call: AttentionCall, function: str) -> dict[str, Any]:
        p = call.params
        kwargs: dict[str, Any] = dict(generation=2, dropout_p=call.dropout_p, softmax_scale=call.softmax_scale,
                                      causal=is_causal(p.attn_mask_type))
        if not is_trivial_window(p.window_size):
            left, right = p.window_size
            kwargs["window_size"] = _window(left, 0 if kwargs["causal"] else right)
        if call.alibi_slopes is not None:
            kwargs["alibi_slopes"] = call.alibi_slopes.to(torch.float32).contiguous()
        if p.deterministic and flash_probe.accepts_keyword(getattr(fa, function), "deterministic"):
            kwargs["deterministic"] = True
        return kwargs

    @staticmethod
    def _fit_alibi(kwargs: dict[str, Any], batch: int) -> None:
        """flash-attn 2 checks ``alibi_slopes.sizes() == {h}`` or ``{batch, h}`` exactly: a 2-D table is cut
        to the batch, or extended with zero rows (sequences past the real ones)."""
        alibi = kwargs.get("alibi_slopes")
        if alibi is None or alibi.dim() != 2 or alibi.shape[0] == batch:
            return
        if alibi.shape[0] > batch:
            kwargs["alibi_slopes"] = alibi[:batch].contiguous()
        else:
            kwargs["alibi_slopes"] = torch.cat([alibi, alibi.new_zeros(batch - alibi.shape[0], alibi.shape[1])])

    def _dense(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v, d_v = self._pad_head_dims(q, k, v)
        kwargs = self._common_kwargs(fa, call, "flash_attn_func")
        self._fit_alibi(kwargs, q.shape[0])
        out = _op("flash_attn_func", call)(q, k, v, **kwargs)
        return out[..., :d_v]

    def _varlen(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_kv: Tensor,
                max_q: int, max_kv: int, seqused_q: Tensor | None, seqused_kv: Tensor | None,
                block_table: Tensor | None = None) -> Tensor:
        if seqused_q is not None or seqused_kv is not None:
            raise ValueError("flash-attn 2 has no padding between thd sequences (pad_between_seqs)")
        q, k, v, d_v = self._pad_head_dims(q, k, v)
        kwargs = self._common_kwargs(fa, call, "flash_attn_varlen_func")
        self._fit_alibi(kwargs, cu_q.numel() - 1)
        if block_table is not None:
            kwargs["block_table"] = block_table
        p = call.params
        if max_q == 1 and (p.kv_cache == "none" or p.qkv_format == "thd"):
            # With max_seqlen_q == 1 and GQA, flash-attn 2 folds head groups into the query length and
            # assumes exactly one query row per sequence; thd rows (zero-length tails, filler) break that.
            # (A bshd / sbhd batch padded up to max_batch_size keeps it: packed row i is sequence i, and the
            # padding rows past the step's sequences have no keys.)
            # max_seqlen_q is only an upper bound, so 2 keeps the plain varlen path.
            max_q = 2
        out = _op("flash_attn_varlen_func", call)(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_kv, max_seqlen_q=max_q,
                                                  max_seqlen_k=max_kv, **kwargs)
        return out[..., :d_v]

    def _cache_attention(self, fa: Any, call: AttentionCall, q: Tensor, cu_q: Tensor, cu_kv: Tensor, max_q: int,
                         page_table: Tensor | None) -> Tensor:
        batch = cu_q.numel() - 1
        if page_table is None:
            # Non-paged: each cache row is one block of max_sequence_length tokens.
            page_table = torch.arange(batch, dtype=torch.int32, device=q.device).view(batch, 1)
        return self._varlen(fa, call, q, call.key, call.value, cu_q, cu_kv, max_q, call.max_seqlen_kv, None, None,
                            block_table=page_table.contiguous())


class Flash3Backend(_FlashBackend):
    """flash-attn 3 (Hopper build, module ``flash_attn_interface``): sm90 only, no dropout or bias."""

    name = "flash3"
    generation = 3
    label = "flash-attn 3"
    notes = ("head dims at most 256; MLA only for 128 < d_qk <= 192 with 96 < d_v <= 128, or d_qk <= 64 with "
             "d_v <= 512",)
    capabilities = Capabilities(
        dtypes=_HALF,
        compute_capabilities=frozenset({(9, 0)}),
        mask_types=_FLASH_MASKS,
        head_dim_multiple=8,
        bias_types=frozenset({"no_bias"}),
        softmax_types=frozenset({"vanilla"}),
        dropout=False,
        pad_between_seqs=True,
        kv_cache=frozenset({"non_paged", "paged"}),
        cuda_graphs=True,
        num_splits=True,
        tolerances=_TOLERANCES,
    )

    def _generation_reasons(self, p: AttentionParams, pkg: flash_probe.FlashPackage) -> list[str]:
        reasons = _num_splits_cap(p, "flash-attn 3")
        if p.num_splits != 1 and pkg.module is not None:
            function = "flash_attn_with_kvcache" if p.kv_cache != "none" else (
                "flash_attn_varlen_func" if p.qkv_format == "thd" or has_padding(p.attn_mask_type)
                else "flash_attn_func")
            if not flash_probe.accepts_keyword(getattr(pkg.module, function, None), "num_splits"):
                reasons.append(f"num_splits != 1: this flash-attn 3 build's {function} takes no num_splits")
        d_qk, d_v = p.head_dim_qk, p.head_dim_v
        if d_qk > 256:
            reasons.append(f"head_dim_qk={d_qk} exceeds flash-attn 3's maximum 256")
        if p.is_mla and not ((128 < d_qk <= 192 and 96 < d_v <= 128) or (d_qk <= 64 and d_v <= 512)):
            reasons.append(
                f"(head_dim_qk, head_dim_v)=({d_qk}, {d_v}) is not a flash-attn 3 MLA pair "
                "(128 < d_qk <= 192 with 96 < d_v <= 128, or d_qk <= 64 with d_v <= 512)"
            )
        elif not p.is_mla and d_v > 256:
            reasons.append(f"head_dim_v={d_v} exceeds flash-attn 3's maximum 256")
        elif p.is_mla and d_v > 256 and p.requires_grad:   # its tests skip this backward; its mha_bwd wants d_v == d
            reasons.append(f"head_dim_v={d_v} > 256 (MLA) has no backward pass in flash-attn 3")
        if p.deterministic and p.requires_grad and max(d_qk, d_v) >= 256:
            reasons.append("deterministic backward needs max(head_dim_qk, head_dim_v) < 256 in flash-attn 3")
        if p.kv_cache != "none" and pkg.module is not None:
            if not flash_probe.accepts_keyword(getattr(pkg.module, "flash_attn_with_kvcache", None), "cu_seqlens_q"):
                reasons.append("this flash-attn 3 build's flash_attn_with_kvcache takes no cu_seqlens_q "
                               "(varlen queries need a newer build)")
        return reasons

    def _kwargs(self, call: AttentionCall, backward: bool = True) -> dict[str, Any]:
        p = call.params
        causal = is_causal(p.attn_mask_type)
        window = None
        if not is_trivial_window(p.window_size):
            window = _window(p.window_size[0], 0 if causal else p.window_size[1])
        deterministic = True if backward and p.deterministic and p.requires_grad else None
        # num_splits=1 is flash-attn 3's own default for these functions: passed only when asked for.
        return _given(generation=3, softmax_scale=call.softmax_scale, causal=causal, window_size=window,
                      deterministic=deterministic, num_splits=None if p.num_splits == 1 else p.num_splits)

    def _dense(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return _op("flash_attn_func", call)(q, k, v, **self._kwargs(call))

    def _varlen(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_kv: Tensor,
                max_q: int, max_kv: int, seqused_q: Tensor | None, seqused_kv: Tensor | None) -> Tensor:
        return _op("flash_attn_varlen_func", call)(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_kv, max_seqlen_q=max_q, max_seqlen_k=max_kv,
            **_given(seqused_q=seqused_q, seqused_k=seqused_kv), **self._kwargs(call))

    def _cache_attention(self, fa: Any, call: AttentionCall, q: Tensor, cu_q: Tensor, cu_kv: Tensor, max_q: int,
                         page_table: Tensor | None) -> Tensor:
        batch = cu_q.numel() - 1
        k_cache, v_cache = call.key, call.value
        if page_table is None:
            k_cache, v_cache = k_cache[:batch], v_cache[:batch]
        kwargs = self._kwargs(call, backward=False)
        kwargs.setdefault("num_splits", 0)   # num_splits=1 (our default): flash-attn 3's heuristic (0)
        return _op("flash_attn_with_kvcache", call)(
            q, k_cache, v_cache, cache_seqlens=_lengths(cu_kv), page_table=page_table, cu_seqlens_q=cu_q,
            max_seqlen_q=max_q, **kwargs,
        )


def _num_splits_cap(p: AttentionParams, label: str) -> list[str]:
    if p.num_splits > FLASH_MAX_NUM_SPLITS:
        return [f"num_splits={p.num_splits} exceeds {label}'s maximum {FLASH_MAX_NUM_SPLITS}"]
    return []


class Flash4Backend(_FlashBackend):
    """flash-attn-4 (CuTe DSL, ``flash_attn.cute``): sm90 and sm100 family, no dropout or bias, sink softmax."""

    name = "flash4"
    generation = 4
    label = "flash-attn-4"
    capabilities = Capabilities(
        dtypes=_HALF,
        compute_capabilities=frozenset({(9, 0), (10, 0), (10, 3), (11, 0)}),
        mask_types=_FLASH_MASKS,
        head_dim_multiple=8,
        bias_types=frozenset({"no_bias"}),
        softmax_types=frozenset({"vanilla", "off-by-one", "learnable"}),
        dropout=False,
        pad_between_seqs=True,
        kv_cache=frozenset({"non_paged", "paged"}),
        cuda_graphs=True,
        num_splits=True,
        tolerances=_TOLERANCES,
    )
    notes = ("num_splits ≠ 1 only on sm100 and newer (TE turns flash-attn-4 off for it below sm100)",)

    def _generation_reasons(self, p: AttentionParams, pkg: flash_probe.FlashPackage) -> list[str]:
        reasons = _num_splits_cap(p, "flash-attn-4")
        module = pkg.module
        head_dim_reason = v4.head_dim_reason(p, pkg.module)
        if head_dim_reason:
            reasons.append(head_dim_reason)
        major = p.compute_capability[0] if p.compute_capability is not None else 9
        if p.num_splits != 1 and major < 10:
            where = "" if p.compute_capability is None else ", got sm%d%d" % p.compute_capability
            reasons.append(f"num_splits != 1 needs sm100 or newer (flash-attn-4 splits KV only there){where}")
        if module is None:
            return reasons
        if p.num_splits != 1 and not flash_probe.accepts_keyword(getattr(module, "flash_attn_varlen_func", None),
                                                                 "num_splits"):
            reasons.append(f"num_splits != 1: this flash-attn-4 ({pkg.version_text}) takes no num_splits")
        if (major == 9 and p.kv_cache == "paged"
                and flash_probe.source_mentions(getattr(module, "_flash_attn_fwd", None), v4.NO_PAGED_SM90)):
            reasons.append(f"this flash-attn-4 ({pkg.version_text}) has no paged KV cache on sm90")
        if p.kv_cache == "paged" and (p.head_dim_qk % 16 or p.head_dim_v % 16):
            # A page of exactly the KV tile loads by TMA; any other page size takes the cp.async path,
            # whose kernels assert "Paged KV does not support irregular head dim" (not a multiple of 16).
            kernel = getattr(module, "FlashAttentionForwardSm90" if major == 9 else "FlashAttentionForwardSm100", None)
            tile_n = v4.tile_n(p, module, major)
            if p.page_size != tile_n and flash_probe.source_mentions(kernel, v4.PAGED_IRREGULAR_HEAD_DIM):
                reasons.append(
                    f"flash-attn-4 reads a paged KV cache with page_size={p.page_size} != its KV tile ({tile_n}) only "
                    f"for head dims that are multiples of 16; got ({p.head_dim_qk}, {p.head_dim_v})")
        if major == 9 and p.requires_grad:   # some releases' sm90 backward (4.0.0b36's has neither limit)
            backward = getattr(module, "_flash_attn_bwd", None)
            if not is_trivial_window(p.window_size) and flash_probe.source_mentions(backward, v4.NO_LOCAL_BWD_SM90):
                reasons.append(f"this flash-attn-4's ({pkg.version_text}) sm90 backward has no sliding window")
            if ((p.qkv_format == "thd" or has_padding(p.attn_mask_type))
                    and flash_probe.source_mentions(backward, v4.NO_VARLEN_BWD_SM90)):
                reasons.append(f"this flash-attn-4's ({pkg.version_text}) sm90 backward has no varlen (thd or padding "
                               "masks)")
        if (major == 9 and p.deterministic and p.requires_grad
                and not flash_probe.accepts_keyword(getattr(module, "FlashAttentionBackwardSm90", None),
                                                    "deterministic")):
            reasons.append(f"this flash-attn-4 ({pkg.version_text}) has no deterministic backward on sm90")
        if p.softmax_type != "vanilla":
            if not flash_probe.accepts_keyword(getattr(module, "flash_attn_varlen_func", None), "learnable_sink"):
                reasons.append(f"softmax_type {p.softmax_type!r}: this flash-attn-4 takes no learnable_sink")
            elif (p.softmax_type == "learnable" and p.requires_grad
                  and not flash_probe.accepts_keyword(getattr(module, "_flash_attn_bwd", None), "learnable_sink")):
                # older releases' backward returns gradients for q, k and v only: the sink would never train
                reasons.append(f"this flash-attn-4's ({pkg.version_text}) backward has no learnable-sink gradient")
            elif (p.requires_grad and v4.runs_hd256_kernels(p)
                  and flash_probe.source_mentions(getattr(module, "_flash_attn_bwd", None), v4.NO_SINK_BWD_HD256)):
                reasons.append("flash-attn-4's sm100 backward with head dim 256 has no learnable sink")
        if v4.runs_hd256_kernels(p):
            reasons += v4.hd256_reasons(p, module)
        return reasons

    def _kwargs(self, call: AttentionCall) -> dict[str, Any]:
        p = call.params
        window = None if is_trivial_window(p.window_size) else _v4_window(call)
        sink = None
        if p.softmax_type != "vanilla":
            # flash-attn-4's learnable_sink: one extra logit per query head (natural-log units, not scaled), [h] in
            # the dtype the release takes (a differentiable cast); "off-by-one" is a sink of 0.
            sink_dtype = installed_sink_dtype()
            sink = call.softmax_offset
            if sink is None:
                sink = torch.zeros(p.num_heads, dtype=sink_dtype, device=call.query.device)
            sink = sink.to(sink_dtype).contiguous()
        return _given(generation=4, softmax_scale=call.softmax_scale, causal=is_causal(p.attn_mask_type),
                      window_size=window, deterministic=True if p.deterministic and p.requires_grad else None,
                      learnable_sink=sink, num_splits=None if p.num_splits == 1 else p.num_splits)

    def _dense(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (x.contiguous() for x in (q, k, v))
        return _op("flash_attn_func", call)(q, k, v, **self._kwargs(call))

    def _varlen(self, fa: Any, call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_kv: Tensor,
                max_q: int, max_kv: int, seqused_q: Tensor | None, seqused_kv: Tensor | None) -> Tensor:
        p = call.params
        if ((seqused_q is not None or seqused_kv is not None) and v4.runs_hd256_kernels(p)
                and installed_refuses_seqused(p.requires_grad)):
            # thd offsets of its own under pad_between_seqs=False: the gate saw no padding between sequences
            raise ValueError(
                "flash-attn-4's sm100 kernels for head dims (256, 256) do not support per-sequence lengths "
                "(seqused_q / seqused_k), which flash4 passes to read this thd call's own offsets "
                "(cu_seqlens_q_padded / cu_seqlens_kv_padded) even under pad_between_seqs=False: pass "
                "pad_between_seqs=True (or None, inferred from the offsets), which flash4 refuses here, so that the "
                "automatic choice takes another backend")
        q, k, v = (x.contiguous() for x in (q, k, v))
        return _op("flash_attn_varlen_func", call)(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_kv, max_seqlen_q=max_q, max_seqlen_k=max_kv,
            **_given(seqused_q=seqused_q, seqused_k=seqused_kv), **self._kwargs(call))

    def _cache_attention(self, fa: Any, call: AttentionCall, q: Tensor, cu_q: Tensor, cu_kv: Tensor, max_q: int,
                         page_table: Tensor | None) -> Tensor:
        batch = cu_q.numel() - 1
        k_cache, v_cache = call.key, call.value
        extra: dict[str, Any] = {}
        if page_table is None:
            # Non-paged: the cache rows are a batched [b, s_max, h_kv, d] K/V; seqused_k gives the lengths.
            k_cache, v_cache = k_cache[:batch], v_cache[:batch]
        else:
            extra["page_table"] = page_table.contiguous()
        return _op("flash_attn_varlen_func", call)(
            q.contiguous(), k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=None, max_seqlen_q=max_q,
            max_seqlen_k=call.max_seqlen_kv, seqused_k=_lengths(cu_kv), **extra, **self._kwargs(call))
