"""A V x V float32 square transposed in registers, for the CPU kernels that turn rows of one
layout into rows of the other (three_interpolate_backward's grad_output staging and
grad_features store, three_interpolate_forward's feature tiles and output).

log2(V) rounds, each swapping one bit of (row, lane): rows i and i + h (i with bit h clear)
become two new rows, each a two-vector lane shuffle (tirx.Shuffle; a two-source permute
such as vpermt2ps on AVX-512). Written as TIR because no schedule primitive emits lane
shuffles: TVM vectorises a transposed copy into per-lane gathers and scatters. Works for
V = 4, 8 or 16 (every CPU's float32 lanes); generic LLVM IR, so every CPU target.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

LANES = (4, 8, 16)


def _row(buf, at, i, V):
    """Row i of the square at `at` (its first row and lane) in buf, as float32 lanes."""
    value = buf[(*at[:-2], at[-2] + i, tirx.Ramp(at[-1], 1, V))]
    return value if buf.dtype == "float32" else T.Cast(f"float32x{V}", value)


def _stored(buf, value, V):
    """A float32 vector as buf's dtype."""
    return value if buf.dtype == "float32" else T.Cast(f"{buf.dtype}x{V}", value)


def transpose_macro(V: int):
    """transpose(src, src_at, dst, dst_at, x_lo, x_hi, y_lo, y_hi): the square of V rows of V
    lanes whose first row and lane are at `src_at` (a tuple of indices into src) stored
    transposed at `dst_at` in dst (the same square of the same buffer: in place). Rows of
    another dtype are widened to float32 on the way in and rounded to dst's on the way out.
    Through four half-squares [V / 2, V] (float32, the caller's buffers): each below TVM's
    stack-allocation limit (1 KiB), so LLVM keeps them in registers (a whole [V, V] square
    is a workspace in memory)."""
    if V not in LANES:
        raise ValueError(f"the register transpose takes 4, 8 or 16 lanes, got {V}")
    vec = tirx.Ramp(0, 1, V)
    # round with half-width h: lanes of rows (i, i + h) for i with bit h clear; LOW[h] gives
    # row i's new lanes, HIGH[h] row i + h's, indices into the two rows side by side
    LOW = {h: [tirx.IntImm("int32", (V if j & h else 0) + (j & ~h)) for j in range(V)] for h in (8, 4, 2, 1)}
    HIGH = {h: [tirx.IntImm("int32", (V if j & h else 0) + (j | h)) for j in range(V)] for h in (8, 4, 2, 1)}

    @T.macro
    def split_round(src, src_at, lo, hi):
        # the round with half-width V / 2: rows i and i + V / 2 of the source into lo[i], hi[i]
        for i in T.unroll(V // 2):
            pair = T.meta_var([_row(src, src_at, i, V), _row(src, src_at, i + V // 2, V)])
            lo[i, vec] = tirx.Shuffle(pair, LOW[V // 2])
            hi[i, vec] = tirx.Shuffle(pair, HIGH[V // 2])

    @T.macro
    def half_round(src, dst, h):
        # a round with half-width h < V / 2 within one half (its rows pair among themselves)
        for i in T.unroll(V // 4):
            low = T.meta_var(i // h * 2 * h + i % h)  # the i-th row with bit h clear
            pair = T.meta_var([src[low, vec], src[low + h, vec]])
            dst[low, vec] = tirx.Shuffle(pair, LOW[h])
            dst[low + h, vec] = tirx.Shuffle(pair, HIGH[h])

    @T.macro
    def last_round(src, dst, dst_at, first):
        # the round with half-width 1 within one half, into rows first + ... of the destination
        for i in T.unroll(V // 4):
            low = T.meta_var(i * 2)
            pair = T.meta_var([src[low, vec], src[low + 1, vec]])
            dst[(*dst_at[:-2], dst_at[-2] + first + low, tirx.Ramp(dst_at[-1], 1, V))] = _stored(
                dst, tirx.Shuffle(pair, LOW[1]), V)
            dst[(*dst_at[:-2], dst_at[-2] + first + low + 1, tirx.Ramp(dst_at[-1], 1, V))] = _stored(
                dst, tirx.Shuffle(pair, HIGH[1]), V)

    @T.macro
    def transpose(src, src_at, dst, dst_at, x_lo, x_hi, y_lo, y_hi):
        split_round(src, src_at, x_lo, x_hi)
        if V == 16:
            half_round(x_lo, y_lo, 4)
            half_round(x_hi, y_hi, 4)
            half_round(y_lo, x_lo, 2)
            half_round(y_hi, x_hi, 2)
            last_round(x_lo, dst, dst_at, 0)
            last_round(x_hi, dst, dst_at, V // 2)
        if V == 8:
            half_round(x_lo, y_lo, 2)
            half_round(x_hi, y_hi, 2)
            last_round(y_lo, dst, dst_at, 0)
            last_round(y_hi, dst, dst_at, V // 2)
        if V == 4:
            last_round(x_lo, dst, dst_at, 0)
            last_round(x_hi, dst, dst_at, V // 2)

    return transpose
