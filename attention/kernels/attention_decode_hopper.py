"""Decode on Hopper (sm90) in Gluon: a KV head's few query rows as wgmma's N, the keys as its M, TMA-fed.

A decode item is a sequence x a KV head: the KV head's query heads x the sequence's query tokens (4-64 packed rows:
a decode step, a speculative verification step) against the sequence's whole KV. Its work is streaming K and V
once; the tensor cores only have to keep up. Two partitions per program:

  * a producer warp loads the item's K / V tiles of BLOCK_N keys into a ring of STAGES slots by TMA (one load a
    tile, or one a page over pages smaller than a tile), running ahead into the program's next item; over pages
    of fewer than 16 tokens (GATHER: TMA's boxes would slice the swizzled tile off its 8-row pattern) it gathers
    the tile's rows by cp.async instead (GATHER warps of them), 16 bytes a lane, each lane's arrival completing a
    slot once its copies landed;
  * a warp group computes S^T = K Q^T ([keys, rows]: keys are wgmma's M, 64 per instruction; a decode's rows
    its N, as few as 8) and O^T += V^T P^T, P through shared memory as [rows, keys] (keys contiguous: the
    transposed [keys, rows] layout, 16 bytes a row at 8 rows, gave wrong sums over 128-key tiles with Triton 3.6
    on the H200); the softmax runs down S^T's columns. The next tile's S^T is issued while this tile's PV runs;
    its K slot goes back to the producer a tile before its V's.

attention_mixed_hopper.py runs the same two partitions beside its prefill ones (``_decode_producer`` and
``_decode`` there), one whole item at a time. attention_decode_hopper_kernel runs them alone, persistent (a
program takes items pid, pid + programs, ...) and with split-KV: item i is split i % num_splits of
sequence x KV head i // num_splits, an even share of that walk's KV tiles, and with more than one split writes
a normalised partial output and its log-sum-exp (log2 units) for combine.py's merge. With FUSED_MERGE the last
split of each walk to finish (an arrival counter per walk) merges them instead, in the same launch.

With HEADS > 1 an item is a sequence x HEADS neighbouring KV heads: a tile holds BLOCK_N / HEADS keys of each
head (a head's keys in a block of rows) and the heads' query heads are the item's rows, each masked against the
other heads' keys, so that a program reads a page's rows of HEADS heads back to back (HEADS programs would each
translate the page's address) while the wgmmas stay as many per byte as with one head of a few rows.

Masking as attention_fwd_hopper.py: keys past the sequence and the causal band are masked on the tiles that
need it, V rows past the sequence zeroed in shared memory before their PV, rows past the item not stored.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .attention_fwd_hopper import (
    _cta_barrier,
    _load_kv_tile,
    _load_paged_tile,
    _tile_page_rows,
    _tile_walk,
    _zero_rows_from,
    _zero_tail_rows,
)

_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
"""cp.async into shared memory (Triton 3.9 renamed Triton 3.6's async_copy_global_to_shared)."""

__all__ = ["MAX_DECODE_ROWS", "SMALL_DECODE_ROWS", "attention_decode_hopper_kernel"]

MAX_DECODE_ROWS = 64
"""The most packed rows (query tokens x query heads of a KV head) of a decode item (wgmma N of the decode tiles)."""

SMALL_DECODE_ROWS = 8
"""The fewest rows of a decode tile: wgmma's smallest N for 16-bit operands."""

GATHER_PRODUCER_REGISTERS = gl.constexpr(112)
"""The producer warps' registers when they gather pages by cp.async (16 row addresses a lane of one warp at a time;
sm90 ptxas, Triton 3.6: 32 B spilled at 112, 88 at 80); 24 when one warp only issues TMA loads."""


@gluon.jit
def _decode_walk(item, sequences, heads_kv, ROWS: gl.constexpr, DECODE_BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                 BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr,
                 GROUP_SIZE: gl.constexpr):
    """What both decode partitions need of decode item ``item`` (a sequence x a KV head): (whether the sequence is
    a decode: 1 to ROWS / GROUP_SIZE queries, seq, KV head, q_len, kv_len, its first query (a start offset or 0),
    causal diagonal offset, KV tiles, first masked tile, first K / V rows, its first packed query token)."""
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr = sequences[0], sequences[1], sequences[2], \
        sequences[3]
    k_batch_rows, v_batch_rows = sequences[5], sequences[6]
    seq = item // heads_kv
    q_begin = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_begin
    kv_len, q_first, kv_first, diag, num_tiles, first_masked = _tile_walk(
        seq, 0, q_len, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, q_len, DECODE_BLOCK_N, CAUSAL, BOTTOM_RIGHT,
        HAS_Q_START, HAS_KV_START)
    return ((q_len > 0) & (q_len * GROUP_SIZE <= ROWS), seq, item % heads_kv, q_len, kv_len,
            q_first, diag, num_tiles, first_masked, seq * k_batch_rows + kv_first,
            seq * v_batch_rows + kv_first, q_begin)


@gluon.jit
def _load_decode_tiles(kv_descriptors, decode_buffers, count, first_tile, num_tiles, k_row0, v_row0, kv_col, pages,
                       kv_len, PAGE_SIZE: gl.constexpr, GATHER: gl.constexpr, HEADS: gl.constexpr = 1):
    """The producer's part of an item: KV tiles first_tile .. first_tile + num_tiles - 1 into the decode ring, from
    its position ``count`` on, each slot once the decode warp group freed it. Over pages smaller than a tile, a
    tile's page ids are read a tile ahead of its loads: a table line missing in L2 (every 8 tiles at 16-token
    pages) then arrives while the slots of two tiles are awaited, not one. HEADS > 1 (TMA only): a tile holds
    BLOCK_N / HEADS keys of each of HEADS KV heads (attention_fwd_hopper._load_kv_tile's HEADS), so that a program
    reads a page's rows of those heads back to back, where HEADS programs would each translate its address."""
    _, dk_smem, dv_smem, dk_ready, dk_empty, dv_ready, dv_empty = decode_buffers[:7]
    DECODE_BLOCK_N: gl.constexpr = dk_smem.type.shape[1]
    DECODE_STAGES: gl.constexpr = dk_smem.type.shape[0]
    KEYS: gl.constexpr = DECODE_BLOCK_N // HEADS  # a KV head's keys in a tile
    ring = (dk_smem, dv_smem, dk_ready, dk_empty, dv_ready, dv_empty)
    if GATHER:  # kv_descriptors: (k, v, their token rows' strides)
        gl.static_assert(HEADS == 1, "KV heads share a tile only when TMA loads it")
        HALF: gl.constexpr = DECODE_BLOCK_N // 2
        first_key = first_tile * DECODE_BLOCK_N
        rows = (_gather_rows(pages, first_key, kv_len, HALF, PAGE_SIZE, GATHER),
                _gather_rows(pages, first_key + HALF, kv_len, HALF, PAGE_SIZE, GATHER))
        for i in range(num_tiles):
            # the next tile's rows (the last tile's again at the end: a hit), a register a lane a half
            next_key = (first_tile + gl.minimum(i + 1, num_tiles - 1)) * DECODE_BLOCK_N
            ahead = (_gather_rows(pages, next_key, kv_len, HALF, PAGE_SIZE, GATHER),
                     _gather_rows(pages, next_key + HALF, kv_len, HALF, PAGE_SIZE, GATHER))
            _gather_tile(kv_descriptors, ring, (count + i) % DECODE_STAGES, ((count + i) // DECODE_STAGES) & 1,
                         rows, kv_col, GATHER)
            rows = ahead
    elif PAGE_SIZE >= KEYS or PAGE_SIZE == 0:
        for i in range(num_tiles):
            _load_kv_tile(kv_descriptors, ring, (count + i) % DECODE_STAGES, ((count + i) // DECODE_STAGES) & 1,
                          first_tile + i, k_row0, v_row0, kv_col, pages, kv_len, KEYS, PAGE_SIZE, HEADS)
    else:
        page_rows = _tile_page_rows(pages, first_tile, kv_len, KEYS, PAGE_SIZE)
        for i in range(num_tiles):
            # the next tile's (the last tile's again at the end: a hit)
            ahead = _tile_page_rows(pages, first_tile + gl.minimum(i + 1, num_tiles - 1), kv_len, KEYS, PAGE_SIZE)
            _load_paged_tile(kv_descriptors, ring, (count + i) % DECODE_STAGES, ((count + i) // DECODE_STAGES) & 1,
                             page_rows, kv_col, PAGE_SIZE, HEADS)
            page_rows = ahead


@gluon.jit
def _gather_rows(pages, first_key, kv_len, KEYS: gl.constexpr, PAGE_SIZE: gl.constexpr, WARPS: gl.constexpr):
    """Keys first_key .. first_key + KEYS - 1 as rows of the page pool (GATHER), KEYS / 32 a lane of each of the
    WARPS producer warps (KEYS: half a tile, 32 at 64-key tiles, 64 at 128; read a tile ahead, they wait in one or two
    registers, not in the copies' layout, which holds KEYS / 2 rows a lane of one warp): keys past the sequence repeat
    its last key (masked and zeroed downstream as any row past it), so no table entry past the sequence is read."""
    keys = first_key + gl.arange(0, KEYS, layout=gl.BlockedLayout([KEYS // 32], [32], [WARPS], [0]))
    keys = gl.minimum(keys, gl.maximum(kv_len - 1, 0))
    return gl.load(pages + keys // PAGE_SIZE) * PAGE_SIZE + keys % PAGE_SIZE


@gluon.constexpr_function
def _gather_layout(head_dim, warps):
    """``warps`` warps over a [keys, head_dim] tile, 8 elements (16 bytes: one cp.async) a lane a row."""
    lanes_along = min(32, head_dim // 8)
    return gl.BlockedLayout([1, 8], [32 // lanes_along, lanes_along], [warps, 1], [1, 0])


@gluon.jit
def _gather_rows_into(tile, base, row_stride, rows, dims, WARPS: gl.constexpr):
    """cp.async of the [len(rows), D] rows at pool rows ``rows`` (_gather_rows's) from ``base`` into ``tile``."""
    rows = gl.convert_layout(rows, gl.SliceLayout(1, _gather_layout(tile.type.shape[1], WARPS))).to(gl.int64)
    _async_load(tile, base + (rows * row_stride)[:, None] + dims[None, :])


@gluon.jit
def _gather_tile(kv_pointers, ring, stage, phase, rows, kv_col, WARPS: gl.constexpr):
    """K then V of a tile's keys at pool rows ``rows`` (two halves, _gather_rows's) into ring slot ``stage`` by
    cp.async by WARPS warps, half a tile at a time (BLOCK_N / 4 / WARPS addresses a lane at d128), each once the
    consumers freed its slot; each lane's arrival on the slot's ready barrier lands with its copies."""
    k_ptr, v_ptr, k_row_stride, v_row_stride = kv_pointers
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ring
    gl.static_assert(v_smem.type.shape[0] == k_smem.type.shape[0], "a gathered ring has as many V slots as K slots")
    HALF: gl.constexpr = k_smem.type.shape[1] // 2
    HEAD_DIM: gl.constexpr = k_smem.type.shape[2]
    dims = kv_col + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, _gather_layout(HEAD_DIM, WARPS)))
    mbarrier.wait(k_empty.index(stage), phase ^ 1)  # a fresh barrier counts as released
    _gather_rows_into(k_smem.index(stage).slice(0, HALF), k_ptr, k_row_stride, rows[0], dims, WARPS)
    _gather_rows_into(k_smem.index(stage).slice(HALF, HALF), k_ptr, k_row_stride, rows[1], dims, WARPS)
    async_copy.mbarrier_arrive(k_ready.index(stage), increment_count=False)
    mbarrier.wait(v_empty.index(stage), phase ^ 1)
    _gather_rows_into(v_smem.index(stage).slice(0, HALF), v_ptr, v_row_stride, rows[0], dims, WARPS)
    _gather_rows_into(v_smem.index(stage).slice(HALF, HALF), v_ptr, v_row_stride, rows[1], dims, WARPS)
    async_copy.mbarrier_arrive(v_ready.index(stage), increment_count=False)


@gluon.jit
def _gather_decode_q(q_ptr, stride_qs, q_token0, kv_head, q_len, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr,
                     GROUP_SIZE: gl.constexpr):
    """An item's packed Q rows in registers (row r: query r // GROUP_SIZE, head kv_head * GROUP_SIZE + r % GROUP_SIZE,
    from token row q_token0), zeros past q_len queries."""
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q_rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, q_layout))
    q_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_layout))
    q_col = (kv_head * GROUP_SIZE + q_rows % GROUP_SIZE) * HEAD_DIM
    q_token = (q_token0 + q_rows // GROUP_SIZE).to(gl.int64)
    q_offsets = q_token[:, None] * stride_qs + (q_col[:, None] + q_cols[None, :])
    return gl.load(q_ptr + q_offsets, mask=(q_rows < q_len * GROUP_SIZE)[:, None], other=0.0)


@gluon.jit
def _store_decode_q(dq_smem, q):
    """Q rows into dq_smem for the wgmmas; every warp past the barrier."""
    dq_smem.store(q)
    fence_async_shared()
    _cta_barrier()


@gluon.jit
def _load_decode_q(dq_smem, q_ptr, stride_qs, q_token0, kv_head, q_len, GROUP_SIZE: gl.constexpr):
    """_gather_decode_q's rows into dq_smem."""
    _store_decode_q(dq_smem, _gather_decode_q(q_ptr, stride_qs, q_token0, kv_head, q_len, dq_smem.type.shape[0],
                                              dq_smem.type.shape[1], GROUP_SIZE))


@gluon.jit
def _decode_tiles(decode_buffers, count, first_tile, num_tiles, first_masked, kv_len, diag, qk_scale,
                  CAUSAL: gl.constexpr, GROUP_SIZE: gl.constexpr, GATHER: gl.constexpr, HEADS: gl.constexpr = 1):
    """The decode warp group's part of an item whose Q is in dq_smem: KV tiles first_tile .. first_tile + num_tiles
    - 1 from ring position ``count`` (GATHER: written by cp.async, so a proxy fence before a wgmma reads K; V's
    comes with P's). Returns O^T [HEAD_DIM, ROWS] (fp32, not yet divided by the sums), the rows'
    running max (log2 units, -inf for a row that saw no key) and their softmax sums.

    HEADS > 1: a tile holds KEYS = BLOCK_N / HEADS keys of each of HEADS KV heads (_load_decode_tiles's), and the
    item's GROUP_SIZE query heads are those heads' groups in order: a row's scores against the other heads' keys
    are masked on every tile, so one wgmma serves every head (block-diagonal S^T)."""
    dq_smem, dk_smem, dv_smem, dk_ready, dk_empty, dv_ready, dv_empty, dp_smem = decode_buffers
    ROWS: gl.constexpr = dq_smem.type.shape[0]
    HEAD_DIM: gl.constexpr = dq_smem.type.shape[1]
    DECODE_STAGES: gl.constexpr = dk_smem.type.shape[0]
    V_STAGES: gl.constexpr = dv_smem.type.shape[0]  # DECODE_STAGES, or a divisor of it (a shorter V ring)
    DECODE_BLOCK_N: gl.constexpr = dk_smem.type.shape[1]
    dtype: gl.constexpr = dq_smem.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, ROWS, 16])
    across: gl.constexpr = gl.SliceLayout(0, acc_layout)  # along axis 1: the item's rows
    KEYS: gl.constexpr = DECODE_BLOCK_N // HEADS  # a head's keys in a tile
    queries = gl.arange(0, ROWS, layout=across) // GROUP_SIZE  # a row's query index
    keys = gl.arange(0, DECODE_BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    if HEADS > 1:
        columns = gl.arange(0, ROWS, layout=across)
        same_head = (keys // KEYS)[:, None] == ((columns % GROUP_SIZE) // (GROUP_SIZE // HEADS))[None, :]
        keys = keys % KEYS
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=across)
    l_i = gl.zeros([DECODE_BLOCK_N, ROWS], gl.float32, layout=acc_layout)  # summed down at the end
    o = gl.zeros([HEAD_DIM, ROWS], gl.float32, layout=acc_layout)
    s = gl.zeros([DECODE_BLOCK_N, ROWS], gl.float32, layout=acc_layout)
    if num_tiles > 0:
        mbarrier.wait(dk_ready.index(count % DECODE_STAGES), (count // DECODE_STAGES) & 1)
        if GATHER:
            fence_async_shared()
        s = warpgroup_mma(dk_smem.index(count % DECODE_STAGES), dq_smem.permute((1, 0)), s, use_acc=False)
    for i in range(num_tiles):
        t = first_tile + i
        stage = (count + i) % DECODE_STAGES
        v_stage = (count + i) % V_STAGES
        if HEADS > 1:
            s = gl.where(same_head, s, float("-inf"))
        if t >= first_masked:
            key = t * KEYS + keys
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
        mbarrier.wait(dv_ready.index(v_stage), ((count + i) // V_STAGES) & 1)
        if (t + 1) * KEYS > kv_len:
            _zero_rows_from(dv_smem.index(v_stage), kv_len - t * KEYS, KEYS)
        dp_smem.store(gl.permute(p.to(dtype), (1, 0)))
        fence_async_shared()
        _cta_barrier()  # all of P in place for the wgmma
        o = o * alpha[None, :]
        o = warpgroup_mma(dv_smem.index(v_stage).permute((1, 0)), dp_smem.permute((1, 0)), o, is_async=True)
        # the next tile's scores while PV runs (the last tile's again: one shape for both branches)
        ahead = count + gl.minimum(i + 1, num_tiles - 1)
        mbarrier.wait(dk_ready.index(ahead % DECODE_STAGES), (ahead // DECODE_STAGES) & 1)
        if GATHER:
            fence_async_shared()
        s = warpgroup_mma(dk_smem.index(ahead % DECODE_STAGES), dq_smem.permute((1, 0)), s, use_acc=False,
                          is_async=True)
        o, s = warpgroup_mma_wait(num_outstanding=0, deps=(o, s))
        _cta_barrier()  # every warp is done with V_t, K_t+1 (and P) before they are written again
        # K_t+1's slot goes back now, a tile before its V's (its scores are in); K_0 goes with tile 0,
        # the last K after its repeated scores
        ahead_stage = (count + i + 1) % DECODE_STAGES
        mbarrier.arrive(dk_empty.index(ahead_stage), count=1, pred=i + 2 < num_tiles)
        mbarrier.arrive(dk_empty.index(stage), count=1, pred=(i == 0) | (i + 1 == num_tiles))
        mbarrier.arrive(dv_empty.index(v_stage), count=1)
    return o, m_i, gl.sum(l_i, axis=0)


@gluon.jit
def _decode_rows_out(o, l_sum, out_ptr, stride_os, out_token0, kv_head, q_len, GROUP_SIZE: gl.constexpr):
    """O^T / the sums into out: row r of the item to token row out_token0 + r // GROUP_SIZE, query head
    kv_head * GROUP_SIZE + r % GROUP_SIZE (rows past q_len queries not stored)."""
    HEAD_DIM: gl.constexpr = o.type.shape[0]
    ROWS: gl.constexpr = o.type.shape[1]
    acc_layout: gl.constexpr = o.type.layout
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(0, acc_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, acc_layout))
    o = o / gl.where(l_sum == 0.0, 1.0, l_sum)[None, :]
    out_token = (out_token0 + rows // GROUP_SIZE).to(gl.int64)
    out_col = (kv_head * GROUP_SIZE + rows % GROUP_SIZE) * HEAD_DIM
    offsets = out_token[None, :] * stride_os + (out_col[None, :] + dims[:, None])
    gl.store(out_ptr + offsets, o.to(out_ptr.dtype.element_ty), mask=(rows < q_len * GROUP_SIZE)[None, :])


@gluon.jit
def _decode_rows_partial(o, m_i, l_sum, partials, split, token0, kv_head, q_len, GROUP_SIZE: gl.constexpr):
    """A split's partial: O^T / the sums into partial_out[split, token, head, :] (fp32 [splits, total_q, H_q, D],
    tokens packed as cu_seqlens_q counts them, from token0) and m + log2(sum) into partial_lse[split, token, head]
    (-inf for a row that saw no key: the merge gives it no weight)."""
    partial_out_ptr, partial_lse_ptr, stride_split, stride_token, stride_lse_split, stride_lse_token = partials[:6]
    HEAD_DIM: gl.constexpr = o.type.shape[0]
    ROWS: gl.constexpr = o.type.shape[1]
    acc_layout: gl.constexpr = o.type.layout
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(0, acc_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, acc_layout))
    o = o / gl.where(l_sum == 0.0, 1.0, l_sum)[None, :]
    token = (token0 + rows // GROUP_SIZE).to(gl.int64)
    head = kv_head * GROUP_SIZE + rows % GROUP_SIZE
    keep = rows < q_len * GROUP_SIZE
    offsets = split * stride_split + token[None, :] * stride_token + (head * HEAD_DIM)[None, :] + dims[:, None]
    gl.store(partial_out_ptr + offsets, o, mask=keep[None, :])
    lse = gl.where(l_sum == 0.0, float("-inf"), m_i + gl.log2(l_sum))
    gl.store(partial_lse_ptr + split * stride_lse_split + token * stride_lse_token + head, lse, mask=keep)


@gluon.jit
def _merge_if_last(partials, walk, num_splits, token0, kv_head, q_len, out_ptr, stride_os, out_token0,
                   GROUP_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, SPLITS_BLOCK: gl.constexpr,
                   MERGE_ROWS: gl.constexpr):
    """Count this split of walk ``walk`` in; the walk's last split to arrive merges every split's partial rows into
    out (rows as _decode_rows_out's) and sets the counter back to 0. MERGE_ROWS rows at a time: a [SPLITS_BLOCK,
    MERGE_ROWS, HEAD_DIM] tile of partials, all of a row's splits in one thread's registers."""
    partial_out_ptr, partial_lse_ptr, stride_split, stride_token, stride_lse_split, stride_lse_token, counters_ptr \
        = partials
    _cta_barrier()  # every warp's partial stores before the arrival, which the counting thread releases
    arrived = gl.atomic_add(counters_ptr + walk, 1, sem="acq_rel", scope="gpu")
    if arrived == num_splits - 1:
        layout: gl.constexpr = gl.BlockedLayout([1, 1, HEAD_DIM // 32], [1, 1, 32], [1, 4, 1], [2, 1, 0])
        lse_layout: gl.constexpr = gl.SliceLayout(2, layout)  # [splits, rows]
        out_layout: gl.constexpr = gl.SliceLayout(0, layout)  # [rows, head dims]
        splits = gl.arange(0, SPLITS_BLOCK, layout=gl.SliceLayout(1, lse_layout))
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
        out_dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
        for first in range(0, q_len * GROUP_SIZE, MERGE_ROWS):
            rows = first + gl.arange(0, MERGE_ROWS, layout=gl.SliceLayout(0, lse_layout))
            head = kv_head * GROUP_SIZE + rows % GROUP_SIZE
            token = (token0 + rows // GROUP_SIZE).to(gl.int64)
            keep = (splits[:, None] < num_splits) & (rows < q_len * GROUP_SIZE)[None, :]
            # .cg: other SMs wrote these; the acquire above orders the loads, L1 must not answer them
            lse_offsets = splits[:, None] * stride_lse_split + (token * stride_lse_token + head)[None, :]
            lse = gl.load(partial_lse_ptr + lse_offsets, mask=keep, other=float("-inf"), cache_modifier=".cg")
            part = gl.load(partial_out_ptr + splits[:, None, None] * stride_split
                           + (token * stride_token + head * HEAD_DIM)[None, :, None] + dims[None, None, :],
                           mask=keep[:, :, None], other=0.0, cache_modifier=".cg")
            top = gl.max(lse, axis=0)
            weights = gl.exp2(lse - gl.where(top == float("-inf"), 0.0, top)[None, :])
            total = gl.sum(weights, axis=0)
            weights = weights / gl.where(total > 0.0, total, 1.0)[None, :]
            o = gl.sum(part * weights[:, :, None], axis=0)
            out_rows = first + gl.arange(0, MERGE_ROWS, layout=gl.SliceLayout(1, out_layout))
            out_token = (out_token0 + out_rows // GROUP_SIZE).to(gl.int64)
            out_col = (kv_head * GROUP_SIZE + out_rows % GROUP_SIZE) * HEAD_DIM
            gl.store(out_ptr + out_token[:, None] * stride_os + (out_col[:, None] + out_dims[None, :]),
                     o.to(out_ptr.dtype.element_ty), mask=(out_rows < q_len * GROUP_SIZE)[:, None])
        gl.atomic_xchg(counters_ptr + walk, 0)


@gluon.jit
def _split_item(item, num_splits, num_tiles):
    """Split ``item % num_splits``'s share of a walk of num_tiles KV tiles: (split, first tile, tiles)."""
    split = item % num_splits
    first = split * num_tiles // num_splits
    return split, first, (split + 1) * num_tiles // num_splits - first


@gluon.jit
def _split_producer(kv_descriptors, decode_buffers, sequences, output, partials, CAUSAL: gl.constexpr,
                    BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr,
                    PAGE_SIZE: gl.constexpr, GROUP_SIZE: gl.constexpr, WRITE_PARTIAL: gl.constexpr,
                    FUSED_MERGE: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr,
                    GATHER: gl.constexpr, HEADS: gl.constexpr):
    """1 warp (GATHER > 0: that many): the K / V tiles of the program's split items into the ring. The next item's
    walk (its lengths) is loaded before this item's tiles, so that its round trip to memory does not stall the loads
    between items."""
    dq_smem, dk_smem = decode_buffers[0], decode_buffers[1]
    page_table_ptr, page_table_stride, num_seqs, heads_kv, num_splits = output[5], output[6], output[7], output[8], \
        output[9]
    ROWS: gl.constexpr = dq_smem.type.shape[0]
    HEAD_DIM: gl.constexpr = dq_smem.type.shape[1]
    KEYS: gl.constexpr = dk_smem.type.shape[1] // HEADS  # a KV head's keys in a tile
    num_items = num_seqs * heads_kv * num_splits
    count = 0
    item = gl.program_id(0)
    walk = _decode_walk(item // num_splits, sequences, heads_kv, ROWS, KEYS, CAUSAL, BOTTOM_RIGHT,
                        HAS_Q_START, HAS_KV_START, GROUP_SIZE)
    while item < num_items:
        is_decode, seq, kv_head, _, kv_len, _, _, walk_tiles, _, k_row0, v_row0, _ = walk
        _, first_tile, num_tiles = _split_item(item, num_splits, walk_tiles)
        item += gl.num_programs(0)
        walk = _decode_walk(gl.minimum(item, num_items - 1) // num_splits, sequences, heads_kv, ROWS, KEYS,
                            CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START, GROUP_SIZE)
        if is_decode:
            pages = page_table_ptr + seq.to(gl.int64) * page_table_stride
            _load_decode_tiles(kv_descriptors, decode_buffers, count, first_tile, num_tiles, k_row0, v_row0,
                               kv_head * HEADS * HEAD_DIM, pages, kv_len, PAGE_SIZE, GATHER, HEADS)
            count += num_tiles


@gluon.jit
def _split_decode(kv_descriptors, decode_buffers, sequences, output, partials, CAUSAL: gl.constexpr,
                  BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr,
                  PAGE_SIZE: gl.constexpr, GROUP_SIZE: gl.constexpr, WRITE_PARTIAL: gl.constexpr,
                  FUSED_MERGE: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr,
                  GATHER: gl.constexpr, HEADS: gl.constexpr):
    """4 warps: the program's split items through their tiles, then their output rows or partials (with
    FUSED_MERGE, the last split of a walk merges them). The next item's walk (its lengths) and Q rows are loaded
    before this item's tiles: their round trips to memory overlap the tiles instead of stalling the tensor cores
    between items."""
    dq_smem, dk_smem = decode_buffers[0], decode_buffers[1]
    out_ptr, stride_os, qk_scale, q_ptr, stride_qs = output[0], output[1], output[2], output[3], output[4]
    num_seqs, heads_kv, num_splits = output[7], output[8], output[9]
    q_batch_rows, out_batch_rows = sequences[4], sequences[7]
    ROWS: gl.constexpr = dq_smem.type.shape[0]
    HEAD_DIM: gl.constexpr = dq_smem.type.shape[1]
    KEYS: gl.constexpr = dk_smem.type.shape[1] // HEADS  # a KV head's keys in a tile
    num_items = num_seqs * heads_kv * num_splits
    count = 0
    item = gl.program_id(0)
    walk = _decode_walk(item // num_splits, sequences, heads_kv, ROWS, KEYS, CAUSAL, BOTTOM_RIGHT,
                        HAS_Q_START, HAS_KV_START, GROUP_SIZE)
    q = _gather_decode_q(q_ptr, stride_qs, walk[1] * q_batch_rows + walk[5], walk[2], walk[3], ROWS, HEAD_DIM,
                         GROUP_SIZE)
    while item < num_items:
        is_decode, seq, kv_head, q_len, kv_len, q_first, diag, walk_tiles, first_masked, _, _, q_begin = walk
        split, first_tile, num_tiles = _split_item(item, num_splits, walk_tiles)
        walk_index = item // num_splits  # (seq, KV head): its arrival counter
        if is_decode:
            _store_decode_q(dq_smem, q)
        item += gl.num_programs(0)
        walk = _decode_walk(gl.minimum(item, num_items - 1) // num_splits, sequences, heads_kv, ROWS, KEYS,
                            CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START, GROUP_SIZE)
        q = _gather_decode_q(q_ptr, stride_qs, walk[1] * q_batch_rows + walk[5], walk[2], walk[3], ROWS, HEAD_DIM,
                             GROUP_SIZE)
        if is_decode:
            o, m_i, l_sum = _decode_tiles(decode_buffers, count, first_tile, num_tiles, first_masked, kv_len, diag,
                                          qk_scale, CAUSAL, GROUP_SIZE, GATHER, HEADS)
            count += num_tiles
            if WRITE_PARTIAL:
                _decode_rows_partial(o, m_i, l_sum, partials, split, q_begin, kv_head, q_len, GROUP_SIZE)
                if FUSED_MERGE:
                    _merge_if_last(partials, walk_index, num_splits, q_begin, kv_head, q_len, out_ptr,
                                   stride_os, seq * out_batch_rows + q_first, GROUP_SIZE, HEAD_DIM, SPLITS_BLOCK,
                                   MERGE_ROWS)
            else:
                _decode_rows_out(o, l_sum, out_ptr, stride_os, seq * out_batch_rows + q_first, kv_head, q_len,
                                 GROUP_SIZE)


@gluon.jit
def attention_decode_hopper_kernel(
    k_desc, v_desc, q_ptr, out_ptr, partial_out_ptr, partial_lse_ptr, split_counter_ptr,
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr,
    num_seqs, heads_kv, num_splits, q_batch_rows, k_batch_rows, v_batch_rows, out_batch_rows, stride_qs, stride_os,
    page_table_stride, qk_scale, stride_part_split, stride_part_token, stride_lse_split, stride_lse_token, tail_rows,
    k_row_stride, v_row_stride,
    GROUP_SIZE: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    PAGE_SIZE: gl.constexpr, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
    HAS_KV_START: gl.constexpr, WRITE_PARTIAL: gl.constexpr, FUSED_MERGE: gl.constexpr, SPLITS_BLOCK: gl.constexpr,
    MERGE_ROWS: gl.constexpr, GATHER: gl.constexpr, HEAD_DIM: gl.constexpr, HEADS: gl.constexpr = 1,
):
    """Grid (programs,), persistent: program p takes items p, p + programs, ... of num_seqs x heads_kv x num_splits
    (split fastest). k_desc / v_desc: TMA descriptors over 2-D views [token rows, H_kv x D] of K / V with blocks
    [min(BLOCK_N, PAGE_SIZE), D] (PAGE_SIZE 0: not paged, [BLOCK_N, D]); key j of sequence b is row
    b * k_batch_rows + kv_start[b] + j, or with pages row page_table[b, j // PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE.
    GATHER > 0 (pages of fewer than 16 tokens): that many producer warps gather K / V rows by cp.async, k_desc /
    v_desc being K's and V's pointers instead, their rows k_row_stride / v_row_stride elements apart (ignored
    otherwise); GATHER 0: one producer warp, TMA. HEADS > 1: an item takes KV heads h x HEADS .. h x HEADS +
    HEADS - 1 (heads_kv and GROUP_SIZE count items a sequence and their query heads), BLOCK_N / HEADS keys of each a
    tile (the TMA blocks' rows: [min(BLOCK_N / HEADS, PAGE_SIZE), D]); GATHER 0 only.
    q_ptr / out_ptr: token rows stride_qs / stride_os elements apart, query token i of sequence b at row
    b * *_batch_rows + q_start[b] + i, heads packed along the row. Every sequence has at most ROWS / GROUP_SIZE
    queries (ROWS: a power of 2 from 8 to MAX_DECODE_ROWS). WRITE_PARTIAL (num_splits > 1): partial_out fp32
    [num_splits, total_q, H_q, D] (head stride D) and partial_lse fp32 [num_splits, total_q, H_q] (head stride 1),
    tokens packed as cu_seqlens_q counts them, instead of out; with FUSED_MERGE (num_splits <= SPLITS_BLOCK) the
    last split of each walk to finish merges them into out, counting arrivals in split_counter_ptr[seq * heads_kv +
    kv_head] (zeros before the launch, zeros after). qk_scale in log2 units. tail_rows > 0 (thd,
    sequences back to back): out's rows cu_seqlens_q[num_seqs] .. tail_rows - 1 are written as zeros."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    if tail_rows > 0:  # (else no load here: the start of every program would wait for its round trip)
        _zero_tail_rows(out_ptr, gl.load(cu_seqlens_q_ptr + num_seqs), tail_rows, stride_os, heads_kv * GROUP_SIZE,
                        gl.program_id(0), gl.num_programs(0), HEAD_DIM)
    dq_smem = gl.allocate_shared_memory(dtype, [ROWS, HEAD_DIM], gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM],
                                                                                                       dtype))
    dp_smem = gl.allocate_shared_memory(dtype, [ROWS, BLOCK_N], gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N],
                                                                                                      dtype))
    if GATHER:
        kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
        dk_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
        dv_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
        kv_descriptors = (k_desc, v_desc, k_row_stride, v_row_stride)
    else:
        dk_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        dv_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        kv_descriptors = (k_desc, v_desc)
    dk_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dk_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        # a slot is ready on the TMA's byte count, or on the producer warps' cp.async arrivals, one a lane (GATHER)
        mbarrier.init(dk_ready.index(i), count=32 * GATHER if GATHER else 1)
        mbarrier.init(dv_ready.index(i), count=32 * GATHER if GATHER else 1)
        mbarrier.init(dk_empty.index(i), count=1)
        mbarrier.init(dv_empty.index(i), count=1)
    _cta_barrier()

    decode_buffers = (dq_smem, dk_smem, dv_smem, dk_ready, dk_empty, dv_ready, dv_empty, dp_smem)
    sequences = (cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, q_batch_rows, k_batch_rows,
                 v_batch_rows, out_batch_rows)
    output = (out_ptr, stride_os, qk_scale, q_ptr, stride_qs, page_table_ptr, page_table_stride, num_seqs, heads_kv,
              num_splits)
    partials = (partial_out_ptr, partial_lse_ptr, stride_part_split, stride_part_token, stride_lse_split,
                stride_lse_token, split_counter_ptr)
    gl.warp_specialize([  # (constexprs stay constexprs only as direct members of an argument tuple literal)
        (_split_decode, (kv_descriptors, decode_buffers, sequences, output, partials, CAUSAL, BOTTOM_RIGHT,
                         HAS_Q_START, HAS_KV_START, PAGE_SIZE, GROUP_SIZE, WRITE_PARTIAL, FUSED_MERGE, SPLITS_BLOCK,
                         MERGE_ROWS, GATHER, HEADS)),
        (_split_producer, (kv_descriptors, decode_buffers, sequences, output, partials, CAUSAL, BOTTOM_RIGHT,
                           HAS_Q_START, HAS_KV_START, PAGE_SIZE, GROUP_SIZE, WRITE_PARTIAL, FUSED_MERGE, SPLITS_BLOCK,
                           MERGE_ROWS, GATHER, HEADS)),
    ], [GATHER if GATHER else 1], [GATHER_PRODUCER_REGISTERS if GATHER else 24])
