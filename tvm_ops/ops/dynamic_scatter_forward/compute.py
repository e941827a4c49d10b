"""TensorIR of dynamic_scatter_forward: group the points by coordinate row, then reduce.

Grouping (two plans, the schedule file's `sort` knob picks one per target):
  radix (CPU)    group_rows, one serial kernel: the kept points (every coordinate >= 0) in
                 index order, the dropped after them; each column's width in bits (of its
                 largest value). When the widths and the point index's add up to 63 bits
                 or less (MVXNet's grid: 6 + 11 + 11, and 15 for 20k points), each row is
                 packed into one int64 key above its point's index, and the keys are LSD
                 radix sorted on the row's bits in 14-bit digits, or small_radix_bits-bit
                 ones below small_sort_keys keys (a pass costs its keys' scatter and its
                 histogram's zeroing and prefix sum: 2^14 entries outweigh a few thousand
                 keys; the passes between two buffers in turn);
                 otherwise the rows are sorted column by column, the last first. Both are
                 stable: each voxel's points stay in point order, and no key can overflow.
                 Then one walk marks each voxel's first point (a key or row unlike the
                 previous one), numbers the voxels and records where each starts.
                 group_split does the packed-key sort on two cores (from the plan's
                 split_min_points on): the points cut in two parts (each part's kept
                 count and column maxima, then its keys and a histogram of the rows' top
                 COARSE_BITS bits), the keys split at the bin where half of them lie below
                 into two sides (a row's keys share a bin, so a voxel lies on one side),
                 each part's keys moved to their sides in index order, each side sorted
                 and walked as above by one core, side 1's voxels numbered after side 0's.
                 Rows too wide for one key (or more than MAX_COLUMNS columns): count -1,
                 and the host runs group_rows. group_rows_d3 / _d4, group_split_d3 / _d4:
                 the same with D fixed.
  bitonic (CUDA) bitonic_init + a bitonic network over the P >= N (a power of two)
                 entries of a point permutation, ordered by (kept before dropped before
                 padding, row, point index): unique keys, so the result is the stable order
                 above. The steps (k, j) with j < tile stay inside tiles of `tile` entries:
                 bitonic_tile runs those of a range of stages k in one launch (a CUDA
                 block per tile, the tile in shared memory, a thread per entry): every
                 stage k <= tile at first, then the j < tile steps of each later stage;
                 bitonic_step is one global step (j >= tile), a launch each. head_flags
                 marks voxel starts; chunk_totals, chunk_offsets and chunk_scan number
                 the voxels (an inclusive scan in chunks of `chunk`); segment_starts
                 records where each starts and the voxel count.
Both leave order[0:N] (sorted point indices), start[0:M+1] (voxel v's points are
order[start[v]:start[v+1]], start[M] = the kept points), voxel_of[i] (1 + the voxel of
sorted position i < start[M]) and count[0] = M. The radix kernels also write
point2voxel_map as they number the voxels (a launch fewer: 3-15 us of a call); the bitonic
plan leaves it to point_map.

Filling (after the host has read M and allocated the [M, ...] outputs):
  reduce_{max,sum,mean}   a block per (voxel, channel vector): the voxel's points in point
                 order, max by `x > acc` (a NaN never wins: mmcv's comparison), sum in float32,
                 mean = that sum / count; the same order on every target, so the same bits.
                 On the CPU the rows come in sorted order, which no hardware prefetcher
                 follows: each step prefetches the row `ahead` sorted points on. Widths
                 (REDUCE_WIDTHS): the plan's vector, the target's lanes (C below the
                 vector), one channel (C below the lanes, and CUDA). On the CPU at a voxel
                 encoder's channels (64, 128): reduce_{max,sum,mean}_rows_c<C>, a block per
                 voxel walking its points once, each whole row added into registers, which
                 writes voxel_rows' outputs too.
  voxel_rows     voxel_coors (the first point's row) and voxel_points_count
  point_map      point2voxel_map[order[i]] = voxel of sorted position i, -1 for dropped points
                 (the bitonic plan's; the radix plan's when the caller gives the map with
                 out=, which is written only once M has been checked: the grouping then
                 writes a workspace instead)

group_rows, group_split and chunk_offsets are programs in a block (the radix sort's
histogram and the scan carry state from one point to the next; group_split's two parts are
parallel loops of its own), not computes a schedule can reshape; the bitonic and scan
kernels and the fill are blocks a schedule places, except bitonic_tile, which binds its own
loops (a CUDA block per tile). Every index the kernels
store through comes from a permutation the kernels built, never from input values, and
point_map checks it against N all the same.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .. import fixed_channels
from ...one_core import BARRIER, LAUNCH_POINT
from ..fixed_channels import VOXEL_ENCODER_CHANNELS
from ..point_vectors import point, scratch_scope, vectors
from ..prefetch import prefetch_words
from . import (COARSE, COARSE_BITS, FIXED_COLUMNS, RADIX_BITS, REDUCE_TYPES, REDUCE_WIDTHS, SHARED_WORDS,
               SPLIT_PARTS)

RADIX = 1 << RADIX_BITS
INT_BITS = 31  # a coordinate of a kept point is a non-negative int32
# a row whose columns' widths and its point index's add up to this packs into one int64 key
KEY_BITS = 63
KEY_PASSES = (KEY_BITS - 1 + RADIX_BITS - 1) // RADIX_BITS  # at most (an index takes a bit at least)
# group_split's small shared state (SHARED_WORDS words) at KEPT (kept points per part), SIDE0
# (keys on side 0), SPLIT_BIN, VOXELS (per side), PART0_SIDE0 (part 0's keys on side 0), TOTAL
# (a key's row bits) and INDEX_BITS (a point index's)
KEPT, SIDE0, SPLIT_BIN, VOXELS, PART0_SIDE0, TOTAL, INDEX_BITS = 0, 2, 3, 4, 6, 7, 8
MAX_COLUMNS = 8  # group_split's columns at most (a part's maxima in registers); more: count -1


@T.macro(hygienic=False)
def _dropped_into(flag, coors, n, D):
    """flag[0] = 1 if point n has a negative coordinate, else 0."""
    flag[0] = 0
    for d in range(D):
        if coors[n, d] < 0:
            flag[0] = 1


@T.macro(hygienic=False)
def _rows_differ_into(flag, coors, a, b, D):
    """flag[0] = 1 if points a and b have different rows, else 0."""
    flag[0] = 0
    for d in range(D):
        if coors[a, d] != coors[b, d]:
            flag[0] = 1


def _part_size(total, part, part_len):
    """How many of `total` entries part `part` holds, parts of part_len entries in turn."""
    return T.max(T.min(total - part * part_len, part_len), 0)


def _row_of(key, index_bits):
    """The packed row of a key (above its point index)."""
    return T.shift_right(key, T.Cast("int64", index_bits))


@T.macro(hygienic=False)
def _starts_voxel_into(flag, sorted_keys, at, first, index_bits):
    """flag[0] = 1 if sorted key `at` starts a voxel: the first of its run from `first`, or
    a row unlike the previous key's (a branch: TIR's `or` may read both sides)."""
    flag[0] = 1
    if at > first:
        if _row_of(sorted_keys[at], index_bits) == _row_of(sorted_keys[at - 1], index_bits):
            flag[0] = 0


@T.macro(hygienic=False)
def _walk_into(order, voxel_of, start, point_map, sorted_keys, first, size, index_bits, flag, voxels, numbered):
    """The walk of sorted keys [first, first + size): order (each key's point index),
    voxel_of (1 + its voxel, counted in voxels[0] from its value on entry) and, where the
    voxel numbers are final (`numbered`), start (each voxel's first sorted position) and
    point_map (each point's voxel)."""
    for i in range(size):
        n = T.Bind(T.Cast("int32", T.bitwise_and(
            sorted_keys[first + i], T.shift_left(T.int64(1), T.Cast("int64", index_bits)) - T.int64(1))))
        order[first + i] = n
        _starts_voxel_into(flag, sorted_keys, first + i, first, index_bits)
        if flag[0] == 1:
            if numbered:
                start[voxels[0]] = first + i
            voxels[0] = voxels[0] + 1
        voxel_of[first + i] = voxels[0]
        if numbered:
            point_map[n] = voxels[0] - 1


def _key_digit(key, shift, radix_bits):
    return T.Cast("int32", T.bitwise_and(T.shift_right(key, shift), T.int64((1 << radix_bits) - 1)))


def _column_digit(coors, n, d, shift):
    return T.bitwise_and(T.shift_right(coors[n, d], shift), RADIX - 1)


@T.macro(hygienic=False)
def _digit_counts(hist, kept, digit_of, total):
    """hist[b] = the first slot of digit b in a counting sort of the `kept` entries
    (total[0]: the running total)."""
    for b in range(RADIX):
        hist[b] = 0
    for i in range(kept):
        digit = T.Bind(digit_of(i))
        hist[digit] = hist[digit] + 1
    _first_slots(hist, 1, 0, total, RADIX_BITS)


@T.macro(hygienic=False)
def _key_pass(key_hist, src, dst, first, count, pass_, index_bits, radix_bits):
    """One stable counting-sort pass of the packed keys src[first:first + count] by row digit
    `pass_` of radix_bits bits (above the index_bits of the point index; its histogram's
    first slots in key_hist[pass_ << radix_bits:], advanced as the keys land in dst)."""
    for i in range(count):
        slot_of = T.Bind(pass_ * (1 << radix_bits) + _key_digit(
            src[first + i], T.Cast("int64", index_bits + pass_ * radix_bits), radix_bits))
        slot = T.Bind(key_hist[slot_of])
        dst[slot] = src[first + i]
        key_hist[slot_of] = slot + 1


@T.macro(hygienic=False)
def _count_digits(key_hist, keys, first, count, passes, index_bits, radix_bits):
    """Count keys[first:first + count] in each pass's digit histogram: a sweep per pass (a
    loop of constant shift LLVM unrolls, where a loop over the passes per key ran a few
    instructions per count more)."""
    for pass_ in range(passes):
        for i in range(count):
            digit = T.Bind(pass_ * (1 << radix_bits) + _key_digit(
                keys[first + i], T.Cast("int64", index_bits + pass_ * radix_bits), radix_bits))
            key_hist[digit] = key_hist[digit] + 1


@T.macro(hygienic=False)
def _first_slots(key_hist, passes, first, total, radix_bits):
    """Each pass's digit counts into its digits' first slots (from `first`; total[0]: the
    running total)."""
    for pass_ in range(passes):
        total[0] = first
        for b in range(1 << radix_bits):
            here = T.Bind(key_hist[pass_ * (1 << radix_bits) + b])
            key_hist[pass_ * (1 << radix_bits) + b] = total[0]
            total[0] = total[0] + here


@T.macro(hygienic=False)
def _key_passes(key_hist, keys, keys_tmp, first, count, passes, index_bits, radix_bits):
    """The LSD passes over keys[first:first + count], between keys and keys_tmp in turn,
    the sorted keys back in keys (an odd count copies them back)."""
    for pair in range((passes + 1) // 2):
        _key_pass(key_hist, keys, keys_tmp, first, count, 2 * pair, index_bits, radix_bits)
        if 2 * pair + 1 < passes:
            _key_pass(key_hist, keys_tmp, keys, first, count, 2 * pair + 1, index_bits, radix_bits)
        else:
            for i in range(count):
                keys[first + i] = keys_tmp[first + i]


@T.macro(hygienic=False)
def _sort_keys(key_hist, keys, keys_tmp, first, count, total, index_bits, running, small_keys, small_bits):
    """keys[first:first + count] sorted by their rows' `total` bits (above index_bits): in
    small_bits-bit digits below small_keys keys, else RADIX_BITS-bit ones (a pass costs its
    keys' scatter plus its histogram's zeroing and prefix: narrower digits for few keys)."""
    if count < small_keys:
        _sort_in_digits(key_hist, keys, keys_tmp, first, count, total, index_bits, running, small_bits)
    else:
        _sort_in_digits(key_hist, keys, keys_tmp, first, count, total, index_bits, running, RADIX_BITS)


@T.macro(hygienic=False)
def _sort_in_digits(key_hist, keys, keys_tmp, first, count, total, index_bits, running, radix_bits):
    """keys[first:first + count] sorted by their rows' `total` bits (above index_bits) in
    digits of radix_bits bits: histograms, first slots, the passes (keys_tmp between them)."""
    passes = T.Bind((total + radix_bits - 1) // radix_bits)
    for b in range(passes * (1 << radix_bits)):
        key_hist[b] = 0
    _count_digits(key_hist, keys, first, count, passes, index_bits, radix_bits)
    _first_slots(key_hist, passes, first, running, radix_bits)
    _key_passes(key_hist, keys, keys_tmp, first, count, passes, index_bits, radix_bits)


@T.macro(hygienic=False)
def _packed_row_into(key, coors, n, bits, D):
    """key[0] = point n's row packed into an int64, column 0 highest, column d in bits[d]."""
    key[0] = T.int64(0)
    for d in range(D):
        key[0] = T.bitwise_or(T.shift_left(key[0], T.Cast("int64", bits[d])), T.Cast("int64", coors[n, d]))


@T.macro(hygienic=False)
def _widths_into(state, bits, N, D):
    """bits[d] = the width in bits of bits[d] (a column's largest value); state[2] = their
    total, state[3] = the width of a point index (of N - 1)."""
    state[2] = 0
    for d in range(D):
        state[3] = 0
        while state[3] < INT_BITS and T.shift_right(bits[d], state[3]) > 0:
            state[3] = state[3] + 1
        bits[d] = state[3]
        state[2] = state[2] + state[3]
    state[3] = 1
    while state[3] < INT_BITS and T.shift_right(N - 1, state[3]) > 0:
        state[3] = state[3] + 1


@T.macro(hygienic=False)
def _network_order_into(rank, flag, before, coors, N, D, a, b):
    """before[0] < 0 if entry a sorts before entry b: (kept, dropped, padding) first, then
    the row, then the point index (rank[0], rank[1]: 0 kept, 1 dropped, 2 padding)."""
    rank[0] = 2
    rank[1] = 2
    if a < N:
        _dropped_into(flag, coors, a, D)
        rank[0] = flag[0]
    if b < N:
        _dropped_into(flag, coors, b, D)
        rank[1] = flag[0]
    before[0] = rank[0] - rank[1]
    if before[0] == 0 and rank[0] == 0:
        for d in range(D):
            if before[0] == 0:
                before[0] = T.Select(coors[a, d] < coors[b, d], -1, T.Select(coors[a, d] > coors[b, d], 1, 0))
    if before[0] == 0:
        before[0] = T.Select(a < b, -1, 1)


@T.macro(hygienic=False)
def _network_store(dst, slot, coors, N, D, vi, a, b, k, j, scope):
    """dst[slot] = the entry network slot vi keeps after step (k, j): a (its own) or b (its
    partner's, slot vi ^ j). The lower slot of an ascending pair (and the upper of a
    descending) keeps the smaller entry; the top stage (k = P) sorts ascending. Booleans
    are compared as int32 (LLVM codegen cannot compare i1 values). Its state: buffers of
    the enclosing block in `scope`."""
    rank = T.alloc_buffer((2,), "int32", scope=scope)
    flag = T.alloc_buffer((1,), "int32", scope=scope)
    before = T.alloc_buffer((1,), "int32", scope=scope)
    _network_order_into(rank, flag, before, coors, N, D, a, b)
    lower = T.meta_var(T.Select(T.bitwise_and(vi, j) == 0, 1, 0))
    ascending = T.meta_var(T.Select(T.bitwise_and(vi, k) == 0, 1, 0))
    smaller_here = T.meta_var(T.Select(lower == ascending, 1, 0))
    dst[slot] = T.Select(T.Select(before[0] < 0, 1, 0) == smaller_here, a, b)


@T.macro(hygienic=False)
def _tile_step(buf, t, k, j, parity, lanes, scope):
    """Step (k, j < tile) of the network on tile t, held in buf: from half `parity` into the
    other, a lane (`lanes`: the loop over them) per slot, its state in `scope`. Reads the
    expanding kernel's coors, N and D, and group_computes' tile."""
    for i in lanes(tile):
        with T.sblock("tile_step"):
            T.reads(coors[0:N, 0:D], buf[0:2 * tile])
            T.writes(buf[0:2 * tile])
            a = T.Bind(buf[parity * tile + i])
            b = T.Bind(buf[parity * tile + T.bitwise_xor(i, j)])
            _network_store(buf, (1 - parity) * tile + i, coors, N, D, t * tile + i, a, b, k, j, scope)


def _with_columns(func, columns: int):
    """`func` (whose first parameter is coors [N, D]) specialised to D = columns."""
    coors = func.params[0]
    return func.specialize({coors: tirx.decl_buffer((tirx.Var("N", "int32"), columns), "int32", "coors")})


def group_computes(kind: str, tile: int, small_sort_keys: int, small_radix_bits: int) -> dict:
    """Both grouping plans' kernels (a library builds its plan's); N, D, the permutation's
    length P and the chunk count G symbolic; the chunk_* kernels take the chunk length as an
    argument (CHUNK, from the plan).
    `kind`: the target's (llvm, cuda), for the bitonic plan's per-element buffers; `tile`:
    the entries (a power of two) bitonic_tile sorts in one CUDA block's shared memory, a
    lane (thread) per entry (on the CPU a loop, a tile at a time)."""
    small = scratch_scope(kind)
    part_loop = T.parallel if kind == "llvm" else T.serial  # group_split's parts: the CPU's cores
    shared = "shared" if kind == "cuda" else "global"
    tile_loop = (lambda n: T.thread_binding(n, thread="blockIdx.x")) if kind == "cuda" else T.serial
    lane_loop = (lambda n: T.thread_binding(n, thread="threadIdx.x")) if kind == "cuda" else T.serial
    tile_bits = tile.bit_length() - 1

    @T.prim_func(s_tir=True)
    def group_rows(coors_h: T.handle, order_h: T.handle, scratch_h: T.handle, keys_h: T.handle,
                   keys_tmp_h: T.handle, bits_h: T.handle, start_h: T.handle, voxel_of_h: T.handle,
                   map_h: T.handle, count_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, D, P, S = T.int32(), T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        scratch = T.match_buffer(scratch_h, (P,), "int32")
        keys = T.match_buffer(keys_h, (N,), "int64")
        keys_tmp = T.match_buffer(keys_tmp_h, (N,), "int64")
        bits = T.match_buffer(bits_h, (D,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        voxel_of = T.match_buffer(voxel_of_h, (N,), "int32")
        point_map = T.match_buffer(map_h, (N,), "int32")
        count = T.match_buffer(count_h, (1,), "int32")
        for unit in range(1):
            with T.sblock("group"):
                T.reads(coors[0:N, 0:D])
                T.writes(order[0:P], scratch[0:P], keys[0:N], keys_tmp[0:N], bits[0:D], start[0:S], voxel_of[0:N],
                         point_map[0:N], count[0])
                hist = T.alloc_buffer((RADIX,), "int32", scope="local")
                key_hist = T.alloc_buffer((KEY_PASSES * RADIX,), "int32", scope="local")
                # the walks' running state: stack allocas LLVM keeps in registers (a workspace's
                # pointer is opaque to it: every access would be a load or a store)
                flag = T.alloc_buffer((1,), "int32", scope=small)
                key = T.alloc_buffer((1,), "int64", scope=small)
                state = T.alloc_buffer((4,), "int32", scope=small)
                running = T.alloc_buffer((1,), "int32", scope=small)
                # 1. the kept points in index order, then the dropped; each column's largest value
                for d in range(D):
                    bits[d] = 0
                state[0] = 0
                state[1] = 0
                for n in range(N):
                    _dropped_into(flag, coors, n, D)
                    if flag[0] == 0:
                        order[state[0]] = n
                        state[0] = state[0] + 1
                        for d in range(D):
                            bits[d] = T.max(bits[d], coors[n, d])
                    else:
                        scratch[state[1]] = n
                        state[1] = state[1] + 1
                kept = T.Bind(state[0])
                for i in range(N - kept):
                    order[kept + i] = scratch[i]
                # 2. each column's width in bits (of its largest value), their total, a point
                # index's width
                _widths_into(state, bits, N, D)
                total = T.Bind(state[2])
                index_bits = T.Bind(state[3])
                state[0] = 0  # from here: the voxels found
                if total + index_bits <= KEY_BITS:
                    # 3. a row packed into one int64 key (column 0 highest) above its point's
                    # index
                    for i in range(kept):
                        _packed_row_into(key, coors, order[i], bits, D)
                        keys[i] = T.bitwise_or(T.shift_left(key[0], T.Cast("int64", index_bits)),
                                               T.Cast("int64", order[i]))
                    # the passes over the row's digits, least significant first, the index
                    # riding below them (the keys start in index order and every pass is
                    # stable)
                    _sort_keys(key_hist, keys, keys_tmp, 0, kept, total, index_bits, running, small_sort_keys,
                               small_radix_bits)
                    # 4. the sorted points; a row unlike the previous one starts a voxel
                    _walk_into(order, voxel_of, start, point_map, keys, 0, kept, index_bits, flag, state, True)
                else:
                    # 3. rows too wide for one key: sorted column by column, the last first
                    for back in range(D):
                        d = T.Bind(D - 1 - back)
                        state[3] = 0
                        while state[3] < bits[d]:
                            shift = T.Bind(state[3])
                            _digit_counts(hist, kept, lambda i: _column_digit(coors, order[i], d, shift), running)
                            for i in range(kept):
                                digit = T.Bind(_column_digit(coors, order[i], d, shift))
                                scratch[hist[digit]] = order[i]
                                hist[digit] = hist[digit] + 1
                            for i in range(kept):
                                order[i] = scratch[i]
                            state[3] = shift + RADIX_BITS
                    # 4. a row unlike the previous one starts a voxel
                    for i in range(kept):
                        if i == 0:
                            flag[0] = 1
                        else:
                            _rows_differ_into(flag, coors, order[i], order[i - 1], D)
                        if flag[0] == 1:
                            start[state[0]] = i
                            state[0] = state[0] + 1
                        voxel_of[i] = state[0]
                        point_map[order[i]] = state[0] - 1
                for i in range(N - kept):
                    voxel_of[kept + i] = state[0]
                    point_map[order[kept + i]] = -1
                start[state[0]] = kept
                count[0] = state[0]

    @T.prim_func(s_tir=True)
    def group_split(coors_h: T.handle, order_h: T.handle, keys_h: T.handle, keys_tmp_h: T.handle,
                    keys_alt_h: T.handle, bits_h: T.handle, part_max_h: T.handle, coarse_h: T.handle,
                    shared_h: T.handle, start_h: T.handle, voxel_of_h: T.handle, map_h: T.handle,
                    count_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, D, P, S = T.int32(), T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        keys = T.match_buffer(keys_h, (N,), "int64")
        keys_tmp = T.match_buffer(keys_tmp_h, (N,), "int64")
        keys_alt = T.match_buffer(keys_alt_h, (N,), "int64")
        bits = T.match_buffer(bits_h, (D,), "int32")
        part_max = T.match_buffer(part_max_h, (SPLIT_PARTS, D), "int32")
        coarse = T.match_buffer(coarse_h, (SPLIT_PARTS, COARSE), "int32")
        shared = T.match_buffer(shared_h, (SHARED_WORDS,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        voxel_of = T.match_buffer(voxel_of_h, (N,), "int32")
        point_map = T.match_buffer(map_h, (N,), "int32")
        count = T.match_buffer(count_h, (1,), "int32")
        for unit in range(1):
            with T.sblock("group"):
                T.reads(coors[0:N, 0:D])
                T.writes(order[0:P], keys[0:N], keys_tmp[0:N], keys_alt[0:N], bits[0:D], part_max[0:2, 0:D],
                         coarse[0:2, 0:COARSE], shared[0:SHARED_WORDS], start[0:S], voxel_of[0:N], point_map[0:N],
                         count[0])
                count[0] = -1  # rows too wide for one key, or more columns than MAX_COLUMNS
                if D <= MAX_COLUMNS:
                    half = T.Bind((N + 1) // 2)  # part p: points [p * half, p * half + points of it)
                    # one parallel launch: the parts' loops wait for each other at TVM's barriers, the
                    # serial steps run on the first part's thread (a launch per loop woke TVM's sleeping
                    # workers once per loop: docs/kernels/dynamic_scatter_forward.md)
                    with T.attr(0, LAUNCH_POINT, 1):
                        with T.attr(0, BARRIER, 1):
                            # A. per part of the points: how many are kept, each column's largest value
                            for part in part_loop(SPLIT_PARTS):
                                with T.sblock("part_widths"):
                                    T.reads()
                                    T.writes()
                                    # (the running values in registers: both parts' maxima share a line)
                                    flag = T.alloc_buffer((1,), "int32", scope=small)
                                    here = T.alloc_buffer((1,), "int32", scope=small)
                                    largest = T.alloc_buffer((MAX_COLUMNS,), "int32", scope=small)
                                    # (loops over all MAX_COLUMNS: a buffer indexed below D would be
                                    # compacted to a symbolic size, which CUDA cannot allocate)
                                    here[0] = 0
                                    for d in range(MAX_COLUMNS):
                                        largest[d] = 0
                                    for i in range(_part_size(N, part, half)):
                                        _dropped_into(flag, coors, part * half + i, D)
                                        if flag[0] == 0:
                                            here[0] = here[0] + 1
                                            for d in range(MAX_COLUMNS):
                                                if d < D:
                                                    largest[d] = T.max(largest[d], coors[part * half + i, d])
                                    for d in range(MAX_COLUMNS):
                                        if d < D:
                                            part_max[part, d] = largest[d]
                                    shared[KEPT + part] = here[0]
                        with T.attr(0, BARRIER, 1):
                            # B. the widths, as the serial kernel, on part 0's thread
                            for part in part_loop(SPLIT_PARTS):
                                with T.sblock("widths"):
                                    T.reads()
                                    T.writes()
                                    state = T.alloc_buffer((4,), "int32", scope=small)
                                    if part == 0:
                                        for d in range(D):
                                            bits[d] = T.max(part_max[0, d], part_max[1, d])
                                        _widths_into(state, bits, N, D)
                                        shared[TOTAL] = state[2]
                                        shared[INDEX_BITS] = state[3]
                        total = T.Bind(shared[TOTAL])
                        index_bits = T.Bind(shared[INDEX_BITS])
                        kept = T.Bind(shared[KEPT] + shared[KEPT + 1])
                        if total + index_bits <= KEY_BITS:
                            # a key's coarse bin: the row's top COARSE_BITS bits
                            coarse_shift = T.Bind(index_bits + T.max(total - COARSE_BITS, 0))
                            with T.attr(0, BARRIER, 1):
                                # C. per part: its kept points' keys in index order (after the kept points
                                # of the parts before), its dropped points after all kept ones; each
                                # part's histogram of coarse bins
                                for part in part_loop(SPLIT_PARTS):
                                    with T.sblock("part_keys"):
                                        T.reads()
                                        T.writes()
                                        flag = T.alloc_buffer((1,), "int32", scope=small)
                                        key = T.alloc_buffer((1,), "int64", scope=small)
                                        at = T.alloc_buffer((2,), "int32", scope=small)
                                        for b in range(COARSE):
                                            coarse[part, b] = 0
                                        at[0] = T.Select(part == 0, 0, shared[KEPT])
                                        at[1] = kept + T.Select(part == 0, 0, half - shared[KEPT])
                                        for i in range(_part_size(N, part, half)):
                                            _dropped_into(flag, coors, part * half + i, D)
                                            if flag[0] == 0:
                                                _packed_row_into(key, coors, part * half + i, bits, D)
                                                bin_ = T.Bind(T.Cast("int32", T.shift_right(key[0], T.Cast(
                                                    "int64", coarse_shift - index_bits))))
                                                coarse[part, bin_] = coarse[part, bin_] + 1
                                                keys[at[0]] = T.bitwise_or(
                                                    T.shift_left(key[0], T.Cast("int64", index_bits)),
                                                    T.Cast("int64", part * half + i))
                                                at[0] = at[0] + 1
                                            else:
                                                order[at[1]] = part * half + i
                                                at[1] = at[1] + 1
                            with T.attr(0, BARRIER, 1):
                                # D. the split: side 0 the bins below the first one where half the kept
                                # points lie below, side 1 the rest (a row's keys share a bin: one
                                # side); and how many of part 0's keys go to side 0 (on part 0's thread)
                                for part in part_loop(SPLIT_PARTS):
                                    with T.sblock("split"):
                                        T.reads()
                                        T.writes()
                                        state = T.alloc_buffer((4,), "int32", scope=small)
                                        if part == 0:
                                            state[0] = 0  # the keys in the bins below b
                                            state[1] = COARSE
                                            shared[PART0_SIDE0] = 0
                                            for b in range(COARSE):
                                                if state[1] == COARSE and 2 * state[0] >= kept:
                                                    state[1] = b
                                                    shared[SIDE0] = state[0]
                                                if state[1] == COARSE:
                                                    shared[PART0_SIDE0] = shared[PART0_SIDE0] + coarse[0, b]
                                                state[0] = state[0] + coarse[0, b] + coarse[1, b]
                                            if state[1] == COARSE:
                                                shared[SIDE0] = kept
                                            shared[SPLIT_BIN] = state[1]
                            with T.attr(0, BARRIER, 1):
                                # E. each part's keys to their sides, in index order (side s's keys
                                # from part 0 first): a stable partition, branch-free (which side a key
                                # goes to is as random as the points)
                                for part in part_loop(SPLIT_PARTS):
                                    with T.sblock("part_sides"):
                                        T.reads()
                                        T.writes()
                                        at = T.alloc_buffer((2,), "int32", scope=small)
                                        at[0] = T.Select(part == 0, 0, shared[PART0_SIDE0])
                                        at[1] = shared[SIDE0] + T.Select(part == 0, 0,
                                                                         shared[KEPT] - shared[PART0_SIDE0])
                                        for i in range(shared[KEPT + part]):
                                            key_at = T.Bind(T.Select(part == 0, 0, shared[KEPT]) + i)
                                            to_side = T.Bind(T.Cast("int32", T.Cast("int32", T.shift_right(
                                                keys[key_at], T.Cast("int64", coarse_shift))) >= shared[SPLIT_BIN]))
                                            keys_tmp[at[to_side]] = keys[key_at]
                                            at[to_side] = at[to_side] + 1
                            with T.attr(0, BARRIER, 1):
                                # F. per side: its keys sorted as the serial kernel does, then walked:
                                # order, each voxel's number in the side
                                for side in part_loop(SPLIT_PARTS):
                                    with T.sblock("side_sort"):
                                        T.reads()
                                        T.writes()
                                        key_hist = T.alloc_buffer((KEY_PASSES * RADIX,), "int32", scope="local")
                                        at = T.alloc_buffer((1,), "int32", scope=small)
                                        total_ = T.alloc_buffer((1,), "int32", scope=small)
                                        flag = T.alloc_buffer((1,), "int32", scope=small)
                                        first = T.Bind(T.Select(side == 0, 0, shared[SIDE0]))
                                        size = T.Bind(T.Select(side == 0, shared[SIDE0], kept - shared[SIDE0]))
                                        _sort_keys(key_hist, keys_tmp, keys_alt, first, size, total, index_bits, total_,
                                                   small_sort_keys, small_radix_bits)
                                        at[0] = 0  # the side's voxels so far
                                        # (side 0's numbers are final: it records its starts and map)
                                        _walk_into(order, voxel_of, start, point_map, keys_tmp, first, size, index_bits,
                                                   flag, at, side == 0)
                                        shared[VOXELS + side] = at[0]
                            # G. side 1's voxels numbered after side 0's, in two halves
                            for part in part_loop(SPLIT_PARTS):
                                with T.sblock("side_numbers"):
                                    T.reads()
                                    T.writes()
                                    flag = T.alloc_buffer((1,), "int32", scope=small)
                                    first = T.Bind(shared[SIDE0])
                                    size = T.Bind(kept - shared[SIDE0])
                                    half_size = T.Bind((size + 1) // 2)
                                    for i in range(_part_size(size, part, half_size)):
                                        at = T.Bind(first + part * half_size + i)
                                        voxel = T.Bind(voxel_of[at] + shared[VOXELS])
                                        voxel_of[at] = voxel
                                        _starts_voxel_into(flag, keys_tmp, at, first, index_bits)
                                        if flag[0] == 1:
                                            start[voxel - 1] = at
                    # H. side 1's map on the calling thread, once the launch is done: its points are
                    # as random as any, and two cores storing into one map would share its lines
                    if shared[TOTAL] + shared[INDEX_BITS] <= KEY_BITS:
                        kept_points = T.Bind(shared[KEPT] + shared[KEPT + 1])
                        for i in range(kept_points - shared[SIDE0]):
                            point_map[order[shared[SIDE0] + i]] = voxel_of[shared[SIDE0] + i] - 1
                        voxels = T.Bind(shared[VOXELS] + shared[VOXELS + 1])
                        for i in range(N - kept_points):
                            voxel_of[kept_points + i] = voxels
                            point_map[order[kept_points + i]] = -1
                        start[voxels] = kept_points
                        count[0] = voxels

    @T.prim_func(s_tir=True)
    def bitonic_init(order_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        P = T.int32()
        order = T.match_buffer(order_h, (P,), "int32")
        for i in range(P):
            with T.sblock("init"):
                vi = T.axis.remap("S", [i])
                order[vi] = vi

    @T.prim_func(s_tir=True)
    def bitonic_step(coors_h: T.handle, src_h: T.handle, dst_h: T.handle, k: T.int32, j: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, D, P = T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        src = T.match_buffer(src_h, (P,), "int32")
        dst = T.match_buffer(dst_h, (P,), "int32")
        for i in range(P):
            with T.sblock("step"):
                vi = T.axis.remap("S", [i])
                T.reads(coors[0:N, 0:D], src[0:P])
                T.writes(dst[vi])
                _network_store(dst, vi, coors, N, D, vi, src[vi], src[T.bitwise_xor(vi, j)], k, j, small)

    @T.prim_func(s_tir=True)
    def bitonic_tile(coors_h: T.handle, src_h: T.handle, dst_h: T.handle, first: T.int32, last: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, D, P = T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        src = T.match_buffer(src_h, (P,), "int32")
        dst = T.match_buffer(dst_h, (P,), "int32")
        for t in tile_loop(P // tile):
            with T.sblock("tile"):
                T.reads(coors[0:N, 0:D], src[0:P])
                T.writes(dst[0:P])
                buf = T.alloc_buffer((2 * tile,), "int32", scope=shared)  # two halves in turn
                steps = T.alloc_buffer((1,), "int32", scope=small)
                for i in lane_loop(tile):
                    buf[i] = src[t * tile + i]
                # the steps (k, j < tile) of the stages k = 2^first .. 2^last, in order
                steps[0] = 0
                for kb in range(first, last + 1):
                    for jr in range(T.min(kb, tile_bits)):
                        _tile_step(buf, t, T.shift_left(1, kb), T.shift_left(1, T.min(kb, tile_bits) - 1 - jr),
                                   T.truncmod(steps[0], 2), lane_loop, small)
                        steps[0] = steps[0] + 1
                for i in lane_loop(tile):
                    dst[t * tile + i] = buf[T.truncmod(steps[0], 2) * tile + i]

    @T.prim_func(s_tir=True)
    def head_flags(coors_h: T.handle, order_h: T.handle, flags_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, D, P = T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        flags = T.match_buffer(flags_h, (N,), "int32")
        for i in range(N):
            with T.sblock("heads"):
                vi = T.axis.remap("S", [i])
                T.reads(coors[0:N, 0:D], order[0:N])
                T.writes(flags[vi])
                flag = T.alloc_buffer((1,), "int32", scope=small)
                n = T.Bind(order[vi])
                _dropped_into(flag, coors, n, D)
                if flag[0] == 1:
                    flags[vi] = 0
                elif vi == 0:
                    flags[vi] = 1
                else:
                    _rows_differ_into(flag, coors, n, order[vi - 1], D)
                    flags[vi] = flag[0]

    @T.prim_func(s_tir=True)
    def chunk_totals(flags_h: T.handle, totals_h: T.handle, chunk: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, G = T.int32(), T.int32()
        flags = T.match_buffer(flags_h, (N,), "int32")
        totals = T.match_buffer(totals_h, (G,), "int32")
        for g in range(G):
            with T.sblock("totals"):
                vg = T.axis.remap("S", [g])
                T.reads(flags[0:N])
                T.writes(totals[vg])
                acc = T.alloc_buffer((1,), "int32", scope=small)
                acc[0] = 0
                for t in range(T.min(chunk, N - vg * chunk)):
                    acc[0] = acc[0] + flags[vg * chunk + t]
                totals[vg] = acc[0]

    @T.prim_func(s_tir=True)
    def chunk_offsets(totals_h: T.handle, offsets_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        G = T.int32()
        totals = T.match_buffer(totals_h, (G,), "int32")
        offsets = T.match_buffer(offsets_h, (G,), "int32")
        for unit in range(1):
            with T.sblock("offsets"):
                T.reads(totals[0:G])
                T.writes(offsets[0:G])
                acc = T.alloc_buffer((1,), "int32", scope=small)
                acc[0] = 0
                for g in range(G):
                    offsets[g] = acc[0]
                    acc[0] = acc[0] + totals[g]

    @T.prim_func(s_tir=True)
    def chunk_scan(flags_h: T.handle, offsets_h: T.handle, voxel_of_h: T.handle, chunk: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, G = T.int32(), T.int32()
        flags = T.match_buffer(flags_h, (N,), "int32")
        offsets = T.match_buffer(offsets_h, (G,), "int32")
        voxel_of = T.match_buffer(voxel_of_h, (N,), "int32")
        for g in range(G):
            with T.sblock("scan"):
                vg = T.axis.remap("S", [g])
                T.reads(flags[0:N], offsets[vg])
                T.writes(voxel_of[0:N])
                acc = T.alloc_buffer((1,), "int32", scope=small)
                acc[0] = offsets[vg]
                for t in range(T.min(chunk, N - vg * chunk)):
                    acc[0] = acc[0] + flags[vg * chunk + t]
                    voxel_of[vg * chunk + t] = acc[0]

    @T.prim_func(s_tir=True)
    def segment_starts(coors_h: T.handle, order_h: T.handle, flags_h: T.handle, voxel_of_h: T.handle,
                       start_h: T.handle, count_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, D, P, S = T.int32(), T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        flags = T.match_buffer(flags_h, (N,), "int32")
        voxel_of = T.match_buffer(voxel_of_h, (N,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        count = T.match_buffer(count_h, (1,), "int32")
        for i in range(N):
            with T.sblock("starts"):
                vi = T.axis.remap("S", [i])
                T.reads(coors[0:N, 0:D], order[0:N], flags[vi], voxel_of[vi])
                T.writes(start[0:S], count[0])
                flag = T.alloc_buffer((1,), "int32", scope=small)
                _dropped_into(flag, coors, order[vi], D)
                if flag[0] == 0:
                    v = T.Bind(voxel_of[vi])
                    if flags[vi] == 1:
                        start[v - 1] = vi
                    # the last kept point ends the last voxel (the dropped points follow)
                    if vi + 1 < N:
                        _dropped_into(flag, coors, order[vi + 1], D)
                    else:
                        flag[0] = 1
                    if flag[0] == 1:
                        start[v] = vi + 1
                        count[0] = v

    fixed = {f"{name}_d{d}": _with_columns(func, d) for d in FIXED_COLUMNS
             for name, func in (("group_rows", group_rows), ("group_split", group_split))}
    return {"group_rows": group_rows, "group_split": group_split, **fixed, "bitonic_init": bitonic_init,
            "bitonic_step": bitonic_step, "bitonic_tile": bitonic_tile, "head_flags": head_flags,
            "chunk_totals": chunk_totals, "chunk_offsets": chunk_offsets, "chunk_scan": chunk_scan,
            "segment_starts": segment_starts}


def reduce_compute(dtype: str, reduce_type: str, lanes: int, ahead: int, kind: str, parts: int = 1,
                   with_rows: bool = False):
    """voxel_feats[v, c] over voxel v's points in point order; `parts` x `lanes` channels per
    vector (lanes 1: one channel at a time: C below the vector width, and CUDA); `ahead`: the
    prefetch distance; `kind`: the target's (llvm, cuda). `with_rows` (the CPU's copies with C
    fixed at a voxel encoder's channels, parts x lanes = C: one walk of a voxel's points with
    its whole row in registers): a block per voxel that also writes voxel_rows' outputs (the
    voxel's first point's coordinates, its point count), a parallel loop fewer."""
    scratch = scratch_scope(kind)
    f32 = "float32"
    width = parts * lanes  # channels per vector

    @T.macro
    def reduce_vector(feats, order, start, voxel_feats, vv, vo, C, P):
        # channel vector vo of voxel vv's row, `parts` registers of `lanes` channels
        acc = T.alloc_buffer((width,), f32, scope=scratch)
        for part in T.unroll(parts):
            for lane in T.vectorized(lanes):
                acc[part * lanes + lane] = T.float32(float("-inf")) if reduce_type == "max" else T.float32(0)
        for i in range(start[vv], start[vv + 1]):
            n = T.Bind(order[i])
            if ahead > 0:  # the row `ahead` sorted points on: no hardware prefetcher follows
                later = T.Bind(order[T.min(i + ahead, P - 1)])
                prefetch_words(lambda w: feats[later, point(C, width, vo, w)], width, 0)
            for part in T.unroll(parts):
                for lane in T.vectorized(lanes):
                    x = T.meta_var(T.Cast(f32, feats[n, point(C, width, vo, part * lanes + lane)]))
                    if reduce_type == "max":
                        acc[part * lanes + lane] = T.Select(x > acc[part * lanes + lane], x, acc[part * lanes + lane])
                    else:
                        acc[part * lanes + lane] = acc[part * lanes + lane] + x
        for part in T.unroll(parts):
            for lane in T.vectorized(lanes):
                if reduce_type == "mean":
                    voxel_feats[vv, point(C, width, vo, part * lanes + lane)] = T.Cast(
                        dtype, acc[part * lanes + lane] / T.Cast(f32, start[vv + 1] - start[vv]))
                else:
                    voxel_feats[vv, point(C, width, vo, part * lanes + lane)] = T.Cast(dtype, acc[part * lanes + lane])

    @T.prim_func(s_tir=True)
    def reduce(feats_h: T.handle, order_h: T.handle, start_h: T.handle, voxel_feats_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, C, P, S, M = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        feats = T.match_buffer(feats_h, (N, C), dtype)
        order = T.match_buffer(order_h, (P,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        voxel_feats = T.match_buffer(voxel_feats_h, (M, C), dtype)
        for v, o in T.grid(M, vectors(C, width)):
            with T.sblock("reduce"):
                vv, vo = T.axis.remap("SS", [v, o])
                T.reads(feats[0:N, 0:C], order[0:P], start[vv:vv + 2])
                T.writes(voxel_feats[vv, 0:C])
                reduce_vector(feats, order, start, voxel_feats, vv, vo, C, P)

    @T.prim_func(s_tir=True)
    def reduce_rows(feats_h: T.handle, coors_h: T.handle, order_h: T.handle, start_h: T.handle,
                    voxel_feats_h: T.handle, voxel_coors_h: T.handle, counts_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, C, D, P, S, M = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        feats = T.match_buffer(feats_h, (N, C), dtype)
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        voxel_feats = T.match_buffer(voxel_feats_h, (M, C), dtype)
        voxel_coors = T.match_buffer(voxel_coors_h, (M, D), "int32")
        counts = T.match_buffer(counts_h, (M,), "int32")
        for v in range(M):
            with T.sblock("reduce"):
                vv = T.axis.remap("S", [v])
                T.reads(feats[0:N, 0:C], coors[0:N, 0:D], order[0:P], start[vv:vv + 2])
                T.writes(voxel_feats[vv, 0:C], voxel_coors[vv, 0:D], counts[vv])
                first = T.Bind(order[start[vv]])
                for d in range(D):
                    voxel_coors[vv, d] = coors[first, d]
                counts[vv] = start[vv + 1] - start[vv]
                reduce_vector(feats, order, start, voxel_feats, vv, 0, C, P)

    return reduce_rows if with_rows else reduce


def fill_computes(dtype: str, widths: tuple, ahead: int, kind: str) -> dict:
    """The kernels that write the outputs once M is known; `widths`: the channels per vector
    of the three reduce widths (REDUCE_WIDTHS), `ahead`: the reduce's prefetch distance,
    `kind`: the target's (llvm, cuda)."""

    @T.prim_func(s_tir=True)
    def voxel_rows(coors_h: T.handle, order_h: T.handle, start_h: T.handle, voxel_coors_h: T.handle,
                   counts_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, D, P, S, M = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        voxel_coors = T.match_buffer(voxel_coors_h, (M, D), "int32")
        counts = T.match_buffer(counts_h, (M,), "int32")
        for v in range(M):
            with T.sblock("rows"):
                vv = T.axis.remap("S", [v])
                T.reads(coors[0:N, 0:D], order[0:P], start[vv:vv + 2])
                T.writes(voxel_coors[vv, 0:D], counts[vv])
                first = T.Bind(order[start[vv]])
                for d in range(D):
                    voxel_coors[vv, d] = coors[first, d]
                counts[vv] = start[vv + 1] - start[vv]

    @T.prim_func(s_tir=True)
    def point_map(order_h: T.handle, voxel_of_h: T.handle, start_h: T.handle, map_h: T.handle, voxels: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, P, S = T.int32(), T.int32(), T.int32()
        order = T.match_buffer(order_h, (P,), "int32")
        voxel_of = T.match_buffer(voxel_of_h, (N,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        for i in range(N):
            with T.sblock("map"):
                vi = T.axis.remap("S", [i])
                T.reads(order[vi], voxel_of[vi], start[voxels])
                T.writes(point2voxel_map[0:N])
                n = T.Bind(order[vi])
                if 0 <= n and n < N:
                    point2voxel_map[n] = T.Select(vi < start[voxels], voxel_of[vi] - 1, -1)

    kernels = {"voxel_rows": voxel_rows, "point_map": point_map}
    for reduce_type in REDUCE_TYPES:
        for suffix, lanes in zip(REDUCE_WIDTHS, widths):
            kernels[f"reduce_{reduce_type}{suffix}"] = reduce_compute(dtype, reduce_type, lanes, ahead, kind)
        if kind == "llvm":  # whole rows at a voxel encoder's channels: the vector is the row
            for channels in VOXEL_ENCODER_CHANNELS:
                if channels % widths[1]:  # the block's one vector must be the whole row
                    raise ValueError(f"reduce_rows: {channels} channels are not whole vectors of {widths[1]} lanes")
                rows = reduce_compute(dtype, reduce_type, widths[1], ahead, kind, channels // widths[1],
                                      with_rows=True)
                kernels |= fixed_channels.copies(f"reduce_{reduce_type}_rows", rows, {0: (("N", "C"), dtype)},
                                                 (channels,))
    return kernels
