"""The Triton forward kernel: varlen / paged / GQA-packed / split-KV attention in one launch.

Grid: (q-tile programs over the flattened query tokens, KV heads, KV splits). The kernel finds
its program's sequence and q tile; `_attend_q_tile` computes it (with the prefill tile, or in mixed
batches with SMALL_BLOCK_M > 0 a small tile for sequences of few queries).
 - Program (t, h, s) finds its sequence b by a binary search over cu_seqlens_q (vLLM's static
   bound: sequence b owns program ids cu_seqlens_q[b] // BLOCK_Q + b ...), exits when the tile is
   past b's queries.
 - Rows of the tile are GQA-packed: row r is query token r // GROUP_SIZE of the tile and query head
   h * GROUP_SIZE + r % GROUP_SIZE, so one K/V tile load serves every query head of KV head h and
   decode (one token) still fills a 16-row tensor-core tile.
 - The KV tiles a q tile can see are bounded by causal/window limits; split s takes a contiguous
   share of them. Tiles fully inside every row's visible band run without any masking; only the
   band edges and the partial last tile are masked.
 - Scores live in log2 units: scale * log2(e) is folded into one multiply and exp2 is used.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .sequence_lookup import find_sequence

__all__ = ["attention_fwd_kernel"]

LOG2E = tl.constexpr(1.4426950408889634)
MERGE_SPLITS = tl.constexpr(64)
"""The fused combine reads a row's LSEs in one load: configs.MAX_NUM_SPLITS (a test checks they agree)."""
MERGE_FLOATS = tl.constexpr(8192)
"""Floats per partial-output load of the fused combine: splits per load = MERGE_FLOATS // BLOCK_DV."""


@triton.jit
def _page_ids(page_table_row_ptr, stride_pt_p, tile, kv_len, valid,
              page_size, BLOCK_N: tl.constexpr, PAGE_SCALAR: tl.constexpr):
    """Cache page ids of KV tile `tile`: a scalar (PAGE_SCALAR) or one per key; 0 where not `valid`.
    (No `valid & ...` mask: Triton 3.9's interpreter turns a scalar bool and'ed with a block into int32.)"""
    if PAGE_SCALAR:
        index = tl.where(valid, (tile * BLOCK_N) // page_size, 0)
        return tl.where(valid, tl.load(page_table_row_ptr + index * stride_pt_p), 0)
    else:
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        return tl.load(page_table_row_ptr + (offs_n // page_size) * stride_pt_p,
                       mask=offs_n < tl.where(valid, kv_len, 0), other=0)


@triton.jit
def _tile_page_ids(page_table_row_ptr, stride_pt_p, tile, kv_len, valid,
                   BLOCK_N: tl.constexpr, PAGES_PER_TILE: tl.constexpr):
    """The PAGES_PER_TILE page ids of KV tile `tile` (pages holding no key of the sequence, or not
    `valid`: 0)."""
    pages = tile * PAGES_PER_TILE + tl.arange(0, PAGES_PER_TILE)
    return tl.load(page_table_row_ptr + pages * stride_pt_p,
                   mask=pages * (BLOCK_N // PAGES_PER_TILE) < tl.where(valid, kv_len, 0), other=0)


@triton.jit
def _load_tile_by_pages(k_base, v_base, page, tile, kv_len, stride_ks, stride_kp, stride_vs, stride_vp,
                        offs_dqk, offs_dv, dqk_in_bounds, dv_in_bounds,
                        BLOCK_N: tl.constexpr, PAGES_PER_TILE: tl.constexpr, BLOCK_DQK: tl.constexpr,
                        BLOCK_DV: tl.constexpr, MASKED: tl.constexpr, MASK_D: tl.constexpr,
                        INDEX_INT32: tl.constexpr):
    """K^T and V of a KV tile of whole pages (their ids `page`, [PAGES_PER_TILE]), read as [page, slot, D].

    Triton lays a load out along its contiguous dim (D), then the others in index order, so threads
    and warps spread over pages first: each thread's rows share one page, and a tile costs a thread
    one page id and one address, its rows constant offsets from it (as with one page per tile), where
    a [key, D] read needs a page id and an address per row (sm90 compile, Triton 3.6)."""
    SLOTS: tl.constexpr = BLOCK_N // PAGES_PER_TILE
    slot = tl.arange(0, SLOTS)[None, :]
    if INDEX_INT32:
        k_rows = page[:, None] * stride_kp + slot * stride_ks
        v_rows = page[:, None] * stride_vp + slot * stride_vs
    else:
        k_rows = page.to(tl.int64)[:, None] * stride_kp + slot.to(tl.int64) * stride_ks
        v_rows = page.to(tl.int64)[:, None] * stride_vp + slot.to(tl.int64) * stride_vs
    k_ptrs = k_base + k_rows[:, :, None] + offs_dqk[None, None, :]
    v_ptrs = v_base + v_rows[:, :, None] + offs_dv[None, None, :]
    if MASKED:
        keys = tile * BLOCK_N + tl.arange(0, PAGES_PER_TILE)[:, None] * SLOTS + slot
        in_bounds = (keys < kv_len)[:, :, None]
        k = tl.load(k_ptrs, mask=in_bounds & dqk_in_bounds[None, None, :], other=0.0)
        v = tl.load(v_ptrs, mask=in_bounds & dv_in_bounds[None, None, :], other=0.0)
    elif MASK_D:
        k = tl.load(k_ptrs, mask=dqk_in_bounds[None, None, :], other=0.0)
        v = tl.load(v_ptrs, mask=dv_in_bounds[None, None, :], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    return tl.trans(tl.reshape(k, [BLOCK_N, BLOCK_DQK])), tl.reshape(v, [BLOCK_N, BLOCK_DV])


@triton.jit
def _load_k_tile(k_base, k_rows, offs_dqk, key_in_bounds, dqk_in_bounds,
                 MASK_KEYS: tl.constexpr, MASK_D: tl.constexpr, TRANSPOSED: tl.constexpr):
    """K^T [D, BLOCK_N] of one KV tile: read [BLOCK_N, D] like V and transposed as a shared-memory
    view (both loads share one layout, so page ids load once per tile), or with TRANSPOSED read as
    [D, BLOCK_N] directly. Keys masked with MASK_KEYS, padded head dims with MASK_D (else unmasked)."""
    if TRANSPOSED:
        ptrs = k_base + k_rows[None, :] + offs_dqk[:, None]
        if MASK_KEYS:
            k_t = tl.load(ptrs, mask=dqk_in_bounds[:, None] & key_in_bounds[None, :], other=0.0)
        elif MASK_D:
            k_t = tl.load(ptrs, mask=dqk_in_bounds[:, None], other=0.0)
        else:
            k_t = tl.load(ptrs)
    else:
        ptrs = k_base + k_rows[:, None] + offs_dqk[None, :]
        if MASK_KEYS:
            k_t = tl.trans(tl.load(ptrs, mask=key_in_bounds[:, None] & dqk_in_bounds[None, :], other=0.0))
        elif MASK_D:
            k_t = tl.trans(tl.load(ptrs, mask=dqk_in_bounds[None, :], other=0.0))
        else:
            k_t = tl.trans(tl.load(ptrs))
    return k_t


@triton.jit
def _tile_at(step, tile_begin, num_tiles, rotation, ROTATE: tl.constexpr):
    """The KV tile visited at loop step `step` of [tile_begin, tile_begin + num_tiles)."""
    if ROTATE:
        return tile_begin + (step - tile_begin + rotation) % num_tiles
    else:
        return step


@triton.jit
def _attend_kv_tiles(
    acc, l_i, m_i, q,
    tile_begin, tile_end,
    k_ptr, v_ptr, k_head_offset, v_head_offset,
    kv_seq_offset_k, kv_seq_offset_v, page_table_row_ptr, stride_pt_p, page_size,
    stride_ks, stride_kp, stride_vs, stride_vp,
    kv_len, row_token, diag_offset, window_left, window_right, alibi_row_slope,
    qk_scale,
    offs_dqk, offs_dv,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, MASKED: tl.constexpr,
    WINDOW_LEFT_BOUNDED: tl.constexpr, WINDOW_RIGHT_BOUNDED: tl.constexpr,
    HAS_ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PAGE_SCALAR: tl.constexpr, PREFETCH_PAGES: tl.constexpr, rotation, ROTATE: tl.constexpr,
    k_desc, v_desc, USE_TMA: tl.constexpr, INDEX_INT32: tl.constexpr, K_TRANSPOSED: tl.constexpr,
    PAGES_PER_TILE: tl.constexpr,
):
    """Online-softmax accumulation over KV tiles [tile_begin, tile_end) of one sequence.

    MASKED=False is the fast path for tiles that every row sees entirely (no key-position
    masks, no bounds checks on keys); MASKED=True handles band edges and the ragged last tile.
    Paged caches: PAGE_SCALAR (page_size a multiple of BLOCK_N) reads one page id per tile and
    addresses the tile as one contiguous run of slots; PREFETCH_PAGES loads the next tile's page
    ids one iteration ahead, so the K/V loads do not wait on a page-table load of their own
    iteration. ROTATE starts the walk at tile_begin + rotation % num_tiles and wraps around, so
    programs of different sequences do not stream the same cache offsets in lockstep.
    USE_TMA: tiles come through the tensor descriptors k_desc / v_desc (Hopper's bulk tensor
    copies): non-paged, over the sequence's rows (rows past it and columns past the head dim read as
    zeros); paged (PAGE_SCALAR only), over all cache rows [pages * page_size, D], one page per tile.
    INDEX_INT32 (every element offset of k and v fits in int32): the per-key offsets of a tile stay
    32-bit instead of 64. PAGES_PER_TILE > 0 (pages smaller than a tile, a tile of whole pages): one
    page id per page of the tile, the tile read page by page (_load_tile_by_pages).
    """
    dqk_in_bounds = offs_dqk < HEAD_DIM_QK
    dv_in_bounds = offs_dv < HEAD_DIM_V
    num_tiles = tl.maximum(tile_end - tile_begin, 1)
    if PAGED and PREFETCH_PAGES:
        if PAGES_PER_TILE > 0:
            next_page = _tile_page_ids(page_table_row_ptr, stride_pt_p,
                                       _tile_at(tile_begin, tile_begin, num_tiles, rotation, ROTATE), kv_len,
                                       tile_begin < tile_end, BLOCK_N, PAGES_PER_TILE)
        else:
            next_page = _page_ids(page_table_row_ptr, stride_pt_p,
                                  _tile_at(tile_begin, tile_begin, num_tiles, rotation, ROTATE), kv_len,
                                  tile_begin < tile_end, page_size, BLOCK_N, PAGE_SCALAR)
    for step in range(tile_begin, tile_end):
        tile = _tile_at(step, tile_begin, num_tiles, rotation, ROTATE)
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_in_bounds = offs_n < kv_len
        if PAGED and PAGES_PER_TILE > 0:
            if PREFETCH_PAGES:
                page = next_page
                next_page = _tile_page_ids(page_table_row_ptr, stride_pt_p,
                                           _tile_at(step + 1, tile_begin, num_tiles, rotation, ROTATE), kv_len,
                                           step + 1 < tile_end, BLOCK_N, PAGES_PER_TILE)
            else:
                page = _tile_page_ids(page_table_row_ptr, stride_pt_p, tile, kv_len, True, BLOCK_N, PAGES_PER_TILE)
            k_t, v = _load_tile_by_pages(
                k_ptr + k_head_offset, v_ptr + v_head_offset, page, tile, kv_len, stride_ks, stride_kp,
                stride_vs, stride_vp, offs_dqk, offs_dv, dqk_in_bounds, dv_in_bounds, BLOCK_N, PAGES_PER_TILE,
                BLOCK_DQK, BLOCK_DV, MASKED, BLOCK_DQK != HEAD_DIM_QK or BLOCK_DV != HEAD_DIM_V, INDEX_INT32)
        elif PAGED:
            if PREFETCH_PAGES:
                page = next_page
                next_page = _page_ids(page_table_row_ptr, stride_pt_p,
                                      _tile_at(step + 1, tile_begin, num_tiles, rotation, ROTATE), kv_len,
                                      step + 1 < tile_end, page_size, BLOCK_N, PAGE_SCALAR)
            elif PAGE_SCALAR:
                page = tl.load(page_table_row_ptr + ((tile * BLOCK_N) // page_size) * stride_pt_p)
            elif MASKED:
                # One vector of page ids per tile (a tile may span several pages).
                page = tl.load(page_table_row_ptr + (offs_n // page_size) * stride_pt_p,
                               mask=key_in_bounds, other=0)
            else:
                page = tl.load(page_table_row_ptr + (offs_n // page_size) * stride_pt_p)
            if PAGE_SCALAR:
                slot = (tile * BLOCK_N) % page_size + tl.arange(0, BLOCK_N)
            else:
                slot = offs_n % page_size
            if INDEX_INT32:
                k_rows = page * stride_kp + slot * stride_ks
                v_rows = page * stride_vp + slot * stride_vs
            else:
                k_rows = page.to(tl.int64) * stride_kp + slot.to(tl.int64) * stride_ks
                v_rows = page.to(tl.int64) * stride_vp + slot.to(tl.int64) * stride_vs
            k_base = k_ptr + k_head_offset
            v_ptrs = v_ptr + v_head_offset + v_rows[:, None] + offs_dv[None, :]
        else:
            if INDEX_INT32:
                k_rows = offs_n * stride_ks
                v_rows = offs_n * stride_vs
            else:
                k_rows = offs_n.to(tl.int64) * stride_ks
                v_rows = offs_n.to(tl.int64) * stride_vs
            k_base = k_ptr + k_head_offset + kv_seq_offset_k
            v_ptrs = v_ptr + v_head_offset + kv_seq_offset_v + v_rows[:, None] + offs_dv[None, :]
        if PAGED and PAGES_PER_TILE > 0:
            pass  # loaded above, page by page
        elif USE_TMA and PAGED:
            # One page holds the whole tile (PAGE_SCALAR): rows of the [pages * page_size, D] view.
            row = (page * page_size + (tile * BLOCK_N) % page_size).to(tl.int32)
            k_t = tl.trans(k_desc.load([row, 0]))
            v = v_desc.load([row, 0])
            if MASKED:  # slots past the sequence are stale cache rows (maybe NaN): 0 * NaN is NaN
                v = tl.where(key_in_bounds[:, None], v, 0.0)
        elif USE_TMA:
            k_t = tl.trans(k_desc.load([tile * BLOCK_N, 0]))
            v = v_desc.load([tile * BLOCK_N, 0])
        elif MASKED:
            k_t = _load_k_tile(k_base, k_rows, offs_dqk, key_in_bounds, dqk_in_bounds, True, True, K_TRANSPOSED)
            v = tl.load(v_ptrs, mask=key_in_bounds[:, None] & dv_in_bounds[None, :], other=0.0)
        elif BLOCK_DQK == HEAD_DIM_QK and BLOCK_DV == HEAD_DIM_V:
            k_t = _load_k_tile(k_base, k_rows, offs_dqk, key_in_bounds, dqk_in_bounds, False, False, K_TRANSPOSED)
            v = tl.load(v_ptrs)
        else:
            k_t = _load_k_tile(k_base, k_rows, offs_dqk, key_in_bounds, dqk_in_bounds, False, True, K_TRANSPOSED)
            v = tl.load(v_ptrs, mask=dv_in_bounds[None, :], other=0.0)

        scores = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale
        if HAS_ALIBI:
            distance = (row_token + diag_offset)[:, None] - offs_n[None, :]
            distance = tl.where(distance < 0, -distance, distance)
            scores -= alibi_row_slope[:, None] * distance.to(tl.float32)
        if MASKED:
            visible = key_in_bounds[None, :]
            if WINDOW_RIGHT_BOUNDED:
                visible = visible & (offs_n[None, :] <= (row_token + diag_offset + window_right)[:, None])
            if WINDOW_LEFT_BOUNDED:
                visible = visible & (offs_n[None, :] >= (row_token + diag_offset - window_left)[:, None])
            scores = tl.where(visible, scores, float("-inf"))

        acc, l_i, m_i = online_softmax_step(scores, v, acc, l_i, m_i, MASKED, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attend_q_tile(
    seq, q_begin, q_len, first_query, kv_head, split, num_splits,
    q_ptr, k_ptr, v_ptr, out_ptr, partial_out_ptr, partial_lse_ptr,
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr, alibi_slopes_ptr,
    softmax_offset_ptr, split_counter_ptr, page_size, num_cache_rows,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh, stride_pt_b, stride_pt_p, stride_alibi_b,
    stride_part_split, stride_part_tok, stride_part_head, stride_lse_split, stride_lse_tok,
    qk_scale, window_left, window_right,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, HAS_Q_START: tl.constexpr, HAS_KV_START: tl.constexpr,
    WINDOW_LEFT_BOUNDED: tl.constexpr, WINDOW_RIGHT_BOUNDED: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr, WRITE_PARTIAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PAGE_SCALAR: tl.constexpr, PREFETCH_PAGES: tl.constexpr,
    ROTATE_KV: tl.constexpr, USE_TMA: tl.constexpr, FUSED_COMBINE: tl.constexpr, INDEX_INT32: tl.constexpr,
    K_TRANSPOSED: tl.constexpr, PAGES_PER_TILE: tl.constexpr,
):
    """Attention of one q tile (BLOCK_Q query tokens x GROUP_SIZE heads = BLOCK_M packed rows) of
    sequence `seq` against KV split `split`, written to out (or to the split workspace; with
    FUSED_COMBINE the last split of the tile to finish merges the workspace into out)."""
    split64 = split.to(tl.int64)

    kv_len = tl.load(cu_seqlens_kv_ptr + seq + 1) - tl.load(cu_seqlens_kv_ptr + seq)
    if BOTTOM_RIGHT:
        diag_offset = kv_len - q_len
    else:
        diag_offset = kv_len * 0

    # Packed rows: query token first_query + r // G, query head kv_head * G + r % G.
    offs_m = tl.arange(0, BLOCK_M)
    row_token = first_query + offs_m // GROUP_SIZE
    row_head = kv_head * GROUP_SIZE + offs_m % GROUP_SIZE
    row_valid = (offs_m < BLOCK_Q * GROUP_SIZE) & (row_token < q_len)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)

    seq64 = seq.to(tl.int64)
    q_row_token = row_token
    if HAS_Q_START:
        q_row_token = row_token + tl.load(q_start_ptr + seq)
    q_ptrs = (q_ptr + seq64 * stride_qb + q_row_token.to(tl.int64)[:, None] * stride_qs
              + row_head[:, None] * stride_qh + offs_dqk[None, :])
    q = tl.load(q_ptrs, mask=row_valid[:, None] & (offs_dqk < HEAD_DIM_QK)[None, :], other=0.0)

    if HAS_ALIBI:
        alibi_row_slope = tl.load(alibi_slopes_ptr + seq64 * stride_alibi_b + row_head).to(tl.float32) * LOG2E
    else:
        alibi_row_slope = tl.zeros([BLOCK_M], dtype=tl.float32)

    # KV range this q tile can see, and the sub-range every valid row sees entirely.
    last_query = tl.minimum(first_query + BLOCK_Q, q_len) - 1
    lo_key = kv_len * 0
    full_lo_key = kv_len * 0
    hi_key = kv_len
    full_hi_key = kv_len
    if WINDOW_LEFT_BOUNDED:
        lo_key = tl.maximum(first_query + diag_offset - window_left, 0)
        full_lo_key = tl.maximum(last_query + diag_offset - window_left, 0)
    if WINDOW_RIGHT_BOUNDED:
        hi_key = tl.maximum(tl.minimum(last_query + diag_offset + window_right + 1, kv_len), 0)
        full_hi_key = tl.maximum(tl.minimum(first_query + diag_offset + window_right + 1, kv_len), 0)
    tile_lo = lo_key // BLOCK_N
    tile_hi = tl.maximum((hi_key + BLOCK_N - 1) // BLOCK_N, tile_lo)
    full_tile_lo = tl.minimum(tl.maximum((full_lo_key + BLOCK_N - 1) // BLOCK_N, tile_lo), tile_hi)
    full_tile_hi = tl.minimum(tl.maximum(full_hi_key // BLOCK_N, full_tile_lo), tile_hi)

    tiles_per_split = (tile_hi - tile_lo + num_splits - 1) // num_splits
    split_lo = tl.minimum(tile_lo + split * tiles_per_split, tile_hi)
    split_hi = tl.minimum(split_lo + tiles_per_split, tile_hi)

    if PAGED:
        kv_seq_offset_k = seq64 * 0
        kv_seq_offset_v = seq64 * 0
        page_table_row_ptr = page_table_ptr + seq64 * stride_pt_b
    else:
        kv_first = seq64 * 0
        if HAS_KV_START:
            kv_first = tl.load(kv_start_ptr + seq).to(tl.int64)
        kv_seq_offset_k = seq64 * stride_kb + kv_first * stride_ks
        kv_seq_offset_v = seq64 * stride_vb + kv_first * stride_vs
        page_table_row_ptr = page_table_ptr
    k_head_offset = kv_head.to(tl.int64) * stride_kh
    v_head_offset = kv_head.to(tl.int64) * stride_vh
    rotation = seq * 13 + kv_head * 7 + split * 3  # any spread; taken modulo the tile count
    k_desc = None
    v_desc = None
    if USE_TMA and PAGED:
        k_desc = tl.make_tensor_descriptor(k_ptr + k_head_offset, shape=[num_cache_rows, HEAD_DIM_QK],
                                           strides=[stride_ks, 1], block_shape=[BLOCK_N, BLOCK_DQK])
        v_desc = tl.make_tensor_descriptor(v_ptr + v_head_offset, shape=[num_cache_rows, HEAD_DIM_V],
                                           strides=[stride_vs, 1], block_shape=[BLOCK_N, BLOCK_DV])
    elif USE_TMA:
        k_desc = tl.make_tensor_descriptor(k_ptr + kv_seq_offset_k + k_head_offset, shape=[kv_len, HEAD_DIM_QK],
                                           strides=[stride_ks, 1], block_shape=[BLOCK_N, BLOCK_DQK])
        v_desc = tl.make_tensor_descriptor(v_ptr + kv_seq_offset_v + v_head_offset, shape=[kv_len, HEAD_DIM_V],
                                           strides=[stride_vs, 1], block_shape=[BLOCK_N, BLOCK_DV])

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Left band edge (masked), fully visible middle (unmasked), right edge + ragged tail (masked).
    acc, l_i, m_i = _attend_kv_tiles(
        acc, l_i, m_i, q, split_lo, tl.minimum(full_tile_lo, split_hi),
        k_ptr, v_ptr, k_head_offset, v_head_offset, kv_seq_offset_k, kv_seq_offset_v,
        page_table_row_ptr, stride_pt_p, page_size, stride_ks, stride_kb, stride_vs, stride_vb,
        kv_len, row_token, diag_offset, window_left, window_right, alibi_row_slope, qk_scale,
        offs_dqk, offs_dv, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, BLOCK_N, PAGED, True,
        WINDOW_LEFT_BOUNDED, WINDOW_RIGHT_BOUNDED, HAS_ALIBI, DOT_PRECISION, PAGE_SCALAR, PREFETCH_PAGES,
        rotation, False, k_desc, v_desc, USE_TMA, INDEX_INT32, K_TRANSPOSED, PAGES_PER_TILE)
    acc, l_i, m_i = _attend_kv_tiles(
        acc, l_i, m_i, q, tl.maximum(split_lo, full_tile_lo), tl.minimum(full_tile_hi, split_hi),
        k_ptr, v_ptr, k_head_offset, v_head_offset, kv_seq_offset_k, kv_seq_offset_v,
        page_table_row_ptr, stride_pt_p, page_size, stride_ks, stride_kb, stride_vs, stride_vb,
        kv_len, row_token, diag_offset, window_left, window_right, alibi_row_slope, qk_scale,
        offs_dqk, offs_dv, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, BLOCK_N, PAGED, False,
        WINDOW_LEFT_BOUNDED, WINDOW_RIGHT_BOUNDED, HAS_ALIBI, DOT_PRECISION, PAGE_SCALAR, PREFETCH_PAGES,
        rotation, ROTATE_KV, k_desc, v_desc, USE_TMA, INDEX_INT32, K_TRANSPOSED, PAGES_PER_TILE)
    acc, l_i, m_i = _attend_kv_tiles(
        acc, l_i, m_i, q, tl.maximum(split_lo, full_tile_hi), split_hi,
        k_ptr, v_ptr, k_head_offset, v_head_offset, kv_seq_offset_k, kv_seq_offset_v,
        page_table_row_ptr, stride_pt_p, page_size, stride_ks, stride_kb, stride_vs, stride_vb,
        kv_len, row_token, diag_offset, window_left, window_right, alibi_row_slope, qk_scale,
        offs_dqk, offs_dv, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, BLOCK_N, PAGED, True,
        WINDOW_LEFT_BOUNDED, WINDOW_RIGHT_BOUNDED, HAS_ALIBI, DOT_PRECISION, PAGE_SCALAR, PREFETCH_PAGES,
        rotation, False, k_desc, v_desc, USE_TMA, INDEX_INT32, K_TRANSPOSED, PAGES_PER_TILE)

    dv_mask = row_valid[:, None] & (offs_dv < HEAD_DIM_V)[None, :]
    out_ptrs = (out_ptr + seq64 * stride_ob + q_row_token.to(tl.int64)[:, None] * stride_os
                + row_head[:, None] * stride_oh + offs_dv[None, :])
    if WRITE_PARTIAL:
        has_keys = l_i > 0.0
        o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        lse = tl.where(has_keys, m_i + tl.math.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        packed_token = (q_begin + row_token).to(tl.int64)
        part_ptrs = (partial_out_ptr + packed_token[:, None] * stride_part_tok
                     + row_head[:, None] * stride_part_head + offs_dv[None, :])
        tl.store(part_ptrs + split64 * stride_part_split, o, mask=dv_mask)
        lse_ptrs = partial_lse_ptr + packed_token * stride_lse_tok + row_head
        tl.store(lse_ptrs + split64 * stride_lse_split, lse, mask=row_valid)
        if FUSED_COMBINE:
            # Every thread's partial stores precede the arrival count (barrier, then a release by the
            # counting thread); the last split to arrive acquires them and merges. It resets the
            # counter, so the buffer is all zeros again for the next launch.
            tl.debug_barrier()
            arrived = tl.atomic_add(split_counter_ptr, 1, sem="acq_rel")
            if arrived == num_splits - 1:
                num_rows = (tl.minimum(first_query + BLOCK_Q, q_len) - first_query) * GROUP_SIZE
                _merge_splits(partial_out_ptr, partial_lse_ptr, out_ptr + seq64 * stride_ob, q_start_ptr + seq,
                              softmax_offset_ptr, q_begin + first_query, first_query, kv_head * GROUP_SIZE, num_rows,
                              num_splits, stride_part_split, stride_part_tok, stride_part_head,
                              stride_lse_split, stride_lse_tok, stride_os, stride_oh,
                              GROUP_SIZE, HEAD_DIM_V, BLOCK_DV, HAS_Q_START, HAS_SINK)
                tl.atomic_xchg(split_counter_ptr, 0)
    else:
        o = normalized_output(acc, l_i, m_i, softmax_offset_ptr, row_head, HAS_SINK)
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=dv_mask)


@triton.jit
def online_softmax_step(scores, v, acc, l_i, m_i, ROWS_MAY_BE_EMPTY: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One KV tile into the running softmax: scores [M, N] (log2 units, masked keys -inf), v [N, D];
    returns (acc, l_i, m_i). ROWS_MAY_BE_EMPTY: a row may have seen no key yet (max -inf), so the
    shift is 0 there and exp2 gives 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    if ROWS_MAY_BE_EMPTY:
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    p = tl.math.exp2(scores - m_new_safe[:, None])
    alpha = tl.math.exp2(m_i - m_new_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def normalized_output(acc, l_i, m_i, softmax_offset_ptr, row_head, HAS_SINK: tl.constexpr):
    """acc / l per row (m_i, l_i: the running max in log2 units and the sum), the sink exp(offset of the
    row's head) added to l first with HAS_SINK; a row that saw no key (and no sink) gets zeros."""
    if HAS_SINK:
        sink = tl.load(softmax_offset_ptr + row_head).to(tl.float32) * LOG2E
        m_total = tl.maximum(m_i, sink)
        rescale = tl.math.exp2(m_i - m_total)
        l_i = l_i * rescale + tl.math.exp2(sink - m_total)
        acc = acc * rescale[:, None]
    return acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]


@triton.jit
def _merge_splits(partial_out_ptr, partial_lse_ptr, out_seq_ptr, q_start_seq_ptr, softmax_offset_ptr,
                  first_packed_token, first_query, first_head, num_rows, num_splits,
                  stride_part_split, stride_part_tok, stride_part_head, stride_lse_split, stride_lse_tok,
                  stride_os, stride_oh,
                  GROUP_SIZE: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                  HAS_Q_START: tl.constexpr, HAS_SINK: tl.constexpr):
    """out = sum_s w_s O_s / (sum_s w_s + exp(sink)), w_s = exp2(lse_s - max), for the first `num_rows`
    packed rows of one q tile (row r: query first_query + r // G, head first_head + r % G): what
    combine_splits_kernel computes per token. Row by row, the splits of a row in [CHUNK, D_v] loads
    (MERGE_FLOATS: one load up to 64 splits at d128), so a row costs about one round trip to L2
    whatever the split count (loads bypass L1, ".cg": other SMs wrote them). One split per loop step
    over all rows at once had measured 1x8k (64 splits) at 41-44 µs on the H200, against 25 µs with
    the separate combine launch: 64 dependent round trips."""
    CHUNK: tl.constexpr = MERGE_FLOATS // BLOCK_DV
    offs_split = tl.arange(0, MERGE_SPLITS).to(tl.int64)
    offs_chunk = tl.arange(0, CHUNK).to(tl.int64)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_valid = offs_dv < HEAD_DIM_V
    out_first = first_query
    if HAS_Q_START:
        out_first += tl.load(q_start_seq_ptr)
    for row in range(num_rows):
        token = (first_packed_token + row // GROUP_SIZE).to(tl.int64)
        head = first_head + row % GROUP_SIZE
        lse_row_ptr = partial_lse_ptr + token * stride_lse_tok + head
        part_row_ptr = partial_out_ptr + token * stride_part_tok + head * stride_part_head
        lse = tl.load(lse_row_ptr + offs_split * stride_lse_split, mask=offs_split < num_splits,
                      other=float("-inf"), cache_modifier=".cg")
        m = tl.max(lse, 0)
        if HAS_SINK:
            sink = tl.load(softmax_offset_ptr + head).to(tl.float32) * LOG2E
            m = tl.maximum(m, sink)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        denominator = tl.sum(tl.math.exp2(lse - m_safe), 0)
        if HAS_SINK:
            denominator += tl.math.exp2(sink - m_safe)
        o = tl.zeros([BLOCK_DV], dtype=tl.float32)
        for first_split in range(0, num_splits, CHUNK):
            splits = first_split + offs_chunk
            valid = splits < num_splits
            chunk_lse = tl.load(lse_row_ptr + splits * stride_lse_split, mask=valid, other=float("-inf"),
                                cache_modifier=".cg")
            partial = tl.load(part_row_ptr + splits[:, None] * stride_part_split + offs_dv[None, :],
                              mask=valid[:, None] & dv_valid[None, :], other=0.0, cache_modifier=".cg")
            o += tl.sum(partial * tl.math.exp2(chunk_lse - m_safe)[:, None], 0)
        o = o / tl.where(denominator > 0.0, denominator, 1.0)
        out_token = (out_first + row // GROUP_SIZE).to(tl.int64)
        tl.store(out_seq_ptr + out_token * stride_os + head * stride_oh + offs_dv,
                 o.to(out_seq_ptr.dtype.element_ty), mask=dv_valid)


@triton.jit
def _zero_tail_rows(out_ptr, tail_first_ptr, chunk, tail_rows, rows_per_chunk, kv_head, stride_os, stride_oh,
                    GROUP_SIZE: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Zeros in rows [max(*tail_first_ptr, chunk * rows_per_chunk), min(tail_rows, (chunk + 1) * rows_per_chunk))
    of out, for the GROUP_SIZE query heads of ``kv_head`` (out's rows are packed tokens: batch stride 0)."""
    first = tl.maximum(tl.load(tail_first_ptr), chunk * rows_per_chunk)
    end = tl.minimum(tail_rows, (chunk + 1) * rows_per_chunk)
    offs_dv = tl.arange(0, BLOCK_DV)
    zeros = tl.zeros([BLOCK_DV], dtype=out_ptr.dtype.element_ty)
    row_ptr = out_ptr + first.to(tl.int64) * stride_os + kv_head * GROUP_SIZE * stride_oh
    for _ in range(first, end):
        for head in range(GROUP_SIZE):
            tl.store(row_ptr + head * stride_oh + offs_dv, zeros, mask=offs_dv < HEAD_DIM_V)
        row_ptr += stride_os


@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    partial_out_ptr, partial_lse_ptr,
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr,
    page_table_ptr, alibi_slopes_ptr, softmax_offset_ptr, split_counter_ptr,
    num_seqs, tiles_per_seq, page_size, num_cache_rows,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_pt_b, stride_pt_p,
    stride_alibi_b,
    stride_part_split, stride_part_tok, stride_part_head,
    stride_lse_split, stride_lse_tok,
    qk_scale, window_left, window_right,
    tail_first_program, tail_rows, tail_rows_per_program,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, HAS_Q_START: tl.constexpr, HAS_KV_START: tl.constexpr,
    WINDOW_LEFT_BOUNDED: tl.constexpr, WINDOW_RIGHT_BOUNDED: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr, WRITE_PARTIAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PAGE_SCALAR: tl.constexpr, PREFETCH_PAGES: tl.constexpr,
    ROTATE_KV: tl.constexpr, USE_TMA: tl.constexpr, SMALL_BLOCK_M: tl.constexpr, SMALL_BLOCK_Q: tl.constexpr,
    FUSED_COMBINE: tl.constexpr, INDEX_INT32: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HEAVY_TILES_FIRST: tl.constexpr, K_TRANSPOSED: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr,
    SEQ_GRID: tl.constexpr, PAGES_PER_TILE: tl.constexpr, ZERO_TAIL: tl.constexpr,
):
    """Strides: dense k/v use (batch, token, head); paged k/v use (page, slot, head).

    WRITE_PARTIAL (split-KV): write fp32 O normalised by this split's sum and its LSE (log2 units)
    to the workspace at the packed token index; the combine kernel merges splits and applies sinks,
    or with FUSED_COMBINE the last split program of each (q tile, KV head) does, counting arrivals
    in split_counter_ptr[tile_id * H_kv + kv_head] (zeros before the launch, zeros after).
    SMALL_BLOCK_M > 0 (mixed batches): a sequence with at most SMALL_BLOCK_Q queries (a decode, a
    short verification step) runs a SMALL_BLOCK_M-row tile instead of the BLOCK_M-row prefill tile.
    HEAVY_TILES_FIRST: program t of a sequence with n q tiles takes tile n - 1 - t.
    SEQ_GRID: the grid is sequence-major, `tiles_per_seq` q-tile programs per sequence (enough for the
    longest), and program t is local tile t % tiles_per_seq of sequence t // tiles_per_seq; decode and
    speculative verification have one (tiles_per_seq == 1, which Triton compiles in), batches of equal
    lengths as many as each needs. Otherwise a program finds its sequence by a binary search over
    cu_seqlens_q: log2(batch) dependent loads from a cold L2 before the first K/V load, paid by every
    program of a one-wave decode at once (H200 sweep: 64x4k 258.7 -> 254.2 µs without the search; the
    small-batch cells, one to three loads, did not move).
    LAUNCH_DEPENDENTS: each program lets the next kernel of the stream launch (launched with
    programmatic dependent launch, the split combine: it waits for this grid before reading partials).
    PAGES_PER_TILE > 0 (a paged cache with PAGE_SIZE * PAGES_PER_TILE == BLOCK_N): KV tiles are read page
    by page, one page id per page (_load_tile_by_pages).
    ZERO_TAIL (thd, sequences back to back): programs from tail_first_program on write zeros to the
    padding rows cu_seqlens_q[num_seqs] .. tail_rows - 1 of out, tail_rows_per_program rows each, the
    query heads of their KV head (split 0 only), instead of a memset of the whole output beforehand.
    PAGE_SIZE > 0 replaces the runtime page_size with a compile-time constant (one compile per cache
    geometry): a key's page and slot (key // page_size, key % page_size) then fold into shifts
    and per-thread constants. With the runtime value sm90 code does a signed division per key and
    tile row: 148 integer multiply-adds per unmasked d128 tile at page 16 against 42 with one page id
    per tile. PAGE_SIZE == 0 keeps it a runtime value (a variant the sweep weighs on decode).
    """
    if PAGE_SIZE > 0:
        page_size = PAGE_SIZE
    if LAUNCH_DEPENDENTS:  # programmatic dependent launch: the combine kernel may start (and wait) now
        tl.extra.cuda.gdc_launch_dependents()
    tile_id = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    if ZERO_TAIL:
        if tile_id >= tail_first_program:
            if split == 0:
                _zero_tail_rows(out_ptr, cu_seqlens_q_ptr + num_seqs, tile_id - tail_first_program, tail_rows,
                                tail_rows_per_program, kv_head, stride_os, stride_oh, GROUP_SIZE, HEAD_DIM_V,
                                BLOCK_DV)
            return

    if SEQ_GRID:  # sequence-major grid: the program id names the sequence, no search
        seq = tile_id // tiles_per_seq
        local_tile = tile_id % tiles_per_seq
    else:
        seq = find_sequence(cu_seqlens_q_ptr, num_seqs, tile_id, BLOCK_Q, True)
    q_begin = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_begin
    if not SEQ_GRID:
        local_tile = tile_id - (q_begin // BLOCK_Q + seq)
    if HEAVY_TILES_FIRST:  # the sequence's last q tile (under a causal mask the one seeing most keys) first
        local_tile = (q_len + BLOCK_Q - 1) // BLOCK_Q - 1 - local_tile
        if local_tile < 0:
            return
    first_query = local_tile * BLOCK_Q
    if first_query >= q_len:
        return
    split_counter = split_counter_ptr + tile_id * tl.num_programs(1) + kv_head
    if SMALL_BLOCK_M > 0:  # constexpr: with SMALL_BLOCK_M == 0 the small-tile call is not compiled at all
        if q_len <= SMALL_BLOCK_Q:  # then first_query == 0: the whole sequence is this tile
            _attend_q_tile(
                seq, q_begin, q_len, first_query, kv_head, split, num_splits,
                q_ptr, k_ptr, v_ptr, out_ptr, partial_out_ptr, partial_lse_ptr,
                cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr, alibi_slopes_ptr,
                softmax_offset_ptr, split_counter, page_size, num_cache_rows,
                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                stride_ob, stride_os, stride_oh, stride_pt_b, stride_pt_p, stride_alibi_b,
                stride_part_split, stride_part_tok, stride_part_head, stride_lse_split, stride_lse_tok,
                qk_scale, window_left, window_right,
                SMALL_BLOCK_M, SMALL_BLOCK_Q,
                HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, GROUP_SIZE, BLOCK_N,
                PAGED, HAS_Q_START, HAS_KV_START, WINDOW_LEFT_BOUNDED, WINDOW_RIGHT_BOUNDED, BOTTOM_RIGHT,
                HAS_ALIBI, HAS_SINK, WRITE_PARTIAL, DOT_PRECISION, PAGE_SCALAR, PREFETCH_PAGES, ROTATE_KV,
                USE_TMA, FUSED_COMBINE, INDEX_INT32, K_TRANSPOSED, PAGES_PER_TILE)
            return
    _attend_q_tile(
        seq, q_begin, q_len, first_query, kv_head, split, num_splits,
        q_ptr, k_ptr, v_ptr, out_ptr, partial_out_ptr, partial_lse_ptr,
        cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr, alibi_slopes_ptr,
        softmax_offset_ptr, split_counter, page_size, num_cache_rows,
        stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_ob, stride_os, stride_oh, stride_pt_b, stride_pt_p, stride_alibi_b,
        stride_part_split, stride_part_tok, stride_part_head, stride_lse_split, stride_lse_tok,
        qk_scale, window_left, window_right,
        BLOCK_M, BLOCK_Q,
        HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DQK, BLOCK_DV, GROUP_SIZE, BLOCK_N,
        PAGED, HAS_Q_START, HAS_KV_START, WINDOW_LEFT_BOUNDED, WINDOW_RIGHT_BOUNDED, BOTTOM_RIGHT,
        HAS_ALIBI, HAS_SINK, WRITE_PARTIAL, DOT_PRECISION, PAGE_SCALAR, PREFETCH_PAGES, ROTATE_KV,
        USE_TMA, FUSED_COMBINE, INDEX_INT32, K_TRANSPOSED, PAGES_PER_TILE)
