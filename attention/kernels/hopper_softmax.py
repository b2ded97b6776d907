"""The online softmax of the Hopper prefill loop (attention_fwd_hopper._prefill_tiles): one score tile at a time.

Two schedules:

  * softmax_tile: the tile's row max first, then P = exp2(S * scale - max) against it, O rescaled by every warp
    (head dims below EXP_AHEAD_MIN_HEAD_DIM, and every walk's first tile);
  * softmax_tile_ahead (from EXP_AHEAD_MIN_HEAD_DIM on): P taken against the rows' running max while the tile's max
    reduces, so the exponentials need not wait for it. A row's max moves only when the tile's passes it by more than
    RESCALE_SLACK (P stays <= 2^8 otherwise); a warp with a row whose max moved takes its P again against the new
    max and rescales its O (a warp vote, then a branch in inline PTX: rescale_moved_rows).

Layouts: S and P [ROWS, BLOCK_N] in a wgmma accumulator layout, the rows' max and sums [ROWS] in its row slice.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["EXP_AHEAD_MIN_HEAD_DIM", "packed_16bit", "rescale_moved_rows", "softmax_tile", "softmax_tile_ahead"]

EXP_AHEAD_MIN_HEAD_DIM = gl.constexpr(256)
"""From this head dim on the prefill loop takes softmax_tile_ahead. H200, 2026-12-04 (tree_ab against 088fc97, two
passes of three rounds, mean µs; docs/results/2026-12-04-h200-088fc97/out/call2/): d256 MHA 16 full 4x4k 1,726.3 ->
1,667.8, causal 987.3 -> 948.7 (3.4 / 3.9 % faster than the lazy O rescale it replaced: softmax_tile with the same
slack, itself 2.2-2.8 % faster than the eager rescale). At every head dim (call1, two passes of two rounds) d128
6.6-11 % slower (M2's prefill part 854.1 -> 948.0, MHA full 4x4k 1,889.6 -> 2,015.2) and d64 MHA 32 causal 4x4k 7.6 %
slower: there the 16-bit P's widening for the sums (call2's fp32-sum diagnostic: 1.041 at d128) and the exp-again
branches (they split the loop's basic block: ptxas no longer hoists the PV wait above the softmax, d128's SASS) cost
more than the wait for the max they hide. At d256 O is 128 registers a thread, and a warp's skipped rescale pays for
the branch."""
RESCALE_SLACK = gl.constexpr(8.0)
"""A row's running max (log2 units) lags the true one by up to this: P <= 2^8, which fp16 and bf16 hold."""

_PACK = 32
"""Elements a thread handles in one asm block (O: 64 a thread at d128, 128 at d256: a branch a block)."""
RESCALE_PACK = gl.constexpr(_PACK)
# A thread's two rows' (tile max - running max - slack) in, the warp's "any row above 0" out (twice: one per row).
_WARP_ANY_PAST_ASM = gl.constexpr(
    "{ .reg .pred p, q; setp.gt.f32 p, $2, 0f00000000; setp.gt.f32 q, $3, 0f00000000; or.pred p, p, q;"
    " vote.sync.any.pred p, p, -1; selp.s32 $0, 1, 0, p; mov.b32 $1, $0; }")
# Operands (PACK 32): $0-$31 O out, tied to the O inputs $32-$63 (updated in place), $64-$95 the alphas, $96-$127 the
# warp's flag (all equal: $96 decides).
_RESCALE_ASM = gl.constexpr(
    f"{{ .reg .pred skip; setp.eq.s32 skip, ${3 * _PACK}, 0; @skip bra.uni DONE;\n"
    + "\n".join(f"mul.f32 ${i}, ${i}, ${2 * _PACK + i};" for i in range(_PACK)) + "\nDONE: }")
_RESCALE_CONSTRAINTS = gl.constexpr(
    ",".join(["=f"] * _PACK + [str(i) for i in range(_PACK)] + ["f"] * _PACK + ["r"] * _PACK))


def _exp_again_asm(cvt: str) -> str:
    """Operands (PACK 32, P 16-bit: two a register): $0-$15 P out, tied to the P inputs $16-$31, $32-$63 S, $64-$95
    -max, $96-$127 the scale, $128-$159 the warp's flag ($128 decides): P = 2^(S * scale - max) as Triton's exp2
    (ex2.approx.ftz), rounded as Triton's conversion."""
    s0 = _PACK  # the operands' first S (after 16 P outs and 16 P ins), then -max, the scale and the flag
    neg_max0, scale0, flag = s0 + _PACK, s0 + 2 * _PACK, s0 + 3 * _PACK
    lines = [f"{{ .reg .pred skip; .reg .f32 x, y; setp.eq.s32 skip, ${flag}, 0; @skip bra.uni DONE;"]
    for i in range(_PACK // 2):
        a, b = 2 * i, 2 * i + 1
        lines.append(f"fma.rn.f32 x, ${s0 + a}, ${scale0 + a}, ${neg_max0 + a}; ex2.approx.ftz.f32 x, x;"
                     f" fma.rn.f32 y, ${s0 + b}, ${scale0 + b}, ${neg_max0 + b};"
                     f" ex2.approx.ftz.f32 y, y; {cvt} ${i}, y, x;")
    return "\n".join(lines) + "\nDONE: }"


_EXP_AGAIN_BF16_ASM = gl.constexpr(_exp_again_asm("cvt.rn.bf16x2.f32"))
_EXP_AGAIN_F16_ASM = gl.constexpr(_exp_again_asm("cvt.rn.f16x2.f32"))
_PACK_BF16_ASM = gl.constexpr("cvt.rn.bf16x2.f32 $0, $2, $1;")
_PACK_F16_ASM = gl.constexpr("cvt.rn.f16x2.f32 $0, $2, $1;")
_EXP_AGAIN_CONSTRAINTS = gl.constexpr(
    ",".join(["=r"] * (_PACK // 2) + [str(i) for i in range(_PACK // 2)] + ["f"] * (3 * _PACK) + ["r"] * _PACK))


@gluon.jit
def packed_16bit(p, dtype: gl.constexpr):
    """``p.to(dtype)`` (fp16 / bf16, round to nearest) two elements an instruction (cvt.rn.bf16x2 / f16x2), in inline
    PTX, as FlashAttention-4's sm90 kernel converts its P. With ``p.to(dtype)`` LLVM folds the conversions on both
    edges into the prefill loop's phi into one after it: the loop carried P as 64 fp32 registers a thread instead of
    32 packed ones and converted it at its head, where ptxas swapped the halves of the second consumer group's P
    registers with 32 PRMTs a tile (sm90, Triton 3.6; the loop 628 -> 596 instructions, the first group's 595).
    Time within noise (H200, 2026-12-04, tree_ab against 10b3ebc, docs/results/2026-12-04-h200-10b3ebc/out/calls
    5, 8, 9): prefill cells 0.988-1.004 (M2's prefill part 0.988 / 0.998 / 0.995), M2's launch without decode queries
    0.984 / 0.988, M1 1.000-1.013."""
    if dtype == gl.bfloat16:
        p16 = gl.inline_asm_elementwise(_PACK_BF16_ASM, "=r,f,f", [p], dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        p16 = gl.inline_asm_elementwise(_PACK_F16_ASM, "=r,f,f", [p], dtype=gl.float16, is_pure=True, pack=2)
    return p16


@gluon.jit
def _mask_tile(s, tile, rows, kv_len, diag, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, col_layout: gl.constexpr):
    """-inf where key j (tile * BLOCK_N + column) is past kv_len or, CAUSAL, past row i's band (j > i + diag): a row
    keeps the columns below its limit. In wgmma's accumulator layout a thread's columns are 2 * (lane % 4) (bits 1-2)
    plus constants of its registers (8k and 8k + 1); comparing the constants with (limit - lane bits) needs one
    register a row, where whole column indices, hoisted out of the KV loop by LLVM, held one a column (32 at 128-key
    tiles: with three consumer groups at d64, 160 registers a thread, ptxas spilled ~30 loads a tile)."""
    cols = gl.arange(0, BLOCK_N, layout=col_layout)
    lane_cols = cols & 6
    limit = kv_len - tile * BLOCK_N
    if CAUSAL:
        limit = gl.minimum(limit, rows + (diag + 1 - tile * BLOCK_N))
        keep = (cols & ~6)[None, :] < limit[:, None] - lane_cols[None, :]
    else:
        keep = ((cols & ~6) < limit - lane_cols)[None, :]
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def softmax_tile(s, m_i, l_i, tile, masked, rows, kv_len, diag, qk_scale,
                 CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, col_layout: gl.constexpr):
    """Online softmax of one score tile (raw Q K^T): returns P (fp32), the rescale of the previous tiles' sums, and
    the new running max (log2 units) and sum. ``rows``: the rows' query indices; ``masked``: the tile needs masking."""
    if masked:
        s = _mask_tile(s, tile, rows, kv_len, diag, CAUSAL, BLOCK_N, col_layout)
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: p = 0, not NaN
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def softmax_tile_ahead(s, m_i, l_i, tile, masked, rows, kv_len, diag, qk_scale,
                       CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, col_layout: gl.constexpr, dtype: gl.constexpr):
    """softmax_tile for a tile after a walk's first, P (in ``dtype``, fp16 / bf16) taken against the rows' running
    max before this tile's max is known; a warp with a row whose max moves past RESCALE_SLACK takes its P again
    against the new max. The sums add the rounded P the PV wgmma reads. Returns P, alpha, the running max and sums,
    and the warp's flag (int32 a row, equal across a warp, nonzero where the warp's O needs the rescale)."""
    if masked:
        s = _mask_tile(s, tile, rows, kv_len, diag, CAUSAL, BLOCK_N, col_layout)
    m_old = gl.where(m_i == float("-inf"), 0.0, m_i)
    p = gl.exp2(s * qk_scale - m_old[:, None]).to(dtype)
    m_tile = gl.max(s, axis=1) * qk_scale
    past = m_tile - (m_i + RESCALE_SLACK)  # > 0: the row's max moves (NaN where both are -inf: it stays)
    # a thread's two rows (r and r + 8 of its warp's 16) in one block: the vote covers the warp's 16 rows
    moved = gl.inline_asm_elementwise(_WARP_ANY_PAST_ASM, "=r,=r,f,f", [past], dtype=gl.int32, is_pure=False, pack=2)
    m_new = gl.where(past > 0, m_tile, m_i)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    again: gl.constexpr = _EXP_AGAIN_BF16_ASM if dtype == gl.bfloat16 else _EXP_AGAIN_F16_ASM
    p = gl.inline_asm_elementwise(again, _EXP_AGAIN_CONSTRAINTS,
                                  [p, s, -m_use[:, None], gl.zeros_like(m_use)[:, None] + qk_scale, moved[:, None]],
                                  dtype=p.dtype, is_pure=True, pack=RESCALE_PACK)
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p.to(gl.float32), axis=1)
    return p, alpha, m_new, l_i, moved


@gluon.jit
def rescale_moved_rows(o, alpha, moved):
    """o * alpha[:, None] (O [ROWS, D] in a wgmma accumulator layout, alpha and ``moved`` [ROWS] in its row layout) in
    the warps whose flag ``moved`` (softmax_tile_ahead's) is nonzero; the others skip their O registers."""
    return gl.inline_asm_elementwise(_RESCALE_ASM, _RESCALE_CONSTRAINTS, [o, alpha[:, None], moved[:, None]],
                                     dtype=gl.float32, is_pure=True, pack=RESCALE_PACK)
