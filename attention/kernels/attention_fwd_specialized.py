"""A warp-specialized attention forward for calls without a mask band (Hopper, Triton 3.6).

Triton 3.6 warp-specializes a loop marked ``tl.range(..., warp_specialize=True)`` on sm90: a producer
warp group issues the TMA loads, two 4-warp consumer groups split the 128 query rows and run the
wgmma / softmax work. Its pass accepts only a plain kernel (sm90 compile, Triton 3.6): one loop; no
early return, other loop or peeled tile around it; every tensor load through a tensor descriptor and
no reshape of one. The general kernel (attention_fwd_kernel.py) breaks each of those rules: it packs
a KV head's query heads into one tile (a reshape), walks the causal band in loops of its own and
searches sequences with a while loop. So this kernel serves what needs none of that:

  * no causal mask, window or ALiBi (keys past the sequence end are masked by a per-key bias added
    with the score scale: no per-score select, which costs the specialized loop most of its gain);
  * a non-paged cache or packed K/V, one query head per program (GQA reads its KV head's tiles once
    per query head, through L2), no split-KV;
  * sinks (softmax_offset), varlen (``thd``) and padded starts as in the general kernel; out is written
    through a descriptor as well (needs 16-byte aligned strides, like q, k and v).

Opt-in for measurements only (``warp_specialize`` in ATTN_FUSED_VARIANTS' prefill/contiguous entry; planning
it warns): it is wrong while other processes use the GPU. On the H200 (Triton 3.6, 2026-11-30) a ragged
non-causal thd prefill returned NaN rows in 553-600 of 600 runs in each of three processes running at
once, against 0 of 400 in one process alone, and 3 of 1,800 under MPS (no time-slicing); the general
kernel was right in all 6,000 runs under the same load (``python -m benchmarks.repeat_check --processes 3``,
docs/results/2026-11-30-h200-dc3ccf8/repeat-check.txt): a race whose odds rise with other work on the GPU.
The GPU suite's shards are such processes: one of its runs (87c85d6) caught it. Not isolated further:
the sm90 code keeps each program's descriptors in a slot of its own and fences them as Triton's general
kernels do; what the specialized code adds is the producer / consumer split (register reallocation,
named barriers, mbarrier pipelines), which a time-slice switch of the GPU apparently upsets.

Grid: (q tiles over the flattened query tokens + one per sequence, H_q). Program (t, h) finds its
sequence by SEARCH_STEPS unrolled halvings of cu_seqlens_q, like find_sequence; a tile past its
sequence's queries walks no KV tile and stores nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .attention_fwd_kernel import normalized_output, online_softmax_step
from .sequence_lookup import find_sequence_unrolled

__all__ = ["attention_fwd_specialized_kernel"]


@triton.jit
def attention_fwd_specialized_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    partial_out_ptr, partial_lse_ptr,  # unused: the general kernel's signature, so launch plans call both alike
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr,
    page_table_ptr, alibi_slopes_ptr, softmax_offset_ptr, split_counter_ptr,  # unused but softmax_offset_ptr
    num_seqs,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    qk_scale,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_Q_START: tl.constexpr, HAS_KV_START: tl.constexpr, HAS_SINK: tl.constexpr,
    SEARCH_STEPS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Strides as in attention_fwd_kernel (dense q/k/v/out: batch, token, head). qk_scale in log2 units."""
    tile_id = tl.program_id(0)
    q_head = tl.program_id(1)
    kv_head = q_head // GROUP_SIZE

    seq = find_sequence_unrolled(cu_seqlens_q_ptr, num_seqs, tile_id, BLOCK_M, True, SEARCH_STEPS)
    q_begin = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_begin
    kv_len = tl.load(cu_seqlens_kv_ptr + seq + 1) - tl.load(cu_seqlens_kv_ptr + seq)
    first_query = (tile_id - (q_begin // BLOCK_M + seq)) * BLOCK_M
    seq64 = seq.to(tl.int64)
    q_first = seq64 * 0
    if HAS_Q_START:
        q_first = tl.load(q_start_ptr + seq).to(tl.int64)
    kv_first = seq64 * 0
    if HAS_KV_START:
        kv_first = tl.load(kv_start_ptr + seq).to(tl.int64)

    # Descriptors never get an empty dim: an empty sequence gets one row and is addressed past it (row 1),
    # so its q load reads zeros without touching memory and its output store writes nothing.
    q_row = first_query + (q_len == 0).to(tl.int32)
    q_desc = tl.make_tensor_descriptor(
        q_ptr + seq64 * stride_qb + q_first * stride_qs + q_head.to(tl.int64) * stride_qh,
        shape=[tl.maximum(q_len, 1), HEAD_DIM_QK], strides=[stride_qs, 1], block_shape=[BLOCK_M, BLOCK_DQK])
    k_desc = tl.make_tensor_descriptor(
        k_ptr + seq64 * stride_kb + kv_first * stride_ks + kv_head.to(tl.int64) * stride_kh,
        shape=[tl.maximum(kv_len, 1), HEAD_DIM_QK], strides=[stride_ks, 1], block_shape=[BLOCK_N, BLOCK_DQK])
    v_desc = tl.make_tensor_descriptor(
        v_ptr + seq64 * stride_vb + kv_first * stride_vs + kv_head.to(tl.int64) * stride_vh,
        shape=[tl.maximum(kv_len, 1), HEAD_DIM_V], strides=[stride_vs, 1], block_shape=[BLOCK_N, BLOCK_DV])
    q = q_desc.load([q_row, 0])  # rows past the sequence read as zeros

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    num_tiles = tl.where(first_query < q_len, (kv_len + BLOCK_N - 1) // BLOCK_N, 0)
    # Every tile holds a key of the sequence: each row's running max is finite after the first one.
    for tile in tl.range(0, num_tiles, warp_specialize=True):
        k_t = tl.trans(k_desc.load([tile * BLOCK_N, 0]))
        v = v_desc.load([tile * BLOCK_N, 0])
        keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        scores = (tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale
                  + tl.where(keys < kv_len, 0.0, float("-inf"))[None, :])
        acc, l_i, m_i = online_softmax_step(scores, v, acc, l_i, m_i, False, DOT_PRECISION)

    o = normalized_output(acc, l_i, m_i, softmax_offset_ptr, q_head, HAS_SINK)
    # Through a descriptor too (rows past the sequence are not written): with a pointer store the two
    # consumer groups' rows landed wrong (H200, Triton 3.6: only a tile's first 64 rows were right).
    out_desc = tl.make_tensor_descriptor(
        out_ptr + seq64 * stride_ob + q_first * stride_os + q_head.to(tl.int64) * stride_oh,
        shape=[tl.maximum(q_len, 1), HEAD_DIM_V], strides=[stride_os, 1], block_shape=[BLOCK_M, BLOCK_DV])
    out_desc.store([q_row, 0], o.to(out_ptr.dtype.element_ty))
