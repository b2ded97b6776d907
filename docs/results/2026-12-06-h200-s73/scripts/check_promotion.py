"""Device check of the L2-promotion experiment (attention/kernels/tma_promotion.py): each promotion setting re-encodes
the descriptors it names (a count that grows) and leaves the outputs as Triton's encoding gives them.

    PYTHONPATH=. python docs/results/2026-12-06-h200-s73/scripts/check_promotion.py
"""

import os

import torch

from attention.kernels import attention_forward, attention_fwd, tma_promotion
from benchmarks.cells import Inputs, Problem


def run(problem: Problem, page_size: int) -> torch.Tensor:
    """benchmarks.providers' fused call (attention_forward over the cell's pages), three times; the last output."""
    inputs = Inputs(problem, torch.device("cuda"))
    k, v, page_table = inputs.paged(page_size)
    batch = problem.batch
    q4 = inputs.q.unsqueeze(0).expand(batch, -1, -1, -1)
    out = torch.empty(problem.total_q, problem.heads_q, problem.head_dim_v, dtype=problem.dtype, device="cuda")
    for _ in range(3):   # the first call is Triton's own launch (its encoding); the later ones direct
        attention_forward(q4, k, v, out.unsqueeze(0).expand(batch, -1, -1, -1), cu_seqlens_q=inputs.cu_q,
                          cu_seqlens_kv=inputs.cu_kv, q_start=inputs.q_start, page_table=page_table,
                          max_seqlen_q=problem.max_q, max_seqlen_kv=problem.max_kv, total_q=problem.total_q,
                          total_kv=problem.total_kv, softmax_scale=inputs.scale, causal=problem.causal,
                          bottom_right=True)
    torch.cuda.synchronize()
    return out.clone()


cases = {
    "decode 8x4k p16": (Problem(q_lens=(1,) * 8, kv_lens=(4096,) * 8, heads_q=32, heads_kv=8, causal=True,
                                dtype=torch.bfloat16), 16),
    "chunk 2k on 6k p16": (Problem(q_lens=(2048,), kv_lens=(8192,), heads_q=32, heads_kv=8, causal=True,
                                   dtype=torch.bfloat16), 16),
    "mixed 2k on 6k + 16 decodes p16": (Problem(q_lens=(2048,) + (1,) * 16, kv_lens=(8192,) + (4096,) * 16,
                                                heads_q=32, heads_kv=8, causal=True, dtype=torch.bfloat16), 16),
}
settings = [{}, {tma_promotion.DECODE_PROMOTION_ENV: "none"}, {tma_promotion.DECODE_PROMOTION_ENV: "64"},
            {tma_promotion.PREFILL_PROMOTION_ENV: "256"}, {tma_promotion.PREFILL_PROMOTION_ENV: "none"}]
for name, (problem, page_size) in cases.items():
    reference = None
    for setting in settings:
        for variable in (tma_promotion.DECODE_PROMOTION_ENV, tma_promotion.PREFILL_PROMOTION_ENV):
            os.environ.pop(variable, None)
        os.environ.update(setting)
        attention_fwd._plans.clear()
        before = tma_promotion.reencoded
        out = run(problem, page_size)
        reference = out if reference is None else reference
        print(f"{name:34s} {str(setting):48s} re-encoded {tma_promotion.reencoded - before:3d}  "
              f"max diff {(out.float() - reference.float()).abs().max().item():.3g}  finite {bool(out.isfinite().all())}")
