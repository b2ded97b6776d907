"""AttentionParams: the frozen, hashable description of one attention call (the selection key)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class AttentionParams:
    """Everything backend selection looks at, and nothing else (no tensors).

    Two calls with equal params get the same backend, so selection is cached per params.
    Shape letters: ``b`` batch, ``s`` sequence, ``h`` query heads, ``d`` head dim.
    """

    dtype: torch.dtype = torch.bfloat16
    device_type: str = "cuda"                        # "cuda" | "cpu" | ...
    compute_capability: tuple[int, int] | None = None  # (9, 0) on the H200; None off CUDA
    qkv_format: str = "bshd"                         # format of the query: bshd | sbhd | thd
    kv_format: str = "bshd"                          # bshd | sbhd | thd, or the cache: bshd (non-paged) | paged
    batch_size: int = 1
    num_heads: int = 16
    num_gqa_groups: int = 16
    head_dim_qk: int = 64
    head_dim_v: int = 64
    max_seqlen_q: int = 128
    max_seqlen_kv: int = 128
    attn_mask_type: str = "no_mask"
    window_size: tuple[int, int] = (-1, -1)
    bottom_right_diagonal: bool = True
    core_attention_bias_type: str = "no_bias"        # no_bias | pre_scale_bias | post_scale_bias | alibi
    core_attention_bias_shape: str | None = None     # 11ss | 1hss | b1ss | bhss | 111s
    alibi_slopes_shape: tuple[int, ...] | None = None
    softmax_type: str = "vanilla"                    # vanilla | off-by-one | learnable
    attention_dropout: float = 0.0                   # effective dropout (0 outside training)
    requires_grad: bool = False                      # a backward pass will follow
    deterministic: bool = False
    pad_between_seqs: bool = False
    kv_cache: str = "none"                           # none | non_paged | paged
    page_size: int | None = None
    cuda_graph_capture: bool = False
    num_splits: int = 1                              # split-KV count; 1 = the backend's own choice (TE's default)
    return_max_logit: bool = False                   # forward also returns the per-head max logit

    def describe(self) -> str:
        """One line per field, for error messages and ``explain()``."""
        return "\n".join(f"  {f.name} = {getattr(self, f.name)!r}" for f in fields(self))

    @property
    def is_mla(self) -> bool:
        """K and V head dims differ (``head_dim_qk != head_dim_v``, as in MLA)."""
        return self.head_dim_qk != self.head_dim_v

    @property
    def is_gqa(self) -> bool:
        """Fewer KV heads than query heads (GQA, or MQA at one)."""
        return self.num_gqa_groups != self.num_heads
