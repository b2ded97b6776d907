"""A Hopper (sm90) attention forward written in Gluon: a TMA producer warp and two or three wgmma consumer warp groups.

The general kernel (attention_fwd_kernel.py) leaves scheduling to Triton's pipeliner; on the H200 it runs
d128 prefill at 413-501 TFLOP/s against flash-attn-4's 616-734. This kernel places the work by hand, the
way FlashAttention-3 does on Hopper:

  * one program per (query head, tile of GROUPS x 64 query tokens, sequence), in sections of whole KV heads (under a
    causal mask those whose K/V the host fits in a part of L2, else one): within a section the heaviest (last)
    q tiles first, a q tile's query heads side by side (the longest causal walks start first, and the programs
    in flight share the section's K/V in L2);
  * a 1-warp producer partition issues every load by TMA: the Q tile's 64-row blocks once,
    then K and V tiles of BLOCK_N keys into a ring of STAGES buffers, each with a ready and an empty
    mbarrier (K and V separately: K is released as soon as QK^T is done, V after PV);
  * GROUPS (2, or 3 at d64: the host's HOPPER_TILE) 4-warp consumer partitions (one warp group each) own 64 query
    rows each. In step t each issues
    S_t = Q K_t^T and O += P_{t-1} V_{t-1} (both async), waits for S_t, runs the online softmax of tile t,
    waits for PV and rescales O (at head dim 256 P is taken against the rows' previous max while the tile's
    reduces, and only the warps whose rows' max moved, which lags by up to 2^8, rescale: hopper_softmax.py). The PTX
    waits for PV after the softmax, but ptxas hoists that wait above the exponentials (to just after the rows' max),
    so a group's softmax overlaps the other group's wgmmas more than its own PV (holding the wait back ran the d128
    prefill 5-6 % slower on the H200, this producer's next K load then waiting on the later V release;
    docs/benchmarks_log.md, forty-second session). The
    warp groups interleave on the SM's tensor cores; with PINGPONG (the host's choice at head dim 64) they take turns
    (round robin) to issue a step's wgmmas, on named barriers 8 to 7 + GROUPS.
  * masking (keys past the sequence end, the causal band) only on the tiles that need it: a walk's tiles before
    its first masked one run in a loop without the mask's code, the rest in a second loop that masks every tile
    (a branch in one loop split its body, and ptxas put the PV wait at the top of the softmax; without it the wait
    lands after the rows' max: H200, 2026-12-04, tree_ab against one loop, d128 prefill cells 1.5-3.6 % faster, d64 and
    d256 within 0.5 %; docs/results/2026-12-04-h200-b01f509); exp2 with the scale folded into one FMA; P goes to
    the PV wgmma from registers.

What it serves (the host side checks, hopper_forward.py): fp16 / bf16, head dims 64, 128 or 256 (equal for
q/k and v), no window, ALiBi or sinks, one KV split; packed K/V, a non-paged cache or a paged one: pages
holding whole KV tiles (page_size % BLOCK_N == 0, BLOCK_N 128 keys, 64 at d256: one page id and one TMA load per
tile, read by the producer), or pages of 16 keys to half a tile (a tile's page ids in one load, then one TMA load
per page into its rows of the tile's buffer); q, k, v, out whose tokens are rows of a 2-D matrix with heads packed
along it (thd, bshd; not sbhd).
Query i of a sequence sees key j iff j < len_kv and, causal, j <= i + off (off = len_kv - len_q when
bottom_right, else 0); a row that sees no key gets zeros.

Rows read past a sequence's end by the tile loads belong to the next sequence, padding, stale cache slots
(or TMA's zero fill past the tensor; small pages past the sequence's last page re-read that page): keys there
are masked, V rows there zeroed in shared memory before their PV
(padding may hold NaN), query rows there are computed and not stored.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .hopper_softmax import (
    EXP_AHEAD_MIN_HEAD_DIM,
    packed_16bit,
    rescale_moved_rows,
    softmax_tile,
    softmax_tile_ahead,
)

__all__ = ["HOPPER_ROWS_PER_GROUP", "attention_fwd_hopper_kernel"]

HOPPER_ROWS_PER_GROUP = 64
"""Query rows per consumer warp group (wgmma's M is 64 per warp group)."""
PINGPONG_BARRIER = gl.constexpr(8)
"""The consumer groups' ping-pong uses named barriers 8 to 7 + GROUPS (Triton's partitions use the lowest ids)."""

# Triton 3.6 names (the H200's) and their later renames (3.9, the CPU CI's): the kernel compiles with both.
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _producer(descriptors, buffers, loads, walk, output, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, PINGPONG: gl.constexpr):
    """1 warp: TMA loads of the Q tile's 64-row blocks (one a consumer group), then K_t / V_t into the stage ring as
    the consumers free it."""
    q_desc, k_desc, v_desc = descriptors
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty = buffers
    q_row0, q_col, k_row0, v_row0, kv_col, num_tiles, pages = loads
    kv_len = walk[2]
    rows: gl.constexpr = q_desc.block_type.shape[0]
    GROUPS: gl.constexpr = q_smem.type.shape[0]
    mbarrier.expect(q_bar, GROUPS * q_desc.block_type.nbytes)
    for g in gl.static_range(GROUPS):
        _tma_load(q_desc, [q_row0 + g * rows, q_col], q_bar, q_smem.index(g))
    for t in range(num_tiles):
        _load_kv_tile((k_desc, v_desc), (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty), t % STAGES,
                      (t // STAGES) & 1, t, k_row0, v_row0, kv_col, pages, kv_len, BLOCK_N, PAGE_SIZE)


@gluon.jit
def _load_kv_tile(kv_descriptors, ring, stage, phase, t, k_row0, v_row0, kv_col, pages, kv_len,
                  BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr, HEADS: gl.constexpr = 1):
    """KV tile t of a walk into ring slot ``stage`` (its empty barriers' ``phase``), once the consumers freed it:
    K and V each by one TMA load, or page by page over pages smaller than a tile. ``ring``: (k_smem, v_smem,
    k_ready, k_empty, v_ready, v_empty). HEADS > 1 (the decode kernel's items of several KV heads): the slot holds
    BLOCK_N keys of each of HEADS KV heads (columns kv_col, kv_col + D, ...), head h's in its h-th block of rows,
    one TMA load a head (a head a page over pages smaller than BLOCK_N)."""
    k_desc, v_desc = kv_descriptors
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ring
    v_stage, v_phase = _v_slot(stage, phase, k_smem.type.shape[0], v_smem.type.shape[0])
    if PAGE_SIZE >= BLOCK_N or PAGE_SIZE == 0:
        k_row = k_row0 + t * BLOCK_N
        v_row = v_row0 + t * BLOCK_N
        if PAGE_SIZE > 0:  # the tile lies in one page: rows page * PAGE_SIZE + offset of the page pool
            key = t * BLOCK_N
            page_row = gl.load(pages + key // PAGE_SIZE) * PAGE_SIZE + key % PAGE_SIZE
            k_row = page_row
            v_row = page_row
        mbarrier.wait(k_empty.index(stage), phase ^ 1)  # a fresh barrier counts as released
        mbarrier.expect(k_ready.index(stage), HEADS * k_desc.block_type.nbytes)
        _tma_load_heads(k_desc, [k_row, kv_col], k_ready.index(stage), k_smem.index(stage), HEADS)
        mbarrier.wait(v_empty.index(v_stage), v_phase ^ 1)
        mbarrier.expect(v_ready.index(v_stage), HEADS * v_desc.block_type.nbytes)
        _tma_load_heads(v_desc, [v_row, kv_col], v_ready.index(v_stage), v_smem.index(v_stage), HEADS)
    else:
        _load_paged_tile(kv_descriptors, ring, stage, phase, _tile_page_rows(pages, t, kv_len, BLOCK_N, PAGE_SIZE),
                         kv_col, PAGE_SIZE, HEADS)


@gluon.jit
def _v_slot(stage, phase, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr):
    """V's slot and phase in a ring of V_STAGES V slots (dividing the K_STAGES K slots) at the ring position where
    K's are (stage, phase): position mod 2 * K_STAGES is stage + K_STAGES * phase. Equal stages: K's."""
    v_stage = stage
    v_phase = phase
    if V_STAGES != K_STAGES:
        v_stage = stage % V_STAGES
        v_phase = ((stage + K_STAGES * phase) // V_STAGES) & 1
    return v_stage, v_phase


@gluon.jit
def _tma_load_heads(desc, coord, ready, tile, HEADS: gl.constexpr):
    """desc's block at ``coord`` into ``tile``; HEADS > 1: the blocks of HEADS KV heads (columns coord[1],
    coord[1] + D, ...) into the tile's HEADS blocks of rows."""
    if HEADS == 1:
        _tma_load(desc, coord, ready, tile)
    else:
        ROWS: gl.constexpr = tile.type.shape[0] // HEADS
        for h in gl.static_range(HEADS):
            _tma_load(desc, [coord[0], coord[1] + h * tile.type.shape[1]], ready, tile.slice(h * ROWS, ROWS))


@gluon.jit
def _tile_page_rows(pages, t, kv_len, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """KV tile t's pages over pages smaller than it: their first rows in the page pool, one lane a page. Pages past
    the sequence's last one repeat that page (a valid table entry; its keys are masked and its V rows zeroed like
    any row past the sequence), so no table entry past the sequence is read."""
    TILE_PAGES: gl.constexpr = BLOCK_N // PAGE_SIZE
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])  # the producer's one warp
    index = t * TILE_PAGES + gl.arange(0, TILE_PAGES, layout=layout)
    return gl.load(pages + gl.minimum(index, gl.maximum(kv_len - 1, 0) // PAGE_SIZE)) * PAGE_SIZE


@gluon.jit
def _load_paged_tile(kv_descriptors, ring, stage, phase, page_rows, kv_col, PAGE_SIZE: gl.constexpr,
                     HEADS: gl.constexpr = 1):
    """A KV tile over pages smaller than it (``page_rows``: _tile_page_rows's, one table read for K and V: both
    pools have the same page rows) into ring slot ``stage``, K then V, each once the consumers freed its slot
    (HEADS: as _load_kv_tile's)."""
    k_desc, v_desc = kv_descriptors
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ring
    v_stage, v_phase = _v_slot(stage, phase, k_smem.type.shape[0], v_smem.type.shape[0])
    _load_tile_by_pages(k_desc, k_smem.index(stage), k_ready.index(stage), k_empty.index(stage), phase, page_rows,
                        kv_col, PAGE_SIZE, HEADS)
    _load_tile_by_pages(v_desc, v_smem.index(v_stage), v_ready.index(v_stage), v_empty.index(v_stage), v_phase,
                        page_rows, kv_col, PAGE_SIZE, HEADS)


@gluon.jit
def _load_tile_by_pages(desc, tile, ready, empty, phase, page_rows, kv_col, PAGE_SIZE: gl.constexpr,
                        HEADS: gl.constexpr = 1):
    """One TMA load of [PAGE_SIZE, D] per page into its rows of ``tile`` (lane p of ``page_rows``: page p's first
    pool row), once ``empty`` released the slot; HEADS > 1: one a page a KV head, into that head's block of rows
    (_tma_load_heads's), a page's heads back to back."""
    TILE_PAGES: gl.constexpr = tile.type.shape[0] // HEADS // PAGE_SIZE
    lanes = gl.arange(0, TILE_PAGES, layout=page_rows.type.layout)
    mbarrier.wait(empty, phase ^ 1)  # a fresh barrier counts as released
    mbarrier.expect(ready, HEADS * TILE_PAGES * desc.block_type.nbytes)
    for p in gl.static_range(TILE_PAGES):
        row = gl.sum(gl.where(lanes == p, page_rows, 0), axis=0)
        if HEADS == 1:
            _tma_load(desc, [row, kv_col], ready, tile.slice(p * PAGE_SIZE, PAGE_SIZE))
        else:
            for h in gl.static_range(HEADS):
                _tma_load(desc, [row, kv_col + h * tile.type.shape[1]], ready,
                          tile.slice(h * TILE_PAGES * PAGE_SIZE + p * PAGE_SIZE, PAGE_SIZE))


@gluon.jit
def _zero_rows_from(tile, first_row, KEYS: gl.constexpr = 0):
    """Zero rows >= first_row of a [BLOCK_N, D] shared tile, in halves (32 registers a thread), for the
    wgmma that reads it next. Both consumer groups run this before their own PV on the tile: each
    writes the same values (its valid rows unchanged), so neither waits for the other. 0 < KEYS < BLOCK_N (the
    decode kernel's items of several KV heads): the tile is blocks of KEYS rows, and rows >= first_row of each
    block are zeroed."""
    BLOCK_N: gl.constexpr = tile.type.shape[0]
    HALF: gl.constexpr = BLOCK_N // 2
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    for half in gl.static_range(2):
        part = tile.slice(half * HALF, HALF)
        values = part.load(layout)
        rows = half * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
        if KEYS > 0 and KEYS < BLOCK_N:
            rows = rows % KEYS
        part.store(gl.where((rows < first_row)[:, None], values, gl.zeros_like(values)))
    fence_async_shared()
    _cta_barrier()


@gluon.jit
def _named_barrier(barrier, ARRIVE: gl.constexpr):
    """``bar.sync`` (ARRIVE False) or ``bar.arrive`` on named barrier ``barrier`` (an int) by this warp group, for
    two warp groups (256 threads). Gluon has no named barriers: an inline asm that runs once a thread (a [128]
    tensor over the group's 4 warps, one element each)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ids = gl.full([128], barrier, gl.int32, layout=layout)
    if ARRIVE:
        gl.inline_asm_elementwise("bar.arrive $1, 256;\n\tmov.b32 $0, $1;", "=r,r", [ids], dtype=gl.int32,
                                  is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("bar.sync $1, 256;\n\tmov.b32 $0, $1;", "=r,r", [ids], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _take_turn(PINGPONG_GROUP: gl.constexpr):
    """Ping-pong of the consumer warp groups (PINGPONG_GROUP 0, 1, ...; -1: off): wait for this group's turn to issue
    its wgmmas (its named barrier, PINGPONG_BARRIER + group)."""
    if PINGPONG_GROUP >= 0:
        _named_barrier(PINGPONG_BARRIER + PINGPONG_GROUP, False)


@gluon.jit
def _pass_turn(PINGPONG_GROUP: gl.constexpr, GROUPS: gl.constexpr):
    """Give the next of GROUPS consumer warp groups (round robin) its turn: arrive on its named barrier."""
    if PINGPONG_GROUP >= 0:
        _named_barrier(PINGPONG_BARRIER + (PINGPONG_GROUP + 1) % GROUPS, True)


@gluon.jit
def _prefill_step(q, ring, count, i, first_tile, rows, kv_len, diag, qk_scale, s, o, p16, m_i, l_i,
                  MASKED: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr, PINGPONG_GROUP: gl.constexpr,
                  GROUPS: gl.constexpr):
    """Step i >= 1 of _prefill_tiles' walk: S_i = Q K_i^T and O += P_{i-1} V_{i-1} issued, the online softmax of
    tile first_tile + i (masked where MASKED), O rescaled; returns S, O, P_i (16-bit, the PV's operand), the rows'
    running max and sums."""
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ring
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = q.type.shape[1]
    dtype: gl.constexpr = q.dtype
    col_s: gl.constexpr = gl.SliceLayout(0, s.type.layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o.type.layout)
    AHEAD: gl.constexpr = HEAD_DIM >= EXP_AHEAD_MIN_HEAD_DIM
    stage = (count + i) % STAGES
    prev = (count + i - 1) % STAGES
    mbarrier.wait(k_ready.index(stage), ((count + i) // STAGES) & 1)
    _take_turn(PINGPONG_GROUP)
    s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(prev), ((count + i - 1) // STAGES) & 1)
    o = warpgroup_mma(p16, v_smem.index(prev), o, is_async=True)
    _pass_turn(PINGPONG_GROUP, GROUPS)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # S_t done, PV_{t-1} may still run
    mbarrier.arrive(k_empty.index(stage), count=1)
    t = first_tile + i
    if AHEAD:
        p_low, alpha, m_i, l_i, moved = softmax_tile_ahead(s, m_i, l_i, t, MASKED, rows, kv_len, diag, qk_scale,
                                                           CAUSAL, BLOCK_N, col_s, dtype)
    else:
        p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, t, MASKED, rows, kv_len, diag, qk_scale, CAUSAL, BLOCK_N,
                                          col_s)
        p_low = packed_16bit(p, dtype)
    o, p16 = warpgroup_mma_wait(num_outstanding=0, deps=(o, p16))
    mbarrier.arrive(v_empty.index(prev), count=1)
    if AHEAD:
        o = rescale_moved_rows(o, gl.convert_layout(alpha, row_o), gl.convert_layout(moved, row_o))
    else:
        o = o * gl.convert_layout(alpha, row_o)[:, None]
    return s, o, gl.convert_layout(p_low, p16.type.layout), m_i, l_i


@gluon.jit
def _prefill_tiles(q, ring, count, first_tile, num_tiles, first_masked, rows, kv_len, diag, qk_scale,
                   CAUSAL: gl.constexpr, STAGES: gl.constexpr, PINGPONG_GROUP: gl.constexpr = -1,
                   GROUPS: gl.constexpr = 2):
    """A consumer warp group's 64 query rows (``q``, ready in shared memory; ``rows``: their query indices) through
    KV tiles first_tile .. first_tile + num_tiles - 1 of the K / V ring (k_smem, v_smem, k_ready, k_empty, v_ready,
    v_empty), from ring position ``count``. In step t it issues S_t = Q K_t^T and O += P_{t-1} V_{t-1} (both async),
    waits for S_t only, runs the online softmax of tile t, then waits for PV and rescales O (ptxas moves that
    wait above the exponentials: see the module docstring; from EXP_AHEAD_MIN_HEAD_DIM on, P is taken before the tile's
    max is known and only warps whose rows' max moved rescale: hopper_softmax.py). The steps before the first
    masked tile run in a loop without the mask's code, the rest in a second loop that masks every tile, as
    FlashAttention-4 splits its loop (see the module docstring).
    Returns O [ROWS, D] (fp32, not yet divided by the sums), the rows' running max (log2 units) and their sums.
    PINGPONG_GROUP 0 .. GROUPS - 1 (GROUPS groups on the same tiles): the groups take turns to issue a step's wgmmas
    (group 0 first, round robin), so one group's softmax runs while the others' wgmmas do (FlashAttention-3's
    schedule); -1: no turns."""
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ring
    ROWS: gl.constexpr = q.type.shape[0]
    HEAD_DIM: gl.constexpr = q.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    dtype: gl.constexpr = q.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([ROWS], gl.float32, layout=row_s)
    o = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
    s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    p16 = gl.zeros([ROWS, BLOCK_N], dtype, layout=p_layout)
    if num_tiles > 0:
        if PINGPONG_GROUP == GROUPS - 1:
            _pass_turn(PINGPONG_GROUP, GROUPS)  # group 0 goes first
        stage = count % STAGES
        mbarrier.wait(k_ready.index(stage), (count // STAGES) & 1)
        _take_turn(PINGPONG_GROUP)
        s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s, use_acc=False, is_async=True)
        _pass_turn(PINGPONG_GROUP, GROUPS)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(k_empty.index(stage), count=1)
        p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, first_tile, first_tile >= first_masked, rows, kv_len, diag,
                                          qk_scale, CAUSAL, BLOCK_N, col_s)
        p16 = gl.convert_layout(packed_16bit(p, dtype), p_layout)
        # the walk's tiles before first_masked need no mask: a loop without the mask's code, then one with it
        plain_end = gl.minimum(gl.maximum(first_masked - first_tile, 1), num_tiles)
        for i in range(1, plain_end):
            s, o, p16, m_i, l_i = _prefill_step(q, ring, count, i, first_tile, rows, kv_len, diag, qk_scale, s, o, p16,
                                                m_i, l_i, False, CAUSAL, STAGES, PINGPONG_GROUP, GROUPS)
        for i in range(plain_end, num_tiles):
            s, o, p16, m_i, l_i = _prefill_step(q, ring, count, i, first_tile, rows, kv_len, diag, qk_scale, s, o, p16,
                                                m_i, l_i, True, CAUSAL, STAGES, PINGPONG_GROUP, GROUPS)
        last = (count + num_tiles - 1) % STAGES
        last_tile = first_tile + num_tiles - 1
        mbarrier.wait(v_ready.index(last), ((count + num_tiles - 1) // STAGES) & 1)
        if (last_tile + 1) * BLOCK_N > kv_len:  # V rows past the sequence: P is 0 there, but 0 * NaN is not
            _zero_rows_from(v_smem.index(last), kv_len - last_tile * BLOCK_N)
        o = warpgroup_mma(p16, v_smem.index(last), o, is_async=True)
        o, p16 = warpgroup_mma_wait(num_outstanding=0, deps=(o, p16))
        mbarrier.arrive(v_empty.index(last), count=1)
        if PINGPONG_GROUP == 0:
            _take_turn(PINGPONG_GROUP)  # the last group's last pass: the barrier ends as it began
    return o, m_i, l_i


@gluon.jit
def _consume(buffers, walk, output,
             GROUP: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             PINGPONG: gl.constexpr):
    """4 warps (one warp group): the program's GROUP-th 64 query rows through every KV tile, then the normalized
    output."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty = buffers
    num_tiles, first_masked, kv_len, diag, qk_scale = walk
    out_ptr, out_row0, stride_os, out_col, rows_left = output
    GROUPS: gl.constexpr = q_smem.type.shape[0]
    ROWS: gl.constexpr = q_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    first_row = GROUP * ROWS  # of the program's GROUPS * ROWS
    rows = first_row + gl.arange(0, ROWS, layout=row_s)  # query index within the tile
    mbarrier.wait(q_bar, 0)
    o, _, l_i = _prefill_tiles(q_smem.index(GROUP), (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty), 0, 0,
                                 num_tiles, first_masked, rows, kv_len, diag, qk_scale, CAUSAL, STAGES,
                                 GROUP if PINGPONG else -1, GROUPS)

    l_o = gl.convert_layout(l_i, row_o)
    o = o / gl.where(l_o == 0.0, 1.0, l_o)[:, None]
    out_rows = first_row + gl.arange(0, ROWS, layout=row_o)
    out_cols = gl.arange(0, HEAD_DIM, layout=col_o)
    offsets = (out_row0 + out_rows.to(gl.int64))[:, None] * stride_os + (out_col + out_cols)[None, :]
    gl.store(out_ptr + offsets, o.to(out_ptr.dtype.element_ty), mask=(out_rows < rows_left)[:, None])


@gluon.jit
def _consume_group0(descriptors, buffers, loads, walk, output, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, PINGPONG: gl.constexpr):
    _consume(buffers, walk, output, 0, CAUSAL, BLOCK_N, STAGES, PINGPONG)


@gluon.jit
def _consume_group1(descriptors, buffers, loads, walk, output, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, PINGPONG: gl.constexpr):
    """A worker partition: the same signature as the producer's (Gluon's rule for workers)."""
    _consume(buffers, walk, output, 1, CAUSAL, BLOCK_N, STAGES, PINGPONG)


@gluon.jit
def _consume_group2(descriptors, buffers, loads, walk, output, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, PINGPONG: gl.constexpr):
    _consume(buffers, walk, output, 2, CAUSAL, BLOCK_N, STAGES, PINGPONG)


@gluon.jit
def _tile_walk(seq, first_query, q_len, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, tile_queries,
               BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
               HAS_KV_START: gl.constexpr):
    """The KV walk of a q tile of ``tile_queries`` queries from ``first_query`` of sequence ``seq``: (kv_len, the
    sequence's first q / kv rows (start offsets or 0), the causal diagonal offset, KV tiles to visit, the first
    masked one)."""
    kv_len = gl.load(cu_seqlens_kv_ptr + seq + 1) - gl.load(cu_seqlens_kv_ptr + seq)
    q_first = 0
    if HAS_Q_START:
        q_first = gl.load(q_start_ptr + seq)
    kv_first = 0
    if HAS_KV_START:
        kv_first = gl.load(kv_start_ptr + seq)
    diag = 0
    if BOTTOM_RIGHT:
        diag = kv_len - q_len
    if CAUSAL:
        keys = gl.minimum(kv_len, gl.maximum(first_query + tile_queries + diag, 0))
        first_masked = gl.minimum(gl.maximum(first_query + diag + 1, 0) // BLOCK_N, kv_len // BLOCK_N)
    else:
        keys = kv_len
        first_masked = kv_len // BLOCK_N
    num_tiles = (keys + BLOCK_N - 1) // BLOCK_N
    return kv_len, q_first, kv_first, diag, num_tiles, first_masked


@gluon.jit
def _program_tile(section_heads, GROUP_SIZE: gl.constexpr):
    """This program's (q tile, query head, sequence) in a grid (q tiles x GROUP_SIZE, H_kv, sequences), launched in
    the order of the programs' linear ids. A sequence's programs run in sections of ``section_heads`` query heads
    (whole KV heads; the last section may hold fewer): within a section the q tiles from the last (the longest walk
    under a causal mask) to the first, each q tile's query heads side by side. One KV head a section is the order of
    KV heads one after another."""
    q_tiles = gl.num_programs(0) // GROUP_SIZE
    index = gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)  # within the sequence's q_tiles x heads_q
    rank, head = _section_order(index, q_tiles, gl.num_programs(1) * GROUP_SIZE, section_heads)
    return q_tiles - 1 - rank, head, gl.program_id(2)


@gluon.jit
def _section_order(index, q_tiles, heads_q, section_heads):
    """Position ``index`` of an order over q_tiles x heads_q (q tile, query head) pairs in sections of
    ``section_heads`` query heads (whole KV heads; the last section may hold fewer), within a section q tile by q
    tile, a q tile's heads side by side -> (the q tile's rank in its section's order, query head). The prefill
    kernel's program order (_program_tile) and the mixed launch's items in sections
    (attention_mixed_hopper._section_item) both run in it."""
    first_head = index // (q_tiles * section_heads) * section_heads
    heads = gl.minimum(section_heads, heads_q - first_head)
    local = index - first_head * q_tiles
    return local // heads, first_head + local % heads


@gluon.jit
def _zero_tail_rows(out_ptr, first, end, stride_os, heads_q, program, programs, HEAD_DIM: gl.constexpr):
    """Zeros in out's rows first + program, first + program + programs, ... below ``end`` (program's share of the
    rows past the last sequence, shared by ``programs`` programs), all query heads."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    cols = gl.arange(0, HEAD_DIM, layout=layout)
    zeros = gl.zeros([HEAD_DIM], out_ptr.dtype.element_ty, layout=layout)
    for row in range(first + program, end, programs):
        row_ptr = out_ptr + row.to(gl.int64) * stride_os
        for head in range(heads_q):
            gl.store(row_ptr + head * HEAD_DIM + cols, zeros)


@gluon.jit
def attention_fwd_hopper_kernel(
    q_desc, k_desc, v_desc, out_ptr,
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr,
    q_batch_rows, k_batch_rows, v_batch_rows, out_batch_rows, stride_os, page_table_stride, qk_scale, section_heads,
    tail_rows, GROUP_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, PINGPONG: gl.constexpr = False, GROUPS: gl.constexpr = 2,
    ZERO_TAIL: gl.constexpr = False,
):
    """Grid (q tiles of the longest sequence x GROUP_SIZE, H_kv, sequences). q_desc / k_desc / v_desc: descriptors over
    2-D views [token rows, heads x head dim] with blocks [64, D] / [BLOCK_N, D]; sequence b's token i is
    row b * *_batch_rows + start[b] + i (start: q_start / kv_start, or 0). With PAGE_SIZE (a multiple of
    BLOCK_N; 0: not paged) k / v are page pools [pages x PAGE_SIZE rows, H_kv x D] and key j of sequence b
    is row page_table[b, j // PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE. out: element offsets
    (b * out_batch_rows + q_start[b] + i) * stride_os + h * D + d. qk_scale in log2 units. section_heads: query
    heads a section of the program order (_program_tile), a multiple of GROUP_SIZE. GROUPS (2 or 3) consumer warp
    groups of 64 query rows each: a q tile is GROUPS * 64 queries. ZERO_TAIL (thd, sequences back to back): the grid
    has one more sequence, whose programs write out's rows cu_seqlens_q[sequences] .. tail_rows - 1 as zeros (a
    constexpr: as a runtime branch it cost the d64 three-group kernel 88 B more spills on Triton 3.9, where it did not
    run; compiled in, Triton 3.6, the H200's, spills none)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    tile, q_head, seq = _program_tile(section_heads, GROUP_SIZE)
    q_begin = gl.load(cu_seqlens_q_ptr + seq)
    if ZERO_TAIL:  # the grid's last sequence is the tail's (cu_seqlens_q has no entry past it): no queries
        q_len = gl.load(cu_seqlens_q_ptr + gl.minimum(seq + 1, gl.num_programs(2) - 1)) - q_begin
    else:
        q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_begin
    first_query = tile * (GROUPS * ROWS)
    if first_query < q_len:
        kv_len, q_first, kv_first, diag, num_tiles, first_masked = _tile_walk(
            seq, first_query, q_len, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, GROUPS * ROWS, BLOCK_N, CAUSAL,
            BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [GROUPS, ROWS, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=GROUPS)  # every consumer group releases a stage
            mbarrier.init(v_empty.index(i), count=GROUPS)

        kv_head = q_head // GROUP_SIZE
        q_row0 = seq * q_batch_rows + q_first + first_query
        descriptors = (q_desc, k_desc, v_desc)
        buffers = (q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty)
        loads = (q_row0, q_head * HEAD_DIM, seq * k_batch_rows + kv_first, seq * v_batch_rows + kv_first,
                 kv_head * HEAD_DIM, num_tiles, page_table_ptr + seq.to(gl.int64) * page_table_stride)
        walk = (num_tiles, first_masked, kv_len, diag + first_query, qk_scale)  # rows count from the tile's first
        output = (out_ptr, (seq * out_batch_rows + q_first + first_query).to(gl.int64), stride_os, q_head * HEAD_DIM,
                  q_len - first_query)
        if GROUPS == 3:  # (constexprs stay constexprs only as direct members of an argument tuple literal)
            gl.warp_specialize([
                (_consume_group0, (descriptors, buffers, loads, walk, output,
                                   CAUSAL, BLOCK_N, STAGES, PAGE_SIZE, PINGPONG)),
                (_consume_group1, (descriptors, buffers, loads, walk, output,
                                   CAUSAL, BLOCK_N, STAGES, PAGE_SIZE, PINGPONG)),
                (_consume_group2, (descriptors, buffers, loads, walk, output,
                                   CAUSAL, BLOCK_N, STAGES, PAGE_SIZE, PINGPONG)),
                (_producer, (descriptors, buffers, loads, walk, output, CAUSAL, BLOCK_N, STAGES, PAGE_SIZE, PINGPONG)),
            ], [4, 4, 1], [CONSUMER_REGISTERS, CONSUMER_REGISTERS, 24])
        else:
            gl.warp_specialize([
                (_consume_group0, (descriptors, buffers, loads, walk, output,
                                   CAUSAL, BLOCK_N, STAGES, PAGE_SIZE, PINGPONG)),
                (_consume_group1, (descriptors, buffers, loads, walk, output,
                                   CAUSAL, BLOCK_N, STAGES, PAGE_SIZE, PINGPONG)),
                (_producer, (descriptors, buffers, loads, walk, output, CAUSAL, BLOCK_N, STAGES, PAGE_SIZE, PINGPONG)),
            ], [4, 1], [CONSUMER_REGISTERS, 24])
    if ZERO_TAIL:
        if seq == gl.num_programs(2) - 1:  # the tail's programs, launched last
            _zero_tail_rows(out_ptr, q_begin, tail_rows, stride_os, gl.num_programs(1) * GROUP_SIZE,
                            gl.program_id(1) * gl.num_programs(0) + gl.program_id(0),
                            gl.num_programs(0) * gl.num_programs(1), HEAD_DIM)
