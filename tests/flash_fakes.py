"""Fake flash-attn packages for CPU tests: each generation's Python signatures and argument checks,
computing flash semantics (bottom-right alignment, varlen, block/page tables) with the fp32 reference.

Used by tests/test_flash_backend.py (adapter plumbing) and tests/test_serving_simulation.py (a whole
serving run through each generation). Rows the real kernels would not write come back NaN, so the
adapters must zero them themselves. The differentiable functions behave as flash-attn's
``torch.autograd.Function``s do: the output is saved for the backward pass (flash-attn 2 returns a view of
it), so an adapter that writes into it in place fails autograd's checks here as it would on a GPU.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace
from types import SimpleNamespace

import torch

from attention.backends import flash_probe
from tests.reference import reference_one_sequence


def _attend(q, k, v, scale, causal, window, slopes, sink=None):
    return reference_one_sequence(q.float(), k.float(), v.float(), softmax_scale=scale, causal=causal,
                                  window_size=tuple(window), bottom_right=True, alibi_slopes=slopes,
                                  softmax_offset=sink).to(q.dtype)


def _slopes(alibi, i):
    return None if alibi is None else (alibi if alibi.dim() == 1 else alibi[i])


def _paged_rows(cache, table_row, length):
    return cache[table_row.long()].flatten(0, 1)[:length]


class _SavesOutput(torch.autograd.Function):
    """The fake's math under autograd, wrapped as flash-attn wraps its kernels: ``out`` saved for backward, and
    the gradients of rows no sequence owns left as garbage (NaN here): the real backward passes allocate dq / dk /
    dv with ``empty_like`` and write only the sequences' rows."""

    @staticmethod
    def forward(ctx, call, view, owned, *tensors):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            out = call(*leaves)
        ctx.graph = (leaves, out, owned)
        saved = out.detach().clone()
        ctx.save_for_backward(saved)
        return saved[..., : saved.shape[-1]] if view else saved   # flash-attn 2: out_padded[..., :head_size_og]

    @staticmethod
    def backward(ctx, grad_out):
        ctx.saved_tensors   # autograd's version check: fails when the output was written in place
        leaves, out, owned = ctx.graph
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
        result = []
        for index, leaf in enumerate(leaves):
            grad = next(grads) if leaf.requires_grad else None
            if grad is not None and index < 3 and owned[index] is not None:
                grad = grad.masked_fill(~owned[index][:, None, None], float("nan"))
            result.append(grad)
        return (None, None, None, *result)


def _owned_rows(rows: int, cu_seqlens, seqused) -> torch.Tensor:
    """bool ``[rows]``: the packed rows some sequence owns (starts from ``cu_seqlens``, lengths from ``seqused``
    when given, else from ``cu_seqlens``' differences)."""
    owned = torch.zeros(rows, dtype=torch.bool)
    starts = cu_seqlens.tolist()
    for i in range(len(starts) - 1):
        length = int(seqused[i]) if seqused is not None else starts[i + 1] - starts[i]
        owned[starts[i] : starts[i] + length] = True
    return owned.to(cu_seqlens.device)


def _saves_output(view: bool = False):
    """Route a fake's ``(self, q, k, v, ...)`` through :class:`_SavesOutput` (tensor arguments that require grad,
    a learnable sink, get their gradients too); ``view``: return a view of the saved output. The result keeps the
    fake's structure (``out``, or a tuple that starts with it)."""
    def decorate(method):
        signature = inspect.signature(method)

        @functools.wraps(method)
        def wrapper(self, q, k, v, *args, **kwargs):
            named = signature.bind(self, q, k, v, *args, **kwargs).arguments
            graded = [name for name, x in named.items()
                      if name not in ("q", "k", "v") and isinstance(x, torch.Tensor) and x.requires_grad]
            owned = [None, None, None]
            if named.get("cu_seqlens_q") is not None:   # varlen: packed q; k / v too unless paged or batched
                owned[0] = _owned_rows(q.shape[0], named["cu_seqlens_q"], named.get("seqused_q"))
                if named.get("cu_seqlens_k") is not None and k.dim() == 3:
                    owned[1] = owned[2] = _owned_rows(k.shape[0], named["cu_seqlens_k"], named.get("seqused_k"))
            rest = []

            def call(q, k, v, *values):
                arguments = {**named, "q": q, "k": k, "v": v, **dict(zip(graded, values))}
                result = method(**arguments)
                if isinstance(result, tuple):
                    rest.append(result[1:])
                    return result[0]
                return result

            out = _SavesOutput.apply(call, view, owned, q, k, v, *(named[name] for name in graded))
            return (out, *rest[0]) if rest else out
        return wrapper
    return decorate


class FakeFlash2:
    """flash-attn 2.8.3.post2's Python signatures and the argument checks of its ``flash_api.cpp``
    (``mha_fwd`` / ``mha_varlen_fwd``): int32 contiguous ``cu_seqlens`` of exactly ``batch + 1``,
    ``block_table`` int32 ``[batch, n]`` with a contiguous last dim and pages of a multiple of 256,
    ALiBi fp32 ``[h]`` or exactly ``[batch, h]``, ``d_qk == d_v <= 256``, the ``max_seqlen_q == 1``
    GQA swap (which reshapes q to ``[batch, ...]``). Returns ``out`` (a tuple only with
    ``return_attn_probs``)."""

    @staticmethod
    def _check_common(q, k, v, alibi_slopes, batch, window_size):
        for x in (q, k, v):
            assert x.stride(-1) == 1, "Input tensor must have contiguous last dimension"
        assert q.shape[-1] == k.shape[-1] == v.shape[-1], "flash-attn 2 needs one head dim (CHECK_SHAPE)"
        assert q.shape[-1] + (-q.shape[-1]) % 8 <= 256, \
            "FlashAttention forward only supports head dimension at most 256"
        assert q.shape[-2] % k.shape[-2] == 0, "Number of heads in key/value must divide number of heads in query"
        assert isinstance(window_size, (tuple, list)) and len(window_size) == 2
        assert all(isinstance(x, int) for x in window_size), "window_size holds ints (-1 = unbounded)"
        if alibi_slopes is not None:
            assert alibi_slopes.dtype == torch.float32, "ALiBi slopes must have dtype fp32"
            assert alibi_slopes.stride(-1) == 1
            h = q.shape[-2]
            assert tuple(alibi_slopes.shape) in ((h,), (batch, h)), "alibi_slopes must be [h] or [batch, h]"

    @_saves_output(view=True)
    def flash_attn_func(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
        batch = q.shape[0]
        self._check_common(q, k, v, alibi_slopes, batch, window_size)
        assert k.shape[0] == v.shape[0] == batch and k.shape[1] == v.shape[1]
        out = torch.stack([_attend(q[i], k[i], v[i], softmax_scale, causal, window_size, _slopes(alibi_slopes, i))
                           for i in range(batch)])
        return (out, None, None) if return_attn_probs else out

    @_saves_output(view=True)
    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        batch = cu_seqlens_q.numel() - 1
        self._check_common(q, k, v, alibi_slopes, batch, window_size)
        for cu in (cu_seqlens_q, cu_seqlens_k):
            assert cu.dtype == torch.int32, "cu_seqlens must have dtype int32"
            assert cu.is_contiguous()
            assert tuple(cu.shape) == (batch + 1,), "CHECK_SHAPE(cu_seqlens, batch_size + 1)"
        if block_table is not None:
            assert block_table.dtype == torch.int32, "block_table must have dtype torch.int32"
            assert block_table.stride(-1) == 1, "block_table must have contiguous last dimension"
            assert k.dim() == 4 and k.shape[1] % 256 == 0, "Paged KV cache block size must be divisible by 256"
            assert block_table.dim() == 2 and block_table.shape[0] == batch, "CHECK_SHAPE(block_table, batch, n)"
        else:
            assert k.dim() == 3
        left, right = window_size
        if max_seqlen_q == 1 and alibi_slopes is None:
            causal = False
        if causal:
            right = 0
        if (max_seqlen_q == 1 and q.shape[1] > k.shape[-2] and left < 0 and right < 0 and dropout_p == 0.0
                and alibi_slopes is None):
            # seqlenq_ngroups_swapped: q.reshape({batch_size, num_heads_k, ngroups, head_size}) needs total_q == batch
            assert q.shape[0] == batch, "seqlen_q/ngroups swap reshapes q to [batch, ...]: total_q must equal batch"
        out = torch.full(q.shape[:2] + (v.shape[-1],), float("nan"), dtype=q.dtype)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(batch):
            n = ck[i + 1] - ck[i]
            if block_table is not None:
                kk, vv = _paged_rows(k, block_table[i], n), _paged_rows(v, block_table[i], n)
            else:
                kk, vv = k[ck[i] : ck[i + 1]], v[ck[i] : ck[i + 1]]
            if cq[i + 1] > cq[i]:
                out[cq[i] : cq[i + 1]] = _attend(q[cq[i] : cq[i + 1]], kk, vv, softmax_scale, causal, window_size,
                                                 _slopes(alibi_slopes, i))
        return (out, None, None) if return_attn_probs else out


class FakeFlash3:
    """flash-attn 3 (``hopper/flash_attn_interface.py`` as shipped with flash-attn 2.8.3.post2): its signatures,
    ``num_splits`` included, int32 contiguous ``cu_seqlens`` / ``seqused`` of one batch. ``flash_attn_func``
    returns ``(out, None)`` as older hopper builds do (the adapter takes either)."""

    @_saves_output()
    def flash_attn_func(self, q, k, v, softmax_scale=None, causal=False, qv=None, window_size=(-1, -1),
                        deterministic=False, num_splits=1):
        out = torch.stack([_attend(q[i], k[i], v[i], softmax_scale, causal, window_size, None)
                           for i in range(q.shape[0])])
        return out, None   # older hopper builds return (out, lse)

    @_saves_output()
    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                               seqused_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                               deterministic=False, num_splits=1):
        batch = cu_seqlens_q.numel() - 1
        for t in (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
            if t is not None:
                assert t.dtype == torch.int32 and t.is_contiguous(), "cu_seqlens / seqused must be int32, contiguous"
        assert tuple(cu_seqlens_k.shape) == (batch + 1,), "batch_size == batch_size_k"
        assert num_splits >= 0
        out = torch.full(q.shape[:2] + (v.shape[-1],), float("nan"), dtype=q.dtype)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(len(cq) - 1):
            nq = int(seqused_q[i]) if seqused_q is not None else cq[i + 1] - cq[i]
            nk = int(seqused_k[i]) if seqused_k is not None else ck[i + 1] - ck[i]
            if nq:
                out[cq[i] : cq[i] + nq] = _attend(q[cq[i] : cq[i] + nq], k[ck[i] : ck[i] + nk],
                                                  v[ck[i] : ck[i] + nk], softmax_scale, causal, window_size, None)
        return out

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, qv=None, cache_seqlens=None,
                                page_table=None, cu_seqlens_q=None, max_seqlen_q=None, softmax_scale=None,
                                causal=False, window_size=(-1, -1), num_splits=0, return_softmax_lse=False):
        batch = cu_seqlens_q.numel() - 1
        assert (page_table.shape[0] if page_table is not None else k_cache.shape[0]) == batch
        out = torch.full(q.shape[:2] + (v_cache.shape[-1],), float("nan"), dtype=q.dtype)
        cq = cu_seqlens_q.tolist()
        for i in range(batch):
            n = int(cache_seqlens[i])
            if page_table is not None:
                kk, vv = _paged_rows(k_cache, page_table[i], n), _paged_rows(v_cache, page_table[i], n)
            else:
                kk, vv = k_cache[i, :n], v_cache[i, :n]
            if cq[i + 1] > cq[i]:
                out[cq[i] : cq[i + 1]] = _attend(q[cq[i] : cq[i + 1]], kk, vv, softmax_scale, causal, window_size, None)
        return out


_V4_PAGED_IRREGULAR = "Paged KV does not support irregular head dim"


def _fake_tile_size_fwd_sm90(head_dim, head_dim_v, is_causal, is_local, sparse_block_size_q=None):
    """flash-attn-4 4.0.0b36's sm90 forward tile (m, n): what decides TMA (page == n) vs cp.async pages."""
    if head_dim <= 64:
        n = 128
    elif head_dim <= 96:
        n = 128 if (is_causal or is_local) else 144
    elif head_dim <= 128:
        n = 128
    elif head_dim <= 192:
        n = 96 if is_local else (128 if head_dim_v <= 128 else 112)
    else:
        n = 64 if is_local else 80
    return SimpleNamespace(m_block_size=128, n_block_size=n)


def _fake_validate_head_dims(head_dim, head_dim_v, compute_capability, alignment):
    """4.0.0b36's ``_validate_head_dims`` (compute_capability is the major)."""
    aligned = head_dim % alignment == 0 and head_dim_v % alignment == 0
    if compute_capability == 9:
        assert 8 <= head_dim <= 256 and 8 <= head_dim_v <= 256 and aligned, (
            f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM90.")
    elif compute_capability in (10, 11):
        ok = ((8 <= head_dim <= 128 and 8 <= head_dim_v <= 128) or (head_dim, head_dim_v) in ((192, 128), (256, 256))
              or ((head_dim == 64 or head_dim == head_dim_v) and head_dim_v == 512))
        assert ok and aligned, f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM100/SM110."


class FakeFlash4:
    """flash-attn-4 4.0.0b36 (``flash_attn.cute.interface``) as the sm90 build sees it: its public
    signatures, ``(out, lse)`` returns and the checks of ``_flash_attn_fwd``: ``page_table`` int32
    ``[batch, n]``, contiguous, never with ``cu_seqlens_k``; batched K ``[batch, s_k, h_kv, d]`` when
    neither is given; int32 contiguous ``cu_seqlens_*`` ``[batch + 1]`` / ``seqused_*`` ``[batch]``;
    ``learnable_sink`` ``[h]``; window bounds ``None`` (not -1) for unbounded; no split-KV on sm90;
    pages other than the KV tile only for head dims that are multiples of 16."""

    _validate_head_dims = staticmethod(_fake_validate_head_dims)
    _tile_size_fwd_sm90 = staticmethod(_fake_tile_size_fwd_sm90)

    class FlashAttentionForwardSm90:
        def __init__(self, head_dim, head_dim_v, paged_kv_non_tma=False):
            assert not paged_kv_non_tma or (head_dim % 16 == 0 and head_dim_v % 16 == 0), (
                "Paged KV does not support irregular head dim")

    class FlashAttentionBackwardSm90:
        def __init__(self, dtype, head_dim, head_dim_v, qhead_per_kvhead, causal, is_local=False,
                     deterministic=False):
            pass

    @staticmethod
    def _flash_attn_bwd(q, k, v, learnable_sink=None):
        assert learnable_sink is None, "SM100 backward with head_dim=256 does not support learnable_sink"

    @staticmethod
    def _window(causal, window_size):
        """``_resolve_causal_local_window``: -> the reference's (left, right) with -1 unbounded."""
        left, right = window_size
        for bound in (left, right):
            assert bound is None or isinstance(bound, int)
        if left is not None and right is not None and left < 0 and right < 0:
            left = right = None
        assert (left is None or left >= 0) and (right is None or right >= 0), (
            f"window_size {window_size}: flash-attn-4 spells an unbounded side None; -1 next to a real bound "
            "would be taken as a local window with a negative bound")
        if causal:
            right = 0
        return (-1 if left is None else left, -1 if right is None else right)

    def _check(self, q, k, v, batch, learnable_sink, num_splits, page_size=None, causal=False, window=(-1, -1)):
        num_head, head_dim = q.shape[-2:]
        assert num_head % v.shape[-2] == 0, "num_head must be divisible by num_head_kv"
        _fake_validate_head_dims(head_dim, v.shape[-1], 9, 8)
        assert num_splits == 1, "SplitKV not supported on SM 9.0"
        if learnable_sink is not None:
            assert tuple(learnable_sink.shape) == (num_head,)
            assert learnable_sink.dtype in (torch.float16, torch.bfloat16, torch.float32)
        if page_size is not None:
            local = window != (-1, -1) and not (window[0] < 0 and window[1] == 0)
            tile_n = _fake_tile_size_fwd_sm90(head_dim, v.shape[-1], causal and not local, local).n_block_size
            self.FlashAttentionForwardSm90(head_dim, v.shape[-1], paged_kv_non_tma=page_size != tile_n)

    @_saves_output()
    def flash_attn_func(self, q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                        window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                        deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                        aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False,
                        gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
        window = self._window(causal, window_size)
        batch = q.shape[0]
        self._check(q, k, v, batch, learnable_sink, num_splits)
        assert k.shape[:3] == v.shape[:3] and k.shape[0] == batch
        out = torch.stack([_attend(q[i], k[i], v[i], softmax_scale, False, window, None, learnable_sink)
                           for i in range(batch)])
        return out, None

    @_saves_output()
    def flash_attn_varlen_func(self, q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                               gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
                               pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                               block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                               scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
                               gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
        assert cu_seqlens_q is not None, "the adapter always passes a thd query"
        window = self._window(causal, window_size)
        batch = cu_seqlens_q.shape[0] - 1
        for t in (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
            if t is not None:
                assert t.dtype == torch.int32, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be int32"
                assert t.stride(0) == 1, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be contiguous"
        assert tuple(cu_seqlens_q.shape) == (batch + 1,), "cu_seqlens_q must have shape (batch_size + 1,)"
        assert seqused_q is None or tuple(seqused_q.shape) == (batch,), "seqused_q must have shape (batch_size,)"
        assert seqused_k is None or tuple(seqused_k.shape) == (batch,), "seqused_k must have shape (batch_size,)"
        page_size = None
        if page_table is not None:
            assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
            assert page_table.dtype == torch.int32, "page_table must be int32"
            assert page_table.stride(-1) == 1, "page_table must be contiguous in the last dimension"
            assert page_table.dim() == 2 and page_table.shape[0] == batch
            assert k.dim() == 4 and k.shape[:3] == v.shape[:3]
            page_size = v.shape[1]
        elif cu_seqlens_k is None:
            assert k.dim() == 4 and k.shape[0] == batch and k.shape[:3] == v.shape[:3], (
                "batched K must be [batch, seqlen_k, h_kv, d]")
        else:
            assert k.dim() == 3 and tuple(cu_seqlens_k.shape) == (batch + 1,)
        self._check(q, k, v, batch, learnable_sink, num_splits, page_size, causal, window)
        out = torch.full(q.shape[:2] + (v.shape[-1],), float("nan"), dtype=q.dtype)
        cq = cu_seqlens_q.tolist()
        for i in range(batch):
            nq = int(seqused_q[i]) if seqused_q is not None else cq[i + 1] - cq[i]
            if page_table is not None:
                n = int(seqused_k[i])
                kk, vv = _paged_rows(k, page_table[i], n), _paged_rows(v, page_table[i], n)
            elif cu_seqlens_k is not None:
                start = int(cu_seqlens_k[i])
                n = int(seqused_k[i]) if seqused_k is not None else int(cu_seqlens_k[i + 1]) - start
                kk, vv = k[start : start + n], v[start : start + n]
            else:
                n = int(seqused_k[i]) if seqused_k is not None else k.shape[1]
                kk, vv = k[i, :n], v[i, :n]
            if nq:
                out[cq[i] : cq[i] + nq] = _attend(q[cq[i] : cq[i] + nq], kk, vv, softmax_scale, False, window, None,
                                                  learnable_sink)
        return out, None


FAKES = {2: FakeFlash2, 3: FakeFlash3, 4: FakeFlash4}


def install_fake(monkeypatch, generation: int, version: str = "9.9.9", module=None) -> flash_probe.FlashPackage:
    """Make the probe report ``generation`` installed as a fake package (or ``module``)."""
    package = flash_probe.FlashPackage(generation, module=module if module is not None else FAKES[generation](),
                                       version=flash_probe.parse_version(version), version_text=version)
    original = flash_probe.probe
    monkeypatch.setattr(flash_probe, "probe", lambda g: package if g == generation else original(g))
    return package


def run_fake_on_cpu(monkeypatch, generation: int, module=None) -> None:
    """Install ``generation``'s fake (or ``module``) and widen its backend's sheet to CPU tensors (the fakes compute on
    any device), so ``DotProductAttention(backend="flash<generation>")`` runs the adapter on CPU."""
    from attention import selection

    install_fake(monkeypatch, generation, module=module)
    monkeypatch.setattr(flash_probe, "cuda_available", lambda: True)
    flash_class = type(selection.registry()[f"flash{generation}"])
    widened = replace(flash_class.capabilities, device_types=frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(flash_class, "capabilities", widened)
    selection.clear_cache()
