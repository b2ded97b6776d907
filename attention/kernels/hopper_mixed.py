"""Host side of the Hopper mixed-batch kernel (attention_mixed_hopper.py): which calls it serves, and their launch.

plan_hopper_forward (hopper_forward.py) hands it the calls that configs.mixed_batch calls mixed and the Hopper
kernels serve; it takes every one it can run (MIXED_HOPPER_ENV has the measurements). ``ATTN_FUSED_HOPPER_MIXED=0``
sends them to the general kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attention.environment import getenv, switch

from .arguments import scale_log2
from .attention_decode_hopper import MAX_DECODE_ROWS, SMALL_DECODE_ROWS
from .attention_fwd_hopper import HOPPER_ROWS_PER_GROUP
from .attention_mixed_hopper import attention_mixed_hopper_kernel
from .combine import split_counter_buffer
from .launch import KernelLaunch
from .tma_promotion import DECODE_PROMOTION_ENV, PREFILL_PROMOTION_ENV, promoted

__all__ = ["MIXED_HOPPER_DEVICE_RULE_ENV", "MIXED_HOPPER_ENV", "MIXED_HOPPER_L2_DEALT_ENV", "MIXED_HOPPER_L2_DEALT_MIB",
           "MIXED_HOPPER_L2_SECTION_ENV", "MIXED_HOPPER_L2_SECTION_MIB",
           "MIXED_HOPPER_PREFILL_TILE", "MIXED_HOPPER_QUEUE_ENV", "MIXED_HOPPER_SMALL_DECODE_REGISTERS",
           "MIXED_HOPPER_TILE",
           "MIXED_HOPPER_TILE_ENV", "PREFILL_TO_DECODE_RATIO", "MixedHopperPlan", "PersistentLaunch",
           "check_environment", "mixed_hopper_unsupported_reason", "plan_mixed_hopper", "prefill_outweighs_decodes"]

MIXED_HOPPER_ENV = "ATTN_FUSED_HOPPER_MIXED"
"""``0``: mixed batches go to the general kernel; unset or ``1``: to attention_mixed_hopper_kernel, every one it can
run. H200, 2026-12-01, graph replays, settled, against the general kernel in the same process (abtree/rule_ab.py,
docs/results/2026-12-01-h200-cf44b01/rule-ab.txt), page 16 unless named / non-paged: a 2k prefill + 128 decodes at
2k 335.5 / 295.2 against 353.9 / 309.6 us; a 2k chunk on 14k + 64 decodes at 4k 1158.7 / 1139.0 against 1374.1 /
1155.8; 512 + 32 decodes at 1k 57.6 / 53.6 against 64.5 / 58.0; a 2k chunk on 2k + 16 decodes at 2k 237.2 / 226.1
against 300.4 / 249.6; 1k + 256 decodes at 512 187.2 / 164.4 against 186.6 / 167.1 (the one tie); 4k + 64 decodes
at 8k 752.8 / 666.6 against 936.1 / 756.5; 1k + 64 decodes at 4k, page 64, 274.0 / 266.5 against 317.2 / 290.4; a
ragged prefill of 8k + 63 x 128 tokens (no decodes) 1233.0 / 1209.9 against 1438.9 / 1239.3; prefills of 2k and 900
+ 64 verification steps of 4 tokens at 2k 217.9 / 190.0 against 276.7 / 232.4. (Before its decode tiles put a
decode's rows in wgmma's N, the kernel lost the fresh-prefill cells and took only paged batches with KV walks of 8k
keys or more.)"""


MIXED_HOPPER_TILE = {64: (64, 2, 64, 3, 176, 136, 128), 128: (64, 2, 64, 3, 176, 136, 128)}
"""Head dim -> (BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, consumer registers, decode registers, maxnreg).
Shared memory at d128: Q 32 KiB, the prefill ring 2 x 2 x 16 KiB, the decode ring 3 x 2 x 16 KiB, the decode Q and
P^T 6 KiB: 200 KiB of sm90's 227. Registers: the partitions take four warp groups (the two 1-warp producers one),
512 threads at maxnreg 128 share 65,536; the second consumer 176, the producers 24, the decode warp group 136, which
leaves the first consumer 176 (192 / 104 for 8-row decode tiles at d128: MIXED_HOPPER_SMALL_DECODE_REGISTERS).
H200, 2026-12-01, graph replays, settled (abtree/decode_ab.py), before the decode producer warp: consumers 192 /
decode 104 ran the 2k chunk on 14k + 64 decodes at 4k in 1132.6 against 1135.1 us
and the fresh 2k prefill + 128 decodes at 2k in 341.3 against 336.3 (noise-sized both ways). With the earlier
64-row decode tiles: consumers 168 / decode 152 1217.9, 184 / 120 1574.8 against 1148.6 on the chunk cell; 32-key
decode tiles 1241.1 (4 stages), 1218.2 (6); the prefill ring 3 deep and the decode ring 2 deep 1193.6. With the
decode producer warp (eighteenth session, docs/benchmarks_log.md): 184 / 120 and 192 / 104 no faster on M1 or M2. With
8-row decode tiles (2026-12-02, docs/results/2026-12-02-h200-24b6f69/, six rounds): 192 / 104 ran M2 1.1-1.8 %
faster and M1 ~1 us slower, and spills in the decode loops (64-row tiles most); 216 / 56 ran M1 4 % slower. 128-key
prefill tiles leave shared memory for one decode stage, on which the decode loop (K_t kept while K_t+1 is awaited)
deadlocks; with two K slots and one V slot (MIXED_HOPPER_TILE_ENV's eighth field, 217,688 B) they fit. H200,
2026-12-04, env_ab, two rounds, against this tile (docs/results/2026-12-04-h200-aff6109/out/call11):
``128,2,64,2,208,72,128,1`` ran M2 in 990.1 against 1,105.2 us (0.896; served page runs 0.893) and M1 in 396.2
against 278.3 (1.424): the long prefill walk gains more than the decodes' single V slot costs on M2, not on M1.
MIXED_HOPPER_PREFILL_TILE holds that tile (and others), and prefill_outweighs_decodes picks it per batch."""

MIXED_HOPPER_PREFILL_TILE = {
    (128, 8): (128, 2, 64, 2, 192, 104, 128, 1),
    (128, 16): (128, 2, 64, 2, 192, 104, 128, 1),
    (128, 32): (128, 2, 64, 2, 192, 104, 128, 1),
    (64, 8): (128, 2, 64, 3, 208, 72, 128),
    (64, 16): (128, 2, 64, 3, 192, 104, 128),
}
"""(head dim, decode tile rows) -> a tile of 128-key prefill tiles in place of MIXED_HOPPER_TILE's (_tile): at d128
its decode ring holds two K slots and one V slot (217,688 B of shared memory), which costs the decodes, so only
batches whose prefill outweighs them (prefill_outweighs_decodes) take it; at d64 the whole three-stage ring fits, and
every batch does. H200, 2026-12-04, env_ab, two rounds, graph replays, settled, page 16, time against
MIXED_HOPPER_TILE's (with 192 / 104 at d128, 8 rows), with the host values' prefill / decode ratio (query-key pairs
a decode KV token; PREFILL_TO_DECODE_RATIO weighs them by the 4 query heads a KV head):

- d128, one-token decodes (8 rows; docs/results/2026-12-04-h200-9d5f604/out/call1, "MX" cells: M2's shape with one
  quantity moved at a time): wins from ratio 54 up (a 2k chunk on 6k + 128 decodes at 2k 0.981 at 54, 128 decodes
  at 4k beside M2's chunk 0.928 at 58, a 4k prefill + 64 decodes at 2k 0.903 at 61, M2 0.927 at 118, a 2k chunk on
  28k 0.875 at 226), losses up to 38 (a 2k chunk on 4k + 64 decodes at 4k 1.047 at 38, a 2k prefill + 32 decodes
  at 2k 1.083 at 32, M1 1.415 at 8); 200 / 88 within noise of 208 / 72. Read back under the rule (out/call2): every
  cell, non-paged ones too, within noise of the faster tile. 192 / 104 on M2 (docs/results/2026-12-04-h200-7be5989,
  calls 7-8): 0.987 / 0.981 of 208 / 72's time in four rounds, 0.989 / 1.000 in six (random pages / page runs); with
  the split prefill loop (docs/results/2026-12-04-h200-b01f509, calls 7-8) 0.993 / 0.982 in three rounds (216 / 56
  1.005 / 0.991, 200 / 88 1.003 / 0.987) and 0.995 / 0.995 in six, M2's probe 0.980 / 0.992: the entry's split
  since, as its 16- and 32-row neighbours (fewer decode spills too: MIXED_HOPPER_SMALL_DECODE_REGISTERS).
- d128, verification steps of 4 queries (16 rows; out/call5/verify): M2's shape 0.896, a 4k prefill + 64 steps at 2k
  0.885, M1's 1.401 at 192 / 104; 208 / 72 and 200 / 88 slower (0.908 / 0.904, 0.960 / 0.898, 1.548 / 1.430).
- d64, GQA 32/8, one-token decodes (out/call5/d64): M2's shape 0.856, a 4k prefill + 64 decodes at 2k 0.893, M1's
  1.001 at 208 / 72; 176 / 136 0.869 / 0.909 / 0.993; one V slot (the d128 tile) 0.854 / 0.898 / 1.808.
- d128, MQA 32/1, one-token decodes (32 rows; out/call7/mqa), the same three shapes: 0.898 / 1.002 / 0.922 at 192 /
  104, 1.138 / 1.098 / 1.148 at 176 / 136.
- d64, verification steps of 4 (16 rows; out/call7/d64v), the whole ring: 0.877 / 0.992 / 0.924 at 192 / 104, 0.885 /
  0.997 / 0.927 at 176 / 136.

Read back as the defaults (out/call6), against MIXED_HOPPER_TILE's: verification steps 1,012.1 / 286.5 / 320.7 against
1,115.0 / 287.6 / 351.6 us (M2's shape, M1's, the 4k prefill); d64 655.9 / 169.6 / 201.7 against 758.3 / 169.3 / 224.2.
64-row decode tiles (16 query heads a KV head with 4 queries, or 64 with one) were not measured: MIXED_HOPPER_TILE's."""

PREFILL_TO_DECODE_RATIO = 192
"""prefill_outweighs_decodes' threshold: query-key pairs of the prefill times the query heads a KV head, per decode KV
token. Measured at GQA 32/8 (4 heads a KV head; MIXED_HOPPER_PREFILL_TILE's docstring, whose ratios are pairs per
token): between the loss at 4 x 38 and the gain at 4 x 54 with one-token decodes, and 4-query verification steps fall
on the same sides. The heads weigh the prefill's work against the decodes' bytes, which one V slot slows: with MQA
(32 heads a KV head) M1's shape, at 32 x 8 = 256, ran 1.002x the 64-key tile's time (a tie; read back under the rule
1.008x, 108.0 against 107.1 us: docs/results/2026-12-04-h200-7be5989/out/call1) and the heavier two 0.90 / 0.92; MHA
(1) was not measured, and takes the tile only from 192 pairs a decode KV token."""

MIXED_HOPPER_SMALL_DECODE_REGISTERS = {128: (192, 104)}
"""Head dim -> (consumer registers, decode registers) in place of MIXED_HOPPER_TILE's when the decode tiles have
SMALL_DECODE_ROWS rows (one-token decodes of groups of up to 8 heads): the 8-row decode loop needs fewer registers
(ptxas spills 4 loads / stores a tile there at 104, 129-263 in the 64-row loops), and the prefill consumers use the
rest. H200, 2026-12-03, graph replays, settled, bench_mixed in alternating processes, three rounds each
(docs/results/2026-12-03-h200-probe/out/ab/): the 2k chunk on 14k + 64 decodes at 4k (M2) 1,079.4-1,094.3 us
against 1,100.2-1,118.8 at 176 / 136 (its prefill alone, the decodes without queries, 995.9-998.4 against
1,003.2-1,007.6); the 2k prefill + 128 decodes at 2k (M1) 275.4-275.5 against 273.8-278.5. Also measured
(docs/results/2026-12-02-h200-24b6f69/): M2 1.1-1.8 % faster in six rounds, M1 ~1 us slower; 216 / 56 ran M1 4 %
slower. Compiled for sm90 (Triton 3.6, nvdisasm of the d128 page-16 launch; the results folder's
out/mixed-register-splits-sass.txt): 200 / 88 and 208 / 72 leave the consumers' loops as 192 / 104 does and spill more
in the decode loops (3-7 loads / stores a tile against 1-5), so the consumers gain nothing past 192. d64's 8-row
decode tiles take MIXED_HOPPER_PREFILL_TILE's tile."""

MIXED_HOPPER_TILE_ENV = "ATTN_FUSED_HOPPER_MIXED_TILE"
"""Override of MIXED_HOPPER_TILE's entry (A/B measurements): seven integers, e.g. ``64,2,64,3,168,152,128``, and an
optional eighth, the decode ring's V slots when fewer than its K slots (a divisor of DECODE_STAGES), e.g.
``128,2,64,2,208,72,128,1``: 128-key prefill tiles beside a decode ring of two K slots and one V slot."""

MIXED_HOPPER_L2_SECTION_MIB = 16
"""K and V bytes (MiB) of the KV heads in one section of the launch's prefill items (hopper_forward.section_heads's
budget; the prefill kernel's is HOPPER_L2_SECTION_MIB). Where one section does not hold every KV head's K / V at
the call's longest key length (under a causal mask; without one a section is one KV head), the programs take their
prefill items off a queue, section by section, heaviest first within each; otherwise (M1's 2k prefill: 8 MiB for all
8 KV heads), or where L2 holds every head's K / V (MIXED_HOPPER_L2_DEALT_MIB), they are dealt round by round over
every head (_prefill_first_step). Dealt over every head, each round of
132 items re-read M2's 67 MB of K / V from DRAM: ncu counted ~290 MB of DRAM traffic for the launch's prefill
against the prefill kernel's 101, an L2 hit rate of 78.7 % against 96 %, and 4.4 % more cycles,
its consumers waiting longer for K (docs/benchmarks_log.md, fifty-fifth session). The queue balances sections of
two KV heads (16 MiB at 16k keys) as well as the dealt order (481 against 482 128-key tiles for the busiest
program) and one KV head a section less well (488). H200, 2026-12-04, env_ab, graph replays, settled, eight rounds
against the dealt order (docs/results/2026-12-04-h200-9cb74a5/out/call5): the 2k chunk on 14k + 64 decodes at 4k
(M2) 0.993, over served page runs 0.991, its prefill in the launch (the decodes without queries) 0.985; 8 MiB
0.996 / 0.994 / 0.989; in three rounds (call 4) 16 MiB 0.999 / 0.987 / 0.982, 32 MiB 1.009 / 1.000 / 0.994. On
bench_mixed's 13 tile-rule batches (all past 16 MiB; docs/results/2026-12-04-h200-1d19c47/out/call1, three rounds)
the dealt order ran 0.985-1.021x the queue's time, seven slower, six faster; the 2k chunk on a 4k prefix (25 MB,
which L2 holds through the dealt rounds) 0.985. With sections the launch's prefill took 1.0 % more cycles than the
prefill kernel under ncu, 117 MB of DRAM traffic against 102 (fifty-sixth session)."""

MIXED_HOPPER_L2_SECTION_ENV = "ATTN_FUSED_HOPPER_MIXED_L2_SECTION"
"""Override of MIXED_HOPPER_L2_SECTION_MIB (A/B measurements)."""

MIXED_HOPPER_L2_DEALT_MIB = 32
"""Under a causal mask, where every KV head's K and V (at the longest key length) fit this many MiB, the launch's
prefill items are dealt even past one section (MIXED_HOPPER_L2_SECTION_MIB): L2 (50 MB) holds them through the dealt
rounds, and the queue only costs its counter and its order. H200, env_ab of the dealt order against the queue, graph
replays, settled: the 2k chunk on a 4k prefix + 64 decodes at 4k (24 MiB) 0.985 in three rounds (2026-12-04),
0.992 and 0.993 in six (two calls, 2026-12-05); on a 6k prefix + 128 decodes at 2k (32 MiB) 1.002, 0.993 and 1.000;
M2 (64 MiB) 1.007 in eight. A small gain, but one way on three leases; two identical variants of M2 read 0.992-0.994
apart in the last call (docs/benchmarks_log.md, fifty-fifth, fifty-sixth and fifty-ninth sessions)."""

MIXED_HOPPER_L2_DEALT_ENV = "ATTN_FUSED_HOPPER_MIXED_L2_DEALT"
"""Override of MIXED_HOPPER_L2_DEALT_MIB (A/B measurements; ``0``: sections wherever one does not hold every head)."""

MIXED_HOPPER_DEVICE_RULE_ENV = "ATTN_FUSED_HOPPER_MIXED_DEVICE_RULE"
"""``0``: a mixed batch planned without its lengths on the host (a CUDA graph's capture, a call without
``total_kv``) runs, in one launch, the tile the host rule gives without them (MIXED_HOPPER_TILE's 64-key tile at
d128). Unset or ``1``: where MIXED_HOPPER_PREFILL_TILE's tile differs from that one (d128), both launch and the
device's lengths pick the one that runs (MixedHopperPlan.heavy_plan); an eager call without ``total_kv`` then pays a
second launch's host work. H100, 2026-12-05, env_ab of DotProductAttention's graph replays (fused_dpa), two rounds,
page 16, against ``0`` (docs/results/2026-12-05-h100-da2b7c2/out/call3): M2 (a 2k chunk on 14k + 64 decodes at 4k)
981.8 against 1,155.5 us, over served page runs 1,003.8 against 1,175.0, a 2k chunk on 6k + 128 decodes at 2k 552.7
against 657.1. The light batches pay ~4 us for the launch that returns: M1 384.8 against 380.7 (1.011), over page
runs 1.013; a 2k chunk on 4k + 64 decodes at 4k (light, near the threshold) 535.1 against 536.1 (noise). The
captured M2 then runs as fast as attention_forward planned with the lengths (940.2 against 964.4 us in one
bench_mixed run)."""

MIXED_HOPPER_QUEUE_ENV = "ATTN_FUSED_HOPPER_MIXED_QUEUE"
"""``0``: the launch's prefill items are dealt round by round over every head even where they would run in sections
off a queue (MIXED_HOPPER_L2_SECTION_MIB; A/B measurements); unset or ``1``: the rule."""

MIXED_HOPPER_MAX_SEQS = 512
"""Batches of fewer sequences only: the schedule's running sums cost each program MAX_SEQS**2 / 128 compares a
thread before it starts (MAX_SEQS: the sequence count rounded up to a power of 2, at least 32)."""


@dataclass(frozen=True)
class PersistentLaunch:
    """What a persistent Hopper launch over a batch of sequences fixes (the mixed and decode plans' common part)."""

    programs: int
    group_size: int
    heads_kv: int
    num_seqs: int
    batch_rows: tuple[int, int, int, int]
    q_token_stride: int
    out_token_stride: int
    softmax_scale_log2: float
    page_size: int
    causal: bool
    bottom_right: bool
    has_q_start: bool
    has_kv_start: bool
    launches: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    """The kernel's KernelLaunch per (zero_tail, page table row stride), both fixed by attention_forward's key, made
    at the first call with them: later calls skip Triton's argument binding (attention.kernels.launch: ~17 us a
    launch on the H200's host)."""

    def _launch_for(self, zero_tail: bool, page_table: torch.Tensor | None) -> KernelLaunch:
        """The kernel's launch for a call with this ``zero_tail`` and page table (``_kernel_launch``'s, kept)."""
        table_stride = 0 if page_table is None else page_table.stride(0)
        launch = self.launches.get((zero_tail, table_stride))
        if launch is None:
            launch = self.launches[zero_tail, table_stride] = self._kernel_launch(zero_tail, table_stride)
        return launch

    def _kernel_launch(self, zero_tail: bool, table_stride: int) -> KernelLaunch:
        raise NotImplementedError


@dataclass(frozen=True)
class MixedHopperPlan(PersistentLaunch):
    """One call's launch of attention_mixed_hopper_kernel, all but the tensors' addresses."""

    tile: tuple[int, ...]
    """(BLOCK_N, STAGES, DECODE_BLOCK_N, DECODE_STAGES, consumer registers, decode registers, maxnreg[, decode V
    stages]): MIXED_HOPPER_TILE's entry or MIXED_HOPPER_TILE_ENV's."""
    decode_rows: int
    """Packed rows of a decode tile (mixed_decode_rows): sequences with more go to the prefill partitions."""
    descriptors: tuple[Any, ...] = ()
    """Q's (64-row blocks), K's and V's (prefill tiles), K's and V's (decode tiles) TMA descriptor makers
    (hopper_forward.RowsDescriptor)."""
    total_q: int = 0
    """The call's token rows: with ``zero_tail`` the launch zeroes out's rows cu_seqlens_q[num_seqs] .. total_q - 1."""
    section_heads: int = 0
    """Query heads a section of the prefill items' order (MIXED_HOPPER_L2_SECTION_MIB), the items then taken off a
    queue; 0: one section of every head, the items dealt."""
    tile_rule: int = 0
    """0: the launch always runs. 1 / 2: it runs only where the device's lengths say that the batch's prefill does /
    does not outweigh its decodes (prefill_outweighs_decodes), the other returning at once: see ``heavy_plan``."""
    heavy_plan: MixedHopperPlan | None = None
    """Where the host does not know the lengths (a CUDA graph's capture, whose replays bring other steps, or a call
    without ``total_kv``) and the two tiles differ: this plan has the 64-key tile (``tile_rule`` 2) and heavy_plan
    MIXED_HOPPER_PREFILL_TILE's (1), both launched, and the batch's lengths on the device pick the one that runs."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, q_start: torch.Tensor | None,
                 kv_start: torch.Tensor | None, page_table: torch.Tensor | None, zero_tail: bool = False) -> None:
        """Launch on these tensors (as HopperPlan.__call__); ``zero_tail``: thd out (sequences back to back),
        its rows past the last sequence are written as zeros too."""
        self._launch_for(zero_tail, page_table)(
            q, k, v, k, v, q, out, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q if q_start is None else q_start,
            cu_seqlens_kv if kv_start is None else kv_start, cu_seqlens_q if page_table is None else page_table,
            split_counter_buffer(q.device, 2) if self.section_heads else cu_seqlens_q)  # the queue (unread if dealt)
        if self.heavy_plan is not None:
            self.heavy_plan(q, k, v, out, cu_seqlens_q, cu_seqlens_kv, q_start, kv_start, page_table, zero_tail)

    def _kernel_launch(self, zero_tail: bool, table_stride: int) -> KernelLaunch:
        """attention_mixed_hopper_kernel's launch, all but its 13 tensor arguments fixed."""
        block_n, stages, decode_block_n, decode_stages, consumer_registers, decode_registers, maxnreg = self.tile[:7]
        return KernelLaunch(
            attention_mixed_hopper_kernel, (self.programs,),
            scalars=(self.num_seqs, self.heads_kv, *self.batch_rows, self.q_token_stride, self.out_token_stride,
                     table_stride, self.softmax_scale_log2, self.total_q if zero_tail else 0,
                     self.section_heads or self.group_size * self.heads_kv),
            constexprs={
                "GROUP_SIZE": self.group_size, "BLOCK_N": block_n, "STAGES": stages,
                "DECODE_BLOCK_N": decode_block_n, "DECODE_STAGES": decode_stages, "PAGE_SIZE": self.page_size,
                "CAUSAL": self.causal, "BOTTOM_RIGHT": self.bottom_right, "HAS_Q_START": self.has_q_start,
                "HAS_KV_START": self.has_kv_start, "LOG2_MAX_SEQS": max(5, self.num_seqs.bit_length()),
                "DECODE_ROWS": self.decode_rows, "CONSUMER_REGISTERS": consumer_registers,
                "DECODE_REGISTERS": decode_registers, "DECODE_V_STAGES": (*self.tile, 0)[7],
                "QUEUE": self.section_heads > 0, "TILE_RULE": self.tile_rule,
                "RULE_RATIO": PREFILL_TO_DECODE_RATIO if self.tile_rule else 0,
            },
            options={"num_warps": 4, "maxnreg": maxnreg}, descriptors=self.descriptors)


def mixed_hopper_unsupported_reason(head_dim: int, group_size: int, num_seqs: int, page_size: int) -> str | None:
    """None when attention_mixed_hopper_kernel can run a mixed batch that attention_fwd_hopper_kernel could (the
    checks of hopper_unsupported_reason, done by the caller) and is not switched off, else why not."""
    if not switch(MIXED_HOPPER_ENV, True):
        return f"{MIXED_HOPPER_ENV}=0"
    if head_dim not in MIXED_HOPPER_TILE:
        return f"needs head dims in {sorted(MIXED_HOPPER_TILE)}"
    if group_size > MAX_DECODE_ROWS:
        return f"needs at most {MAX_DECODE_ROWS} query heads per KV head"
    if num_seqs >= MIXED_HOPPER_MAX_SEQS:
        return f"needs fewer than {MIXED_HOPPER_MAX_SEQS} sequences"
    tile = _tile(head_dim)
    if not _tile_takes_pages(tile, page_size):
        return f"needs pages of 16 to {tile[2]} tokens dividing {tile[2]}, or a multiple of {tile[0]}"
    return None


def _tile_takes_pages(tile: tuple[int, ...], page_size: int) -> bool:
    """Whether a tile's KV boxes can load pages of ``page_size`` tokens (0: a non-paged cache): whole pages of at
    least 16 tokens in every box, or whole prefill boxes in every page."""
    block_n, _, decode_block_n = tile[:3]
    return not page_size or page_size % block_n == 0 or (
        block_n % page_size == 0 and decode_block_n % page_size == 0 and page_size >= 16)


def plan_mixed_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_kv: int,
                      batch_rows: tuple[int, int, int, int], *, num_seqs: int, out_token_stride: int,
                      softmax_scale: float, causal: bool,
                      bottom_right: bool, page_size: int, has_q_start: bool, has_kv_start: bool,
                      num_sms: int, total_q: int, max_seqlen_q: int, max_seqlen_kv: int,
                      mean_seqlen_kv: int | None) -> MixedHopperPlan | None:
    """A MixedHopperPlan for a mixed batch the Hopper kernel serves (plan_hopper_forward checked the tensors), or a
    MixedRolesPlan when the one-role-a-program kernel is switched on (hopper_mixed_roles.py), else None. q: a 4-D
    view [B, S, H_q, D]; k / v: as attention_forward's (their geometry sizes the TMA descriptors); batch_rows as
    HopperPlan's; the lengths pick the tile (prefill_outweighs_decodes), or without ``mean_seqlen_kv`` the device's
    lengths do, between two launches (MixedHopperPlan.heavy_plan)."""
    group_size = q.shape[2] // heads_kv
    if mixed_hopper_unsupported_reason(q.shape[3], group_size, num_seqs, page_size):
        return None
    from .hopper_forward import RowsDescriptor  # (hopper_forward imports this module)

    decode_rows = mixed_decode_rows(group_size, num_seqs, total_q, max_seqlen_q)
    from .hopper_mixed_roles import plan_mixed_roles  # (it imports this module)

    roles = plan_mixed_roles(q, k, v, heads_kv, batch_rows, num_seqs=num_seqs, out_token_stride=out_token_stride,
                             softmax_scale=softmax_scale, causal=causal, bottom_right=bottom_right,
                             page_size=page_size, has_q_start=has_q_start, has_kv_start=has_kv_start,
                             num_sms=num_sms, total_q=total_q, decode_rows=decode_rows)
    if roles is not None:
        return roles
    heavy_prefill = prefill_outweighs_decodes(num_seqs, max_seqlen_q, max_seqlen_kv, mean_seqlen_kv, causal,
                                              group_size)
    tile = _tile(q.shape[3], decode_rows, heavy_prefill, page_size)
    device_rule = mean_seqlen_kv is None and switch(MIXED_HOPPER_DEVICE_RULE_ENV, True)
    heavy_tile = _tile(q.shape[3], decode_rows, True, page_size) if device_rule else tile
    sections = _section_heads(q, k, v, heads_kv, max_seqlen_kv, causal)

    def plan(tile: tuple[int, ...], tile_rule: int = 0, heavy_plan: MixedHopperPlan | None = None) -> MixedHopperPlan:
        block_n, decode_block_n = tile[0], tile[2]
        return MixedHopperPlan(
            descriptors=(RowsDescriptor.of(q, HOPPER_ROWS_PER_GROUP),
                         promoted(RowsDescriptor.of(k, block_n, page_size), PREFILL_PROMOTION_ENV),
                         promoted(RowsDescriptor.of(v, block_n, page_size), PREFILL_PROMOTION_ENV),
                         promoted(RowsDescriptor.of(k, decode_block_n, page_size), DECODE_PROMOTION_ENV),
                         promoted(RowsDescriptor.of(v, decode_block_n, page_size), DECODE_PROMOTION_ENV)),
            programs=num_sms, group_size=group_size, heads_kv=heads_kv, num_seqs=num_seqs, batch_rows=batch_rows,
            q_token_stride=q.stride(-3), out_token_stride=out_token_stride,
            softmax_scale_log2=scale_log2(softmax_scale), page_size=page_size, causal=causal,
            bottom_right=bool(bottom_right), has_q_start=has_q_start, has_kv_start=has_kv_start,
            tile=tile, decode_rows=decode_rows, total_q=total_q, section_heads=sections, tile_rule=tile_rule,
            heavy_plan=heavy_plan)

    if heavy_tile == tile:
        return plan(tile)
    return plan(tile, tile_rule=2, heavy_plan=plan(heavy_tile, tile_rule=1))


def check_environment() -> None:
    """Read every variable of the mixed kernel's plans that is set: a bad value is a ValueError naming it, on any
    device (the plans read them on sm90 GPUs only)."""
    from .hopper_forward import section_budget_mib  # (hopper_forward imports this module)

    for name in (MIXED_HOPPER_ENV, MIXED_HOPPER_QUEUE_ENV, MIXED_HOPPER_DEVICE_RULE_ENV):
        switch(name, True)
    _tile(128)   # parses MIXED_HOPPER_TILE_ENV where set (any head dim reads it)
    section_budget_mib(MIXED_HOPPER_L2_SECTION_ENV, MIXED_HOPPER_L2_SECTION_MIB)
    section_budget_mib(MIXED_HOPPER_L2_DEALT_ENV, MIXED_HOPPER_L2_DEALT_MIB)


def _section_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_kv: int, max_seqlen_kv: int,
                   causal: bool) -> int:
    """MixedHopperPlan.section_heads: hopper_forward.section_heads at MIXED_HOPPER_L2_SECTION_MIB, 0 (items dealt)
    where one section holds every head, where L2 holds every head's K and V (MIXED_HOPPER_L2_DEALT_MIB) or where
    MIXED_HOPPER_QUEUE_ENV is ``0``."""
    from .hopper_forward import section_budget_mib, section_heads  # (hopper_forward imports this module)

    kv_bytes_per_token = (k.shape[-1] + v.shape[-1]) * k.element_size()
    heads = section_heads(q.shape[2], heads_kv, max_seqlen_kv, kv_bytes_per_token, causal,
                          section_budget_mib(MIXED_HOPPER_L2_SECTION_ENV, MIXED_HOPPER_L2_SECTION_MIB))
    l2_holds_all = causal and heads_kv * max_seqlen_kv * kv_bytes_per_token <= (
        section_budget_mib(MIXED_HOPPER_L2_DEALT_ENV, MIXED_HOPPER_L2_DEALT_MIB) << 20)
    return heads if heads < q.shape[2] and not l2_holds_all and switch(MIXED_HOPPER_QUEUE_ENV, True) else 0


def decode_tile_rows(rows: int) -> int:
    """wgmma's N for decode tiles of ``rows`` packed rows (query tokens x a KV head's query heads): a power of 2
    from 8 (wgmma's smallest N for 16-bit operands) to MAX_DECODE_ROWS."""
    return min(MAX_DECODE_ROWS, max(SMALL_DECODE_ROWS, 1 << (rows - 1).bit_length()))


def mixed_decode_rows(group_size: int, num_seqs: int, total_q: int, max_seqlen_q: int) -> int:
    """Packed rows of the mixed kernel's decode tiles (wgmma's N): room for a group and for a verification step
    of 4 query tokens of a 4-head group (16 rows), unless the host values say that the sequences besides the
    longest have one query each (at most one on average): then a group's rows, 8 for groups of up to 8 heads (half
    the decodes' tensor-core work beside the prefill). Sequences with more rows run as prefill items, so a wrong
    guess costs speed, never correctness. H200, 2026-12-02, graph replays, settled, three interleaved rounds
    (docs/results/2026-12-02-h200-1ee9195/mixed-rows-ab.txt): a 2k prefill + 128 decodes at 2k (GQA 32/8) 275.7-281.0 us
    on 8-row tiles against 282.4-286.0 on 16; a 2k chunk on 14k + 64 decodes at 4k 1104.0-1153.6 against
    1103.3-1161.5. Both tiles in one kernel (8 rows for one-token decodes, 16 for the rest, chosen per item) lost
    that gain and more: 282.6-287.2 and 1145.8-1192.4.

    Example:
        >>> mixed_decode_rows(4, num_seqs=129, total_q=2048 + 128, max_seqlen_q=2048)  # a prefill + decodes
        8
        >>> mixed_decode_rows(4, num_seqs=65, total_q=2048 + 64 * 4, max_seqlen_q=2048)  # + verification steps
        16
    """
    one_query_each = total_q - max_seqlen_q <= num_seqs - 1
    return decode_tile_rows(group_size if one_query_each else max(16, group_size))


def prefill_outweighs_decodes(num_seqs: int, max_seqlen_q: int, max_seqlen_kv: int, mean_seqlen_kv: int | None,
                              causal: bool, group_size: int) -> bool:
    """Whether a mixed batch's prefill work outweighs its decodes' reads enough for MIXED_HOPPER_PREFILL_TILE: the
    longest query sequence's query-key pairs (taken as the prefill, over the longest KV; causal: its rows see
    max_seqlen_kv - max_seqlen_q / 2 keys on average) times ``group_size`` (query heads a KV head: the prefill's
    work per KV head's bytes) at least PREFILL_TO_DECODE_RATIO times the other sequences' KV tokens (num_seqs x the
    mean KV length less the prefill's). Without a mean KV length (no ``total_kv``, or a CUDA graph's capture) the
    host cannot tell: False, and plan_mixed_hopper leaves the choice to the device (the kernel's
    _prefill_outweighs_decodes, on exact lengths). A wrong guess costs speed, never correctness.

    Example:
        >>> prefill_outweighs_decodes(65, 2048, 16384, 4352, causal=True, group_size=4)  # M2: 2k chunk on 14k + 64
        True
        >>> prefill_outweighs_decodes(129, 2048, 2048, 2048, causal=True, group_size=4)  # M1: 2k + 128 decodes @2k
        False
        >>> prefill_outweighs_decodes(65, 2048, 16384, 4352, causal=True, group_size=1)  # M2 with MHA: 4x the reads
        False
    """
    if mean_seqlen_kv is None:
        return False
    prefill_pairs = max_seqlen_q * (max_seqlen_kv - max_seqlen_q / 2 if causal else max_seqlen_kv)
    decode_tokens = num_seqs * mean_seqlen_kv - max_seqlen_kv
    return prefill_pairs * group_size >= PREFILL_TO_DECODE_RATIO * decode_tokens


def _tile(head_dim: int, decode_rows: int = 0, heavy_prefill: bool = False, page_size: int = 0) -> tuple[int, ...]:
    """The launch tile for ``head_dim`` and decode tiles of ``decode_rows`` rows: MIXED_HOPPER_TILE_ENV's where set;
    MIXED_HOPPER_PREFILL_TILE's entry where there is one whose boxes take the pages and whose decode ring is whole
    or the batch's prefill is ``heavy_prefill`` (prefill_outweighs_decodes); else MIXED_HOPPER_TILE's, with
    MIXED_HOPPER_SMALL_DECODE_REGISTERS's split for 8-row decode tiles."""
    override = getenv(MIXED_HOPPER_TILE_ENV, "")
    if override:
        parts = override.split(",")
        if len(parts) not in (7, 8) or not all(part.strip().isdigit() for part in parts):
            raise ValueError(f"{MIXED_HOPPER_TILE_ENV} must hold 7 or 8 comma-separated integers, got {override!r}")
        return tuple(int(part) for part in parts)
    prefill_tile = MIXED_HOPPER_PREFILL_TILE.get((head_dim, decode_rows))
    if prefill_tile and (heavy_prefill or _whole_decode_ring(prefill_tile)) \
            and _tile_takes_pages(prefill_tile, page_size):
        return prefill_tile
    tile = MIXED_HOPPER_TILE[head_dim]
    registers = MIXED_HOPPER_SMALL_DECODE_REGISTERS.get(head_dim)
    if decode_rows == SMALL_DECODE_ROWS and registers:
        tile = (*tile[:4], *registers, tile[6])
    return tile


def _whole_decode_ring(tile: tuple[int, ...]) -> bool:
    """Whether a tile's decode ring has a V slot for each K slot (its optional eighth field absent)."""
    return len(tile) == 7
