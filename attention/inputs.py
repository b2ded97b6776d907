"""Checks and normalisation of a call's tensors: every error names the argument and the expectation."""

from __future__ import annotations

import functools
import numbers

import torch

from attention.formats import cu_seqlens_from_lengths, full_cu_seqlens, lengths_from_padding_mask
from attention.integers import as_int
from attention.masks import default_alibi_slopes

BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
_NAMES = ("query_layer", "key_layer", "value_layer")


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qkv_format: str,
    num_heads: int, num_gqa_groups: int, head_dim_qk: int, head_dim_v: int,
) -> None:
    """Shapes, dtypes and devices of q/k/v against the module's configuration (its head counts, which may have
    been set since it was built, too)."""
    heads, groups = as_int(num_heads), as_int(num_gqa_groups)
    if heads is None or heads < 1:
        raise ValueError(f"num_attention_heads must be an int >= 1; got {num_heads!r} (the module's attribute)")
    if groups is None or groups < 1 or heads % groups:
        raise ValueError(f"num_gqa_groups must be an int >= 1 that divides num_attention_heads={heads}; got "
                         f"{num_gqa_groups!r} (the module's attributes)")
    for name, t in zip(_NAMES, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        want = 3 if qkv_format == "thd" else 4
        if t.dim() != want:
            raise ValueError(f"{name} must be {want}-D for qkv_format={qkv_format!r}; got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor; got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"query_layer, key_layer and value_layer must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"query_layer, key_layer and value_layer must be on one device; got {q.device}, {k.device}, {v.device}")
    if q.shape[-2] != num_heads:
        raise ValueError(f"query_layer must have num_attention_heads={num_heads} heads (dim -2); got {q.shape[-2]}")
    for name, t in (("key_layer", k), ("value_layer", v)):
        if t.shape[-2] != num_gqa_groups:
            raise ValueError(f"{name} must have num_gqa_groups={num_gqa_groups} heads (dim -2); got {t.shape[-2]}")
    for name, t, d in (("query_layer", q, head_dim_qk), ("key_layer", k, head_dim_qk), ("value_layer", v, head_dim_v)):
        if t.shape[-1] != d:
            raise ValueError(f"{name} head dim (last) must be {d} (kv_channels); got {t.shape[-1]}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"key_layer and value_layer must agree on all dims but the last; got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if qkv_format != "thd":
        batch_dim = 0 if qkv_format == "bshd" else 1
        if q.shape[batch_dim] != k.shape[batch_dim]:
            raise ValueError(
                f"query_layer and key_layer must have the same batch size (dim {batch_dim} in {qkv_format}); "
                f"got {q.shape[batch_dim]} and {k.shape[batch_dim]}"
            )


def check_cu_seqlens(name: str, cu: torch.Tensor | None, device: torch.device) -> None:
    if cu is None:
        return
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be a 1-D int32 tensor of b+1 cumulative lengths; got {_describe(cu)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device} with the inputs; got {cu.device}")


def check_cu_seqlens_batch(batch: int, exact: bool = False, **cu_seqlens: torch.Tensor | None) -> None:
    """Each given cu_seqlens holds ``batch + 1`` entries (thd: exactly; bshd/sbhd: at least, as TE
    reads only the first ``b + 1``)."""
    for name, cu in cu_seqlens.items():
        if cu is None:
            continue
        if cu.numel() < batch + 1 or (exact and cu.numel() != batch + 1):
            need = f"{batch + 1}" if exact else f"at least {batch + 1}"
            raise ValueError(f"{name} must have {need} entries (batch size {batch} + 1); got {cu.numel()}")


def check_arbitrary_mask(mask: torch.Tensor, batch: int, heads: int, seqlen_q: int, seqlen_kv: int,
                         device: torch.device) -> None:
    """An arbitrary mask is bool, 4-D and broadcastable to ``[b, h, s_q, s_kv]``, on the inputs' device."""
    want = (batch, heads, seqlen_q, seqlen_kv)
    if mask.dim() != 4 or any(m not in (1, w) for m, w in zip(mask.shape, want)):
        raise ValueError(
            f"attention_mask must be broadcastable to [b, h, s_q, s_kv] = {list(want)} for attn_mask_type='arbitrary'; "
            f"got {_describe(mask)}"
        )
    if mask.device != device:
        raise ValueError(f"attention_mask must be on {device} with the inputs; got {mask.device}")


def padding_cu_seqlens(
    attention_mask: torch.Tensor | tuple | None, batch: int, seqlen_q: int, seqlen_kv: int, device: torch.device,
    self_attention: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens for bshd/sbhd with a padding mask: from TE's ``[b,1,1,s]`` masks (True = pad), or full."""
    if attention_mask is None:
        return full_cu_seqlens(batch, seqlen_q, device), full_cu_seqlens(batch, seqlen_kv, device)
    masks = attention_mask if isinstance(attention_mask, (tuple, list)) else (attention_mask,)
    if self_attention and len(masks) == 1:
        masks = (masks[0], masks[0])
    if len(masks) != 2:
        raise ValueError("attention_mask must be one [b,1,1,s] tensor (self-attention) or a (q_mask, kv_mask) pair")
    for m, s, which in ((masks[0], seqlen_q, "query"), (masks[1], seqlen_kv, "key")):
        # the lengths are counted per row of dim 0: a [1, 1, b, s] or flat mask of b * s elements is not one
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or tuple(m.shape) != (batch, 1, 1, s):
            raise ValueError(
                f"attention_mask for the {which} side must be a bool [b,1,1,s] = [{batch},1,1,{s}] tensor "
                f"(True = padded); got {_describe(m)}"
            )
        if m.device != device and m.device.type != "cpu":   # (its lengths are counted where it is)
            raise ValueError(f"attention_mask for the {which} side must be on the inputs' device ({device}) or the "
                             f"CPU; got {m.device}")
    return (cu_seqlens_from_lengths(lengths_from_padding_mask(masks[0])),
            cu_seqlens_from_lengths(lengths_from_padding_mask(masks[1])))


def bias_shape_tag(bias: torch.Tensor, batch: int, heads: int) -> str:
    """TE's shape tag of a bias tensor: 11ss, 1hss, b1ss, bhss or 111s."""
    if bias.dim() != 4:
        raise ValueError(f"core_attention_bias must be 4-D [1|b, 1|h, s_q|1, s_kv]; got {_describe(bias)}")
    b, h, sq = bias.shape[:3]
    if b == 1 and h == 1 and sq == 1:
        return "111s"
    tag = ("1" if b == 1 else "b") + ("1" if h == 1 else "h") + "ss"
    if (b not in (1, batch)) or (h not in (1, heads)):
        raise ValueError(
            f"core_attention_bias must have shape 11ss, 1hss, b1ss, bhss or 111s with b={batch}, h={heads} (b: the "
            f"batch; in a thd KV-cache step the cache's max_batch_size rows); got {tuple(bias.shape)}"
        )
    return tag


def host_scalars(*values: object) -> tuple:
    """forward's host scalars as Python values: a one-element tensor (Megatron's ``PackedSeqParams`` passes
    ``max_seqlen_*`` so; a host sync on CUDA, as in TE) or a numpy scalar becomes its ``.item()``."""
    return tuple(value.item() if isinstance(value, torch.Tensor) and value.numel() == 1
                 or type(value).__module__ == "numpy" and hasattr(value, "item") else value for value in values)


def check_host_arguments(max_seqlen_q: object, max_seqlen_kv: object, pad_between_seqs: object) -> None:
    """forward's host arguments that are not tensors: ``max_seqlen_*`` ints >= 0 or None, ``pad_between_seqs``
    True, False (or 1 / 0) or None."""
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0):
            raise ValueError(f"{name} must be an int >= 0 or None; got {value!r}")
    if not (pad_between_seqs is None or pad_between_seqs in (True, False) and isinstance(pad_between_seqs, int)):
        raise ValueError(f"pad_between_seqs must be True, False or None (inferred); got {pad_between_seqs!r}")


def check_bias(bias_type: str, bias: torch.Tensor | None, alibi_slopes: torch.Tensor | None,
               batch: int, heads: int, seqlen_q: int, seqlen_kv: int) -> str | None:
    if bias_type not in BIAS_TYPES:
        raise ValueError(f"core_attention_bias_type must be one of {BIAS_TYPES}; got {bias_type!r}")
    if bias_type in ("pre_scale_bias", "post_scale_bias"):
        if bias is None:
            raise ValueError(f"core_attention_bias is required for core_attention_bias_type={bias_type!r}")
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise ValueError(
                f"core_attention_bias must be a floating-point tensor added to the scores; got {_describe(bias)} "
                "(a bool mask goes in attention_mask with attn_mask_type='arbitrary')"
            )
        tag = bias_shape_tag(bias, batch, heads)
        if bias.shape[-1] != seqlen_kv or (tag != "111s" and bias.shape[-2] != seqlen_q):
            raise ValueError(
                f"core_attention_bias must end in [s_q, s_kv] = [{seqlen_q}, {seqlen_kv}] (max_seqlen_q, "
                f"max_seqlen_kv; a KV-cache step's max_seqlen_kv is the cache's max_sequence_length); got "
                f"{tuple(bias.shape)}"
            )
        return tag
    if bias is not None:
        raise ValueError(f"core_attention_bias must be None for core_attention_bias_type={bias_type!r}")
    if alibi_slopes is not None:
        if bias_type != "alibi":
            raise ValueError("alibi_slopes requires core_attention_bias_type='alibi'")
        if not isinstance(alibi_slopes, torch.Tensor) or not alibi_slopes.is_floating_point():
            raise ValueError(
                f"alibi_slopes must be a floating-point tensor [h] or [b, h]; got {_describe(alibi_slopes)}")
        if alibi_slopes.shape not in ((heads,), (batch, heads)):
            raise ValueError(f"alibi_slopes must have shape [h] = [{heads}] or [b, h] = [{batch}, {heads}]; "
                             f"got {tuple(alibi_slopes.shape)}")
    return None


@functools.lru_cache(maxsize=64)
def alibi_slopes_tensor(num_heads: int, device: torch.device) -> torch.Tensor:
    """Default ALiBi slopes as fp32 ``[h]`` on ``device`` (cached)."""
    return torch.tensor(default_alibi_slopes(num_heads), dtype=torch.float32, device=device)


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return repr(x)
