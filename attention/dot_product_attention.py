"""DotProductAttention: normalise inputs -> (KV-cache step) -> select a backend -> run it.

The constructor and ``forward`` follow TransformerEngine's names and semantics; ``backend=`` is
ours (a name or a priority list: fused, flash, flash2, flash3, flash4, unfused).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch.nn.modules import module as nn_module

from attention import call_plans, call_setup, inputs, selection, seqlens_check, te_arguments
from attention.backends.base import AttentionCall, Backend
from attention.formats import check_format
from attention.integers import integer_argument
from attention.masks import check_set_window_size, has_padding, normalize_mask_type, resolve_bottom_right

_PLANNED_ATTRIBUTES = frozenset({
    "training", "num_attention_heads", "num_gqa_groups", "head_dim_qk", "head_dim_v", "attention_dropout",
    "qkv_format", "attn_mask_type", "_window_size_arg", "attention_type", "softmax_type", "bottom_right_diagonal",
    "return_max_logit", "backend", "deterministic",
})
"""The module's attributes that a call plan's checks and choice read (``planned_configuration``)."""


def _checked_backend(module: nn.Module, backend: str | Sequence[str] | None) -> tuple[str, ...] | None:
    return None if backend is None else selection.expand_names(backend, "backend")


def _checked_dropout(module: nn.Module, attention_dropout: Any) -> float:
    if not (isinstance(attention_dropout, numbers.Real) and 0.0 <= attention_dropout < 1.0):
        raise ValueError(f"attention_dropout must be a number in [0, 1); got {attention_dropout!r}")
    return float(attention_dropout)


def _checked_softmax_scale(module: nn.Module, softmax_scale: Any) -> float:
    """A finite number (a numpy scalar or one-element tensor: its value); None: 1/sqrt(d_qk)."""
    (softmax_scale,) = inputs.host_scalars(softmax_scale)
    if softmax_scale is None:
        return 1.0 / math.sqrt(module.head_dim_qk)
    if isinstance(softmax_scale, bool) or not (isinstance(softmax_scale, numbers.Real)
                                               and math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale must be a finite number or None (1/sqrt(d_qk)); got {softmax_scale!r}")
    return softmax_scale


def _checked_softmax_type(module: nn.Module, softmax_type: Any) -> str:
    """One of SOFTMAX_TYPES, set once: the constructor gives the module its sink logits for it."""
    if softmax_type not in inputs.SOFTMAX_TYPES:
        raise ValueError(f"softmax_type must be one of {inputs.SOFTMAX_TYPES}; got {softmax_type!r}")
    held = module.__dict__.get("softmax_type")
    if held is not None and softmax_type != held:
        raise ValueError(f"softmax_type is fixed when the module is built (it decides the softmax_offset sink "
                         f"logits): this one has {held!r}; build DotProductAttention(..., softmax_type="
                         f"{softmax_type!r}) instead")
    return softmax_type


def _checked_layer_number(module: nn.Module, layer_number: Any) -> int:
    """An int >= 0; set after construction, the module's layer is no longer TE's default one."""
    layer_number = integer_argument("layer_number", layer_number, 0)
    module.__dict__["_layer_number_defaulted"] = False   # (the constructor sets it after this)
    return layer_number


def _checked_attention_type(module: nn.Module, attention_type: Any) -> str:
    if attention_type not in ("self", "cross"):
        raise ValueError(f"attention_type must be 'self' or 'cross'; got {attention_type!r}")
    return attention_type


_ASSIGNMENT_CHECKS = {
    "backend": _checked_backend,
    "attention_dropout": _checked_dropout,
    "softmax_scale": _checked_softmax_scale,
    "softmax_type": _checked_softmax_type,
    "layer_number": _checked_layer_number,
    "attention_type": _checked_attention_type,
}
"""Attributes whose every assignment, the constructor's and later ones, is checked (and normalised) as the
constructor's argument of that name: name -> check(module, value) -> the value kept."""


_MODULE_CALL = nn.Module.__call__
"""nn.Module's own call, as imported (``torch.fx``'s tracer swaps it while it traces)."""


class DotProductAttention(nn.Module):
    """``softmax(scale * Q Kᵀ + bias + mask) V`` on the fastest backend that can run the call.

    Shapes: bshd ``[b, s, h, d]``, sbhd ``[s, b, h, d]``, thd ``[t, h, d]`` (sequences concatenated,
    described by ``cu_seqlens``). The output keeps the query's format with heads flattened:
    ``[b, s_q, h*d_v]``, ``[s_q, b, h*d_v]`` or ``[t_q, h*d_v]``; padded query rows are zero. A padding
    mask in bshd / sbhd is TE's bool ``[b, 1, 1, s]`` (True = padded, each row's real tokens first) or
    a (queries, keys) pair of them; given ``cu_seqlens_q`` / ``cu_seqlens_kv`` take precedence.

    Example::

        attn = DotProductAttention(num_attention_heads=32, kv_channels=128, num_gqa_groups=8,
                                   qkv_format="bshd", attn_mask_type="causal")
        out = attn(q, k, v)            # q [2, 1024, 32, 128], k/v [2, 1024, 8, 128] -> [2, 1024, 4096]
        print(attn.last_backend)       # "fused" on an H200, "unfused" on a CPU

    With ``return_max_logit=True`` the module returns ``(out, max_logit)``: ``max_logit`` is fp32 ``[h]``,
    the largest logit ``scale * Q Kᵀ + bias`` per head over the batch, the real query rows and the keys
    each row sees (masked positions, the window's and padded rows excluded; ALiBi's term counts as a bias, a
    softmax sink does not); only the ``unfused`` backend computes it.

    The constructor and ``forward`` take TransformerEngine's arguments in its order (positional calls bind as in
    TE); ``backend=`` (ours) is keyword-only. Parallelism runs one partition (``tp_size=1``, no context split),
    FP8 and ``score_mod`` are refused unless left at their defaults, and ``qkv_layer`` / ``kv_layer`` are unpacked
    into views (``attention/te_arguments.py``).

    Args (the constructor's; TE's meaning unless said):
        num_attention_heads: query heads ``h``.
        kv_channels: head dim ``d``, or ``(d_qk, d_v)`` for different K and V head dims (MLA).
        num_gqa_groups: key / value heads ``h_kv`` (default ``h``); must divide ``h`` (GQA, 1 = MQA).
        attention_dropout: dropout probability on the attention weights, in training mode only.
        qkv_format: ``"sbhd"`` (TE's default), ``"bshd"`` or ``"thd"``; ``forward(qkv_format=...)`` overrides it.
        attn_mask_type: ``"no_mask"``, ``"causal"`` (top-left diagonal), ``"causal_bottom_right"``,
            ``"padding"``, ``"padding_causal"``, ``"padding_causal_bottom_right"`` or ``"arbitrary"`` (a bool mask
            given to ``forward``, True = masked). Only the padding types and ``"arbitrary"`` read
            ``attention_mask``; thd needs a padding type.
        window_size: ``(left, right)`` sliding window, in tokens either side of the diagonal (-1 = unbounded);
            causal masks use ``(left, 0)``, and a module built with one keeps ``(left, 0)`` in calls that pass
            another mask type (as TE's constructor normalises it). None: no window.
        bottom_right_diagonal: the diagonal a window aligns to when q and kv lengths differ, for mask types
            without one of their own (``no_mask``, ``padding``, ``arbitrary``; default bottom-right). ``causal`` and
            ``padding_causal`` are top-left and the ``*_bottom_right`` types bottom-right, whatever it says.
        layer_number: which ``InferenceParams`` cache this module reads and appends to (default 1, TE's; a module
            left at the default is refused when such a module, itself or another, already appended in this step).
            Set later, it is checked as here.
        attention_type: ``"self"`` or ``"cross"`` (thd self-attention may leave out ``cu_seqlens_kv``).
        softmax_scale: default ``1 / sqrt(d_qk)``.
        softmax_type: ``"vanilla"``, ``"off-by-one"`` (a zero logit in every row's softmax) or ``"learnable"``
            (a learned per-head sink logit, the ``softmax_offset`` parameter).
        return_max_logit: also return the per-head maximum logit (below).
        backend: ours, keyword-only: a backend name, a family (``"flash"``) or a sequence of them, tried in order;
            the module never falls back past them. None: the automatic priority (``docs/selection.md``).
        sequence_parallel, tp_size, tp_group, get_rng_state_tracker, cp_group, cp_global_ranks, cp_stream,
            cp_comm_type, name: TE's parallelism arguments, for one partition (above).

    After each call ``last_backend`` names the backend that ran it (None before the first call).

    Raises ``ValueError`` for bad inputs (naming the argument) and when no backend can run the call
    ("No dot product attention backend is available ...", with every backend's reasons).
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int | tuple[int, int],
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker: Callable[[], Any] | None = None,
        tp_group: Any = None,
        layer_number: int | None = None,
        attention_type: str = "self",
        cp_group: Any = None,
        cp_global_ranks: list[int] | None = None,
        cp_stream: torch.cuda.Stream | None = None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
        name: str | None = None,
        *,
        backend: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        te_arguments.check_parallelism(sequence_parallel, tp_size, tp_group, cp_group, cp_comm_type)
        self.sequence_parallel, self.tp_size, self.tp_group = bool(sequence_parallel), int(tp_size), tp_group
        self.get_rng_state_tracker = get_rng_state_tracker
        self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = (
            cp_group, cp_global_ranks, cp_stream, cp_comm_type)
        self.name = name
        self.num_attention_heads = integer_argument("num_attention_heads", num_attention_heads, 1)
        self.num_gqa_groups = (self.num_attention_heads if num_gqa_groups is None
                               else integer_argument("num_gqa_groups", num_gqa_groups, 1))
        if self.num_attention_heads % self.num_gqa_groups:
            raise ValueError(
                f"num_gqa_groups must divide num_attention_heads={num_attention_heads}; got {num_gqa_groups}"
            )
        if isinstance(kv_channels, (tuple, list)) and len(kv_channels) == 2:
            self.head_dim_qk, self.head_dim_v = (integer_argument("kv_channels", d, 1) for d in kv_channels)
        elif isinstance(kv_channels, (tuple, list)):
            raise ValueError(f"kv_channels must be an int or a (d_qk, d_v) pair; got {kv_channels!r}")
        else:
            self.head_dim_qk = self.head_dim_v = integer_argument("kv_channels", kv_channels, 1)
        self.attention_dropout = attention_dropout   # (checked by _ASSIGNMENT_CHECKS, as every later assignment)
        self.qkv_format = check_format(qkv_format)
        self.attn_mask_type = normalize_mask_type(attn_mask_type)
        # normalised for the module's mask type, as TE's constructor does: a causal module's (2, 2) is (2, 0) in
        # calls that pass another mask type too (None stays None: each call's mask type gives its default)
        self.window_size = window_size if window_size is None else check_set_window_size(self.attn_mask_type,
                                                                                          window_size)
        # a numpy scalar or one-element tensor: its value
        (bottom_right_diagonal,) = inputs.host_scalars(bottom_right_diagonal)
        self.softmax_scale = softmax_scale
        self.layer_number = 1 if layer_number is None else layer_number   # (checked by _ASSIGNMENT_CHECKS)
        self._layer_number_defaulted = layer_number is None
        self.attention_type = attention_type   # (checked by _ASSIGNMENT_CHECKS)
        self.softmax_type = softmax_type
        if softmax_type == "learnable":
            self.softmax_offset = nn.Parameter(torch.zeros(self.num_attention_heads))
        elif softmax_type == "off-by-one":
            self.register_buffer("softmax_offset", torch.zeros(self.num_attention_heads), persistent=False)
        else:
            self.softmax_offset = None
        resolve_bottom_right(self.attn_mask_type, bottom_right_diagonal)   # checks its type
        self.bottom_right_diagonal = bottom_right_diagonal
        if return_max_logit not in (True, False) or not isinstance(return_max_logit, int):
            raise ValueError(f"return_max_logit must be True or False; got {return_max_logit!r}")
        self.return_max_logit = bool(return_max_logit)
        self.backend = backend
        self.deterministic = (
            not selection.env_flag("NVTE_ALLOW_NONDETERMINISTIC_ALGO") or torch.are_deterministic_algorithms_enabled()
        )
        self.last_backend: str | None = None
        self._call_plans = call_plans.CallPlans()   # call signature -> its checks and choices

    _planned_configuration: tuple | None = None   # planned_configuration()'s, until a planned attribute is set
    _window_size_arg: tuple[int, int] | None = None   # window_size as given; normalised per call for its mask type
    _layer_number_defaulted = False   # built without layer_number (TE's 1); a class default for older pickles

    @property
    def window_size(self) -> tuple[int, int]:
        """The sliding window of calls that pass none, normalised for the module's ``attn_mask_type`` (TE's
        ``check_set_window_size``: ``None`` is ``(-1, 0)`` for causal masks, ``(-1, -1)`` for the rest).
        Assigning it changes later calls, as in TE; each call re-normalises the value as given for its own
        mask type."""
        return check_set_window_size(self.attn_mask_type, self._window_size_arg, warn=False)

    @window_size.setter
    def window_size(self, window_size: tuple[int, int] | None) -> None:
        if "attn_mask_type" in self.__dict__:   # (a subclass may set it before __init__ has)
            check_set_window_size(self.attn_mask_type, window_size)   # checks it, or raises
        self._window_size_arg = window_size

    def __setattr__(self, name: str, value: Any) -> None:
        check = _ASSIGNMENT_CHECKS.get(name)
        if check is not None:   # in the constructor and after it: `attn.backend = "unfused"` is checked as backend=
            value = check(self, value)
        super().__setattr__(name, value)
        if name in _PLANNED_ATTRIBUTES:   # .train() / .eval() set training so too
            self.__dict__["_planned_configuration"] = None

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        # A TransformerEngine checkpoint carries the module's FP8 metadata as ``_extra_state``: nothing here reads
        # it, and strict loading would refuse the unexpected key.
        state_dict.pop(prefix + "_extra_state", None)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def planned_configuration(self) -> tuple:
        """The values of the module's attributes that the call plans' checks and choice read: a part of every
        call signature (``attention.call_plans``), kept until one of those attributes is set again."""
        configuration = self._planned_configuration
        if configuration is None:
            configuration = tuple(getattr(self, name) for name in sorted(_PLANNED_ATTRIBUTES))
            self.__dict__["_planned_configuration"] = configuration
        return configuration

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_attention_heads}, gqa_groups={self.num_gqa_groups}, "
            f"kv_channels=({self.head_dim_qk}, {self.head_dim_v}), qkv_format={self.qkv_format}, "
            f"attn_mask_type={self.attn_mask_type}, backend={self.backend}"
            + (", return_max_logit=True" if self.return_max_logit else "")
        )

    def _softmax_offset_fp32(self, kv_caching: bool) -> torch.Tensor | None:
        """The sink logits as backends take them: fp32 (a differentiable cast after ``module.half()``), detached in
        a KV-cache step (which has no backward pass)."""
        offset = self.softmax_offset
        if offset is None:
            return None
        if kv_caching and offset.requires_grad:
            offset = offset.detach()
        return offset if offset.dtype in (torch.float32, torch.float64) else offset.float()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module.__call__``, without its two argument-forwarding layers where they would only call ``forward``:
        no hook of this module or global one, no ``torch.jit.trace``, no ``torch.compile`` of this module, not inside
        a compiled graph (Dynamo sees the module's own call), ``nn.Module.__call__`` not swapped (``torch.fx``'s
        tracer does that). 0.6 µs of the eager thd decode call's 15.5 on this project's CPU."""
        if (torch.compiler.is_compiling() or self._compiled_call_impl is not None
                or nn.Module.__call__ is not _MODULE_CALL
                or self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks or self._backward_hooks
                or nn_module._global_forward_pre_hooks or nn_module._global_forward_hooks
                or nn_module._global_backward_pre_hooks or nn_module._global_backward_hooks
                or torch._C._get_tracing_state()):
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(
        self,
        query_layer: torch.Tensor | None = None,
        key_layer: torch.Tensor | None = None,
        value_layer: torch.Tensor | None = None,
        attention_mask: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        fast_zero_fill: bool = True,
        inference_params: Any = None,
        pad_between_seqs: bool | None = None,
        fp8_output: bool = False,
        bf16_backward: bool = False,
        num_splits: int = 1,
        score_mod: Any = None,
        score_mod_bprop: Any = None,
        score_mod_tensors: Any = None,
        score_mod_bprop_tensors: Any = None,
        qkv_layer: torch.Tensor | None = None,
        kv_layer: torch.Tensor | None = None,
        qkv_interleave_dim: int = -3,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run attention; see the class docstring for shapes. ``inference_params`` appends k/v to its
        cache for ``layer_number`` and attends over the whole cache (padding masks only), with the
        cache's cu_seqlens: given ``cu_seqlens_*`` are then not read (as in TE). The cache has no backward
        pass: such a call whose inputs require grad is refused (run generation under ``torch.no_grad()``).
        ``alibi_slopes`` are constants on every backend, as in TE: no gradient reaches them.

        TransformerEngine's knobs:

        - ``checkpoint_core_attention``: recompute attention in the backward pass instead of keeping
          its intermediates (``torch.utils.checkpoint``, non-reentrant, around the backend call; every
          backend). No effect when no gradient is needed.
        - ``fast_zero_fill``: accepted for compatibility and ignored; padded query rows of the output
          are always zero, on every backend.
        - ``num_splits``: split-KV count, a positive int. ``1`` (the default, as in TE) leaves the
          choice to the backend: the fused kernel keeps its own split heuristic (TE's 1 means "no
          split"; ours may still split) and flash-attn 3 its default. A value > 1 is passed on to the
          fused kernel (at most 64), flash-attn 3, or flash-attn-4 on sm100+; flash2, flash4 on sm90
          and unfused refuse it, as in TE.

        - ``qkv_layer`` / ``kv_layer``: TE's packed inputs, ``[..., 3, h, d]`` / ``[..., 2, h, d]``
          (``qkv_interleave_dim=-3``) or ``[..., h, 3, d]`` (-2), unpacked into views.
        - ``fp8_output``, ``bf16_backward``, ``score_mod*``: only their defaults (no FP8, no score_mod).

        Returns ``out``, or ``(out, max_logit)`` when the module was built with ``return_max_logit``.
        """
        if qkv_layer is not None or kv_layer is not None or query_layer is None:
            query_layer, key_layer, value_layer = te_arguments.unpack_packed_inputs(
                query_layer, key_layer, value_layer, qkv_layer, kv_layer, qkv_interleave_dim, inference_params,
                (self.num_attention_heads, self.num_gqa_groups))
        if fp8_output or bf16_backward or score_mod is not None or score_mod_bprop is not None \
                or score_mod_tensors is not None or score_mod_bprop_tensors is not None:
            te_arguments.refuse_unsupported_forward_arguments(
                fp8_output, bf16_backward, (score_mod, score_mod_bprop, score_mod_tensors, score_mod_bprop_tensors))
        compiling = torch.compiler.is_compiling()
        capturing = (not compiling and isinstance(query_layer, torch.Tensor) and query_layer.is_cuda
                     and torch.cuda.is_current_stream_capturing())
        cu_seqlens = (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
        signature = None if compiling else call_plans.call_signature(
            self, query_layer, key_layer, value_layer, cu_seqlens, core_attention_bias,
            (qkv_format, attn_mask_type, window_size, bottom_right_diagonal, core_attention_bias_type, max_seqlen_q,
             max_seqlen_kv, pad_between_seqs, num_splits, type(inference_params)),
            inference_params is not None, capturing,
        )
        plan = self._call_plans.lookup(signature)
        # positional: _prepare's parameters in order (keywords cost ~0.7 µs a call here)
        call, backend = self._prepare(
            query_layer, key_layer, value_layer, attention_mask, qkv_format, cu_seqlens_q, cu_seqlens_kv,
            cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv, attn_mask_type, window_size,
            core_attention_bias_type, core_attention_bias, alibi_slopes, inference_params, pad_between_seqs,
            bottom_right_diagonal, num_splits, False, plan, not (compiling or capturing),
        )
        self._call_plans.keep(signature, plan)
        if compiling:   # the choice is made at trace time, a constant of the graph
            backend = selection.select_compiled(call.params, self.backend)
            self.last_backend = backend.name
        else:
            if backend is None:
                backend = selection.select(call.params, self.backend)
            if self.last_backend != backend.name:   # skips nn.Module.__setattr__ (slow) on the hot path
                self.last_backend = backend.name
        # heads and head dim -> h * d_v (and (out, max_logit) with return_max_logit)
        if checkpoint_core_attention or call.dropout_p:
            return self._run_training(backend, call, checkpoint_core_attention)
        return backend.forward_flat(call)

    def _run_training(self, backend: Backend, call: AttentionCall, checkpoint_core_attention: bool) -> Any:
        """The backend call under TE's training knobs: recomputed in backward (``checkpoint_core_attention``),
        dropout in the ``get_rng_state_tracker``'s RNG stream (Megatron's model-parallel RNG)."""
        run = backend.forward_flat
        if checkpoint_core_attention and call.params.requires_grad:
            def run(call: AttentionCall) -> Any:
                return torch.utils.checkpoint.checkpoint(backend.forward_flat, call, use_reentrant=False)
        if self.get_rng_state_tracker is not None and call.dropout_p > 0:
            with self.get_rng_state_tracker().fork():
                return run(call)
        return run(call)

    def set_context_parallel_group(self, cp_group: Any, cp_global_ranks: list[int] | None = None,
                                   cp_stream: torch.cuda.Stream | None = None, cp_comm_type: str = "p2p") -> None:
        """TE's context-parallel setter: a group of one rank (or None) only; context parallelism is not
        implemented."""
        te_arguments.check_parallelism(False, 1, None, cp_group, cp_comm_type)
        self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = (
            cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def explain(self, query_layer: torch.Tensor | None = None, key_layer: torch.Tensor | None = None,
                value_layer: torch.Tensor | None = None, **kwargs: Any) -> str:
        """What ``forward`` with these arguments would choose and why, without running (the KV cache
        is not touched)."""
        unknown = sorted(set(kwargs) - set(inspect.signature(self.forward).parameters))
        if unknown:
            raise TypeError(f"explain() takes forward's arguments; got an unexpected keyword argument {unknown[0]!r}")
        kwargs.pop("checkpoint_core_attention", None)   # forward-only: no effect on the choice
        kwargs.pop("fast_zero_fill", None)
        te_arguments.refuse_unsupported_forward_arguments(
            kwargs.pop("fp8_output", False), kwargs.pop("bf16_backward", False),
            tuple(kwargs.pop(name, None) for name in ("score_mod", "score_mod_bprop", "score_mod_tensors",
                                                      "score_mod_bprop_tensors")))
        query_layer, key_layer, value_layer = te_arguments.unpack_packed_inputs(
            query_layer, key_layer, value_layer, kwargs.pop("qkv_layer", None), kwargs.pop("kv_layer", None),
            kwargs.pop("qkv_interleave_dim", -3), kwargs.get("inference_params"),
            (self.num_attention_heads, self.num_gqa_groups))
        check_stepped = getattr(kwargs.get("inference_params"), "check_stepped", None)
        if check_stepped is not None:   # forward refuses a cache without a step when it appends; explain appends none
            check_stepped()
        call, _ = self._prepare(query_layer, key_layer, value_layer, dry_run=True, **kwargs)
        return selection.explain_params(call.params, self.backend)

    def _prepare(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask: Any = None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        inference_params: Any = None,
        pad_between_seqs: bool | None = None,
        bottom_right_diagonal: bool | None = None,
        num_splits: int = 1,
        dry_run: bool = False,
        plan: call_plans.CallPlan | None = None,
        eager: bool | None = None,
    ) -> tuple[AttentionCall, Backend | None]:
        """The call's AttentionCall, and its backend when a plan (``attention.call_plans``) is given:
        the plan's checks and choices are reused, or made and recorded (None without a plan: the
        caller selects). ``eager``: the call is neither compiled nor captured (None: find out here)."""
        q, k, v = query_layer, key_layer, value_layer
        kv_caching = inference_params is not None
        if plan is not None and plan.checked:
            fmt, mask_type, window, bottom_right = plan.fmt, plan.mask_type, plan.window, plan.bottom_right
        else:
            if kv_caching and not hasattr(inference_params, "cu_seqlens_kv"):
                raise ValueError("inference_params must be an inference.InferenceParams (or None); got "
                                 f"{type(inference_params).__name__}")
            if type(num_splits) is not int or num_splits < 1:   # (a numpy integer is an int: attention.integers)
                integer_argument("num_splits", num_splits, 1)
            # a numpy scalar or one-element tensor (Megatron's max_seqlen_*) is its value; a plan made for a value
            # serves its equals (numpy scalars hash as their value, a tensor as itself)
            max_seqlen_q, max_seqlen_kv, pad_between_seqs, bottom_right_diagonal = inputs.host_scalars(
                max_seqlen_q, max_seqlen_kv, pad_between_seqs, bottom_right_diagonal)
            inputs.check_host_arguments(max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                                        pad_between_seqs=pad_between_seqs)
            fmt = check_format(qkv_format or self.qkv_format)
            if kv_caching and pad_between_seqs and fmt == "thd":   # (bshd / sbhd have no gaps: the flag is unread)
                raise ValueError("pad_between_seqs=True cannot be honoured with inference_params: a thd KV-cache step "
                                 "reads its query tokens back to back (cu_seqlens_*_padded are not read, as in TE); "
                                 "pack the step's tokens without gaps")
            inputs.check_qkv(q, k, v, fmt, self.num_attention_heads, self.num_gqa_groups, self.head_dim_qk,
                             self.head_dim_v)
            mask_type, window, bottom_right = call_setup.resolve_mask(
                attn_mask_type or self.attn_mask_type,
                window_size if window_size is not None else self._window_size_arg,
                bottom_right_diagonal if bottom_right_diagonal is not None else self.bottom_right_diagonal,
                kv_caching,
            )
            if not kv_caching:   # a cache step replaces them (call_setup.kv_cache_step)
                for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv),
                                 ("cu_seqlens_q_padded", cu_seqlens_q_padded),
                                 ("cu_seqlens_kv_padded", cu_seqlens_kv_padded)):
                    inputs.check_cu_seqlens(name, cu, q.device)
            if plan is not None:
                plan.fmt, plan.mask_type, plan.window, plan.bottom_right = fmt, mask_type, window, bottom_right
        if attention_mask is not None and eager is not False and not dry_run:
            call_setup.warn_unread_mask(mask_type, fmt, kv_caching, call_setup.cu_seqlens_replace_mask(
                q, k, fmt, attention_mask, self.attention_type == "self", cu_seqlens_q, cu_seqlens_kv))
        if (cu_seqlens_q is not None or cu_seqlens_kv is not None) and fmt != "thd" and not kv_caching \
                and not has_padding(mask_type) and eager is not False and not dry_run:
            call_setup.warn_unread_cu_seqlens(mask_type)
        if kv_caching and (cu_seqlens_q_padded is not None or cu_seqlens_kv_padded is not None) \
                and eager is not False and not dry_run:
            call_setup.warn_unread_padded_offsets()
        if fmt != "thd" and not kv_caching and (cu_seqlens_q_padded is not None or cu_seqlens_kv_padded is not None
                                                or pad_between_seqs) and eager is not False and not dry_run:
            call_setup.warn_unread_thd_layout(fmt)
        device = q.device
        self_attention = self.attention_type == "self"
        if kv_caching and eager is None:
            eager = call_setup.eager_call(device)

        # the cu_seqlens' and padding masks' values read (attention.seqlens_check); a cache step builds its own
        check_values = not kv_caching and eager is not False and seqlens_check.values_checked(device)
        if fmt == "thd":
            (batch, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv,
             pad_between_seqs) = call_setup.thd_seqlens(
                mask_type, self_attention, kv_caching, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv, pad_between_seqs, q.shape[0], k.shape[0],
                check_values,
            )
        else:
            batch, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv = call_setup.bshd_seqlens(
                q, k, device, fmt, mask_type, attention_mask, self_attention, kv_caching, cu_seqlens_q, cu_seqlens_kv,
                check_values,
            )
            cu_seqlens_q_padded = cu_seqlens_kv_padded = None
            pad_between_seqs = False

        kv_cache, page_size, page_table, kv_format = "none", None, None, fmt
        if kv_caching:   # the step's lengths; its k/v are appended once every check has passed (below)
            batch, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv = call_setup.kv_cache_step(
                inference_params, q, fmt, batch, max_seqlen_q, eager,
            )
            kv_cache, page_size, page_table, kv_format = call_setup.cache_layout(inference_params)
            cu_seqlens_q_padded = cu_seqlens_kv_padded = None
            pad_between_seqs = False

        if core_attention_bias_type == "no_bias" and core_attention_bias is None and alibi_slopes is None:
            bias_shape = None   # nothing to check (check_bias would return (None, None))
        else:
            if kv_caching and fmt == "thd":
                alibi_slopes = call_setup.step_slopes(alibi_slopes, inference_params.batch_size, batch)
            if kv_caching and core_attention_bias is not None and core_attention_bias.requires_grad:
                core_attention_bias = core_attention_bias.detach()   # a cache step trains nothing (as the sink)
            bias_shape, alibi_slopes = call_setup.check_bias(
                self, core_attention_bias_type, core_attention_bias, alibi_slopes, batch, max_seqlen_q, max_seqlen_kv,
                device,
            )
        if mask_type == "arbitrary":
            attention_mask = call_setup.arbitrary_mask(
                attention_mask, batch, self.num_attention_heads, max_seqlen_q, max_seqlen_kv, device,
            )
        dropout_p = self.attention_dropout if self.training else 0.0
        backend = None
        choice = launches = None
        if plan is not None:
            key = call_plans.choice_key(batch, max_seqlen_q, max_seqlen_kv, kv_format, kv_cache, page_size,
                                        pad_between_seqs, bias_shape, alibi_slopes)
            choice = plan.choices.get(key)
        if choice is not None:
            params, backend, launches = choice
        else:
            params = call_setup.attention_params(
                self, q, k, v, device, fmt, kv_format, batch, max_seqlen_q, max_seqlen_kv, mask_type, window,
                bottom_right, core_attention_bias_type, core_attention_bias, bias_shape, alibi_slopes, dropout_p,
                pad_between_seqs, kv_cache, page_size, num_splits,
            )
            if kv_caching and params.requires_grad:   # before the append: the cache would join autograd's graph
                call_setup.refuse_differentiable_step(q, k, v)
            if plan is not None:
                backend = selection.select(params, self.backend)
                launches = plan.remember(key, params, backend)
        if kv_caching and not dry_run:   # checked and chosen: nothing is written for a call that is refused
            default_layer = self._layer_number_defaulted and self.layer_number == 1 and eager
            if default_layer:
                call_setup.check_default_layer_append(inference_params)
            k, v = call_setup.append_step(inference_params, self.layer_number, k, v, fmt)   # the layer's caches
            if default_layer:
                call_setup.record_default_layer_append(inference_params)
        # positional, in AttentionCall's field order (keywords cost ~0.7 µs a call)
        call = AttentionCall(
            params, q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
            int(max_seqlen_q), int(max_seqlen_kv), self.softmax_scale, dropout_p,
            attention_mask if mask_type == "arbitrary" else None,
            core_attention_bias, alibi_slopes, self._softmax_offset_fp32(kv_caching), page_table, inference_params,
            self.layer_number,
            # the step's query rows (host), in eager calls (eager is a bool for a cache step by now)
            getattr(inference_params, "step_tokens" if fmt == "thd" else "batch_size", None)
            if kv_caching and eager else None,
            eager, launches,
        )
        return call, backend


def explain(module: DotProductAttention, query_layer: torch.Tensor, key_layer: torch.Tensor,
            value_layer: torch.Tensor, **forward_kwargs: Any) -> str:
    """``module.explain(...)``: the backend ``module(query_layer, ...)`` would run and every reason."""
    return module.explain(query_layer, key_layer, value_layer, **forward_kwargs)
