"""The steps of ``DotProductAttention._prepare``: from one call's arguments to an ``AttentionCall``.

Mask and window resolution, sequence lengths (thd, or bshd/sbhd), the KV-cache step, bias and
mask checks, and the ``AttentionParams`` that selection keys on. Plain functions with explicit
arguments, so torch.compile traces them like the rest of ``forward``; results are plain tuples.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd.forward_ad as _forward_ad

from attention import inputs, seqlens_check
from attention.formats import batch_and_seqlen, full_cu_seqlens, has_own_offsets
from attention.masks import check_set_window_size, has_padding, normalize_mask_type, resolve_bottom_right
from attention.params import AttentionParams
from attention.user_warnings import warn

_functorch_level = torch._C._functorch.maybe_current_level

if TYPE_CHECKING:
    from attention.dot_product_attention import DotProductAttention


@functools.lru_cache(maxsize=16)
def _compute_capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def _compute_capability_at_trace(device: torch.device) -> tuple[int, int] | None:
    """``_compute_capability`` for torch.compile: run once at trace time, a constant of the graph."""
    return _compute_capability(device)


_compute_capability_at_trace._dynamo_marked_constant = True  # = torch._dynamo.assume_constant_result


def resolve_mask(
    attn_mask_type: str, window_size: tuple[int, int] | None, bottom_right_diagonal: bool | None, kv_caching: bool,
) -> tuple[str, tuple[int, int], bool]:
    """(mask type, window, bottom-right diagonal) of the call. A KV cache needs a padding mask and
    makes ``padding_causal`` bottom-right (new queries sit at the end of the cache)."""
    mask_type = normalize_mask_type(attn_mask_type)
    if kv_caching and not has_padding(mask_type):
        raise ValueError(
            "attn_mask_type must be a padding mask (padding, padding_causal, padding_causal_bottom_right) "
            f"with inference_params (KV caching); got {mask_type!r}"
        )
    window = check_set_window_size(mask_type, window_size)   # its errors name the mask type as the caller gave it
    if kv_caching and mask_type == "padding_causal":
        mask_type = "padding_causal_bottom_right"
    return mask_type, window, resolve_bottom_right(mask_type, bottom_right_diagonal)


_WARNED: set[tuple[str, ...]] = set()
"""The unread-argument warnings already given, by key: once each per process (tests reset it)."""


def _first_time(key: tuple[str, ...]) -> bool:
    """Whether the warning of ``key`` has not been given yet (it counts as given from now on)."""
    if key in _WARNED:
        return False
    _WARNED.add(key)
    return True


def cu_seqlens_replace_mask(q: torch.Tensor, k: torch.Tensor, fmt: str, attention_mask: Any, self_attention: bool,
                            cu_seqlens_q: torch.Tensor | None, cu_seqlens_kv: torch.Tensor | None) -> bool:
    """Whether bshd / sbhd padding lengths come from the given cu_seqlens alone (bshd_seqlens): both are given, or
    one of them in self-attention with one mask over as many keys as queries (the other side takes its lengths)."""
    if cu_seqlens_q is not None and cu_seqlens_kv is not None:
        return True
    return ((cu_seqlens_q is not None or cu_seqlens_kv is not None) and self_attention and fmt != "thd"
            and not isinstance(attention_mask, (tuple, list))
            and batch_and_seqlen(q, fmt)[1] == batch_and_seqlen(k, fmt)[1])


def warn_unread_mask(mask_type: str, fmt: str, kv_caching: bool, lengths_given: bool = False) -> None:
    """Warn once per kind of call that a given ``attention_mask`` is not read (as in TE, which ignores it silently):
    a KV-cache step, thd and a padding type whose lengths all come from the given cu_seqlens
    (``lengths_given``: cu_seqlens_replace_mask's) take the lengths from elsewhere, and masks other than the
    padding ones and ``"arbitrary"`` read none. For eager calls (a compiled one would guard on the warned set)."""
    if kv_caching:
        key = ("cache step",)
    elif fmt == "thd":
        key = ("thd",)
    elif not has_padding(mask_type) and mask_type != "arbitrary":
        key = ("mask type", mask_type)
    elif lengths_given and has_padding(mask_type):
        key = ("cu_seqlens",)
    else:
        return
    if not _first_time(key):
        return
    reason = {
        "cache step": "a KV-cache step takes each sequence's lengths from inference_params",
        "thd": "qkv_format='thd' takes each sequence's lengths from cu_seqlens_q / cu_seqlens_kv",
        "mask type": (f"attn_mask_type={mask_type!r} reads no mask (a mask that only repeats it can be left out; "
                      "a padding mask needs a padding type such as 'padding_causal', any other mask 'arbitrary')"),
        "cu_seqlens": ("the given cu_seqlens give each sequence's lengths (self-attention: one of cu_seqlens_q / "
                       "cu_seqlens_kv serves both sides; the mask's are read only when neither, or one in "
                       "cross-attention, is given)"),
    }[key[0]]
    warn(f"attention_mask is given but not read: {reason}")


def warn_unread_cu_seqlens(mask_type: str) -> None:
    """Warn once per mask type that ``cu_seqlens_q`` / ``cu_seqlens_kv`` given in bshd / sbhd with a mask type
    without padding are not read (every sequence is full length there; TE ignores them silently)."""
    if _first_time(("unread cu_seqlens", mask_type)):
        warn(f"cu_seqlens_q / cu_seqlens_kv are given but not read: attn_mask_type={mask_type!r} has no padding, so "
             "every sequence in bshd / sbhd is full length (for per-sequence lengths use a padding type such as "
             "'padding_causal')")


def warn_unread_padded_offsets() -> None:
    """Warn once that ``cu_seqlens_q_padded`` / ``cu_seqlens_kv_padded`` given with ``inference_params`` are not
    read (TE drops them in a cache step): the step reads its query tokens back to back, so a query laid out with
    gaps would be read at the wrong rows. For eager calls (a compiled one would guard on the warned set)."""
    if _first_time(("padded offsets",)):
        warn("cu_seqlens_q_padded / cu_seqlens_kv_padded are given with inference_params but not read: a KV-cache "
             "step reads its query tokens back to back (as in TE); pack them without gaps")


def warn_unread_thd_layout(fmt: str) -> None:
    """Warn once per format that ``cu_seqlens_*_padded`` / ``pad_between_seqs`` given in bshd / sbhd are not read:
    they lay out thd's packed tokens, and a bshd / sbhd sequence starts at its row (TE ignores them silently)."""
    if _first_time(("unread thd layout", fmt)):
        warn(f"cu_seqlens_q_padded / cu_seqlens_kv_padded / pad_between_seqs are given but not read: they lay out "
             f"thd's packed tokens, and in {fmt} every sequence starts at its own row (pass qkv_format='thd' to "
             "use them)")


_DEFAULT_LAYER_APPENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per cache object, the step (its ``step_dict`` object, new at every ``pre_step``) in which a module built without
``layer_number`` last appended to layer 1."""


def check_default_layer_append(inference_params: Any) -> None:
    """A module built without ``layer_number`` caches as layer 1 (TE's default). Raise the ValueError that says so
    when layer 1 already took such a module's append in this step (``record_default_layer_append``): a second
    module without one, or one module called for two layers, would write layer 1's cache twice (eager calls)."""
    step = getattr(inference_params, "step_dict", None)
    if step is None:   # a cache object without InferenceParams' steps: unchecked
        return
    try:
        appended = _DEFAULT_LAYER_APPENDS.get(inference_params)
    except TypeError:   # nor one that takes no weak reference
        return
    if appended is step:
        raise ValueError(
            "layer 1's cache already took an append in this step from a DotProductAttention built without "
            "layer_number (such a module caches as layer 1, TE's default): a second module without one, or one "
            "module called for two layers, would overwrite it; pass each layer's DotProductAttention(..., "
            "layer_number=L)"
        )


def record_default_layer_append(inference_params: Any) -> None:
    """Note that a module without ``layer_number`` appended to layer 1 in this step (after the append went through:
    a refused append leaves the step open to a corrected call)."""
    step = getattr(inference_params, "step_dict", None)
    if step is None:
        return
    try:
        _DEFAULT_LAYER_APPENDS[inference_params] = step
    except TypeError:
        return


def thd_seqlens(
    mask_type: str,
    self_attention: bool,
    kv_caching: bool,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_kv: torch.Tensor | None,
    cu_seqlens_q_padded: torch.Tensor | None,
    cu_seqlens_kv_padded: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_kv: int | None,
    pad_between_seqs: bool | None,
    q_tokens: int = 0,
    kv_tokens: int = 0,
    check_values: bool = False,
) -> tuple[int, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, int | None, int | None, bool]:
    """thd: (batch, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv,
    pad_between_seqs), the keys' taken from the queries' when self-attention gives none,
    checked against each other. With a KV cache the step supplies the cu_seqlens (the given ones
    are optional and unused, batch 0 and None here) and ``max_seqlen_q`` / ``max_seqlen_kv`` stay
    None when not given (the step sets them, without reading ``cu_seqlens``). ``check_values``: also
    read the cu_seqlens and check them against q's and k's ``q_tokens`` / ``kv_tokens`` and the given
    max_seqlens (``attention.seqlens_check``)."""
    if not has_padding(mask_type):
        raise ValueError(
            f"qkv_format='thd' needs a padding attn_mask_type (padding, padding_causal, ...); got {mask_type!r}"
        )
    if kv_caching:
        return 0, None, None, None, max_seqlen_q, max_seqlen_kv, False
    if cu_seqlens_q is None or (cu_seqlens_kv is None and not self_attention):
        raise ValueError("qkv_format='thd' requires cu_seqlens_q and cu_seqlens_kv (int32 [b+1]; self-attention "
                         "may leave out cu_seqlens_kv when the keys are the queries' tokens), unless inference_params "
                         "supplies them")
    if cu_seqlens_kv is None:   # self-attention: the keys are the queries' tokens, at the queries' offsets
        if kv_tokens != q_tokens and cu_seqlens_kv_padded is None:
            raise ValueError(f"qkv_format='thd' without cu_seqlens_kv takes the keys at cu_seqlens_q's offsets, "
                             f"which needs as many key tokens as query tokens; key_layer has {kv_tokens} and "
                             f"query_layer {q_tokens}: pass cu_seqlens_kv")
        cu_seqlens_kv = cu_seqlens_q
        if cu_seqlens_kv_padded is None:
            cu_seqlens_kv_padded = cu_seqlens_q_padded
    inputs.check_cu_seqlens_batch(cu_seqlens_q.numel() - 1, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                                  cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
                                  exact=True)
    if pad_between_seqs is None:
        pad_between_seqs = has_own_offsets(cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    batch = cu_seqlens_q.numel() - 1
    if check_values:
        seqlens_check.check_cu_seqlens_values("thd", q_tokens, kv_tokens, batch, cu_seqlens_q, cu_seqlens_kv,
                                              cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv,
                                              pad_between_seqs)
    if max_seqlen_q is None:   # host sync; pass max_seqlen_q to avoid it
        max_seqlen_q = int((cu_seqlens_q_padded if cu_seqlens_q_padded is not None else cu_seqlens_q).diff().max())
    if max_seqlen_kv is None:
        max_seqlen_kv = int((cu_seqlens_kv_padded if cu_seqlens_kv_padded is not None else cu_seqlens_kv).diff().max())
    return batch, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv, pad_between_seqs


def bshd_seqlens(
    q: torch.Tensor,
    k: torch.Tensor,
    device: torch.device,
    fmt: str,
    mask_type: str,
    attention_mask: Any,
    self_attention: bool,
    kv_caching: bool,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_kv: torch.Tensor | None,
    check_values: bool = False,
) -> tuple[int, torch.Tensor | None, torch.Tensor | None, int, int]:
    """bshd/sbhd: (batch, cu_seqlens_q, cu_seqlens_kv, seqlen_q, seqlen_kv). Padding masks take the
    given cu_seqlens, else TE's ``[b,1,1,s]`` masks, else full lengths; other masks full lengths.
    With a KV cache the cu_seqlens are left as given (the step replaces them). ``check_values``: also
    read the given cu_seqlens and the mask the lengths are counted from (``attention.seqlens_check``)."""
    batch, seqlen_q = batch_and_seqlen(q, fmt)
    seqlen_kv = batch_and_seqlen(k, fmt)[1]
    if has_padding(mask_type) and not kv_caching:
        inputs.check_cu_seqlens_batch(batch, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv)
        if check_values:
            seqlens_check.check_cu_seqlens_values(fmt, seqlen_q, seqlen_kv, batch, cu_seqlens_q, cu_seqlens_kv,
                                                  None, None, None, None)
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            from_mask = inputs.padding_cu_seqlens(attention_mask, batch, seqlen_q, seqlen_kv, device, self_attention)
            if check_values and attention_mask is not None:
                seqlens_check.check_padding_mask_values(attention_mask)
            if cu_seqlens_replace_mask(q, k, fmt, attention_mask, self_attention, cu_seqlens_q, cu_seqlens_kv):
                given = cu_seqlens_q if cu_seqlens_q is not None else cu_seqlens_kv   # it serves both sides
                from_mask = (given, given)
            cu_seqlens_q = cu_seqlens_q if cu_seqlens_q is not None else from_mask[0]
            cu_seqlens_kv = cu_seqlens_kv if cu_seqlens_kv is not None else from_mask[1]
    elif not kv_caching:
        cu_seqlens_q = full_cu_seqlens(batch, seqlen_q, device)
        cu_seqlens_kv = full_cu_seqlens(batch, seqlen_kv, device)
    return batch, cu_seqlens_q, cu_seqlens_kv, seqlen_q, seqlen_kv


def kv_cache_step(
    inference_params: Any,
    q: torch.Tensor,
    fmt: str,
    batch: int,
    max_seqlen_q: int | None,
    eager: bool | None = None,
) -> tuple[int, torch.Tensor, torch.Tensor, int, int]:
    """The lengths of the cache step the last ``pre_step`` set up: (batch, cu_seqlens_q, cu_seqlens_kv,
    max_seqlen_q, max_seqlen_kv), read from the cache's metadata; nothing is appended (the module calls
    ``inference_params.step`` once every check has passed). Checks that q holds the step: its batch
    (bshd/sbhd: the step's, or up to max_batch_size with padding rows, as TE's CUDA-graph recipe captures) and, in
    eager calls, its tokens and a given thd ``max_seqlen_q`` against the step's host
    lengths. ``eager``: as for ``eager_step_value``."""
    ip = inference_params
    eager = eager or (eager is None and eager_call(q.device))   # the step's host lengths hold for this call
    # bshd / sbhd: the step's batch, or padded up to max_batch_size. A traced or captured call serves later steps
    # of other batch sizes (and torch.compile would guard on this one's): it checks only the bound.
    max_batch = getattr(ip, "max_batch_size", None)
    if fmt == "thd":
        batch_fits = True
    elif max_batch is None:   # a cache object without one: its step's batch only
        batch_fits = batch == ip.batch_size
    elif eager:
        batch_fits = batch == ip.batch_size or ip.batch_size < batch <= max_batch
    else:
        batch_fits = batch <= max_batch
    if not batch_fits:
        if hasattr(ip, "check_stepped"):
            ip.check_stepped()   # no pre_step yet: say that, not the batch size
        padded = "" if max_batch is None else (
            f", or up to max_batch_size={max_batch} with padding rows past them (as in TE: they bring no tokens, and "
            "their output rows are zero)")
        raise ValueError(f"query_layer batch size {batch} must be inference_params.batch_size={ip.batch_size} (the "
                         f"sequences of the last pre_step){padded}")
    if eager:
        # q must hold every new token of the step, else the kernels read and write past its end or skip queries
        longest = getattr(ip, "longest_step", None)
        if longest is not None and (
            (q.shape[0] < getattr(ip, "step_tokens", 0) or (max_seqlen_q is not None and max_seqlen_q < longest))
            if fmt == "thd" else max_seqlen_q < longest   # bshd / sbhd: max_seqlen_q is q's positions
        ):
            _refuse_short_queries(ip, q, fmt, max_seqlen_q, longest)
    if fmt == "thd" and max_seqlen_q is None:
        max_seqlen_q = _step_queries_bound(ip, q.device, eager)
    cu_seqlens_q, cu_seqlens_kv = ip.cu_seqlens_q, ip.cu_seqlens_kv
    if max_seqlen_q is None:   # host sync: a thd cache that says neither longest_step nor max_ctx_len
        max_seqlen_q = int(cu_seqlens_q.diff().max())
    if fmt == "thd":
        batch = cu_seqlens_q.numel() - 1
    return batch, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, ip.max_sequence_length


def append_step(inference_params: Any, layer_number: int, k: torch.Tensor, v: torch.Tensor,
                fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``inference_params.step``'s K and V caches of the layer after appending k and v; its refusals, which name
    its arguments new_k / new_v, also say that they are the module's key_layer / value_layer."""
    try:
        return inference_params.step(layer_number, k, v, fmt)[:2]
    except ValueError as error:
        if "new_k" not in str(error) and "new_v" not in str(error):
            raise
        raise ValueError(f"{error} (key_layer and value_layer are appended to the cache as "
                         "inference_params.step's new_k and new_v)") from None


def _refuse_short_queries(ip: Any, q: torch.Tensor, fmt: str, max_seqlen_q: int | None, longest: int) -> None:
    """Raise the ValueError of an eager cache step whose q does not hold the step: fewer rows than its
    ``step_tokens`` (thd) or positions than its ``longest`` sequence (bshd/sbhd), or a given thd
    ``max_seqlen_q`` below ``longest``. (Traced or captured calls are sized for the steps their replays bring.)"""
    if fmt == "thd":
        tokens = getattr(ip, "step_tokens", 0)
        if q.shape[0] < tokens:
            raise ValueError(
                f"query_layer holds {q.shape[0]} tokens (dim 0 in thd) but this step brings {tokens} "
                "(inference_params.step_tokens, the sum of the step lengths given to pre_step)"
            )
        if max_seqlen_q is not None and max_seqlen_q < longest:
            raise ValueError(
                f"max_seqlen_q={max_seqlen_q} is less than this step's longest sequence, {longest} new tokens "
                "(inference_params.longest_step); pass at least that, or None"
            )
        return
    positions = q.shape[1] if fmt == "bshd" else q.shape[0]
    if positions < longest:
        raise ValueError(
            f"query_layer has {positions} token positions (dim {1 if fmt == 'bshd' else 0} in {fmt}) but a sequence "
            f"of this step brings {longest} new tokens (inference_params.longest_step)"
        )


def eager_call(device: torch.device) -> bool:
    """Is this call neither traced by torch.compile nor captured in a CUDA graph (whose replays bring
    other steps)?"""
    return not (torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()))


def eager_step_value(ip: Any, name: str, device: torch.device, eager: bool | None = None) -> int | None:
    """A host value of this cache step (``InferenceParams.longest_step``, ``step_tokens``), or None
    when the cache has none or the call is not eager (``eager_call(device)``, or ``eager`` when the
    caller knows it already)."""
    if not (eager_call(device) if eager is None else eager):
        return None
    return getattr(ip, name, None)


def _step_queries_bound(ip: Any, device: torch.device, eager: bool | None) -> int | None:
    """thd ``max_seqlen_q`` of a cache step, from the host: the step's longest (``longest_step``)
    in eager calls, else ``max_ctx_len`` (None if the cache has neither)."""
    longest = eager_step_value(ip, "longest_step", device, eager)
    return getattr(ip, "max_ctx_len", None) if longest is None else longest


def cache_layout(inference_params: Any) -> tuple[str, int | None, torch.Tensor | None, str]:
    """(kv_cache, page_size, page_table, kv_format) of the cache behind ``inference_params``."""
    ip = inference_params
    if ip.is_paged:
        return "paged", ip.page_size, ip.cache_manager.page_table, "paged"
    return "non_paged", None, None, "bshd"


def step_slopes(alibi_slopes: Any, step_batch: int, rows: int) -> Any:
    """Per-sequence ALiBi slopes ``[batch_size, h]`` of a thd cache step, as bshd takes them, extended with zero rows
    to the ``rows`` (max_batch_size) that thd's cu_seqlens hold: the rows past the step's sequences are empty.
    Anything else is returned as given, for check_bias to judge."""
    if (isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.dim() == 2
            and alibi_slopes.shape[0] == step_batch < rows):
        return torch.cat([alibi_slopes, alibi_slopes.new_zeros(rows - step_batch, alibi_slopes.shape[1])])
    return alibi_slopes


def check_bias(
    module: DotProductAttention,
    core_attention_bias_type: str,
    core_attention_bias: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    batch: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    device: torch.device,
) -> tuple[str | None, torch.Tensor | None]:
    """(bias shape tag, alibi slopes as fp32 on ``device``; the default slopes for ``alibi``)."""
    bias_shape = inputs.check_bias(
        core_attention_bias_type, core_attention_bias, alibi_slopes, batch, module.num_attention_heads,
        max_seqlen_q, max_seqlen_kv,
    )
    if core_attention_bias is not None and core_attention_bias.device != device:
        raise ValueError(f"core_attention_bias must be on {device} with the inputs; got {core_attention_bias.device}")
    if core_attention_bias_type == "alibi" and alibi_slopes is None:
        alibi_slopes = inputs.alibi_slopes_tensor(module.num_attention_heads, device)
    elif alibi_slopes is not None:
        if alibi_slopes.device != device and alibi_slopes.device.type != "cpu":
            raise ValueError(
                f"alibi_slopes must be on the inputs' device ({device}) or the CPU; got {alibi_slopes.device}")
        alibi_slopes = alibi_slopes.to(device=device, dtype=torch.float32)
        if alibi_slopes.stride(-1) != 1:   # a strided or expanded view: the kernels index the last dim densely
            alibi_slopes = alibi_slopes.contiguous()
    return bias_shape, alibi_slopes


def arbitrary_mask(attention_mask: Any, batch: int, heads: int, max_seqlen_q: int, max_seqlen_kv: int,
                   device: torch.device) -> torch.Tensor:
    """``attn_mask_type='arbitrary'``: the mask, a bool tensor broadcastable to ``[b, h, s_q, s_kv]`` (as in TE,
    ``[s_q, s_kv]`` or ``[h, s_q, s_kv]`` too), as a 4-D view."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
        got = (f"a {attention_mask.dtype} tensor of shape {list(attention_mask.shape)}"
               if isinstance(attention_mask, torch.Tensor) else repr(attention_mask))
        hint = ("; an additive float mask (0 / -inf) is `attention_mask < 0` as a bool mask, or a "
                "core_attention_bias_type='post_scale_bias' bias" if isinstance(attention_mask, torch.Tensor)
                and attention_mask.is_floating_point() else "")
        raise ValueError("attention_mask must be a bool tensor broadcastable to [b, h, s_q, s_kv] (True = masked) "
                         f"for attn_mask_type='arbitrary'; got {got}{hint}")
    if 2 <= attention_mask.dim() < 4:
        attention_mask = attention_mask.view(*(1,) * (4 - attention_mask.dim()), *attention_mask.shape)
    inputs.check_arbitrary_mask(attention_mask, batch, heads, max_seqlen_q, max_seqlen_kv, device)
    return attention_mask


def requires_grad(module: DotProductAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  core_attention_bias: torch.Tensor | None, kv_caching: bool = False) -> bool:
    """Will a derivative of this call be taken? A backward pass (grad mode on and a differentiable input), forward-mode
    AD (an input carries a tangent) or a torch.func transform (jvp, vmap, grad: wrapped inputs, which only plain
    PyTorch ops can read). Backends without a backward pass (``fused``) are not chosen then. A KV-cache step trains
    neither a bias nor the module's learnable sink (it reads both detached): they do not count there."""
    return (torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad
        or (not kv_caching and core_attention_bias is not None and core_attention_bias.requires_grad)
        or (not kv_caching and module.softmax_type == "learnable" and module.softmax_offset.requires_grad)
    )) or ((_functorch_level() is not None or _forward_ad._current_level >= 0)   # ~0.1 µs: two module-level reads
           and _transformed(q, k, v, core_attention_bias))


def refuse_differentiable_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """A KV-cache step has no backward pass: appended k / v that require grad made the cache part of autograd's
    graph, and a derivative w.r.t. q would read a cache that later steps change. Refused naming the input (a
    module's own learnable sink, which a cache step does not train, is not one)."""
    grad_mode = torch.is_grad_enabled()
    for name, t in (("query_layer", q), ("key_layer", k), ("value_layer", v)):
        tangent = _forward_ad._current_level >= 0 and _has_tangent(t)
        if (grad_mode and t.requires_grad) or tangent:
            raise ValueError(
                f"inference_params: a KV-cache step has no backward pass, but {name} "
                f"{'carries a forward-mode tangent' if tangent else 'requires grad'}; run generation under "
                "torch.no_grad() or torch.inference_mode(), or pass it detached")


def _transformed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, core_attention_bias: torch.Tensor | None) -> bool:
    """requires_grad's forward-mode AD and torch.func cases, inside a dual_level() or a torch.func transform
    (torch.compile's graphs take neither)."""
    if torch.compiler.is_compiling():
        return False
    if _functorch_level() is not None:   # inside torch.func.jvp / vmap / grad: the inputs are wrapped tensors
        return True
    # a dual_level() is open: does an input carry a tangent?
    return any(t is not None and _has_tangent(t) for t in (q, k, v, core_attention_bias))


def _has_tangent(t: torch.Tensor) -> bool:
    """Does ``t`` carry a forward-mode tangent (inside an open ``forward_ad.dual_level()``)?"""
    return _forward_ad.unpack_dual(t).tangent is not None


def attention_params(
    module: DotProductAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    device: torch.device,
    fmt: str,
    kv_format: str,
    batch: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    mask_type: str,
    window: tuple[int, int],
    bottom_right: bool,
    core_attention_bias_type: str,
    core_attention_bias: torch.Tensor | None,
    bias_shape: str | None,
    alibi_slopes: torch.Tensor | None,
    dropout_p: float,
    pad_between_seqs: bool,
    kv_cache: str,
    page_size: int | None,
    num_splits: int,
) -> AttentionParams:
    """The selection key of the call: the resolved arguments plus the module's configuration, whether
    a backward pass will follow, the device's compute capability and whether a CUDA graph is being
    captured."""
    compiling = torch.compiler.is_compiling()
    # Under torch.compile a capture happens when the compiled graph runs (cudagraph trees), not now.
    capturing = device.type == "cuda" and not compiling and torch.cuda.is_current_stream_capturing()
    return AttentionParams(
        dtype=q.dtype,
        device_type=device.type,
        compute_capability=(_compute_capability_at_trace if compiling else _compute_capability)(device),
        qkv_format=fmt,
        kv_format=kv_format,
        batch_size=batch,
        num_heads=module.num_attention_heads,
        num_gqa_groups=module.num_gqa_groups,
        head_dim_qk=module.head_dim_qk,
        head_dim_v=module.head_dim_v,
        max_seqlen_q=int(max_seqlen_q),
        max_seqlen_kv=int(max_seqlen_kv),
        attn_mask_type=mask_type,
        window_size=window,
        bottom_right_diagonal=bottom_right,
        core_attention_bias_type=core_attention_bias_type,
        core_attention_bias_shape=bias_shape,
        alibi_slopes_shape=tuple(alibi_slopes.shape) if alibi_slopes is not None else None,
        softmax_type=module.softmax_type,
        attention_dropout=dropout_p,
        requires_grad=requires_grad(module, q, k, v, core_attention_bias, kv_cache != "none"),
        deterministic=module.deterministic,
        pad_between_seqs=bool(pad_between_seqs),
        kv_cache=kv_cache,
        page_size=page_size,
        cuda_graph_capture=capturing,
        num_splits=int(num_splits),   # (a numpy integer's value: a plan keys it as equal to the int)
        return_max_logit=module.return_max_logit,
    )
