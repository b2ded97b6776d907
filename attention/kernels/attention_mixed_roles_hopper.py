"""Mixed batches on Hopper (sm90) in one launch, one role a program at a time, prefill split by keys (Gluon).

attention_mixed_hopper.py runs a prefill pipeline and a decode pipeline side by side in every program; its prefill
then gets 64-key tiles and 176 registers, and a 2k chunk on a 14k prefix runs ~15 % slower in it than in the prefill
kernel. This kernel keeps the prefill kernel's shape whole (a TMA producer warp, two consumer warp groups of 64 query
rows, a ring of two 128-key K / V stages, consumers at 240 registers) and gives a program one kind of item at a time:

  * a prefill item is a key split: 1 / PREFILL_SPLITS of a q tile's KV walk (128 queries of one head), run as the
    prefill kernel runs a tile. With more than one split each consumer group writes its rows' partial output and
    log-sum-exp and the last split of the rows to arrive merges them (attention_decode_hopper's _merge_if_last).
    Splits make items shorter (~70 µs for a 2k chunk on 14k at 3 splits, against 213 unsplit) for a shorter tail,
    at the price of the partials and their merges (hopper_mixed_roles.MIXED_ROLES_SPLITS has what that measured).
  * a decode item is a (sequence, KV head) walk, run by consumer group 0 alone as the decode kernel runs one
    (_load_decode_tiles, _decode_tiles): the item takes the ring's two slots whole and sees them as four stages of
    64 keys (_decode_ring); group 1 waits for the next item. A program's walks read ~60 GB/s (H200, 2026-12-02), as
    the decode kernel's do with one program an SM and as they did here halved between the two groups over the slots'
    halves (two stages each, and a merge of the halves through shared memory): this layout is the simpler, with the
    same speed, 8-14 KB less shared memory and fewer spills. Two decode programs an SM read ~120 GB/s.

One list is dealt to the programs, round by round in alternating directions: the prefill splits (KV head by KV
head, a query head's q tiles heaviest first), then the decode walks. A program runs its decodes in one block placed
among its splits by its program id, so at any time a fifth or so of the SMs stream decodes while the rest compute
prefill. (Decodes spread evenly among each program's splits ran on every SM at once, every program's k-th item
having the same role.) Either way the decodes cost their bytes at one SM's decode rate, spread over the SMs: ~160 µs
a GB on M2, which hides nothing (hopper_mixed_roles.MIXED_ROLES_ENV has the figures). Every
partition walks its program's items on its own, the producer running ahead into the next item's tiles while the
consumers finish one.

Finding prefill items needs per-sequence query lengths, which the host does not have: each program counts each
sequence's q tiles into running sums in shared memory first (attention_mixed_hopper.py's schedule).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .attention_decode_hopper import (
    _decode_rows_out,
    _decode_tiles,
    _decode_walk,
    _load_decode_q,
    _load_decode_tiles,
    _merge_if_last,
    _split_item,
)
from .attention_fwd_hopper import (
    _cta_barrier,
    _load_kv_tile,
    _prefill_tiles,
    _tma_load,
)
from .attention_mixed_hopper import _prefill_item, _prefill_schedule, _prefill_walk

__all__ = ["attention_mixed_roles_hopper_kernel"]

_smem_reinterpret = getattr(gl.shared_memory_descriptor, "reinterpret", None) or \
    gl.shared_memory_descriptor._reinterpret  # (Triton 3.6's name, the H200's; 3.9: reinterpret)


@gluon.jit
def _dealt(work):
    """How many of the first ``work`` items of a list this program is dealt, round by round in alternating
    directions (program p takes item p of the first round, the (programs - 1 - p)-th of the second, ...)."""
    rounds = work // gl.num_programs(0)
    last = gl.where(rounds % 2 == 0, gl.program_id(0), gl.num_programs(0) - 1 - gl.program_id(0))
    return rounds + (last < work % gl.num_programs(0)).to(gl.int32)


@gluon.jit
def _dealt_item(j):
    """This program's j-th item of a list dealt as _dealt deals it."""
    return j * gl.num_programs(0) + gl.where(j % 2 == 0, gl.program_id(0), gl.num_programs(0) - 1 - gl.program_id(0))


@gluon.jit
def _program_items(prefill_work, decode_work):
    """(this program's prefill splits, its decode walks). One list is dealt: the prefill splits, then the decode
    walks, so a program dealt one split fewer than others is dealt the next round's decode walks first."""
    prefills = _dealt(prefill_work)
    return prefills, _dealt(prefill_work + decode_work) - prefills


@gluon.jit
def _program_item(k, prefills, decodes, prefill_work):
    """This program's k-th item: (a decode walk?, its index in the decode list, or in the prefill list). The program
    runs its ``decodes`` walks in one block placed among its ``prefills`` splits by its program id (after none of
    them for program 0, after all of them for the last), so at any time about 1 / (prefills + 1) of the SMs stream
    decodes and the rest compute prefill splits."""
    first_decode = gl.program_id(0) * (prefills + 1) // gl.num_programs(0)
    is_decode = (k >= first_decode) & (k < first_decode + decodes)
    prefill = gl.where(k < first_decode, k, k - decodes)
    decode = _dealt_item(prefills + k - first_decode) - prefill_work
    return is_decode, gl.where(is_decode, decode, _dealt_item(prefill))


@gluon.jit
def _prefill_item_of(index, tile_ends, per_kv_head, GROUP_SIZE: gl.constexpr, WARPS: gl.constexpr):
    """Prefill item ``index`` -> (sequence, local q tile, query head): KV head by KV head (per_kv_head items each,
    the items in flight share a few KV heads' K / V in L2), within one query head's q tiles, heaviest first, then the
    next's. (A q tile's query heads side by side left whole heads' worth of keys to the deal's last round: its
    heaviest program carried 1.08x the mean on M2's prefill, 1.03x so, a CPU model.)"""
    tiles = per_kv_head // GROUP_SIZE
    within = index % per_kv_head
    seq, local_tile, _ = _prefill_item(within % tiles, tile_ends, 1, WARPS)
    return seq, local_tile, (index // per_kv_head) * GROUP_SIZE + within // tiles


@gluon.jit
def _take_ring(ring, count, STAGES: gl.constexpr):
    """The producer's side of a decode item, which takes ring positions count .. count + STAGES - 1 whole (their
    slots become the decode ring): each slot once both consumer groups freed it, then its ready barriers' phase
    completed without bytes, so the positions count like any other on both sides."""
    _, _, k_ready, k_empty, v_ready, v_empty = ring
    for s in gl.static_range(STAGES):
        stage = (count + s) % STAGES
        phase = ((count + s) // STAGES) & 1
        mbarrier.wait(k_empty.index(stage), phase ^ 1)
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        mbarrier.arrive(k_ready.index(stage), count=1)
        mbarrier.arrive(v_ready.index(stage), count=1)


@gluon.jit
def _hold_ring(ring, count, STAGES: gl.constexpr):
    """A consumer group's side of _take_ring, before it uses or releases the positions (group 1, with nothing to
    do, would otherwise release a slot for this item while group 0 still holds it for an earlier one)."""
    k_ready, v_ready = ring[2], ring[4]
    for s in gl.static_range(STAGES):
        mbarrier.wait(k_ready.index((count + s) % STAGES), ((count + s) // STAGES) & 1)
        mbarrier.wait(v_ready.index((count + s) % STAGES), ((count + s) // STAGES) & 1)


@gluon.jit
def _release_ring(ring, count, STAGES: gl.constexpr):
    """A consumer group's release of the positions a decode item took."""
    k_empty, v_empty = ring[3], ring[5]
    for s in gl.static_range(STAGES):
        mbarrier.arrive(k_empty.index((count + s) % STAGES), count=1)
        mbarrier.arrive(v_empty.index((count + s) % STAGES), count=1)


@gluon.jit
def _producer(descriptors, buffers, decode_buffers, schedule, sequences, output,
              CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
              HAS_KV_START: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, GROUP_SIZE: gl.constexpr,
              PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr):
    """1 warp: the program's items' loads: a prefill split's Q halves (once the consumers released the previous
    split's) and its K / V tiles, or a decode walk's 64-key tiles into the decode ring (the prefill ring's slots, taken
    whole for the walk)."""
    q_desc, k_desc, v_desc, k_half_desc, v_half_desc = descriptors
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = buffers
    tile_ends, per_kv_head, prefill_work, decode_work = schedule
    page_table_ptr, page_table_stride, heads_kv = output[5], output[6], output[8]
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    DECODE_BLOCK_N: gl.constexpr = BLOCK_N // 2  # a decode tile: half a ring slot
    DECODE_ROWS: gl.constexpr = decode_buffers[0].type.shape[0]
    ring = (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty)
    decode_ring = _decode_ring(k_smem, v_smem, decode_buffers)
    count = 0  # ring stages loaded so far
    decode_tiles = 0  # decode tiles loaded so far
    prefills = 0  # prefill splits so far (the Q buffer's phase)
    prefills_dealt, decodes_dealt = _program_items(prefill_work, decode_work)
    for k in range(prefills_dealt + decodes_dealt):
        is_decode, index = _program_item(k, prefills_dealt, decodes_dealt, prefill_work)
        if is_decode:
            is_walk, seq, kv_head, _, kv_len, _, _, num_tiles, _, k_row0, v_row0, _ = _decode_walk(
                index, sequences, heads_kv, DECODE_ROWS, DECODE_BLOCK_N, CAUSAL, BOTTOM_RIGHT, HAS_Q_START,
                HAS_KV_START, GROUP_SIZE)
            if is_walk:
                _take_ring(ring, count, STAGES)
                count += STAGES
                pages = page_table_ptr + seq.to(gl.int64) * page_table_stride
                _load_decode_tiles((k_half_desc, v_half_desc), decode_ring, decode_tiles, 0, num_tiles, k_row0, v_row0,
                                   kv_head * HEAD_DIM, pages, kv_len, PAGE_SIZE, False)
                decode_tiles += num_tiles
        else:
            seq, local_tile, q_head = _prefill_item_of(index // PREFILL_SPLITS, tile_ends, per_kv_head,
                                                       GROUP_SIZE, 1)
            prefill = _prefill_walk(seq, local_tile, q_head, sequences, ROWS, BLOCK_N, CAUSAL, BOTTOM_RIGHT,
                                    HAS_Q_START, HAS_KV_START)
            kv_len, walk_tiles, q_row0, k_row0, v_row0 = prefill[2], prefill[4], prefill[6], prefill[7], prefill[8]
            _, first_tile, num_tiles = _split_item(index, PREFILL_SPLITS, walk_tiles)
            pages = page_table_ptr + seq.to(gl.int64) * page_table_stride
            mbarrier.wait(q_empty, (prefills & 1) ^ 1)
            mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
            _tma_load(q_desc, [q_row0, q_head * HEAD_DIM], q_ready, q_smem.index(0))
            _tma_load(q_desc, [q_row0 + ROWS, q_head * HEAD_DIM], q_ready, q_smem.index(1))
            kv_col = (q_head // GROUP_SIZE) * HEAD_DIM
            for t in range(num_tiles):
                _load_kv_tile((k_desc, v_desc), ring, count % STAGES, (count // STAGES) & 1, first_tile + t, k_row0,
                              v_row0, kv_col, pages, kv_len, BLOCK_N, PAGE_SIZE)
                count += 1
            prefills += 1


@gluon.jit
def _prefill_rows_out(o, m_i, l_i, split, group_rows, q_head, token0, out_row0, output, partials,
                      PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr):
    """A consumer group's rows of a prefill split (``group_rows`` of its 64 are the sequence's): normalized into out
    (one split), or as a partial (O / sums and log2-sum-exp at packed token rows token0 ..) that the split of these
    rows arriving last merges into out."""
    out_ptr, stride_os, heads_q = output[0], output[1], output[9]
    ROWS: gl.constexpr = o.type.shape[0]
    HEAD_DIM: gl.constexpr = o.type.shape[1]
    o_layout: gl.constexpr = o.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = gl.arange(0, ROWS, layout=row_o)
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    l_o = gl.convert_layout(l_i, row_o)
    o = o / gl.where(l_o == 0.0, 1.0, l_o)[:, None]
    keep = rows < group_rows
    if PREFILL_SPLITS == 1:
        offsets = (out_row0 + rows.to(gl.int64))[:, None] * stride_os + (q_head * HEAD_DIM + dims)[None, :]
        gl.store(out_ptr + offsets, o.to(out_ptr.dtype.element_ty), mask=keep[:, None])
    else:
        partial_out_ptr, partial_lse_ptr, stride_split, stride_token, stride_lse_split, stride_lse_token = \
            partials[:6]
        token = (token0 + rows).to(gl.int64)
        offsets = split * stride_split + token[:, None] * stride_token + (q_head * HEAD_DIM + dims)[None, :]
        gl.store(partial_out_ptr + offsets, o, mask=keep[:, None])
        m_o = gl.convert_layout(m_i, row_o)
        lse = gl.where(l_o == 0.0, float("-inf"), m_o + gl.log2(l_o))
        gl.store(partial_lse_ptr + split * stride_lse_split + token * stride_lse_token + q_head, lse, mask=keep)
        # one counter per (first packed row of the group, query head)
        _merge_if_last(partials, token0 * heads_q + q_head, PREFILL_SPLITS, token0, q_head, group_rows, out_ptr,
                       stride_os, out_row0, 1, HEAD_DIM, SPLITS_BLOCK, MERGE_ROWS)


@gluon.jit
def _decode_ring(k_smem, v_smem, decode_buffers):
    """The decode kernel's buffers (attention_decode_hopper's decode_buffers: dq, K, V, their four barriers, dp) over
    the prefill ring: its K / V slots seen as 2 * STAGES stages of BLOCK_N / 2 keys (each a run of the slots' bytes,
    in the slots' layout: only the decode ring's loads and reads see them so)."""
    dq_smem, dp_smem, dk_ready, dk_empty, dv_ready, dv_empty = decode_buffers
    STAGES: gl.constexpr = k_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[2]
    dk_smem = _smem_reinterpret(k_smem, k_smem.dtype, [2 * STAGES, BLOCK_N // 2, HEAD_DIM], k_smem.type.layout)
    dv_smem = _smem_reinterpret(v_smem, v_smem.dtype, [2 * STAGES, BLOCK_N // 2, HEAD_DIM], v_smem.type.layout)
    return (dq_smem, dk_smem, dv_smem, dk_ready, dk_empty, dv_ready, dv_empty, dp_smem)


@gluon.jit
def _consumer(descriptors, buffers, decode_buffers, schedule, sequences, output, partials, GROUP: gl.constexpr,
              CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
              HAS_KV_START: gl.constexpr, STAGES: gl.constexpr, GROUP_SIZE: gl.constexpr,
              PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr):
    """4 warps (one warp group): the program's items; of a prefill split, query rows 64 * GROUP .. of its tile; a
    decode walk, group 0 alone (group 1 waits for the next item)."""
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = buffers
    tile_ends, per_kv_head, prefill_work, decode_work = schedule
    out_ptr, stride_os, qk_scale, q_ptr, stride_qs, heads_kv = output[0], output[1], output[2], output[3], \
        output[4], output[8]
    q_batch_rows, out_batch_rows = sequences[4], sequences[7]
    ring = (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty)
    decode_ring = _decode_ring(k_smem, v_smem, decode_buffers)
    dq_smem = decode_ring[0]
    ROWS: gl.constexpr = q_smem.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    DECODE_BLOCK_N: gl.constexpr = BLOCK_N // 2  # a decode tile: half a ring slot
    DECODE_ROWS: gl.constexpr = dq_smem.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    rows = GROUP * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))  # of the q tile
    count = 0
    prefills = 0
    decode_tiles = 0
    prefills_dealt, decodes_dealt = _program_items(prefill_work, decode_work)
    for k in range(prefills_dealt + decodes_dealt):
        is_decode, index = _program_item(k, prefills_dealt, decodes_dealt, prefill_work)
        if is_decode:
            is_walk, seq, kv_head, q_len, kv_len, q_first, diag, num_tiles, first_masked, _, _, _ = _decode_walk(
                index, sequences, heads_kv, DECODE_ROWS, DECODE_BLOCK_N, CAUSAL, BOTTOM_RIGHT, HAS_Q_START,
                HAS_KV_START, GROUP_SIZE)
            if is_walk:
                _hold_ring(ring, count, STAGES)
                if GROUP == 0:
                    _load_decode_q(dq_smem, q_ptr, stride_qs, seq * q_batch_rows + q_first, kv_head, q_len,
                                   GROUP_SIZE)
                    o, m_i, l_sum = _decode_tiles(decode_ring, decode_tiles, 0, num_tiles, first_masked, kv_len, diag,
                                                  qk_scale, CAUSAL, GROUP_SIZE, False)
                    decode_tiles += num_tiles
                    _decode_rows_out(o, l_sum, out_ptr, stride_os, seq * out_batch_rows + q_first, kv_head, q_len,
                                     GROUP_SIZE)
                _release_ring(ring, count, STAGES)
                count += STAGES
        else:
            seq, local_tile, q_head = _prefill_item_of(index // PREFILL_SPLITS, tile_ends, per_kv_head,
                                                       GROUP_SIZE, 4)
            prefill = _prefill_walk(seq, local_tile, q_head, sequences, ROWS, BLOCK_N, CAUSAL, BOTTOM_RIGHT,
                                    HAS_Q_START, HAS_KV_START)
            first_query, q_len, kv_len, diag, walk_tiles, first_masked = prefill[0], prefill[1], prefill[2], \
                prefill[3], prefill[4], prefill[5]
            split, first_tile, num_tiles = _split_item(index, PREFILL_SPLITS, walk_tiles)
            mbarrier.wait(q_ready, prefills & 1)
            o, m_i, l_i = _prefill_tiles(q_smem.index(GROUP), (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty),
                                         count, first_tile, num_tiles, first_masked, rows, kv_len, diag + first_query,
                                         qk_scale, CAUSAL, STAGES)
            _cta_barrier()  # every warp's last wgmma on Q is done before Q goes back
            mbarrier.arrive(q_empty, count=1)
            count += num_tiles
            prefills += 1
            group_rows = gl.minimum(gl.maximum(q_len - first_query - GROUP * ROWS, 0), ROWS)
            token0 = prefill[10] + first_query + GROUP * ROWS  # its first row's packed token
            _prefill_rows_out(o, m_i, l_i, split, group_rows, q_head, token0, prefill[9] + GROUP * ROWS, output,
                              partials, PREFILL_SPLITS, SPLITS_BLOCK, MERGE_ROWS)


@gluon.jit
def _first_consumer(descriptors, buffers, decode_buffers, schedule, sequences, output, partials,
                    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                    HAS_KV_START: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                    GROUP_SIZE: gl.constexpr, PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr,
                    MERGE_ROWS: gl.constexpr):
    _consumer(descriptors, buffers, decode_buffers, schedule, sequences, output, partials, 0, CAUSAL, BOTTOM_RIGHT,
              HAS_Q_START, HAS_KV_START, STAGES, GROUP_SIZE, PREFILL_SPLITS, SPLITS_BLOCK, MERGE_ROWS)


@gluon.jit
def _second_consumer(descriptors, buffers, decode_buffers, schedule, sequences, output, partials,
                     CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                     HAS_KV_START: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                     GROUP_SIZE: gl.constexpr, PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr,
                     MERGE_ROWS: gl.constexpr):
    """A worker partition: the same signature as the others (Gluon's rule for workers)."""
    _consumer(descriptors, buffers, decode_buffers, schedule, sequences, output, partials, 1, CAUSAL, BOTTOM_RIGHT,
              HAS_Q_START, HAS_KV_START, STAGES, GROUP_SIZE, PREFILL_SPLITS, SPLITS_BLOCK, MERGE_ROWS)


@gluon.jit
def _producer_partition(descriptors, buffers, decode_buffers, schedule, sequences, output, partials,
                    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                    HAS_KV_START: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                    GROUP_SIZE: gl.constexpr, PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr,
                    MERGE_ROWS: gl.constexpr):
    _producer(descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT, HAS_Q_START,
              HAS_KV_START, STAGES, PAGE_SIZE, GROUP_SIZE, PREFILL_SPLITS, SPLITS_BLOCK, MERGE_ROWS)


@gluon.jit
def attention_mixed_roles_hopper_kernel(
    q_desc, k_desc, v_desc, k_half_desc, v_half_desc, q_ptr, out_ptr, partial_out_ptr, partial_lse_ptr, counters_ptr,
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr,
    num_seqs, heads_kv, q_batch_rows, k_batch_rows, v_batch_rows, out_batch_rows, stride_qs, stride_os,
    page_table_stride, qk_scale, tail_rows, stride_part_split, stride_part_token, stride_lse_split,
    stride_lse_token,
    GROUP_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr,
    LOG2_MAX_SEQS: gl.constexpr,
    DECODE_ROWS: gl.constexpr, PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr,
):
    """Grid (programs,): persistent, one per SM. q_desc / k_desc / v_desc as attention_mixed_hopper_kernel's (blocks
    [64, D] / [min(BLOCK_N, PAGE_SIZE), D]), k_half_desc / v_half_desc over the same K / V with blocks
    [min(BLOCK_N / 2, PAGE_SIZE), D] (PAGE_SIZE 0: [BLOCK_N / 2, D]); q_ptr: Q, token rows stride_qs elements apart.
    DECODE_ROWS: packed rows of a decode tile (sequences with more are prefill). PREFILL_SPLITS > 1: partial_out fp32
    [splits, total_q, H_q, D] and partial_lse fp32 [splits, total_q, H_q] (strides given, head strides D and 1), the
    merges' arrival counters at counters_ptr[token * H_q + head] (token < total_q), each 0 before the launch and
    after it. Program p takes items p, then dealt round by round in alternating directions. qk_scale in
    log2 units. tail_rows > 0 (thd): out's rows cu_seqlens_q[num_seqs] .. tail_rows - 1 are written as zeros."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    DECODE_BLOCK_N: gl.constexpr = BLOCK_N // 2  # a decode tile: half a ring slot
    MAX_SEQS: gl.constexpr = 1 << LOG2_MAX_SEQS
    heads_q = heads_kv * GROUP_SIZE

    tile_ends, prefill_tiles = _prefill_schedule(cu_seqlens_q_ptr, num_seqs, out_ptr, tail_rows, stride_os, heads_q,
                                                 ROWS, HEAD_DIM, GROUP_SIZE, DECODE_ROWS, MAX_SEQS)
    prefill_work = prefill_tiles * heads_q * PREFILL_SPLITS
    decode_work = num_seqs * heads_kv

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    dq_smem = gl.allocate_shared_memory(dtype, [DECODE_ROWS, HEAD_DIM],
                                        gl.NVMMASharedLayout.get_default_for([DECODE_ROWS, HEAD_DIM], dtype))
    dp_smem = gl.allocate_shared_memory(dtype, [DECODE_ROWS, DECODE_BLOCK_N],
                                        gl.NVMMASharedLayout.get_default_for([DECODE_ROWS, DECODE_BLOCK_N], dtype))
    bar: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
    q_empty = gl.allocate_shared_memory(gl.int64, [1], bar)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    dk_ready = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], bar)
    dk_empty = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], bar)
    dv_ready = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], bar)
    dv_empty = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], bar)
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=2)  # both consumer groups release Q
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # and each stage, prefill or decode
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2 * STAGES):  # the decode ring: group 0 alone
        mbarrier.init(dk_ready.index(i), count=1)
        mbarrier.init(dv_ready.index(i), count=1)
        mbarrier.init(dk_empty.index(i), count=1)
        mbarrier.init(dv_empty.index(i), count=1)
    _cta_barrier()  # the schedule is in shared memory before any partition reads it

    descriptors = (q_desc, k_desc, v_desc, k_half_desc, v_half_desc)
    buffers = (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)
    decode_buffers = (dq_smem, dp_smem, dk_ready, dk_empty, dv_ready, dv_empty)
    schedule = (tile_ends, prefill_tiles * GROUP_SIZE, prefill_work, decode_work)
    sequences = (cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, q_batch_rows, k_batch_rows,
                 v_batch_rows, out_batch_rows)
    output = (out_ptr, stride_os, qk_scale, q_ptr, stride_qs, page_table_ptr, page_table_stride, num_seqs, heads_kv,
              heads_q)
    partials = (partial_out_ptr, partial_lse_ptr, stride_part_split, stride_part_token, stride_lse_split,
                stride_lse_token, counters_ptr)
    gl.warp_specialize([  # (constexprs stay constexprs only as direct members of an argument tuple literal)
        (_first_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, partials, CAUSAL,
                           BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START, STAGES, PAGE_SIZE, GROUP_SIZE, PREFILL_SPLITS,
                           SPLITS_BLOCK, MERGE_ROWS)),
        (_second_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, partials, CAUSAL,
                            BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START, STAGES, PAGE_SIZE, GROUP_SIZE, PREFILL_SPLITS,
                            SPLITS_BLOCK, MERGE_ROWS)),
        (_producer_partition, (descriptors, buffers, decode_buffers, schedule, sequences, output, partials, CAUSAL,
                           BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START, STAGES, PAGE_SIZE, GROUP_SIZE, PREFILL_SPLITS,
                           SPLITS_BLOCK, MERGE_ROWS)),
    ], [4, 1], [CONSUMER_REGISTERS, 24])
