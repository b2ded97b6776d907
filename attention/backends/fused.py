"""The fused backend: our Triton kernels (``attention.kernels``), forward only.

One kernel launch serves prefill, chunked prefill, decode and mixed batches, reading bshd/sbhd/thd
through strides and KV caches through the page table. What it does not do is declared below, so
selection sends such calls elsewhere (and an explicit ``backend="fused"`` request says why).
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch

from attention import custom_ops
from attention.backends.base import AttentionCall, Backend, Capabilities
from attention.call_setup import eager_step_value
from attention.kernels.availability import interpreter_enabled, kernels_interpreted
from attention.kernels.configs import MAX_NUM_SPLITS
from attention.masks import is_causal
from attention.params import AttentionParams

_HALF = frozenset({torch.float16, torch.bfloat16})


@functools.cache
def _launches() -> ModuleType:
    """attention.backends.fused_launches, imported on first use (it imports Triton)."""
    from attention.backends import fused_launches

    return fused_launches


def _triton_reason() -> str | None:
    return _triton_reason_for(kernels_interpreted(), interpreter_enabled())


@functools.cache
def _triton_reason_for(interpreted: bool, interpret_now: bool) -> str | None:
    del interpreted, interpret_now   # the cache key: the kernels' mode and TRITON_INTERPRET now (what the reason says)
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    from attention.kernels import triton_available

    return triton_available()


def output_rows_may_be_padding(p: AttentionParams, q_shape: torch.Size, step_rows: int | None = None) -> bool:
    """Can the output hold rows of padding tokens, which must come out as zeros (a memset first, unless the kernels
    zero them: thd rows past the last sequence, and bshd / sbhd decodes run as thd)? Not for a KV-cache step whose
    query rows are exactly the step's ``step_rows`` (host; None when the call is captured or compiled, and later
    replays may bring fewer): a thd step's tokens, or a bshd/sbhd decode's sequences with one query each (every
    sequence of a step brings at least one token, InferenceParams checks it), so an eager decode step skips the
    memset. A bshd/sbhd batch padded up to max_batch_size has rows of no sequence."""
    if p.pad_between_seqs:
        return True
    if p.kv_cache != "none":
        if p.qkv_format == "thd":
            return step_rows != q_shape[0]
        if p.qkv_format == "bshd":   # one query a row, and the step's sequences as its rows
            return q_shape[1] != 1 or step_rows != q_shape[0]
        return q_shape[0] != 1 or step_rows != q_shape[1]
    return "padding" in p.attn_mask_type


def split_sizing_kv_length(call: AttentionCall) -> int:
    """The KV length the kernel sizes split-KV on (it only picks the split count and tile classes).

    With a KV cache ``max_seqlen_kv`` is the cache's capacity (``max_sequence_length``, as in TE):
    at 64k capacity a batch-1 decode over 256 tokens would run 16 splits of a few keys each and a
    combine launch. An eager step uses the longest sequence the step actually holds; a CUDA-graph
    capture or torch.compile keeps the capacity, since later replays of that graph attend to
    longer sequences.
    """
    ip = call.inference_params
    longest = None if ip is None else eager_step_value(ip, "longest_sequence", call.query.device, call.eager)
    return call.max_seqlen_kv if longest is None else min(call.max_seqlen_kv, longest)


def _leading(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x[:rows]``, without making a view when ``x`` has exactly ``rows`` rows (a view costs ~1 µs)."""
    return x if x.shape[0] == rows else x[:rows]


class FusedBackend(Backend):
    name = "fused"
    notes = ("CPU tensors and float32 only under TRITON_INTERPRET=1 (tests; Triton before 3.7 interprets only with "
             "numpy < 2.4), and there no bfloat16; num_splits at most 64",)
    capabilities = Capabilities(
        dtypes=_HALF | {torch.float32},
        device_types=frozenset({"cuda", "cpu"}),
        min_compute_capability=(8, 0),
        mask_types=frozenset(
            {"no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"}
        ),
        max_head_dim=256,
        head_dim_multiple=8,
        bias_types=frozenset({"no_bias", "alibi"}),
        dropout=False,
        backward=False,
        cuda_graphs=True,
        num_splits=True,
        tolerances={torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)},
    )

    def availability_reason(self) -> str | None:
        return _triton_reason()

    def extra_reasons(self, params: AttentionParams) -> list[str]:
        reasons = []
        if params.device_type == "cpu" and not kernels_interpreted() and torch.cuda.is_available():
            reasons.append("CPU tensors run only under TRITON_INTERPRET=1 (tests)" + (
                ", which was set after the kernels were defined (Triton reads it as it defines them)"
                if interpreter_enabled() else "") + "; move the inputs to CUDA")
        if params.device_type == "cpu" and params.dtype == torch.bfloat16:
            # (triton 3.6 to 3.9: errors of ~1e9 against the fp32 reference)
            reasons.append("bfloat16 on CPU: the Triton interpreter's tl.dot gets it wrong; "
                           "use float16 or float32 there")
        if params.dtype == torch.float32 and not kernels_interpreted():
            reasons.append("float32 runs only under TRITON_INTERPRET=1 (tests)"
                           + ("; on CUDA use float16 or bfloat16" if params.device_type == "cuda" else ""))
        if params.num_splits > MAX_NUM_SPLITS:
            reasons.append(f"num_splits={params.num_splits} exceeds the fused kernel's maximum {MAX_NUM_SPLITS}")
        return reasons

    def forward(self, call: AttentionCall) -> torch.Tensor:
        return self.forward_flat(call).unflatten(-1, (call.query.shape[-2], call.params.head_dim_v))

    def forward_flat(self, call: AttentionCall) -> torch.Tensor:
        """The output with heads flattened, written so by the kernel (no view of it made per call)."""
        p = call.params
        q = call.query
        q_shape = q.shape
        q_format = p.qkv_format
        cu_seqlens_q = call.cu_seqlens_q
        q_starts = None
        if q_format == "thd":
            batch = cu_seqlens_q.numel() - 1   # so cu_seqlens_q has exactly batch + 1 entries
            q_starts = cu_seqlens_q if call.cu_seqlens_q_padded is None else call.cu_seqlens_q_padded
            total_q = q_shape[0]
        else:
            batch = q_shape[0] if q_format == "bshd" else q_shape[1]
            total_q = q_shape[0] * q_shape[1]
            cu_seqlens_q = _leading(cu_seqlens_q, batch + 1)

        page_table = None
        kv_starts = None
        kv_format = p.kv_format
        if p.kv_cache == "paged":
            k, v = call.key, call.value
            page_table = _leading(call.page_table, batch)
            kv_format = "cache"
        elif p.kv_cache == "non_paged":
            k, v = _leading(call.key, batch), _leading(call.value, batch)
            kv_format = "cache"
        else:
            k, v = call.key, call.value
            if kv_format == "thd":
                kv_starts = call.cu_seqlens_kv if call.cu_seqlens_kv_padded is None else call.cu_seqlens_kv_padded

        padding = output_rows_may_be_padding(p, q_shape, call.step_rows)
        one_token_rows = (q_format != "thd" and total_q == batch and p.kv_cache != "none"
                          and (padding or q_format == "sbhd")
                          and getattr(call.inference_params, "step_tokens_packed", False))
        if one_token_rows:
            # A cache step of one query row a sequence (a decode) whose rows may be padding (batch_size below the
            # rows, or a capture), or in sbhd: its rows are the step's tokens back to back, then the rows of no
            # sequence (InferenceParams.step_tokens_packed). As thd, the kernels zero those tail rows themselves, in
            # place of a memset of all of out; and sbhd reads as the token rows the Hopper decode kernel takes.
            token_dim = 1 if q_format == "bshd" else 0
            q = q.select(token_dim, 0)
            q_format, q_starts = "thd", cu_seqlens_q
        # thd padding rows are the rows past the last sequence when the sequences are packed from row 0 (no padded
        # offsets of their own): the kernels zero them (no memset of all of out)
        zero_tail = padding and q_format == "thd" and (q_starts is cu_seqlens_q) and not p.pad_between_seqs
        out = _flat_output(q, q_shape, q_shape[-2] * p.head_dim_v, padding and not zero_tail)
        rows_out = out.select(token_dim, 0) if one_token_rows else out
        # num_splits=1 (the default) keeps the kernel's own split-KV heuristic; a larger value is forced.
        window_left, window_right = p.window_size
        num_splits = None if p.num_splits == 1 else p.num_splits
        cu_seqlens_kv = _leading(call.cu_seqlens_kv, batch + 1)
        kv_length = split_sizing_kv_length(call)
        causal = is_causal(p.attn_mask_type)
        if call.eager:   # through the plans kept under the call's choice
            _launches().run(
                call, q, k, v, rows_out, cu_seqlens_q, cu_seqlens_kv, q_starts, kv_starts, page_table, q_format,
                kv_format, batch, kv_length, eager_step_value(call.inference_params, "kv_tokens", q.device, True),
                total_q, causal, window_left, window_right, num_splits, zero_tail,
            )
            return out
        # the custom op dpa::fused_attention_forward under torch.compile (attention.custom_ops)
        custom_ops.dispatch("fused_attention_forward", eager=call.eager)(
            q, k, v, rows_out, cu_seqlens_q, cu_seqlens_kv, q_starts, kv_starts, page_table, q_format, kv_format,
            batch, call.max_seqlen_q, kv_length, total_q, call.softmax_scale, causal, window_left, window_right,
            p.bottom_right_diagonal, call.alibi_slopes, call.softmax_offset, num_splits, zero_tail,
        )
        return out


def _flat_output(q: torch.Tensor, shape: torch.Size, width: int, zeros: bool) -> torch.Tensor:
    """A new contiguous output ``[..., width]`` (heads flattened) in q's format, dtype and device (zeros or
    uninitialised); ``shape``: q's. ``new_empty`` with unpacked sizes parses fastest (~1 µs a call less than
    ``empty_like`` and a flatten)."""
    new = q.new_zeros if zeros else q.new_empty
    if len(shape) == 3:
        return new(shape[0], width)
    return new(shape[0], shape[1], width)
