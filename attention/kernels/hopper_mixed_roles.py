"""Host side of the Hopper mixed-batch kernel with one role a program (attention_mixed_roles_hopper.py).

plan_mixed_hopper (hopper_mixed.py) offers it every mixed batch it plans; it takes them only when switched on
(MIXED_ROLES_ENV has the measurements: not yet faster than the mixed kernel on M2 or M1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attention.environment import getenv, switch

from .arguments import scale_log2
from .attention_mixed_roles_hopper import attention_mixed_roles_hopper_kernel
from .combine import split_counter_buffer
from .configs import next_power_of_2
from .hopper_mixed import MixedHopperPlan
from .launch import KernelLaunch

__all__ = ["MIXED_ROLES_ENV", "MIXED_ROLES_SPLITS_ENV", "MIXED_ROLES_TILE", "MixedRolesPlan", "check_environment",
           "mixed_roles_unsupported_reason", "plan_mixed_roles", "use_mixed_roles"]

MIXED_ROLES_ENV = "ATTN_FUSED_HOPPER_MIXED_ROLES"
"""``1``: every mixed batch the mixed kernel would run (and whose pages this kernel reads) runs
attention_mixed_roles_hopper_kernel; unset or ``0``: none (hopper_mixed.py's kernel, decodes beside the prefill on
every SM). H200, 2026-12-02, graph replays, settled, against that kernel in the same process
(docs/results/2026-12-02-h200-dephase/): M2 (a 2k chunk on a 14k prefix + 64 decodes at 4k, page 16) 1,083-1,102 us
against 1,107-1,123, its prefill in the launch (decodes without queries) 890-893 against 994-1,008 (the prefill kernel
alone: 852-857); M1 (a 2k prefill + 128 decodes at 2k) 354-355 against 279-281. Its prefill is the faster, its
decodes the slower: ~160 us a GB of K / V on M2 against the mixed kernel's ~105, since a program's decode walks read
~60 GB/s (8 decodes at 32k, two walks on the busiest programs: 553-601 us) and the decodes' SM time is theirs
alone. Again on 2026-12-04, after the mask code cut its spills (env_ab, three rounds;
docs/results/2026-12-04-h200-aff6109/out/call9): M2 1,075.9 against 1,111.8 us, M1 311.0 against 280.7."""

MIXED_ROLES_SPLITS_ENV = "ATTN_FUSED_HOPPER_MIXED_ROLES_SPLITS"
"""Override of the prefill key splits (A/B measurements): a positive integer."""

MIXED_ROLES_TILE = {64: (128, 2, 240, 168, 8), 128: (128, 2, 240, 168, 8)}
"""Head dim -> (BLOCK_N, STAGES, consumer registers, maxnreg, merge rows): the prefill kernel's tile
(hopper_forward.HOPPER_TILE; a decode walk sees its stages as 2 * STAGES of BLOCK_N / 2 keys), and the rows a split
merge reads at a time."""

MIXED_ROLES_SPLITS = 1
"""Key splits of a prefill q tile. Three (items of ~70 us on M2 instead of ~213, a shorter tail) measured slower:
M2's prefill in the launch 1,160.0-1,162.6 us against 927.7-929.1 at one (the partial rows' writes and merges, 12
items a program instead of 4, and ~750 B of register spills in the consumers, sm90 ptxas, Triton 3.6). With the
spills at 136 B (the mask code, 2026-12-04) M2 still 1,298.1 against 1,075.9 at one split, M1 545.8 against 311.0."""


def use_mixed_roles() -> bool:
    """Whether mixed batches go to the one-role-a-program kernel (MIXED_ROLES_ENV, off unless set to 1)."""
    return switch(MIXED_ROLES_ENV, False)


@dataclass(frozen=True)
class MixedRolesPlan(MixedHopperPlan):
    """One call's launch of attention_mixed_roles_hopper_kernel, all but the tensors' addresses (the descriptors:
    Q's, K's and V's prefill tiles, K's and V's half tiles)."""

    tile: tuple[int, int, int, int, int]
    """MIXED_ROLES_TILE's entry (the parent's field, a tile of this kernel's)."""
    prefill_splits: int = 1
    heads_q: int = 0
    head_dim: int = 128

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, q_start: torch.Tensor | None,
                 kv_start: torch.Tensor | None, page_table: torch.Tensor | None, zero_tail: bool = False) -> None:
        """Launch on these tensors (as MixedHopperPlan.__call__)."""
        if self.prefill_splits > 1:
            shape = (self.prefill_splits, self.total_q, self.heads_q)
            partial_out = torch.empty(*shape, self.head_dim, dtype=torch.float32, device=q.device)
            partial_lse = torch.empty(*shape, dtype=torch.float32, device=q.device)
            counters = split_counter_buffer(q.device, self.total_q * self.heads_q)
        else:
            partial_out = partial_lse = counters = out  # unused
        self._launch_for(zero_tail, page_table)(
            q, k, v, k, v, q, out, partial_out, partial_lse, counters, cu_seqlens_q, cu_seqlens_kv,
            cu_seqlens_q if q_start is None else q_start, cu_seqlens_kv if kv_start is None else kv_start,
            cu_seqlens_q if page_table is None else page_table)

    def _kernel_launch(self, zero_tail: bool, table_stride: int) -> KernelLaunch:
        """attention_mixed_roles_hopper_kernel's launch, all but its 15 tensor arguments fixed."""
        block_n, stages, consumer_registers, maxnreg, merge_rows = self.tile
        tokens, heads, head_dim = self.total_q, self.heads_q, self.head_dim
        return KernelLaunch(
            attention_mixed_roles_hopper_kernel, (self.programs,),
            scalars=(self.num_seqs, self.heads_kv, *self.batch_rows, self.q_token_stride, self.out_token_stride,
                     table_stride, self.softmax_scale_log2, self.total_q if zero_tail else 0,
                     tokens * heads * head_dim, heads * head_dim, tokens * heads, heads),
            constexprs={
                "GROUP_SIZE": self.group_size, "BLOCK_N": block_n, "STAGES": stages, "PAGE_SIZE": self.page_size,
                "CAUSAL": self.causal, "BOTTOM_RIGHT": self.bottom_right, "HAS_Q_START": self.has_q_start,
                "HAS_KV_START": self.has_kv_start, "LOG2_MAX_SEQS": max(5, self.num_seqs.bit_length()),
                "DECODE_ROWS": self.decode_rows, "PREFILL_SPLITS": self.prefill_splits,
                "SPLITS_BLOCK": max(2, next_power_of_2(self.prefill_splits)), "MERGE_ROWS": merge_rows,
                "CONSUMER_REGISTERS": consumer_registers,
            },
            options={"num_warps": 4, "maxnreg": maxnreg}, descriptors=self.descriptors)


def check_environment() -> None:
    """Read this kernel's variables where set: a bad value is a ValueError naming it, on any device (the plans read
    them on sm90 GPUs only)."""
    use_mixed_roles()
    prefill_splits()


def prefill_splits() -> int:
    """MIXED_ROLES_SPLITS, or MIXED_ROLES_SPLITS_ENV's count."""
    value = getenv(MIXED_ROLES_SPLITS_ENV, "")
    if not value:
        return MIXED_ROLES_SPLITS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{MIXED_ROLES_SPLITS_ENV} must be a positive integer, got {value!r}")
    return int(value)


def mixed_roles_unsupported_reason(head_dim: int, page_size: int) -> str | None:
    """None when attention_mixed_roles_hopper_kernel can run a mixed batch that the mixed kernel could (the caller's
    checks) and is chosen (use_mixed_roles), else why not."""
    if not use_mixed_roles():
        return f"{MIXED_ROLES_ENV} is not 1"
    block_n = MIXED_ROLES_TILE[head_dim][0]
    if page_size and page_size % block_n and page_size not in (16, 32, 64):
        return f"needs pages of 16, 32 or 64 tokens, or a multiple of {block_n}"
    return None


def plan_mixed_roles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_kv: int,
                     batch_rows: tuple[int, int, int, int], *, num_seqs: int, out_token_stride: int,
                     softmax_scale: float, causal: bool, bottom_right: bool, page_size: int, has_q_start: bool,
                     has_kv_start: bool, num_sms: int, total_q: int, decode_rows: int) -> MixedRolesPlan | None:
    """A MixedRolesPlan for a mixed batch that plan_mixed_hopper would plan (arguments as its, ``decode_rows``: its
    mixed_decode_rows), else None."""
    head_dim = q.shape[3]
    if mixed_roles_unsupported_reason(head_dim, page_size):
        return None
    from .hopper_forward import RowsDescriptor  # (hopper_forward imports this module)

    tile = MIXED_ROLES_TILE[head_dim]
    block_n = tile[0]
    return MixedRolesPlan(
        descriptors=(RowsDescriptor.of(q, 64), RowsDescriptor.of(k, block_n, page_size),
                     RowsDescriptor.of(v, block_n, page_size), RowsDescriptor.of(k, block_n // 2, page_size),
                     RowsDescriptor.of(v, block_n // 2, page_size)),
        programs=num_sms, group_size=q.shape[2] // heads_kv, heads_kv=heads_kv, num_seqs=num_seqs,
        batch_rows=batch_rows, q_token_stride=q.stride(-3), out_token_stride=out_token_stride,
        softmax_scale_log2=scale_log2(softmax_scale), page_size=page_size, causal=causal,
        bottom_right=bool(bottom_right), has_q_start=has_q_start, has_kv_start=has_kv_start, tile=tile,
        decode_rows=decode_rows, total_q=total_q, prefill_splits=prefill_splits(), heads_q=q.shape[2],
        head_dim=head_dim)
