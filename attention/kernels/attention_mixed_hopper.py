"""Mixed batches on Hopper (sm90) in one launch, prefill and decodes sharing every SM at once (Gluon).

A mixed batch (configs.mixed_batch: a prefill or a chunk beside many decodes) is tensor-core work (the prefill)
next to bandwidth work (each decode streams its whole KV once). Programs of one grid cannot share an SM between
the two when the prefill program needs the SM's shared memory; one after the other, the launch costs what its
parts cost apart. This kernel is persistent (one program per SM) and runs two independent pipelines per program:

  * prefill: the partitions of attention_fwd_hopper.py (a TMA producer warp; two consumer warp groups of 64
    query rows each) looping over the program's share of the batch's prefill items (a query head x a tile of
    128 queries of a sequence with more than DECODE_ROWS packed rows), the heaviest q tiles first. Where the
    prefill's K / V outgrows a section of L2 (hopper_mixed.MIXED_HOPPER_L2_SECTION_MIB) the items run in sections
    of a few KV heads, each program taking its next item off a queue (an atomic counter; _section_item);
    otherwise they are dealt round by round in alternating directions (_prefill_first_step) so heavy and light
    items even out. The producer posts each item to the consumers in shared memory. The K / V ring and the Q
    buffer carry their mbarrier phases from item to item;
  * decode: one more warp group walking the program's share of the (sequence, KV head) decode items (at most
    DECODE_ROWS packed rows: a KV head's query heads x the sequence's query tokens, wgmma's N; keys and head dims
    are its M: S^T = K Q^T, O^T += V^T P^T), with its own Q buffer and ring of DECODE_BLOCK_N-key tiles, filled
    by TMA from a decode producer warp (one page per load over pages smaller than a tile). The two producer warps
    share a warp group's registers.

Finding items needs per-sequence query lengths, which the host does not have: each program loads cu_seqlens_q
once, counts each sequence's prefill q tiles and keeps their running sums in shared memory; a prefill partition
finds q tile u's sequence by counting the sums <= u. A decode item's sequence is its index // H_kv.

Masking as attention_fwd_hopper.py: keys past the sequence and the causal band are masked on the tiles that need
it, V rows past the sequence zeroed before their PV, query rows past the sequence computed and not stored.

Where the host does not know the batch's lengths (a CUDA graph's capture), the plan launches the kernel once per
tile (TILE_RULE): the launch whose tile the lengths do not call for returns before its prologue, so the work still
runs in one launch.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .attention_decode_hopper import (
    MAX_DECODE_ROWS,
    _decode_rows_out,
    _decode_tiles,
    _decode_walk,
    _load_decode_q,
    _load_decode_tiles,
)
from .attention_fwd_hopper import (
    _cta_barrier,
    _load_kv_tile,
    _prefill_tiles,
    _section_order,
    _tile_walk,
    _tma_load,
    _zero_tail_rows,
)

__all__ = ["MAX_DECODE_ROWS", "attention_mixed_hopper_kernel"]


@gluon.jit
def _store_running_sums(tiles, sums, MAX_SEQS: gl.constexpr, layout: gl.constexpr):
    """sums[b] = tiles[0] + ... + tiles[b] for a [MAX_SEQS] tensor of SliceLayout(0, layout), 32 sums at a time as
    masked row sums of a [32, MAX_SEQS] tile (Triton 3.6's Gluon has no cumsum; 32-entry slices of the buffer
    keep their offsets tile-aligned)."""
    columns = gl.arange(0, MAX_SEQS, layout=gl.SliceLayout(0, layout))
    for chunk in gl.static_range(MAX_SEQS // 32):
        rows = chunk * 32 + gl.arange(0, 32, layout=gl.SliceLayout(1, layout))
        chunk_sums = gl.sum(gl.where(columns[None, :] <= rows[:, None], tiles[None, :], 0), axis=1)
        sums.slice(chunk * 32, 32).store(chunk_sums)


@gluon.jit
def _prefill_schedule(cu_seqlens_q_ptr, num_seqs, out_ptr, tail_rows, stride_os, heads_q, ROWS: gl.constexpr,
                      HEAD_DIM: gl.constexpr, GROUP_SIZE: gl.constexpr, DECODE_ROWS: gl.constexpr,
                      MAX_SEQS: gl.constexpr):
    """A persistent mixed launch's prologue (4 warps): each sequence's prefill q tiles of 2 * ROWS queries (sequences
    of more than DECODE_ROWS packed rows) counted and their running sums stored in shared memory (the tile_ends that
    _tile_sequence reads), and out's rows past the last sequence zeroed (_zero_tail_rows). Returns (tile_ends, the
    batch's prefill q tiles)."""
    sum_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    seqs = gl.arange(0, MAX_SEQS, layout=gl.SliceLayout(0, sum_layout))
    q_begin = gl.load(cu_seqlens_q_ptr + seqs, mask=seqs < num_seqs, other=0)
    q_lens = gl.load(cu_seqlens_q_ptr + seqs + 1, mask=seqs < num_seqs, other=0) - q_begin
    tail_first = gl.load(cu_seqlens_q_ptr + num_seqs)  # (issued with the lengths: no wait of its own)
    tiles = gl.where(q_lens * GROUP_SIZE > DECODE_ROWS, (q_lens + 2 * ROWS - 1) // (2 * ROWS), 0)
    tile_ends = gl.allocate_shared_memory(gl.int32, [MAX_SEQS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    _store_running_sums(tiles, tile_ends, MAX_SEQS, sum_layout)
    _zero_tail_rows(out_ptr, tail_first, tail_rows, stride_os, heads_q, gl.program_id(0), gl.num_programs(0),
                    HEAD_DIM)
    return tile_ends, gl.sum(tiles, 0)


@gluon.jit
def _prefill_outweighs_decodes(cu_seqlens_q_ptr, cu_seqlens_kv_ptr, num_seqs, CAUSAL: gl.constexpr,
                               GROUP_SIZE: gl.constexpr, RATIO: gl.constexpr, MAX_SEQS: gl.constexpr):
    """hopper_mixed.prefill_outweighs_decodes on the batch's lengths as the device has them (the host's are
    rounded up to buckets): 1 when the longest query sequence's query-key pairs times GROUP_SIZE reach RATIO times
    the other sequences' KV tokens, else 0. In int64, doubled to keep the causal average's half exact."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    seqs = gl.arange(0, MAX_SEQS, layout=layout)
    live = seqs < num_seqs
    q_lens = gl.load(cu_seqlens_q_ptr + seqs + 1, mask=live, other=0) - gl.load(cu_seqlens_q_ptr + seqs, mask=live,
                                                                                 other=0)
    kv_begin = gl.load(cu_seqlens_kv_ptr + seqs, mask=live, other=0)
    kv_lens = gl.load(cu_seqlens_kv_ptr + seqs + 1, mask=live, other=0) - kv_begin
    longest_q = gl.max(q_lens, 0).to(gl.int64)
    longest_kv = gl.max(kv_lens, 0).to(gl.int64)
    other_kv = gl.sum(kv_lens.to(gl.int64), 0) - longest_kv
    if CAUSAL:
        twice_pairs = longest_q * (2 * longest_kv - longest_q)
    else:
        twice_pairs = 2 * longest_q * longest_kv
    return (twice_pairs * GROUP_SIZE >= 2 * RATIO * other_kv).to(gl.int32)


@gluon.jit
def _prefill_first_step():
    """The step from this program's first prefill item to its second. The items are dealt round by round, each
    round's num_programs items in alternating directions: program p takes item p of the first round, the
    (num_programs - 1 - p)-th of the second, and so on; its steps alternate between 2 * num_programs - 1 - 2p and
    2p + 1. Items run heaviest first, so a program that takes a round's heaviest item takes the next one's lightest.
    (A while loop over (item, step): a `for` over the rounds cost the 2k chunk on 14k + 64 decodes 5 % on the H200,
    its consumers' inner loops compiled longer.) Dealt in sections of a few KV heads, the items would not even out
    (the sections' q tiles run heaviest first within each): sections take a queue (_next_item)."""
    return 2 * gl.num_programs(0) - 1 - 2 * gl.program_id(0)


@gluon.jit
def _tile_sequence(tile, tile_ends, WARPS: gl.constexpr):
    """The batch's prefill q tile ``tile`` -> (sequence, local q tile): a sequence's q tiles last tile first (under
    a causal mask it sees the most keys). ``tile_ends``: the running sums of the sequences' q tiles, read whole from
    shared memory."""
    ends = tile_ends.load(gl.BlockedLayout([1], [32], [WARPS], [0]))
    before = ends <= tile  # the sequences whose tiles all come before `tile`
    seq = gl.sum(before.to(gl.int32), axis=0)
    end = gl.min(gl.where(before, 1 << 30, ends), axis=0)
    return seq, end - 1 - tile


@gluon.jit
def _prefill_item(item, tile_ends, heads_q, WARPS: gl.constexpr):
    """Prefill item ``item`` -> (sequence, local q tile, query head): items run q tile by q tile (_tile_sequence's
    order), a tile's query heads (a KV head's first) side by side."""
    seq, local_tile = _tile_sequence(item // heads_q, tile_ends, WARPS)
    return seq, local_tile, item % heads_q


@gluon.jit
def _section_item(item, tile_ends, prefill_tiles, heads_q, section_heads, WARPS: gl.constexpr):
    """Prefill item ``item`` -> (sequence, local q tile, query head) in sections of ``section_heads`` query heads
    (whole KV heads; the last section may hold fewer): within a section q tile by q tile (_tile_sequence's order),
    the section's heads side by side, so the items in flight share a few KV heads' K / V in L2 (the prefill
    kernel's order: attention_fwd_hopper._section_order). ``section_heads`` = heads_q: one section, q tile by
    q tile over every head (_prefill_item's order)."""
    rank, q_head = _section_order(item, prefill_tiles, heads_q, section_heads)
    seq, local_tile = _tile_sequence(rank, tile_ends, WARPS)
    return seq, local_tile, q_head


@gluon.jit
def _dealt_step(item, step):
    """The program's next dealt prefill item and step (_prefill_first_step's alternation)."""
    return item + step, 2 * gl.num_programs(0) - step


@gluon.jit
def _next_item(queue_ptr, item, step, QUEUE: gl.constexpr):
    """This program's next prefill item and dealing step: QUEUE, the next one off the launch's queue (an atomic
    counter, queue_ptr[0]); else dealt (_dealt_step)."""
    if QUEUE:
        item = gl.atomic_add(queue_ptr, 1)
    else:
        item, step = _dealt_step(item, step)
    return item, step


@gluon.jit
def _first_item(queue_ptr, QUEUE: gl.constexpr):
    """This program's first prefill item and dealing step (_next_item's)."""
    item = gl.program_id(0)
    if QUEUE:
        item = gl.atomic_add(queue_ptr, 1)
    return item, _prefill_first_step()


@gluon.jit
def _item_at(item, schedule, WARPS: gl.constexpr, QUEUE: gl.constexpr):
    """Prefill item ``item`` -> (sequence, local q tile, query head): in sections off the queue (_section_item),
    else q tile by q tile over every head (_prefill_item)."""
    tile_ends, heads_q, prefill_tiles, section_heads = schedule[0], schedule[1], schedule[2], schedule[3]
    if QUEUE:
        seq, local_tile, q_head = _section_item(item, tile_ends, prefill_tiles, heads_q, section_heads, WARPS)
    else:
        seq, local_tile, q_head = _prefill_item(item, tile_ends, heads_q, WARPS)
    return seq, local_tile, q_head


@gluon.jit
def _post_item(item_smem, item):
    """The producer's item for the consumers (they read it once q_ready completes: the producer's arrive orders
    this store before it), from every lane of its warp."""
    item_smem.store(gl.full([1], item, gl.int32, layout=gl.BlockedLayout([1], [32], [1], [0])))
    _cta_barrier()  # (the warp's lanes: the one that arrives on q_ready next has seen the store)


@gluon.jit
def _read_item(item_smem):
    """The item the producer posted (_post_item), read by a consumer warp group."""
    return gl.max(item_smem.load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)


@gluon.jit
def _close_queue(queue_ptr):
    """The last program to find the queue empty sets it back to zeros (queue_ptr[0], the next item; queue_ptr[1],
    the programs that found it empty) for the next launch."""
    finished = gl.atomic_add(queue_ptr + 1, 1)
    if finished == gl.num_programs(0) - 1:
        gl.atomic_xchg(queue_ptr, 0)
        gl.atomic_xchg(queue_ptr + 1, 0)


@gluon.jit
def _prefill_walk(seq, local_tile, q_head, sequences, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                  CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                  HAS_KV_START: gl.constexpr):
    """What the partitions need of one prefill item: (first query, q_len, kv_len, diag, KV tiles, first masked
    tile, first Q row, first K / V rows, output row, the sequence's first packed query token)."""
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr = sequences[0], sequences[1], sequences[2], \
        sequences[3]
    q_batch_rows, k_batch_rows, v_batch_rows, out_batch_rows = sequences[4], sequences[5], sequences[6], sequences[7]
    q_begin = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_begin
    first_query = local_tile * (2 * ROWS)
    kv_len, q_first, kv_first, diag, num_tiles, first_masked = _tile_walk(
        seq, first_query, q_len, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, 2 * ROWS, BLOCK_N, CAUSAL,
        BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START)
    return (first_query, q_len, kv_len, diag, num_tiles, first_masked,
            seq * q_batch_rows + q_first + first_query, seq * k_batch_rows + kv_first, seq * v_batch_rows + kv_first,
            (seq * out_batch_rows + q_first + first_query).to(gl.int64), q_begin)


@gluon.jit
def _prefill_producer(descriptors, buffers, decode_buffers, schedule, sequences, output,
                      CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                      HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                      GROUP_SIZE: gl.constexpr, QUEUE: gl.constexpr):
    """1 warp: for each of the program's prefill items, posted to the consumers, TMA loads of its Q halves (once
    the consumers released the previous item's), then its K / V tiles into the ring; an item past the last, posted
    with no Q, stops the consumers."""
    q_desc, k_desc, v_desc, _, _ = descriptors
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = buffers
    page_table_ptr, page_table_stride, prefill_items = output[5], output[6], output[7]
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    queue_ptr, item_smem = schedule[4], schedule[5]
    count = 0  # KV tiles loaded so far (the ring's position)
    done = 0  # items so far (the Q buffer's phase)
    item, step = _first_item(queue_ptr, QUEUE)
    while item < prefill_items:
        seq, local_tile, q_head = _item_at(item, schedule, 1, QUEUE)
        walk = _prefill_walk(seq, local_tile, q_head, sequences, ROWS, BLOCK_N, CAUSAL, BOTTOM_RIGHT,
                             HAS_Q_START, HAS_KV_START)
        kv_len, num_tiles, q_row0, k_row0, v_row0 = walk[2], walk[4], walk[6], walk[7], walk[8]
        kv_col = (q_head // GROUP_SIZE) * HEAD_DIM
        pages = page_table_ptr + seq.to(gl.int64) * page_table_stride
        mbarrier.wait(q_empty, (done & 1) ^ 1)  # a fresh barrier counts as released
        if QUEUE:
            _post_item(item_smem, item)
        mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row0, q_head * HEAD_DIM], q_ready, q_smem.index(0))
        _tma_load(q_desc, [q_row0 + ROWS, q_head * HEAD_DIM], q_ready, q_smem.index(1))
        for t in range(num_tiles):
            _load_kv_tile((k_desc, v_desc), (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty), count % STAGES,
                          (count // STAGES) & 1, t, k_row0, v_row0, kv_col, pages, kv_len, BLOCK_N, PAGE_SIZE)
            count += 1
        done += 1
        item, step = _next_item(queue_ptr, item, step, QUEUE)
    if QUEUE:
        mbarrier.wait(q_empty, (done & 1) ^ 1)
        _post_item(item_smem, item)  # past the last item: the consumers stop
        mbarrier.arrive(q_ready, count=1)
        _close_queue(queue_ptr)


@gluon.jit
def _prefill_consumer(buffers, schedule, sequences, output, GROUP: gl.constexpr,
                      CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                      HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, QUEUE: gl.constexpr):
    """4 warps: 64 query rows (half GROUP of each item's 128) through the item's KV tiles, then its output."""
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = buffers
    out_ptr, stride_os, qk_scale, prefill_items = output[0], output[1], output[2], output[7]
    ROWS: gl.constexpr = q_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    first_row = GROUP * ROWS
    rows = first_row + gl.arange(0, ROWS, layout=row_s)
    out_rows = first_row + gl.arange(0, ROWS, layout=row_o)
    out_cols = gl.arange(0, HEAD_DIM, layout=col_o)
    q = q_smem.index(GROUP)
    item_smem = schedule[5]
    count = 0
    done = 0
    item, step = gl.program_id(0), _prefill_first_step()
    if QUEUE:  # the producer posts each item
        mbarrier.wait(q_ready, 0)
        item = _read_item(item_smem)
    while item < prefill_items:
        seq, local_tile, q_head = _item_at(item, schedule, 4, QUEUE)
        walk = _prefill_walk(seq, local_tile, q_head, sequences, ROWS, BLOCK_N, CAUSAL, BOTTOM_RIGHT,
                             HAS_Q_START, HAS_KV_START)
        first_query, q_len, kv_len, diag, num_tiles, first_masked = walk[0], walk[1], walk[2], walk[3], walk[4], walk[5]
        out_row0 = walk[9]
        diag = diag + first_query  # rows count from the tile's first query
        if not QUEUE:
            mbarrier.wait(q_ready, done & 1)
        o, _, l_i = _prefill_tiles(q, (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty), count, 0, num_tiles,
                                     first_masked, rows, kv_len, diag, qk_scale, CAUSAL, STAGES)
        mbarrier.arrive(q_empty, count=1)
        count += num_tiles
        done += 1
        l_o = gl.convert_layout(l_i, row_o)
        o = o / gl.where(l_o == 0.0, 1.0, l_o)[:, None]
        offsets = (out_row0 + out_rows.to(gl.int64))[:, None] * stride_os + (q_head * HEAD_DIM + out_cols)[None, :]
        gl.store(out_ptr + offsets, o.to(out_ptr.dtype.element_ty), mask=(out_rows < q_len - first_query)[:, None])
        if QUEUE:
            mbarrier.wait(q_ready, done & 1)
            item = _read_item(item_smem)
        else:
            item, step = _dealt_step(item, step)


@gluon.jit
def _decode_producer(descriptors, buffers, decode_buffers, schedule, sequences, output,
                     CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                     HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                     GROUP_SIZE: gl.constexpr, QUEUE: gl.constexpr):
    """1 warp: the K / V tiles of the program's decode items into the decode ring, as the decode warp group frees
    it (the prefill producer's loads: one TMA load a tile, or a page; a warp group issuing them itself paid a
    barrier of its 4 warps before each). The next item's walk is loaded before this item's tiles. Its loads run as
    fast as the ring frees: paced to spread over the prefill's time (by %globaltimer, or by the prefill producer's
    progress) they measured no faster on the 2k chunk on 14k + 64 decodes (docs/benchmarks_log.md, fifty-first
    session), and with their tiles prefetched into L2 a few tiles ahead 2-17 % slower (fifty-second). What they cost
    the prefill beside them is their DRAM traffic's power: the launch runs at the H200's 700 W cap, and the decodes'
    reads lower its SM clock (M2 1,515 against 1,680 MHz without them; in cycles they are free: fifty-second
    session)."""
    dq_smem = decode_buffers[0]
    page_table_ptr, page_table_stride, num_seqs, heads_kv = output[5], output[6], output[8], output[9]
    ROWS: gl.constexpr = dq_smem.type.shape[0]
    HEAD_DIM: gl.constexpr = dq_smem.type.shape[1]
    num_items = num_seqs * heads_kv
    count = 0
    item = gl.program_id(0)
    walk = _decode_walk(gl.minimum(item, num_items - 1), sequences, heads_kv, ROWS, DECODE_BLOCK_N, CAUSAL,
                        BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START, GROUP_SIZE)
    while item < num_items:
        is_decode, seq, kv_head, _, kv_len, _, _, num_tiles, _, k_row0, v_row0, _ = walk
        item += gl.num_programs(0)
        walk = _decode_walk(gl.minimum(item, num_items - 1), sequences, heads_kv, ROWS, DECODE_BLOCK_N, CAUSAL,
                            BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START, GROUP_SIZE)
        if is_decode:
            pages = page_table_ptr + seq.to(gl.int64) * page_table_stride
            _load_decode_tiles((descriptors[3], descriptors[4]), decode_buffers, count, 0, num_tiles, k_row0, v_row0,
                               kv_head * HEAD_DIM, pages, kv_len, PAGE_SIZE, False)
            count += num_tiles


@gluon.jit
def _decode(descriptors, buffers, decode_buffers, schedule, sequences, output,
            CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
            HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
            GROUP_SIZE: gl.constexpr, QUEUE: gl.constexpr):
    """4 warps: the program's decode items, each a KV head's query heads x the sequence's queries (at most
    DECODE_ROWS rows) through the sequence's KV tiles (the decode producer's ring of DECODE_STAGES), the way
    attention_decode_hopper.py's kernel runs a split (its ``_decode_tiles``)."""
    dq_smem = decode_buffers[0]
    out_ptr, stride_os, qk_scale, q_ptr, stride_qs = output[0], output[1], output[2], output[3], output[4]
    num_seqs, heads_kv, q_batch_rows, out_batch_rows = output[8], output[9], sequences[4], sequences[7]
    ROWS: gl.constexpr = dq_smem.type.shape[0]
    count = 0
    for item in range(gl.program_id(0), num_seqs * heads_kv, gl.num_programs(0)):
        is_decode, seq, kv_head, q_len, kv_len, q_first, diag, num_tiles, first_masked, _, _, _ = _decode_walk(
            item, sequences, heads_kv, ROWS, DECODE_BLOCK_N, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
            GROUP_SIZE)
        if is_decode:
            _load_decode_q(dq_smem, q_ptr, stride_qs, seq * q_batch_rows + q_first, kv_head, q_len, GROUP_SIZE)
            o, _row_max, l_sum = _decode_tiles(decode_buffers, count, 0, num_tiles, first_masked, kv_len, diag,
                                               qk_scale, CAUSAL, GROUP_SIZE, False)
            count += num_tiles
            _decode_rows_out(o, l_sum, out_ptr, stride_os, seq * out_batch_rows + q_first, kv_head, q_len, GROUP_SIZE)


@gluon.jit
def _first_consumer(descriptors, buffers, decode_buffers, schedule, sequences, output,
                    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                    HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                    GROUP_SIZE: gl.constexpr, QUEUE: gl.constexpr):
    _prefill_consumer(buffers, schedule, sequences, output, 0, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
                      BLOCK_N, STAGES, QUEUE)


@gluon.jit
def _second_consumer(descriptors, buffers, decode_buffers, schedule, sequences, output,
                     CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_Q_START: gl.constexpr,
                     HAS_KV_START: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     DECODE_BLOCK_N: gl.constexpr, DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                     GROUP_SIZE: gl.constexpr, QUEUE: gl.constexpr):
    """A worker partition: the same signature as the others (Gluon's rule for workers)."""
    _prefill_consumer(buffers, schedule, sequences, output, 1, CAUSAL, BOTTOM_RIGHT, HAS_Q_START, HAS_KV_START,
                      BLOCK_N, STAGES, QUEUE)


@gluon.jit
def attention_mixed_hopper_kernel(
    q_desc, k_desc, v_desc, k_decode_desc, v_decode_desc, q_ptr, out_ptr,
    cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, page_table_ptr, queue_ptr,
    num_seqs, heads_kv, q_batch_rows, k_batch_rows, v_batch_rows, out_batch_rows, stride_qs, stride_os,
    page_table_stride, qk_scale, tail_rows, section_heads,
    GROUP_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DECODE_BLOCK_N: gl.constexpr,
    DECODE_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
    HAS_Q_START: gl.constexpr, HAS_KV_START: gl.constexpr, LOG2_MAX_SEQS: gl.constexpr, DECODE_ROWS: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, DECODE_REGISTERS: gl.constexpr, DECODE_V_STAGES: gl.constexpr = 0,
    QUEUE: gl.constexpr = False, TILE_RULE: gl.constexpr = 0, RULE_RATIO: gl.constexpr = 0,
):
    """Grid (programs,): persistent, one per SM. Tensors as attention_fwd_hopper_kernel's: q_desc / k_desc / v_desc
    over 2-D views [token rows, heads x head dim] with blocks [64, D] / [min(BLOCK_N, PAGE_SIZE), D], and
    k_decode_desc / v_decode_desc over the same K / V with blocks [min(DECODE_BLOCK_N, PAGE_SIZE), D] (PAGE_SIZE 0:
    not paged, the whole tile); q_ptr: the same Q, token rows stride_qs elements apart (decode rows load by
    pointer). 2**LOG2_MAX_SEQS > num_seqs bounds the schedule's buffer. qk_scale in log2 units. DECODE_ROWS: the
    packed rows of a decode tile (wgmma's N, a power of 2 from 8 to MAX_DECODE_ROWS); sequences with more are
    prefill items. tail_rows > 0 (thd, sequences back to back): out's rows cu_seqlens_q[num_seqs] ..
    tail_rows - 1 are written as zeros, a row per program in turn. DECODE_V_STAGES (a divisor of DECODE_STAGES; 0:
    DECODE_STAGES): V slots of the decode ring, fewer than K's to leave shared memory to the prefill ring (K_t+1 is
    awaited while K_t is held: K needs two). section_heads: query heads a section of the prefill items' order
    (_section_item) when QUEUE: the programs then take prefill items off a queue, queue_ptr[0] (a counter;
    queue_ptr[1] counts the programs that found it empty; both 0 before the launch and left 0 by it), the producer
    posting each to the consumers. Else the items are dealt (_prefill_first_step) over every head. TILE_RULE 1 / 2:
    the launch returns at once unless the batch's prefill does / does not outweigh its decodes
    (_prefill_outweighs_decodes at RULE_RATIO): one of two launches of this batch, each compiled with its tile, when
    the host does not know the lengths (hopper_mixed.MixedHopperPlan.heavy_plan); 0: it always runs."""
    if TILE_RULE != 0:
        heavy = _prefill_outweighs_decodes(cu_seqlens_q_ptr, cu_seqlens_kv_ptr, num_seqs, CAUSAL, GROUP_SIZE,
                                           RULE_RATIO, 1 << LOG2_MAX_SEQS)
        if heavy != (2 - TILE_RULE):
            return
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    MAX_SEQS: gl.constexpr = 1 << LOG2_MAX_SEQS
    V_STAGES: gl.constexpr = DECODE_STAGES if DECODE_V_STAGES == 0 else DECODE_V_STAGES
    heads_q = heads_kv * GROUP_SIZE

    tile_ends, prefill_tiles = _prefill_schedule(cu_seqlens_q_ptr, num_seqs, out_ptr, tail_rows, stride_os, heads_q,
                                                 ROWS, HEAD_DIM, GROUP_SIZE, DECODE_ROWS, MAX_SEQS)
    prefill_items = prefill_tiles * heads_q

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    item_smem = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    dq_smem = gl.allocate_shared_memory(q_desc.dtype, [DECODE_ROWS, HEAD_DIM],
                                        gl.NVMMASharedLayout.get_default_for([DECODE_ROWS, HEAD_DIM], q_desc.dtype))
    dp_smem = gl.allocate_shared_memory(q_desc.dtype, [DECODE_ROWS, DECODE_BLOCK_N],
                                        gl.NVMMASharedLayout.get_default_for([DECODE_ROWS, DECODE_BLOCK_N],
                                                                             q_desc.dtype))
    dk_smem = gl.allocate_shared_memory(k_decode_desc.dtype, [DECODE_STAGES, DECODE_BLOCK_N, HEAD_DIM],
                                        k_decode_desc.layout)
    dv_smem = gl.allocate_shared_memory(v_decode_desc.dtype, [V_STAGES, DECODE_BLOCK_N, HEAD_DIM],
                                        v_decode_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dk_ready = gl.allocate_shared_memory(gl.int64, [DECODE_STAGES, 1], mbarrier.MBarrierLayout())
    dk_empty = gl.allocate_shared_memory(gl.int64, [DECODE_STAGES, 1], mbarrier.MBarrierLayout())
    dv_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    dv_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=2)  # both consumer groups release Q
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(DECODE_STAGES):
        for barrier in gl.static_range(4):
            if barrier < 2 or i < V_STAGES:
                mbarrier.init((dk_ready, dk_empty, dv_ready, dv_empty)[barrier].index(i), count=1)
    _cta_barrier()  # the schedule is in shared memory before any partition reads it

    descriptors = (q_desc, k_desc, v_desc, k_decode_desc, v_decode_desc)
    buffers = (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)
    decode_buffers = (dq_smem, dk_smem, dv_smem, dk_ready, dk_empty, dv_ready, dv_empty, dp_smem)
    schedule = (tile_ends, heads_q, prefill_tiles, section_heads, queue_ptr, item_smem)
    sequences = (cu_seqlens_q_ptr, cu_seqlens_kv_ptr, q_start_ptr, kv_start_ptr, q_batch_rows, k_batch_rows,
                 v_batch_rows, out_batch_rows)
    output = (out_ptr, stride_os, qk_scale, q_ptr, stride_qs, page_table_ptr, page_table_stride, prefill_items,
              num_seqs, heads_kv)
    gl.warp_specialize([  # (constexprs stay constexprs only as direct members of an argument tuple literal)
        (_first_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                           HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                           GROUP_SIZE, QUEUE)),
        (_second_consumer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                            HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                            GROUP_SIZE, QUEUE)),
        (_prefill_producer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                             HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                             GROUP_SIZE, QUEUE)),
        (_decode, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                   HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                   GROUP_SIZE, QUEUE)),
        (_decode_producer, (descriptors, buffers, decode_buffers, schedule, sequences, output, CAUSAL, BOTTOM_RIGHT,
                            HAS_Q_START, HAS_KV_START, BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, PAGE_SIZE,
                            GROUP_SIZE, QUEUE)),
    ], [4, 1, 4, 1], [CONSUMER_REGISTERS, 24, DECODE_REGISTERS, 24])
