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
  * a decode item is a (sequence, KV head) walk, its KV tiles halved between the two consumer groups: each stage of
    the ring holds a 64-key tile of each half (a group's view is its 64 rows of every stage), each group runs the
    decode kernel's _decode_tiles on its half, and group 0 merges group 1's rows through shared memory. A walk alone
    on its SM reads ~30 GB/s (H200, 2026-12-02: one stage in flight a group, 64 KB an SM; the decode kernel's own
    ring reads ~120 GB/s an SM with two programs).

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
    _merge_if_last,
    _split_item,
)
from .attention_fwd_hopper import (
    _cta_barrier,
    _load_kv_tile,
    _prefill_tiles,
    _tile_page_rows,
    _tma_load,
)
from .attention_mixed_hopper import _prefill_item, _prefill_schedule, _prefill_walk

__all__ = ["attention_mixed_roles_hopper_kernel"]


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
def _half_rows(pages, tile, kv_len, HALF: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Where decode tile ``tile`` (HALF keys) of a walk lies: its first key (not paged: K's and V's rows follow their
    walk's first row), its first pool row (pages of HALF keys or more), or its pages' first pool rows, one lane a
    page (smaller pages). One page-table read serves K and V (both pools have the same page rows)."""
    key = tile * HALF
    if PAGE_SIZE == 0:
        rows = key
    elif PAGE_SIZE >= HALF:
        rows = gl.load(pages + key // PAGE_SIZE) * PAGE_SIZE + key % PAGE_SIZE
    else:
        rows = _tile_page_rows(pages, tile, kv_len, HALF, PAGE_SIZE)
    return rows


@gluon.jit
def _load_half(desc, half_tile, ready, rows, row0, kv_col, PAGE_SIZE: gl.constexpr):
    """TMA loads of a decode tile (HALF keys, where _half_rows put them; row0: the walk's first row, not paged) into
    half_tile, completing on ``ready`` (its bytes expected by the caller)."""
    HALF: gl.constexpr = half_tile.type.shape[0]
    if PAGE_SIZE == 0:
        _tma_load(desc, [row0 + rows, kv_col], ready, half_tile)
    elif PAGE_SIZE >= HALF:
        _tma_load(desc, [rows, kv_col], ready, half_tile)
    else:
        lanes = gl.arange(0, HALF // PAGE_SIZE, layout=rows.type.layout)
        for p in gl.static_range(HALF // PAGE_SIZE):
            row = gl.sum(gl.where(lanes == p, rows, 0), axis=0)
            _tma_load(desc, [row, kv_col], ready, half_tile.slice(p * PAGE_SIZE, PAGE_SIZE))


@gluon.jit
def _load_decode_halves(desc, tile, ready, empty, phase, has_second, rows, row0, kv_col, PAGE_SIZE: gl.constexpr):
    """A decode tile into the first HALF rows of ``tile`` (a ring slot) and, when has_second, another into its
    second (``rows``: both tiles' _half_rows), once both consumer groups freed the slot (``empty``'s ``phase``)."""
    HALF: gl.constexpr = tile.type.shape[0] // 2
    HALF_BYTES: gl.constexpr = (1 if PAGE_SIZE >= HALF or PAGE_SIZE == 0 else HALF // PAGE_SIZE) * \
        desc.block_type.nbytes
    mbarrier.wait(empty, phase ^ 1)
    if has_second:  # (an expect takes a constant byte count)
        mbarrier.expect(ready, 2 * HALF_BYTES)
        _load_half(desc, tile.slice(HALF, HALF), ready, rows[1], row0, kv_col, PAGE_SIZE)
    else:
        mbarrier.expect(ready, HALF_BYTES)
    _load_half(desc, tile.slice(0, HALF), ready, rows[0], row0, kv_col, PAGE_SIZE)


@gluon.jit
def _load_decode_stage(half_descriptors, ring, stage, phase, has_second, rows, walk_rows, kv_col,
                       PAGE_SIZE: gl.constexpr):
    """One ring stage of a decode item: K then V of a decode tile into the stage's first HALF rows and, when
    has_second, of another into its second (``rows``: both tiles' _half_rows)."""
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ring
    _load_decode_halves(half_descriptors[0], k_smem.index(stage), k_ready.index(stage), k_empty.index(stage), phase,
                        has_second, rows, walk_rows[0], kv_col, PAGE_SIZE)
    _load_decode_halves(half_descriptors[1], v_smem.index(stage), v_ready.index(stage), v_empty.index(stage), phase,
                        has_second, rows, walk_rows[1], kv_col, PAGE_SIZE)


@gluon.jit
def _producer(descriptors, buffers, decode_buffers, schedule, sequences, output,
              CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
              HAS_KV_START: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, GROUP_SIZE: gl.constexpr,
              PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr):
    """1 warp: the program's items' loads: a prefill split's
    Q halves (once the consumers released the previous split's) and its K / V tiles, or a decode walk's two halves
    of 64-key tiles, stage by stage."""
    q_desc, k_desc, v_desc, k_half_desc, v_half_desc = descriptors
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = buffers
    tile_ends, per_kv_head, prefill_work, decode_work = schedule
    page_table_ptr, page_table_stride, heads_kv = output[5], output[6], output[8]
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    HALF: gl.constexpr = BLOCK_N // 2
    DECODE_ROWS: gl.constexpr = decode_buffers[0].type.shape[1]  # (the decode Q buffers: [2 groups, rows, D])
    ring = (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty)
    count = 0  # ring stages loaded so far
    prefills = 0  # prefill splits so far (the Q buffer's phase)
    prefills_dealt, decodes_dealt = _program_items(prefill_work, decode_work)
    for k in range(prefills_dealt + decodes_dealt):
        is_decode, index = _program_item(k, prefills_dealt, decodes_dealt, prefill_work)
        if is_decode:
            is_walk, seq, kv_head, _, kv_len, _, _, num_tiles, _, k_row0, v_row0, _ = _decode_walk(
                index, sequences, heads_kv, DECODE_ROWS, HALF, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
                GROUP_SIZE)
            if is_walk:
                pages = page_table_ptr + seq.to(gl.int64) * page_table_stride
                first_half = (num_tiles + 1) // 2
                # A stage's page rows are read a stage ahead, where the read's latency hides behind the wait for a
                # free slot: read after it, four in a row (K's and V's of both tiles), they held the ring idle.
                last = gl.maximum(num_tiles - 1, 0)
                first_rows = _half_rows(pages, 0, kv_len, HALF, PAGE_SIZE)
                second_rows = _half_rows(pages, gl.minimum(first_half, last), kv_len, HALF, PAGE_SIZE)
                for j in range(first_half):
                    rows = (first_rows, second_rows)
                    ahead = gl.minimum(j + 1, first_half - 1)
                    first_rows = _half_rows(pages, ahead, kv_len, HALF, PAGE_SIZE)
                    second_rows = _half_rows(pages, gl.minimum(first_half + ahead, last), kv_len, HALF, PAGE_SIZE)
                    _load_decode_stage((k_half_desc, v_half_desc), ring, count % STAGES, (count // STAGES) & 1,
                                       first_half + j < num_tiles, rows, (k_row0, v_row0), kv_head * HEAD_DIM,
                                       PAGE_SIZE)
                    count += 1
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
def _merge_decode_halves(o, m_i, l_sum, merge_buffers, decodes, GROUP: gl.constexpr):
    """Group 1 hands its half of a decode walk (O^T, running max, sums) to group 0 through shared memory; group 0
    returns both halves merged (group 1 gets its own back, unused)."""
    merge_o, merge_m, merge_l, merge_ready, merge_empty = merge_buffers
    across: gl.constexpr = gl.SliceLayout(0, o.type.layout)
    if GROUP == 1:
        mbarrier.wait(merge_empty, (decodes & 1) ^ 1)
        merge_o.store(o)
        merge_m.store(m_i)
        merge_l.store(l_sum)
        _cta_barrier()
        mbarrier.arrive(merge_ready, count=1)
    else:
        mbarrier.wait(merge_ready, decodes & 1)
        o_other = merge_o.load(o.type.layout)
        m_other = merge_m.load(across)
        l_other = merge_l.load(across)
        _cta_barrier()
        mbarrier.arrive(merge_empty, count=1)
        m_new = gl.maximum(m_i, m_other)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        beta = gl.exp2(m_other - m_use)
        o = o * alpha[None, :] + o_other * beta[None, :]
        l_sum = l_sum * alpha + l_other * beta
    return o, l_sum


@gluon.jit
def _consumer(descriptors, buffers, decode_buffers, schedule, sequences, output, partials, GROUP: gl.constexpr,
              CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
              HAS_KV_START: gl.constexpr, STAGES: gl.constexpr, GROUP_SIZE: gl.constexpr,
              PREFILL_SPLITS: gl.constexpr, SPLITS_BLOCK: gl.constexpr, MERGE_ROWS: gl.constexpr):
    """4 warps (one warp group): the program's items; of a prefill split, query rows
    64 * GROUP .. of its tile; of a decode walk, half GROUP of its KV tiles."""
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = buffers
    tile_ends, per_kv_head, prefill_work, decode_work = schedule
    out_ptr, stride_os, qk_scale, q_ptr, stride_qs, heads_kv = output[0], output[1], output[2], output[3], \
        output[4], output[8]
    q_batch_rows, out_batch_rows = sequences[4], sequences[7]
    dq_smem, dp_smem = decode_buffers[0].index(GROUP), decode_buffers[1].index(GROUP)
    merge_buffers = decode_buffers[2:]
    ROWS: gl.constexpr = q_smem.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    HALF: gl.constexpr = BLOCK_N // 2
    DECODE_ROWS: gl.constexpr = dq_smem.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    rows = GROUP * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))  # of the q tile
    # a decode's tiles: this group's 64 rows of each ring stage (_decode_tiles' PART)
    half_ring = (dq_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, dp_smem)
    count = 0
    prefills = 0
    decodes = 0
    prefills_dealt, decodes_dealt = _program_items(prefill_work, decode_work)
    for k in range(prefills_dealt + decodes_dealt):
        is_decode, index = _program_item(k, prefills_dealt, decodes_dealt, prefill_work)
        if is_decode:
            is_walk, seq, kv_head, q_len, kv_len, q_first, diag, num_tiles, first_masked, _, _, _ = _decode_walk(
                index, sequences, heads_kv, DECODE_ROWS, HALF, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
                GROUP_SIZE)
            if is_walk:
                stages = (num_tiles + 1) // 2
                first_tile = GROUP * stages
                my_tiles = stages if GROUP == 0 else num_tiles - stages
                _load_decode_q(dq_smem, q_ptr, stride_qs, seq * q_batch_rows + q_first, kv_head, q_len, GROUP_SIZE)
                o, m_i, l_sum = _decode_tiles(half_ring, count, first_tile, my_tiles, first_masked, kv_len, diag,
                                              qk_scale, CAUSAL, GROUP_SIZE, False, GROUP)
                for j in range(my_tiles, stages):  # group 1's stage without a tile of its own (an odd count)
                    mbarrier.wait(k_ready.index((count + j) % STAGES), ((count + j) // STAGES) & 1)
                    mbarrier.wait(v_ready.index((count + j) % STAGES), ((count + j) // STAGES) & 1)
                    mbarrier.arrive(k_empty.index((count + j) % STAGES), count=1)
                    mbarrier.arrive(v_empty.index((count + j) % STAGES), count=1)
                count += stages
                o, l_sum = _merge_decode_halves(o, m_i, l_sum, merge_buffers, decodes, GROUP)
                decodes += 1
                if GROUP == 0:
                    _decode_rows_out(o, l_sum, out_ptr, stride_os, seq * out_batch_rows + q_first, kv_head, q_len,
                                     GROUP_SIZE)
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
    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr, LOG2_MAX_SEQS: gl.constexpr,
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
    HALF: gl.constexpr = BLOCK_N // 2
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
    dq_smem = gl.allocate_shared_memory(dtype, [2, DECODE_ROWS, HEAD_DIM],
                                        gl.NVMMASharedLayout.get_default_for([DECODE_ROWS, HEAD_DIM], dtype))
    dp_smem = gl.allocate_shared_memory(dtype, [2, DECODE_ROWS, HALF],
                                        gl.NVMMASharedLayout.get_default_for([DECODE_ROWS, HALF], dtype))
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    merge_o = gl.allocate_shared_memory(gl.float32, [HEAD_DIM, DECODE_ROWS], plain)
    merge_m = gl.allocate_shared_memory(gl.float32, [DECODE_ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    merge_l = gl.allocate_shared_memory(gl.float32, [DECODE_ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
    q_empty = gl.allocate_shared_memory(gl.int64, [1], bar)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    merge_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
    merge_empty = gl.allocate_shared_memory(gl.int64, [1], bar)
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=2)  # both consumer groups release Q
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # and each stage, prefill or decode
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(merge_ready, count=1)
    mbarrier.init(merge_empty, count=1)
    _cta_barrier()  # the schedule is in shared memory before any partition reads it

    descriptors = (q_desc, k_desc, v_desc, k_half_desc, v_half_desc)
    buffers = (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)
    decode_buffers = (dq_smem, dp_smem, merge_o, merge_m, merge_l, merge_ready, merge_empty)
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
