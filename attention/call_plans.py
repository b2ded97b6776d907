"""Call plans: the checks and the backend choice of ``DotProductAttention``, once per call signature.

Most of what ``DotProductAttention._prepare`` does reads no tensor contents: the shape, dtype and
device checks of q/k/v and the cu_seqlens, the mask and window resolution, the ``AttentionParams``
and the backend selection. A serving loop calls a layer with the same signature step after step,
so the module keeps, per signature, what those steps decided (a ``CallPlan``) and skips them on
the next call with that signature. The steps that carry data (sequence lengths, the KV-cache
append, bias and mask checks) run on every call.

A signature holds everything the skipped steps read: the module's configuration and mode
(``DotProductAttention.planned_configuration``), the tensors' sizes, dtypes and devices (with a KV cache
not the given cu_seqlens, which the step replaces), the host arguments, whether autograd will need a
backward, whether a CUDA graph is being captured, the ``NVTE_*`` switches, ``use_backends()`` and how often
``clear_cache()`` ran. Within a plan each combination of the values the data-carrying steps
produce (batch size, sequence lengths, cache layout, bias shape) gets its own ``AttentionParams``
and backend, and a dict the backend may keep its launches in (``AttentionCall.launches``: the fused
backend's kernel plans, ``attention.backends.fused_launches``).

Example (what a repeated call reuses)::

    attn = DotProductAttention(32, 128, num_gqa_groups=8, qkv_format="bshd", attn_mask_type="padding_causal")
    for _ in range(steps):
        out = attn(q, k, v, inference_params=params)   # planned on the first call, reused after
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from attention import call_setup, selection
from attention.backends.base import Backend
from attention.environment import token_reader
from attention.params import AttentionParams

if TYPE_CHECKING:
    from attention.dot_product_attention import DotProductAttention

__all__ = ["MAX_CHOICES", "MAX_PLANS", "CallPlan", "CallPlans", "call_signature", "choice_key"]

MAX_PLANS = 64
"""Plans a module keeps (all dropped when full)."""
MAX_CHOICES = 64
"""(params, backend, launches) choices a plan keeps (all dropped when full): a thd cache step makes one per
distinct max_seqlen_q."""


@dataclass
class CallPlan:
    """What the checks of one call signature resolved, and the choices made under it.

    fmt / mask_type / window / bottom_right: the call's resolved format and mask (None until the
    first call with this signature passed its checks). choices: ``choice_key(...)`` -> the call's
    ``AttentionParams``, the backend selected for them and that backend's launches under them.
    kept: ``CallPlans`` holds it (a repeat call need not hash its signature a second time to find that out).
    """

    kept: bool = False
    fmt: str | None = None
    mask_type: str | None = None
    window: tuple[int, int] | None = None
    bottom_right: bool | None = None
    choices: dict[tuple, tuple[AttentionParams, Backend, dict]] = field(default_factory=dict)

    @property
    def checked(self) -> bool:
        return self.fmt is not None

    def remember(self, key: tuple, params: AttentionParams, backend: Backend) -> dict:
        """Record a choice; returns its (empty) dict of the backend's launches."""
        if len(self.choices) >= MAX_CHOICES:
            self.choices.clear()
        launches: dict = {}
        self.choices[key] = (params, backend, launches)
        return launches


class CallPlans:
    """A module's plans by call signature (all dropped when ``MAX_PLANS`` are kept)."""

    def __init__(self) -> None:
        self._plans: dict[tuple, CallPlan] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def __getstate__(self) -> dict:
        """A copy or a pickle (``copy.deepcopy`` / ``torch.save`` of the module) starts with no plans: the kept
        ones hold compiled kernels, their locks and TMA descriptors, which neither copy nor pickle."""
        return {"_plans": {}}

    def lookup(self, signature: tuple | None) -> CallPlan | None:
        """The signature's plan, a new (unchecked) one if it has none yet; None without a signature or
        for one that is not hashable (a list among the host arguments, say: such calls take the full
        path, whose checks say what is wrong)."""
        if signature is None:
            return None
        try:
            return self._plans.get(signature) or CallPlan()
        except TypeError:
            return None

    def keep(self, signature: tuple | None, plan: CallPlan | None) -> None:
        """Keep a new plan once its call went through (a failed call leaves no plan behind)."""
        if plan is None or plan.kept:
            return
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[signature] = plan
        plan.kept = True


_env_tokens = token_reader(*selection._ENV_NAMES)
"""The ``NVTE_*`` switches selection reads (``selection.env_snapshot``), as key tokens (~0.25 µs cheaper)."""


def _tensor(x: Any) -> tuple | None:
    """A tensor's part of a signature: sizes, dtype, device (None for None). Raises TypeError for
    anything else (``call_signature`` answers None then)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError
    return x.shape, x.dtype, x.device


def call_signature(
    module: DotProductAttention,
    q: Any, k: Any, v: Any,
    cu_seqlens: tuple[Any, Any, Any, Any],
    core_attention_bias: Any,
    host_arguments: tuple,
    kv_caching: bool,
    capturing: bool,
) -> tuple | None:
    """The signature of a call (a dict key; ``CallPlans.lookup`` refuses an unhashable one), or None
    when a tensor argument is not a tensor: such calls take the full path, whose checks say what is
    wrong.

    ``host_arguments``: forward's non-tensor arguments that ``_prepare``'s checks and the choice read
    (qkv_format, attn_mask_type, window_size, bottom_right_diagonal, core_attention_bias_type,
    max_seqlen_q, max_seqlen_kv, pad_between_seqs, num_splits, and the type of inference_params: a plan made
    for an InferenceParams must not serve a dict, whose check a repeated call would skip). Values are keyed as
    values, so a plan made for 1 serves an equal ``True`` or ``1.0`` as 1 (keying their types too cost ~0.5 µs a
    call, 4 % of the module's host time). ``capturing``: a CUDA graph is being captured on
    the current stream.
    """
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return None
    if kv_caching:   # the cache step replaces the cu_seqlens: given ones are not read
        cu_seqlens = (None, None, None, None)
    cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded = cu_seqlens
    if (cu_seqlens_q is None and cu_seqlens_kv is None and cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None
            and core_attention_bias is None):
        others = None
    else:
        try:
            others = (*map(_tensor, cu_seqlens), _tensor(core_attention_bias))
        except TypeError:
            return None
    return (
        q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, v.shape, v.dtype, v.device, others,
        host_arguments, kv_caching, module._planned_configuration or module.planned_configuration(),
        call_setup.requires_grad(module, q, k, v, core_attention_bias, kv_caching),
        capturing,
        _env_tokens(), selection.context_backends(), selection.cache_generation(),
    )


def choice_key(batch: int, max_seqlen_q: int, max_seqlen_kv: int, kv_format: str, kv_cache: str,
               page_size: int | None, pad_between_seqs: bool, bias_shape: str | None,
               alibi_slopes: torch.Tensor | None) -> tuple:
    """The values of a call that ``AttentionParams`` takes from its data-carrying steps (the rest of
    it is fixed by the signature)."""
    return (batch, max_seqlen_q, max_seqlen_kv, kv_format, kv_cache, page_size, bool(pad_between_seqs), bias_shape,
            None if alibi_slopes is None else alibi_slopes.shape)
