"""TransformerEngine's arguments that this package takes for compatibility but implements only in part: tensor and
context parallelism (one partition of the heads, no context split), FP8 and score_mod (refused unless left at their
defaults), and the packed ``qkv_layer`` / ``kv_layer`` inputs (unpacked into views).

Megatron's ``TEDotProductAttention`` and TE's ``MultiheadAttention`` pass these; a value this package cannot honour is
refused naming the argument, never ignored.

Example:
    >>> import torch
    >>> qkv = torch.randn(2, 5, 3, 4, 8)                  # bshd, packed as [b, s, 3, h, d]
    >>> q, k, v = unpack_packed_inputs(None, None, None, qkv, None, -3, None)
    >>> q.shape, q.data_ptr() == qkv.data_ptr()          # views, nothing copied
    (torch.Size([2, 5, 4, 8]), True)
"""

from __future__ import annotations

from typing import Any

import torch

from attention.integers import integer_argument

__all__ = ["check_parallelism", "refuse_unsupported_forward_arguments", "unpack_packed_inputs"]

CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


def _group_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def check_parallelism(sequence_parallel: Any, tp_size: Any, tp_group: Any, cp_group: Any, cp_comm_type: Any) -> None:
    """Tensor and context parallelism of one partition only: ``tp_size`` 1 (or a ``tp_group`` of one rank) and no
    ``cp_group`` of more than one rank. With tensor parallelism, build the module with the partition's heads.
    ``sequence_parallel`` must be a bool: an int there is an older positional call (TE's order before
    ``bottom_right_diagonal``) whose later arguments would bind one place off."""
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False; got {sequence_parallel!r} (positional arguments "
                         "follow TE's current order: ..., window_size, bottom_right_diagonal, sequence_parallel, "
                         "tp_size, ...)")
    world = integer_argument("tp_size", tp_size, 1) if tp_group is None else _group_size(tp_group)
    if world > 1:
        raise NotImplementedError(
            f"tensor parallelism (tp_size={world}) is not implemented: build the module with this rank's "
            "partition, num_attention_heads and num_gqa_groups divided by the TP size, and tp_size=1")
    if cp_comm_type not in CP_COMM_TYPES:
        raise ValueError(f"cp_comm_type must be one of {CP_COMM_TYPES}; got {cp_comm_type!r}")
    cp_groups = cp_group if isinstance(cp_group, (list, tuple)) else [cp_group]
    if any(group is not None and _group_size(group) > 1 for group in cp_groups):
        raise NotImplementedError("context parallelism (a cp_group of more than one rank) is not implemented")


def refuse_unsupported_forward_arguments(fp8_output: Any, bf16_backward: Any, score_mods: tuple) -> None:
    """forward's FP8 and score_mod arguments: only their defaults (False, False, None x 4)."""
    if fp8_output or bf16_backward:
        name = "fp8_output" if fp8_output else "bf16_backward"
        raise NotImplementedError(f"{name}=True: FP8 attention is not implemented (every backend computes in the "
                                  "inputs' dtype)")
    names = ("score_mod", "score_mod_bprop", "score_mod_tensors", "score_mod_bprop_tensors")
    for name, value in zip(names, score_mods):
        if value is not None:
            raise NotImplementedError(f"{name}: cuDNN's score_mod callbacks are not implemented; got {value!r}")


def unpack_packed_inputs(query_layer: torch.Tensor | None, key_layer: torch.Tensor | None,
                         value_layer: torch.Tensor | None, qkv_layer: torch.Tensor | None,
                         kv_layer: torch.Tensor | None, qkv_interleave_dim: int,
                         inference_params: Any, heads: tuple[int, int] | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v): the given layers, or views of TE's packed buffers. ``qkv_layer``: ``[..., 3, h, d]``
    (``qkv_interleave_dim=-3``) or ``[..., h, 3, d]`` (-2); ``kv_layer``: the same with 2, beside ``query_layer``.
    Not with ``inference_params`` (as in TE). ``heads``: the module's (num_attention_heads, num_gqa_groups); a
    qkv_layer packs as many of each, so GQA modules are refused one."""
    if qkv_layer is None and kv_layer is None:
        if query_layer is None or key_layer is None or value_layer is None:
            raise ValueError("query_layer, key_layer and value_layer are required (or qkv_layer, or query_layer "
                             "with kv_layer)")
        return query_layer, key_layer, value_layer
    if inference_params is not None:
        raise ValueError("qkv_layer / kv_layer cannot be used with inference_params (as in TE): pass query_layer, "
                         "key_layer and value_layer")
    if qkv_interleave_dim not in (-3, -2):
        raise ValueError(f"qkv_interleave_dim must be -3 ([..., 3, h, d]) or -2 ([..., h, 3, d]); "
                         f"got {qkv_interleave_dim!r}")
    if qkv_layer is not None:
        if query_layer is not None or key_layer is not None or value_layer is not None or kv_layer is not None:
            raise ValueError("qkv_layer replaces query_layer, key_layer, value_layer and kv_layer: pass it alone")
        if heads is not None and heads[0] != heads[1]:
            raise ValueError(f"qkv_layer packs as many key / value heads as query heads, but this module has "
                             f"num_gqa_groups={heads[1]} for num_attention_heads={heads[0]}: pass query_layer with "
                             "kv_layer, or query_layer, key_layer and value_layer")
        return tuple(_unpack(qkv_layer, "qkv_layer", 3, qkv_interleave_dim))
    if query_layer is None or key_layer is not None or value_layer is not None:
        raise ValueError("kv_layer replaces key_layer and value_layer: pass it with query_layer only")
    key, value = _unpack(kv_layer, "kv_layer", 2, qkv_interleave_dim)
    return query_layer, key, value


def _unpack(packed: Any, name: str, count: int, dim: int) -> list[torch.Tensor]:
    if not isinstance(packed, torch.Tensor) or packed.dim() < 4 or packed.shape[dim] != count:
        shape = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed).__name__
        where = "[..., {0}, h, d]" if dim == -3 else "[..., h, {0}, d]"
        raise ValueError(f"{name} must be {where.format(count)} (qkv_interleave_dim={dim}); got {shape}")
    return list(packed.unbind(dim))
