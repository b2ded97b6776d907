"""Device-side lookup of the sequence that owns a program of a flattened-token grid."""

from __future__ import annotations

import triton
import triton.language as tl

from .availability import note_kernels_defined

__all__ = ["find_sequence"]

note_kernels_defined()   # (every Triton attention kernel module imports this one before it defines its kernels)


@triton.jit
def find_sequence(cu_seqlens_ptr, num_seqs, target, BLOCK_Q: tl.constexpr, TILE_GRID: tl.constexpr):
    """Binary search over cu_seqlens for the sequence that owns `target`.

    TILE_GRID=True: `target` is a q-tile program id; sequence b owns the ids from
    cu_seqlens[b] // BLOCK_Q + b on (vLLM's static bound: cdiv(total, BLOCK_Q) + B ids suffice).
    TILE_GRID=False: `target` is a packed token index; sequence b owns cu_seqlens[b] onwards.
    Returns the largest b in [0, num_seqs) whose start is <= target, so zero-length sequences are
    skipped; the caller checks that `target` lies inside b's range.
    """
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        start = tl.load(cu_seqlens_ptr + mid)
        if TILE_GRID:
            start = start // BLOCK_Q + mid
        if start <= target:
            left = mid + 1
        else:
            right = mid
    return left - 1
