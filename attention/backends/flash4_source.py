"""What the installed flash-attn-4 release refuses or takes, read from its own source.

flash-attn-4 (``flash_attn.cute``) is a fast-moving beta: releases differ in what their asserts refuse (paged KV on
sm90, irregular head dims under cp.async paging, the (256, 256) sm100 kernels' limits) and in the ``learnable_sink``
dtype they take. Rather than a version table, the adapter (``attention.backends.flash.Flash4Backend``) asks the
release: these helpers look for the asserts' messages in its functions' source (``flash_probe.source_mentions``;
a function the release lacks mentions nothing). The head-dim check calls the release's own validator where it has
one, else a copy of its rules.
"""

from __future__ import annotations

from typing import Any

import torch

from attention.backends import flash_probe
from attention.masks import is_causal, is_trivial_window
from attention.params import AttentionParams

__all__ = ["NO_LOCAL_BWD_SM90", "NO_PAGED_SM90", "NO_SINK_BWD_HD256", "NO_VARLEN_BWD_SM90",
           "PAGED_IRREGULAR_HEAD_DIM", "hd256_reasons", "head_dim_reason", "installed_refuses_seqused",
           "installed_sink_dtype", "runs_hd256_kernels", "tile_n"]

NO_PAGED_SM90 = "paged KV not supported on SM 9.0"
PAGED_IRREGULAR_HEAD_DIM = "Paged KV does not support irregular head dim"
NO_SINK_BWD_HD256 = "head_dim=256 does not support learnable_sink"
NO_LOCAL_BWD_SM90 = "local not supported yet on 9.x"
NO_VARLEN_BWD_SM90 = "varlen backward is not yet supported on sm90"
_HD256_FWD = "SM100 forward with head_dim=256 does not support"
_HD256_BWD = "SM100 backward with head_dim=256 does not support"
#: Older flash-attn-4 releases assert a bf16 sink in _flash_attn_fwd whatever q's dtype (Dao-AILab/flash-attention
#: flash_attn/cute/interface.py at 66ee1b5 and 004b1a2: ``assert learnable_sink.dtype == torch.bfloat16, "learnable_sink
#: must be bfloat16"``; the kernels read it as ``Float32(learnable_sink[h])``, so fp16 inputs take a bf16 sink too).
#: Later ones take fp16, bf16 or fp32 (``_LEARNABLE_SINK_DTYPES``), 4.0.0b36 fp32.
_BF16_ONLY_SINK = ("learnable_sink.dtype == torch.bfloat16", "learnable_sink must be bfloat16")


def head_dim_reason(p: AttentionParams, module: Any) -> str | None:
    """flash-attn-4's own validator when importable, else a copy of its rules."""
    d_qk, d_v = p.head_dim_qk, p.head_dim_v
    major = p.compute_capability[0] if p.compute_capability is not None else 9
    validator = getattr(module, "_validate_head_dims", None)
    if validator is not None:
        try:
            validator(d_qk, d_v, major, 8)
            return None
        except (AssertionError, ValueError) as error:
            return f"flash-attn-4 rejects (head_dim_qk, head_dim_v)=({d_qk}, {d_v}): {error}"
        except TypeError:
            pass  # another release's signature: use the rules below
    aligned = d_qk % 8 == 0 and d_v % 8 == 0
    if major == 9:
        ok = 8 <= d_qk <= 256 and 8 <= d_v <= 256
        rule = "8..256 on sm90"
    else:
        ok = ((8 <= d_qk <= 128 and 8 <= d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))
              or (d_v == 512 and d_qk in (64, 512)))
        rule = "8..128, (192, 128), (256, 256) or (64|512, 512) on sm100"
    if ok and aligned:
        return None
    return f"flash-attn-4 does not take (head_dim_qk, head_dim_v)=({d_qk}, {d_v}): needs multiples of 8 in {rule}"


def _causal_local(p: AttentionParams) -> tuple[bool, bool]:
    """flash-attn-4's ``_resolve_causal_local_window`` on our window: (causal, local)."""
    causal = is_causal(p.attn_mask_type)
    if is_trivial_window(p.window_size):
        return causal, False
    left, right = p.window_size
    if causal:
        right = 0
    if left < 0 and right == 0:
        return True, False
    return False, left >= 0 or right >= 0


def tile_n(p: AttentionParams, module: Any, major: int) -> int | None:
    """The forward's KV tile (``n_block_size``) flash-attn-4 picks: a page of that size loads by TMA."""
    if major in (10, 11):
        return 128
    tile = getattr(module, "_tile_size_fwd_sm90", None)
    if tile is None:
        return None
    causal, local = _causal_local(p)
    try:
        return tile(p.head_dim_qk, p.head_dim_v, causal, local).n_block_size
    except Exception:  # noqa: BLE001 - another release's signature
        return None


def _sink_dtype(module: Any) -> torch.dtype:
    """The ``learnable_sink`` dtype this release takes: bf16 where its ``_flash_attn_fwd`` asserts it, else fp32."""
    forward = getattr(module, "_flash_attn_fwd", None)
    bf16_only = any(flash_probe.source_mentions(forward, text) for text in _BF16_ONLY_SINK)
    return torch.bfloat16 if bf16_only else torch.float32


def runs_hd256_kernels(p: AttentionParams) -> bool:
    """Head dims (256, 256) on sm100 / sm110: flash-attn-4's dedicated two-CTA kernels."""
    major = p.compute_capability[0] if p.compute_capability is not None else 9
    return major in (10, 11) and (p.head_dim_qk, p.head_dim_v) == (256, 256)


def _hd256_refuses_seqused(module: Any, backward: bool) -> bool:
    """Do this release's (256, 256) sm100 kernels assert on seqused_q / seqused_k: its forward, or (``backward``)
    either pass?"""
    probes = [(("_flash_attn_fwd", "BlackwellFusedMultiHeadAttentionForward"), f"{_HD256_FWD} seqused_q/seqused_k")]
    if backward:
        probes.append((("_flash_attn_bwd", "BlackwellFusedMultiHeadAttentionBackward"),
                       f"{_HD256_BWD} seqused_q/seqused_k"))
    return any(flash_probe.source_mentions(getattr(module, name, None), text)
               for names, text in probes for name in names)


def installed_sink_dtype() -> torch.dtype:
    """``_sink_dtype`` of the installed release, for a call."""
    return _sink_dtype(flash_probe.probe(4).module)


def installed_refuses_seqused(backward: bool) -> bool:
    """``_hd256_refuses_seqused`` of the installed release, for a call."""
    return _hd256_refuses_seqused(flash_probe.probe(4).module, backward)


# torch.compile traces the adapter's forward: Dynamo calls these at trace time and keeps the result as a constant of
# the graph (torch._dynamo.assume_constant_result, as attention.selection marks _select_name_at_trace). Their
# arguments must be constants too (torch 2.11 refuses the package object), so they find the package themselves.
installed_sink_dtype._dynamo_marked_constant = True  # type: ignore[attr-defined]
installed_refuses_seqused._dynamo_marked_constant = True  # type: ignore[attr-defined]


def hd256_reasons(p: AttentionParams, module: Any) -> list[str]:
    """Head dims (256, 256) on sm100 / sm110 run on flash-attn-4's dedicated two-CTA kernels, whose asserts refuse
    inputs its other kernels take. Each is refused where this release's source says so: releases differ (4.0.0b36
    has no dedicated forward kernel; its backward refuses a window)."""
    forward = [getattr(module, name, None) for name in ("_flash_attn_fwd", "BlackwellFusedMultiHeadAttentionForward")]
    backward = [getattr(module, name, None)
                for name in ("_flash_attn_bwd", "BlackwellFusedMultiHeadAttentionBackward")]

    def says(functions: list[Any], *texts: str) -> bool:
        return any(flash_probe.source_mentions(function, text) for function in functions for text in texts)

    windowed = not is_trivial_window(p.window_size)
    # seqused_* are passed by every KV-cache step and by thd with offsets of its own: pad_between_seqs here; a call
    # with offsets of its own under pad_between_seqs=False is refused by Flash4Backend._varlen (params can't tell)
    lengths = "a KV-cache step" if p.kv_cache != "none" else "thd with pad_between_seqs" if p.pad_between_seqs else ""
    fwd, bwd = _HD256_FWD, _HD256_BWD
    refused = {
        f"per-sequence lengths (seqused_k), which {lengths} passes":
            bool(lengths) and _hd256_refuses_seqused(module, backward=False),
        "a sink softmax (learnable_sink)": p.softmax_type != "vanilla" and says(forward, f"{fwd} learnable_sink"),
        "a sliding window": windowed and says(forward, f"{fwd} local attention"),
        "num_splits != 1 (split-KV)": p.num_splits != 1 and says(forward, f"{fwd} SplitKV"),
        "a paged KV cache": p.kv_cache == "paged" and says(forward, f"{fwd} paged KV\""),
        f"pages of {p.page_size} tokens (only 128, its KV tile)": (
            p.kv_cache == "paged" and p.page_size != 128
            and says(forward, "hd256 2CTA supports TMA paged KV only", f"{fwd} non-TMA paged KV")),
        "a sliding window in the backward pass": (p.requires_grad and windowed
                                                  and says(backward, f"{bwd} local attention")),
        "pad_between_seqs in the backward pass": (p.requires_grad and p.pad_between_seqs
                                                  and says(backward, f"{bwd} seqused_q/seqused_k")),
    }
    return [f"flash-attn-4's sm100 kernels for head dims (256, 256) do not support {what}"
            for what, refuses in refused.items() if refuses]
