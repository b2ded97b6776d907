"""Probe: does Triton 3.6's Hopper automatic warp specialization speed up a plain attention loop?

A minimal attention forward (tensor descriptors, one KV loop) with and without
``tl.range(..., warp_specialize=True)``, unmasked, masked per score (MASK_ALWAYS, or CAUSAL in the same
loop), masked by a per-key bias (BIAS) or with the causal diagonal tile peeled before the loop (PEEL:
Triton 3.6 rejects it when specializing), next to the fused backend on the same problem, in TFLOP/s.

    python -m benchmarks.ws_probe
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _probe_attention(q_ptr, k_ptr, v_ptr, o_ptr, seqlen, qk_scale,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WS: tl.constexpr,
                     CAUSAL: tl.constexpr, MASK_ALWAYS: tl.constexpr, PEEL: tl.constexpr, BIAS: tl.constexpr):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    rows = tl.num_programs(1) * seqlen
    q_desc = tl.make_tensor_descriptor(q_ptr, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(k_ptr, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(v_ptr, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    o_desc = tl.make_tensor_descriptor(o_ptr, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    first = head * seqlen
    q = q_desc.load([first + tile * BLOCK_M, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi = seqlen
    if CAUSAL:
        hi = tl.minimum((tile + 1) * BLOCK_M, seqlen)
    rows_q = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    if PEEL:  # the diagonal tile (BLOCK_N == BLOCK_M), masked, as straight-line code before the loop
        start = tile * BLOCK_M
        k = k_desc.load([first + start, 0])
        s = tl.dot(q, k.T) * qk_scale
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.where(keys[None, :] <= rows_q[:, None], s, float("-inf"))
        m_i = tl.max(s, 1)
        p = tl.math.exp2(s - m_i[:, None])
        l_i = tl.sum(p, 1)
        v = v_desc.load([first + start, 0])
        acc = tl.dot(p.to(v.dtype), v)
        hi = start
    for start in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([first + start, 0])
        s = tl.dot(q, k.T) * qk_scale
        if BIAS:  # ragged-tail mask as a per-key bias added with the scale (no per-score select)
            keys = start + tl.arange(0, BLOCK_N)
            s = s + tl.where(keys < seqlen, 0.0, float("-inf"))[None, :]
        if (CAUSAL and not PEEL) or MASK_ALWAYS:  # one select per score on every tile (a single loop for the band too)
            keys = start + tl.arange(0, BLOCK_N)
            visible = keys[None, :] < seqlen
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows_q[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([first + start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    o_desc.store([first + tile * BLOCK_M, 0], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty))


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA (bf16, 8 heads at a time) as the probe's yardstick."""
    return torch.cat([torch.nn.functional.scaled_dot_product_attention(q[i:i + 8], k[i:i + 8], v[i:i + 8],
                                                                       is_causal=causal)
                      for i in range(0, q.shape[0], 8)]).float()


def main() -> None:
    from attention.kernels import attention_forward

    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    batch, heads, seqlen, dim = 4, 32, 4096, 128
    flops = 4 * batch * heads * seqlen * seqlen * dim
    q, k, v = (torch.randn(batch * heads, seqlen, dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    scale = dim ** -0.5 * 1.4426950408889634
    references: dict = {}
    variants = (  # (CAUSAL, MASK_ALWAYS, BIAS, warp-specialized, warps, block_m, block_n, stages)
        (False, False, False, False, 8, 128, 64, 3), (False, False, False, True, 4, 128, 128, 2),
        (False, True, False, True, 4, 128, 128, 2), (False, False, True, True, 4, 128, 128, 2),
        (False, False, True, True, 4, 128, 64, 2), (False, False, True, True, 4, 128, 128, 3))
    for causal, mask_always, bias, ws, warps, block_m, block_n, stages in variants:
        out = torch.empty_like(q)
        run = functools.partial(
            _probe_attention[(seqlen // block_m, batch * heads)], q, k, v, out, seqlen, scale, BLOCK_M=block_m,
            BLOCK_N=block_n, D=dim, WS=ws, CAUSAL=causal, MASK_ALWAYS=mask_always, PEEL=False, BIAS=bias,
            num_warps=warps, num_stages=stages)
        label = (f"causal={causal!s:5} mask_always={mask_always!s:5} bias={bias!s:5} ws={ws!s:5} warps={warps} "
                 f"m{block_m} n{block_n} s{stages}")
        try:
            run()
            ms = triton.testing.do_bench(run, warmup=25, rep=100)
            if (causal, mask_always) not in references:
                references[causal, mask_always] = _reference(q, k, v, causal)
            error = (out.float() - references[causal, mask_always]).abs().max().item()
            print(f"probe {label}: {flops / (2 if causal else 1) / ms / 1e9:6.1f} TFLOP/s  max err {error:.1e}",
                  flush=True)
        except Exception as error:  # noqa: BLE001 - a probe reports and goes on
            print(f"probe {label}: {type(error).__name__}: {str(error)[:200]}", flush=True)
    # the fused backend on the same problem ([b, s, h, d] views of the same data)
    q4, k4, v4 = (x.view(batch, heads, seqlen, dim).transpose(1, 2) for x in (q, k, v))
    out4 = torch.empty_like(q4)
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * seqlen
    for causal in (False, True):
        fused = functools.partial(attention_forward, q4, k4, v4, out4, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                  max_seqlen_q=seqlen, max_seqlen_kv=seqlen, softmax_scale=dim ** -0.5, causal=causal)
        fused()
        ms = triton.testing.do_bench(fused, warmup=25, rep=100)
        print(f"fused backend causal={causal} (strided bshd view): {flops / (2 if causal else 1) / ms / 1e9:6.1f} "
              f"TFLOP/s", flush=True)

if __name__ == "__main__":
    main()
