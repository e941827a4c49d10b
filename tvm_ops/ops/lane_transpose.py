"""A V x V float32 square transposed in registers, for the CPU kernels that turn rows of one
layout into rows of the other (three_interpolate_backward's grad_output staging and
grad_features store, three_interpolate_forward's feature tiles and output).

Each round is a set of two-vector lane shuffles (tirx.Shuffle), log2(V) rounds in all.
Written as TIR because no schedule primitive emits lane shuffles: TVM vectorises a
transposed copy into per-lane gathers and scatters. Works for V = 4, 8 or 16 (every CPU's
float32 lanes); generic LLVM IR, so every CPU target.

- V = 16 (AVX-512): each round swaps one bit of (row, lane): rows i and i + h (i with bit h
  clear) become two new rows, each one two-source permute (vpermt2ps).
- V = 4 and 8 (SSE, AVX2, NEON): the rounds stay inside 128-bit blocks of 4 lanes as long as
  they can, as x86's shuffles do: rows (2j, 2j + 1) interleaved (vunpcklps / vunpckhps), then
  pairs of lanes gathered (vshufps), then, for 8 lanes, the two 128-bit halves exchanged
  (vperm2f128): one instruction per new row, 24 for an 8 x 8 square. The bit-swapping rounds
  took 32 on AVX2, their half-width-1 round two vshufps a row (NEON's trn1 / trn2 and zip1 /
  zip2 take either form in one instruction).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

LANES = (4, 8, 16)


def _row_index(at, i, V):
    """The index of row i of the square at `at` (a tuple of indices: its first row and lane)."""
    return (*at[:-2], at[-2] + i, tirx.Ramp(at[-1], 1, V))


def _row(buf, at, i, V):
    """Row i of the square at `at` in buf, as float32 lanes."""
    value = buf[_row_index(at, i, V)]
    return value if buf.dtype == "float32" else T.Cast(f"float32x{V}", value)


def _stored(buf, value, V):
    """A float32 vector as buf's dtype."""
    return value if buf.dtype == "float32" else T.Cast(f"{buf.dtype}x{V}", value)


def _lanes(indices):
    return [tirx.IntImm("int32", j) for j in indices]


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
    return _by_bits(V) if V == 16 else _in_lanes(V)


def _by_bits(V: int):
    """The 16-lane square: four rounds, each swapping one bit of (row, lane)."""
    vec = tirx.Ramp(0, 1, V)
    # round with half-width h: lanes of rows (i, i + h) for i with bit h clear; LOW[h] gives
    # row i's new lanes, HIGH[h] row i + h's, indices into the two rows side by side
    LOW = {h: _lanes((V if j & h else 0) + (j & ~h) for j in range(V)) for h in (8, 4, 2, 1)}
    HIGH = {h: _lanes((V if j & h else 0) + (j | h) for j in range(V)) for h in (8, 4, 2, 1)}

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
            dst[_row_index(dst_at, first + low, V)] = _stored(dst, tirx.Shuffle(pair, LOW[1]), V)
            dst[_row_index(dst_at, first + low + 1, V)] = _stored(dst, tirx.Shuffle(pair, HIGH[1]), V)

    @T.macro
    def transpose(src, src_at, dst, dst_at, x_lo, x_hi, y_lo, y_hi):
        split_round(src, src_at, x_lo, x_hi)
        half_round(x_lo, y_lo, 4)
        half_round(x_hi, y_hi, 4)
        half_round(y_lo, x_lo, 2)
        half_round(y_hi, x_hi, 2)
        last_round(x_lo, dst, dst_at, 0)
        last_round(x_hi, dst, dst_at, V // 2)

    return transpose


def _in_lanes(V: int):
    """The 4- and 8-lane squares: rounds inside 128-bit blocks of 4 lanes, then across them."""
    vec = tirx.Ramp(0, 1, V)

    def blocks(pattern):  # a pattern of one 128-bit block, repeated in each
        return _lanes(b + j for b in range(0, V, 4) for j in pattern)

    UNPACK = (blocks([0, V, 1, V + 1]), blocks([2, V + 2, 3, V + 3]))  # lanes of two rows interleaved
    PAIRS = (blocks([0, 1, V, V + 1]), blocks([2, 3, V + 2, V + 3]))  # lane pairs of two rows
    HALVES = (_lanes((0, 1, 2, 3, 8, 9, 10, 11)), _lanes((4, 5, 6, 7, 12, 13, 14, 15)))  # 8 lanes: 128-bit halves

    @T.macro
    def unpack_round(src, src_at, lo, hi):
        # rows (2j, 2j + 1) of the source interleaved: the first V / 2 rows into lo, the rest into hi
        for j in T.unroll(V // 4):
            first = T.meta_var([_row(src, src_at, 2 * j, V), _row(src, src_at, 2 * j + 1, V)])
            lo[2 * j, vec] = tirx.Shuffle(first, UNPACK[0])
            lo[2 * j + 1, vec] = tirx.Shuffle(first, UNPACK[1])
            second = T.meta_var([_row(src, src_at, V // 2 + 2 * j, V), _row(src, src_at, V // 2 + 2 * j + 1, V)])
            hi[2 * j, vec] = tirx.Shuffle(second, UNPACK[0])
            hi[2 * j + 1, vec] = tirx.Shuffle(second, UNPACK[1])

    @T.macro
    def pairs_round(src, dst):
        # V = 8, within one half: rows (i, i + 2) into lane pairs; row c of dst then holds
        # lanes c (low block) and c + 4 (high block) of the half's four source rows
        for i in T.unroll(2):
            pair = T.meta_var([src[i, vec], src[i + 2, vec]])
            dst[2 * i, vec] = tirx.Shuffle(pair, PAIRS[0])
            dst[2 * i + 1, vec] = tirx.Shuffle(pair, PAIRS[1])

    @T.macro
    def across_round(lo, hi, dst, dst_at, pattern, step, second):
        # the last round, across the halves: row c of lo with row c of hi into the destination
        # rows c * step and c * step + second
        for c in T.unroll(V // 2):
            pair = T.meta_var([lo[c, vec], hi[c, vec]])
            dst[_row_index(dst_at, c * step, V)] = _stored(dst, tirx.Shuffle(pair, pattern[0]), V)
            dst[_row_index(dst_at, c * step + second, V)] = _stored(dst, tirx.Shuffle(pair, pattern[1]), V)

    @T.macro
    def transpose(src, src_at, dst, dst_at, x_lo, x_hi, y_lo, y_hi):
        unpack_round(src, src_at, x_lo, x_hi)
        if V == 8:  # y rows c: lanes c and c + 4 of rows 0-3 (y_lo) and 4-7 (y_hi)
            pairs_round(x_lo, y_lo)
            pairs_round(x_hi, y_hi)
            across_round(y_lo, y_hi, dst, dst_at, HALVES, 1, 4)
        if V == 4:  # x rows c: lanes 2c, 2c + 1 of rows 0-1 (x_lo) and 2-3 (x_hi)
            across_round(x_lo, x_hi, dst, dst_at, PAIRS, 2, 1)

    return transpose
