"""The unfused backend: attention in plain PyTorch, the executable specification.

Every feature, any device, any float dtype (softmax in fp32 for half inputs), autograd included.
All formats are brought to padded ``[b, s, h, d]``, one explicit mask is built, and the result is
written back in the query's format with padded rows zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention.backends.base import ALL_MASKS, AttentionCall, Backend, Capabilities
from attention.formats import from_padded, to_padded, valid_token_mask
from attention.masks import is_causal


class UnfusedBackend(Backend):
    name = "unfused"
    capabilities = Capabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64}),
        device_types=frozenset({"cuda", "cpu", "mps", "xpu", "meta"}),
        mask_types=ALL_MASKS,
        cuda_graphs=False,
        return_max_logit=True,
        tolerances={torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1e-2)},
    )

    def forward(self, call: AttentionCall) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The output in the query's format; ``(out, max_logit)`` with ``params.return_max_logit``:
        fp32 ``[h]``, the largest logit (``scale * Q Kᵀ + bias``) over the visible keys of the real
        query rows of every sequence (-inf for a head that sees no key)."""
        p = call.params
        q, k, v = self._padded_inputs(call)                  # [b, s_q, h, d], [b, s_kv, h_kv, d]
        b, s_q, h, _ = q.shape
        s_kv, h_kv = k.shape[1], k.shape[2]
        compute_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        real_queries = valid_token_mask(call.cu_seqlens_q[: b + 1], s_q)[..., None, None]   # [b, s_q, 1, 1]
        real_keys = valid_token_mask(call.cu_seqlens_kv[: b + 1], s_kv)      # [b, s_kv]
        # padding slots zeroed: garbage there (NaN in a torch.empty buffer) meets real rows in the matmuls, forward
        # and backward, with weight 0, and 0 * NaN is NaN
        q = torch.where(real_queries, q, 0)
        k, v = (torch.where(real_keys[:, :, None, None], t, 0) for t in (k, v))
        qf, kf, vf = (t.to(compute_dtype).transpose(1, 2) for t in (q, k, v))   # [b, h, s, d]
        if h != h_kv:
            kf = kf.repeat_interleave(h // h_kv, dim=1)
            vf = vf.repeat_interleave(h // h_kv, dim=1)

        scores = torch.matmul(qf, kf.transpose(-1, -2))      # [b, h, s_q, s_kv]
        bias = call.core_attention_bias
        if p.core_attention_bias_type == "pre_scale_bias":
            scores = (scores + bias.to(compute_dtype)) * call.softmax_scale
        else:
            scores = scores * call.softmax_scale
            if p.core_attention_bias_type == "post_scale_bias":
                scores = scores + bias.to(compute_dtype)

        len_q = call.cu_seqlens_q[1 : b + 1] - call.cu_seqlens_q[:b]
        len_kv = call.cu_seqlens_kv[1 : b + 1] - call.cu_seqlens_kv[:b]
        offset = (len_kv - len_q) if p.bottom_right_diagonal else torch.zeros_like(len_q)
        rows = torch.arange(s_q, device=q.device)[None, :, None] + offset[:, None, None]  # i + off
        cols = torch.arange(s_kv, device=q.device)[None, None, :]
        if call.alibi_slopes is not None:
            slopes = call.alibi_slopes.detach().to(compute_dtype)   # constants, as in TE: no gradient
            slopes = slopes[None, :, None, None] if slopes.dim() == 1 else slopes[:b, :, None, None]
            scores = scores - slopes * (rows - cols).abs()[:, None].to(compute_dtype)

        visible = real_keys[:, None, :]                          # [b, 1, s_kv]
        left, right = p.window_size
        if is_causal(p.attn_mask_type):
            right = 0
        if right >= 0:
            visible = visible & (cols <= rows + right)
        if left >= 0:
            visible = visible & (cols >= rows - left)
        visible = visible[:, None]                            # [b, 1, s_q, s_kv]
        if call.attention_mask is not None:
            visible = visible & ~call.attention_mask
        scores = scores.masked_fill(~visible, float("-inf"))
        max_logit = None
        if p.return_max_logit:
            real_rows = valid_token_mask(call.cu_seqlens_q[: b + 1], s_q)[:, None, :, None]   # [b, 1, s_q, 1]
            logits = scores.detach().masked_fill(~real_rows, float("-inf"))
            max_logit = (logits.amax(dim=(0, 2, 3)) if logits.numel() else logits.new_full((h,), float("-inf"))).float()

        if call.softmax_offset is not None:
            sink = call.softmax_offset.to(compute_dtype)[None, :, None, None].expand(b, h, s_q, 1)
            scores = torch.cat([scores, sink], dim=-1)
        if scores.shape[-1] == 0:   # no key at all (every KV sequence empty): amax has nothing to reduce
            row_max = scores.new_zeros(*scores.shape[:-1], 1)
        else:
            row_max = scores.amax(dim=-1, keepdim=True).detach()
        row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
        weights = torch.exp(scores - row_max)
        denom = weights.sum(dim=-1, keepdim=True)
        probs = weights / torch.where(denom == 0, torch.ones_like(denom), denom)
        if call.softmax_offset is not None:
            probs = probs[..., :-1]
        if call.dropout_p > 0:
            probs = F.dropout(probs, p=call.dropout_p, training=True)

        out = torch.matmul(probs, vf).transpose(1, 2)          # [b, s_q, h, d_v]
        out = torch.where(real_queries, out, 0)
        out = out.to(q.dtype)
        num_tokens = call.query.shape[0]
        out = from_padded(out, p.qkv_format, call.cu_seqlens_q[: b + 1], num_tokens, call.cu_seqlens_q_padded)
        return out if max_logit is None else (out, max_logit)

    @staticmethod
    def _padded_inputs(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p = call.params
        b = p.batch_size
        cu_q = call.cu_seqlens_q[: b + 1]
        q = to_padded(call.query, p.qkv_format, cu_q, call.max_seqlen_q, call.cu_seqlens_q_padded)
        if p.kv_cache == "paged":
            # every row of the batch (thd's b counts every buffer row; rows past the step's sequences have no keys):
            # reading inference_params.batch_size would make torch.compile guard on it
            k, v = call.inference_params.convert_paged_to_nonpaged(call.layer_number, b)
        elif p.kv_cache == "non_paged":
            k, v = call.key, call.value
        else:
            cu_kv = call.cu_seqlens_kv[: b + 1]
            k = to_padded(call.key, p.kv_format, cu_kv, call.max_seqlen_kv, call.cu_seqlens_kv_padded)
            v = to_padded(call.value, p.kv_format, cu_kv, call.max_seqlen_kv, call.cu_seqlens_kv_padded)
        if k.shape[0] < b:   # thd over a cache: rows past inference_params.batch_size are empty sequences
            k = torch.cat([k, k.new_zeros((b - k.shape[0],) + k.shape[1:])])
            v = torch.cat([v, v.new_zeros((b - v.shape[0],) + v.shape[1:])])
        return q, k[:b], v[:b]
