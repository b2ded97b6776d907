"""PROBE COPY (docs/results/2026-12-03-h200-wide/scripts): attention_mixed_wide_hopper.py with PROBE / DECODERS_N.

Mixed batches on Hopper (sm90) in one launch, the prefill on the prefill kernel's 128-key tiles (Gluon).

attention_mixed_hopper.py's kernel runs its decodes on a fourth warp group of wgmmas; the registers and shared memory
that group takes leave its prefill consumers 64-key tiles and 176-192 registers, so on a prefill-heavy batch (a 2k
chunk on a 14k prefix beside 64 decodes at 4k) its prefill runs 1.18x the prefill kernel's time. This kernel keeps
three warp groups (launch with maxnreg 168):

  * the prefill partitions of attention_mixed_hopper.py (a TMA producer warp; two consumer warp groups of 64 query
    rows) over 128-key tiles, with its schedule;
  * DECODERS decode warps, in the producer's warp group, each walking decode items of its own (a sequence x a KV
    head: the KV head's query heads x the sequence's one query, 8 rows) alone on mma.sync: S^T = K Q^T ([16 keys,
    8 rows]), the softmax down S^T's columns within the warp (no barrier shared with another warp), O^T += V^T P^T
    in four blocks of head dims. A decode warp loads its own ring of DECODE_STAGES tiles of 16 keys by TMA, and
    issues the load of a slot's next tile as soon as it has read the slot.

A decode item's tiles hold 16 keys: one TMA load each for K and V over pages of 16 tokens or more, or a non-paged
cache. Masking as attention_mixed_hopper.py's decodes: keys past the sequence and the causal band masked on the tiles
that need it, V rows past the sequence zeroed in shared memory before their PV.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from attention.kernels.attention_decode_hopper import _decode_walk
from attention.kernels.attention_fwd_hopper import _cta_barrier, _tma_load
from attention.kernels.attention_mixed_hopper import _prefill_consumer, _prefill_producer, _prefill_schedule

__all__ = ["WIDE_DECODERS", "attention_mixed_wide_hopper_kernel"]

WIDE_DECODERS = gl.constexpr(3)
"""Decode warps a program: with the prefill producer warp they make the third warp group."""


@gluon.jit
def _tile_rows(pages, k_row0, v_row0, t, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """The first K and V rows of decode tile t (BLOCK_N keys within one page, or a non-paged walk)."""
    if PAGE_SIZE == 0:
        return k_row0 + t * BLOCK_N, v_row0 + t * BLOCK_N
    key = t * BLOCK_N
    row = gl.load(pages + key // PAGE_SIZE) * PAGE_SIZE + key % PAGE_SIZE
    return row, row


@gluon.jit
def _issue_tile(kv_descriptors, k_tile, v_tile, ready, rows, kv_col):
    """K and V of one tile into a slot (whose previous reads this warp has finished) by TMA."""
    k_desc, v_desc = kv_descriptors
    fence_async_shared()  # this warp's reads of the slot before the async proxy's writes
    mbarrier.expect(ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [rows[0], kv_col], ready, k_tile)
    _tma_load(v_desc, [rows[1], kv_col], ready, v_tile)


@gluon.jit
def _store_q_rows(q_tile, q_ptr, stride_qs, q_token0, kv_head, q_len, GROUP_SIZE: gl.constexpr):
    """An item's packed Q rows (row r: query r // GROUP_SIZE, head kv_head * GROUP_SIZE + r % GROUP_SIZE) into this
    warp's q_tile, zeros past q_len queries."""
    ROWS: gl.constexpr = q_tile.type.shape[0]
    HEAD_DIM: gl.constexpr = q_tile.type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    q_col = (kv_head * GROUP_SIZE + rows % GROUP_SIZE) * HEAD_DIM
    q_token = (q_token0 + rows // GROUP_SIZE).to(gl.int64)
    q = gl.load(q_ptr + q_token[:, None] * stride_qs + (q_col[:, None] + cols[None, :]),
                mask=(rows < q_len * GROUP_SIZE)[:, None], other=0.0)
    q_tile.store(q)
    _cta_barrier()


@gluon.jit
def _zero_rows_from(tile, first_row):
    """Zero rows >= first_row of this warp's [BLOCK_N, D] V slot, 8 rows at a time, before its mma reads it."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0])
    for part in gl.static_range(tile.type.shape[0] // 8):
        rows_tile = tile.slice(part * 8, 8)
        values = rows_tile.load(layout)
        rows = part * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, layout))
        rows_tile.store(gl.where((rows < first_row)[:, None], values, gl.zeros_like(values)))
    _cta_barrier()


@gluon.jit
def _decoder(descriptors, decode_buffers, sequences, output, WARP: gl.constexpr, CAUSAL: gl.constexpr,
             BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr,
             PAGE_SIZE: gl.constexpr, GROUP_SIZE: gl.constexpr, PROBE: gl.constexpr = 0):
    """1 warp: decode items WARP, WARP + DECODERS, ... of this program's share (program p's decoders take items
    p x DECODERS + WARP, then that plus programs x DECODERS, ...), each through its KV tiles in this warp's ring."""
    dq_smem, dk_smem, dv_smem, ready = decode_buffers
    kv_descriptors = (descriptors[3], descriptors[4])
    out_ptr, stride_os, qk_scale, q_ptr, stride_qs = output[0], output[1], output[2], output[3], output[4]
    page_table_ptr, page_table_stride, num_seqs, heads_kv = output[5], output[6], output[8], output[9]
    q_batch_rows, out_batch_rows = sequences[4], sequences[7]
    DECODERS: gl.constexpr = dq_smem.type.shape[0]
    ROWS: gl.constexpr = dq_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = dq_smem.type.shape[2]
    STAGES: gl.constexpr = dk_smem.type.shape[0] // DECODERS
    BLOCK_N: gl.constexpr = dk_smem.type.shape[1]
    PART: gl.constexpr = HEAD_DIM // 4  # S^T's reduction and O^T's rows in four blocks of head dims
    dtype: gl.constexpr = dq_smem.dtype
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    across: gl.constexpr = gl.SliceLayout(0, mma)  # along the item's rows
    down: gl.constexpr = gl.SliceLayout(1, mma)  # along keys, or head dims
    q_tile = dq_smem.index(WARP)
    queries = gl.arange(0, ROWS, layout=across) // GROUP_SIZE
    keys = gl.arange(0, BLOCK_N, layout=down)
    count = 0  # tiles through this warp's ring so far
    for item in range(gl.program_id(0) * DECODERS + WARP, num_seqs * heads_kv, gl.num_programs(0) * DECODERS):
        is_decode, seq, kv_head, q_len, kv_len, q_first, diag, num_tiles, first_masked, k_row0, v_row0, _ = \
            _decode_walk(item, sequences, heads_kv, ROWS, BLOCK_N, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
                         GROUP_SIZE)
        if is_decode:
            pages = page_table_ptr + seq.to(gl.int64) * page_table_stride
            kv_col = kv_head * HEAD_DIM
            for j in gl.static_range(STAGES):
                if j < num_tiles:
                    slot = WARP * STAGES + (count + j) % STAGES
                    _issue_tile(kv_descriptors, dk_smem.index(slot), dv_smem.index(slot), ready.index(slot),
                                _tile_rows(pages, k_row0, v_row0, j, BLOCK_N, PAGE_SIZE), kv_col)
            _store_q_rows(q_tile, q_ptr, stride_qs, seq * q_batch_rows + q_first, kv_head, q_len, GROUP_SIZE)
            m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=across)
            l_i = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=mma)  # summed down at the end
            o0 = gl.zeros([PART, ROWS], gl.float32, layout=mma)
            o1 = gl.zeros([PART, ROWS], gl.float32, layout=mma)
            o2 = gl.zeros([PART, ROWS], gl.float32, layout=mma)
            o3 = gl.zeros([PART, ROWS], gl.float32, layout=mma)
            first_rows = _tile_rows(pages, k_row0, v_row0, 0, BLOCK_N, PAGE_SIZE)
            for t in range(num_tiles):
                slot = WARP * STAGES + (count + t) % STAGES
                if PROBE == 4:  # every tile again from the item's first tile's rows: L2 hits, no page ids
                    ahead = first_rows
                else:
                    ahead = _tile_rows(pages, k_row0, v_row0, gl.minimum(t + STAGES, num_tiles - 1), BLOCK_N,
                                       PAGE_SIZE)  # (its page id's round trip under this tile)
                if PROBE != 2 or t < STAGES:
                    mbarrier.wait(ready.index(slot), ((count + t) // STAGES) & 1)
                k_tile = dk_smem.index(slot)
                v_tile = dv_smem.index(slot)
                if PROBE != 1 and PROBE != 4:
                    if PROBE == 3:  # four independent partial sums: one HMMA chain two deep, not eight
                        zero = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=mma)
                        s0 = mma_v2(k_tile.slice(0, PART, dim=1).load(a_op),
                                    q_tile.slice(0, PART, dim=1).permute((1, 0)).load(b_op), zero)
                        s1 = mma_v2(k_tile.slice(PART, PART, dim=1).load(a_op),
                                    q_tile.slice(PART, PART, dim=1).permute((1, 0)).load(b_op), zero)
                        s2 = mma_v2(k_tile.slice(2 * PART, PART, dim=1).load(a_op),
                                    q_tile.slice(2 * PART, PART, dim=1).permute((1, 0)).load(b_op), zero)
                        s3 = mma_v2(k_tile.slice(3 * PART, PART, dim=1).load(a_op),
                                    q_tile.slice(3 * PART, PART, dim=1).permute((1, 0)).load(b_op), zero)
                        s = (s0 + s1) + (s2 + s3)
                    else:
                        s = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=mma)
                        for part in gl.static_range(4):  # (Q's rows re-read each tile: registers for O^T instead)
                            s = mma_v2(k_tile.slice(part * PART, PART, dim=1).load(a_op),
                                       q_tile.slice(part * PART, PART, dim=1).permute((1, 0)).load(b_op), s)
                    if t >= first_masked:
                        key = t * BLOCK_N + keys
                        keep = key[:, None] < kv_len
                        if CAUSAL:
                            keep = keep & (key[:, None] <= queries[None, :] + diag)
                        s = gl.where(keep, s, float("-inf"))
                    m_new = gl.maximum(m_i, gl.max(s, axis=0) * qk_scale)
                    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: p = 0, not NaN
                    p = gl.exp2(s * qk_scale - m_use[None, :])
                    alpha = gl.exp2(m_i - m_use)
                    m_i = m_new
                    l_i = l_i * alpha[None, :] + p
                    p_t = gl.convert_layout(p.to(dtype), b_op)
                    if (t + 1) * BLOCK_N > kv_len:  # V rows past the sequence: P is 0 there, but 0 * NaN is not
                        _zero_rows_from(v_tile, kv_len - t * BLOCK_N)
                    o0 = mma_v2(v_tile.slice(0, PART, dim=1).permute((1, 0)).load(a_op), p_t, o0 * alpha[None, :])
                    o1 = mma_v2(v_tile.slice(PART, PART, dim=1).permute((1, 0)).load(a_op), p_t, o1 * alpha[None, :])
                    o2 = mma_v2(v_tile.slice(2 * PART, PART, dim=1).permute((1, 0)).load(a_op), p_t,
                                o2 * alpha[None, :])
                    o3 = mma_v2(v_tile.slice(3 * PART, PART, dim=1).permute((1, 0)).load(a_op), p_t,
                                o3 * alpha[None, :])
                if t + STAGES < num_tiles and PROBE != 2:
                    _issue_tile(kv_descriptors, k_tile, v_tile, ready.index(slot), ahead, kv_col)
            if PROBE == 2:
                count += gl.minimum(num_tiles, STAGES)
            else:
                count += num_tiles
            l_sum = gl.sum(l_i, axis=0)
            scale = 1.0 / gl.where(l_sum == 0.0, 1.0, l_sum)
            rows = gl.arange(0, ROWS, layout=across)
            out_token = (seq * out_batch_rows + q_first + rows // GROUP_SIZE).to(gl.int64)
            out_at = out_ptr + (out_token * stride_os + (kv_head * GROUP_SIZE + rows % GROUP_SIZE) * HEAD_DIM)[None, :]
            keep_rows = (rows < q_len * GROUP_SIZE)[None, :]
            dims = gl.arange(0, PART, layout=down)[:, None]
            element: gl.constexpr = out_ptr.dtype.element_ty
            gl.store(out_at + dims, (o0 * scale[None, :]).to(element), mask=keep_rows)
            gl.store(out_at + PART + dims, (o1 * scale[None, :]).to(element), mask=keep_rows)
            gl.store(out_at + 2 * PART + dims, (o2 * scale[None, :]).to(element), mask=keep_rows)
            gl.store(out_at + 3 * PART + dims, (o3 * scale[None, :]).to(element), mask=keep_rows)


@gluon.jit
def _first_consumer(descriptors, buffers, decode_buffers, schedule, sequences, output,
                    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                    HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                    GROUP_SIZE: gl.constexpr):
    _prefill_consumer(buffers, schedule, sequences, output, 0, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
                      BLOCK_N, STAGES, True)


@gluon.jit
def _second_consumer(descriptors, buffers, decode_buffers, schedule, sequences, output,
                     CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                     HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                     GROUP_SIZE: gl.constexpr):
    _prefill_consumer(buffers, schedule, sequences, output, 1, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
                      BLOCK_N, STAGES, True)


@gluon.jit
def _first_decoder(descriptors, buffers, decode_buffers, schedule, sequences, output,
                   CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                   HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                   GROUP_SIZE: gl.constexpr):
    _decoder(descriptors, decode_buffers, sequences, output, 0, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
             PAGE_SIZE, GROUP_SIZE, schedule[2])


@gluon.jit
def _second_decoder(descriptors, buffers, decode_buffers, schedule, sequences, output,
                    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                    HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                    GROUP_SIZE: gl.constexpr):
    _decoder(descriptors, decode_buffers, sequences, output, 1, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
             PAGE_SIZE, GROUP_SIZE, schedule[2])


@gluon.jit
def _third_decoder(descriptors, buffers, decode_buffers, schedule, sequences, output,
                   CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                   HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                   GROUP_SIZE: gl.constexpr):
    _decoder(descriptors, decode_buffers, sequences, output, 2, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
             PAGE_SIZE, GROUP_SIZE, schedule[2])


@gluon.jit
def attention_mixed_wide_hopper_kernel(
    q_desc, k_desc, v_desc, k_decode_desc, v_decode_desc, q_ptr, out_ptr,
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr,
    num_seqs, heads_kv, q_batch_rows, k_batch_rows, v_batch_rows, out_batch_rows, stride_qs, stride_os,
    page_table_stride, qk_scale, tail_rows,
    GROUP_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DECODE_BLOCK_N: gl.constexpr,
    DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
    HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr, LOG2_MAX_SEQS: gl.constexpr, DECODE_ROWS: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, DECODE_REGISTERS: gl.constexpr, PROBE: gl.constexpr = 0,
    DECODERS_N: gl.constexpr = 3,
):
    """attention_mixed_hopper_kernel's arguments and grid (persistent, one program per SM), with BLOCK_N 128 and
    decode tiles of DECODE_BLOCK_N = 16 keys (k_decode_desc / v_decode_desc blocks [16, D]) and DECODE_ROWS = 8.
    DECODE_REGISTERS: the third warp group's (the prefill producer and the decode warps); launch with maxnreg 168."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    MAX_SEQS: gl.constexpr = 1 << LOG2_MAX_SEQS
    DECODERS: gl.constexpr = DECODERS_N
    heads_q = heads_kv * GROUP_SIZE

    tile_ends, prefill_tiles = _prefill_schedule(cu_seqlens_q_ptr, num_seqs, out_ptr, tail_rows, stride_os, heads_q,
                                                 ROWS, HEAD_DIM, GROUP_SIZE, DECODE_ROWS, MAX_SEQS)
    prefill_items = prefill_tiles * heads_q

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    dq_smem = gl.allocate_shared_memory(q_desc.dtype, [DECODERS, DECODE_ROWS, HEAD_DIM],
                                        gl.NVMMASharedLayout.get_default_for([DECODE_ROWS, HEAD_DIM], q_desc.dtype))
    dk_smem = gl.allocate_shared_memory(k_decode_desc.dtype, [DECODERS * DECODE_STAGES, DECODE_BLOCK_N, HEAD_DIM],
                                        k_decode_desc.layout)
    dv_smem = gl.allocate_shared_memory(v_decode_desc.dtype, [DECODERS * DECODE_STAGES, DECODE_BLOCK_N, HEAD_DIM],
                                        v_decode_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    d_ready = gl.allocate_shared_memory(gl.int64, [DECODERS * DECODE_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=2)  # both consumer groups release Q
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(DECODERS * DECODE_STAGES):
        mbarrier.init(d_ready.index(i), count=1)
    _cta_barrier()  # the schedule is in shared memory before any partition reads it

    descriptors = (q_desc, k_desc, v_desc, k_decode_desc, v_decode_desc)
    buffers = (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)
    decode_buffers = (dq_smem, dk_smem, dv_smem, d_ready)
    schedule = (tile_ends, heads_q, PROBE)
    sequences = (cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, q_batch_rows, k_batch_rows,
                 v_batch_rows, out_batch_rows)
    output = (out_ptr, stride_os, qk_scale, q_ptr, stride_qs, page_table_ptr, page_table_stride, prefill_items,
              num_seqs, heads_kv)
    if DECODERS_N == 3:
        gl.warp_specialize([  # (constexprs stay constexprs only as direct members of an argument tuple literal)
            (_first_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                               HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                               GROUP_SIZE)),
            (_second_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                                HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                                GROUP_SIZE)),
            (_prefill_producer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                                 HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                                 GROUP_SIZE)),
            (_first_decoder, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                              HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                              GROUP_SIZE)),
            (_second_decoder, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                               HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                               GROUP_SIZE)),
            (_third_decoder, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                              HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                              GROUP_SIZE)),
        ], [4, 1, 1, 1, 1], [CONSUMER_REGISTERS, DECODE_REGISTERS, DECODE_REGISTERS, DECODE_REGISTERS,
                             DECODE_REGISTERS])
    else:
        gl.warp_specialize([  # (constexprs stay constexprs only as direct members of an argument tuple literal)
            (_first_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                               HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                               GROUP_SIZE)),
            (_second_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                                HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                                GROUP_SIZE)),
            (_prefill_producer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                                 HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                                 GROUP_SIZE)),
            (_first_decoder, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                              HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                              GROUP_SIZE)),
            (_second_decoder, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                               HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                               GROUP_SIZE)),
        ], [4, 1, 1, 1], [CONSUMER_REGISTERS, DECODE_REGISTERS, DECODE_REGISTERS, DECODE_REGISTERS])
