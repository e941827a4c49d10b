"""TensorIR of dynamic_scatter_forward: group the points by coordinate row, then reduce.

Grouping (two plans, the schedule file's `sort` knob picks one per target):
  radix (CPU)    group_rows, one serial kernel: the kept points (every coordinate >= 0) in
                 index order, the dropped after them; each column's width in bits (of its
                 largest value). When the widths and the point index's add up to 63 bits
                 or less (MVXNet's grid: 6 + 11 + 11, and 15 for 20k points), each row is
                 packed into one int64 key above its point's index, and the keys are LSD
                 radix sorted on the row's bits in 14-bit digits (every pass's histogram
                 counted in the packing sweep, the passes between two buffers in turn);
                 otherwise the rows are sorted column by column, the last first. Both are
                 stable: each voxel's points stay in point order, and no key can overflow.
                 Then one walk marks each voxel's first point (a key or row unlike the
                 previous one), numbers the voxels and records where each starts.
                 group_rows_d3 / _d4: the same with D fixed.
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
sorted position i < start[M]) and count[0] = M.

Filling (after the host has read M and allocated the [M, ...] outputs):
  reduce_{max,sum,mean}   a block per (voxel, channel vector): the voxel's points in point
                 order, max by `x > acc` (a NaN never wins: mmcv's comparison), sum in float32,
                 mean = that sum / count; the same order on every target, so the same bits.
                 On the CPU the rows come in sorted order, which no hardware prefetcher
                 follows: each step prefetches the row `ahead` sorted points on. Widths
                 (REDUCE_WIDTHS): the plan's vector, the target's lanes (C below the
                 vector), one channel (C below the lanes, and CUDA).
  voxel_rows     voxel_coors (the first point's row) and voxel_points_count
  point_map      point2voxel_map[order[i]] = voxel of sorted position i, -1 for dropped points

group_rows and chunk_offsets are serial programs in a block (the radix sort's histogram and
the scan carry state from one point to the next), not computes a schedule can reshape; the
bitonic and scan kernels and the fill are blocks a schedule places. Every index the kernels
store through comes from a permutation the kernels built, never from input values, and
point_map checks it against N all the same.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..point_vectors import point, scratch_scope, vectors
from ..prefetch import LINE_WORDS

RADIX_BITS = 14
RADIX = 1 << RADIX_BITS
INT_BITS = 31  # a coordinate of a kept point is a non-negative int32
# a row whose columns' widths and its point index's add up to this packs into one int64 key
KEY_BITS = 63
KEY_PASSES = (KEY_BITS - 1 + RADIX_BITS - 1) // RADIX_BITS  # at most (an index takes a bit at least)
# the CPU's grouping also comes with D fixed (its per-point column loops unrolled: a third
# faster at D = 3): MVXNet's (z, y, x) and mmdet3d's batched (b, z, y, x)
FIXED_COLUMNS = (3, 4)
GROUP_KERNELS = {"radix": ("group_rows",) + tuple(f"group_rows_d{d}" for d in FIXED_COLUMNS),
                 "bitonic": ("bitonic_init", "bitonic_step", "bitonic_tile", "head_flags",
                             "chunk_totals", "chunk_offsets", "chunk_scan", "segment_starts")}
REDUCE_TYPES = ("max", "sum", "mean")
REDUCE_WIDTHS = ("", "_lanes", "_small")  # channel vectors of the plan's width, the target's lanes, one
FILL_KERNELS = ("voxel_rows", "point_map") + tuple(f"reduce_{r}{w}" for r in REDUCE_TYPES for w in REDUCE_WIDTHS)
KERNELS = GROUP_KERNELS["radix"] + GROUP_KERNELS["bitonic"] + FILL_KERNELS


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


def _key_digit(key, shift):
    return T.Cast("int32", T.bitwise_and(T.shift_right(key, shift), T.int64(RADIX - 1)))


def _column_digit(coors, n, d, shift):
    return T.bitwise_and(T.shift_right(coors[n, d], shift), RADIX - 1)


@T.macro(hygienic=False)
def _digit_counts(hist, kept, digit_of):
    """hist[b] = the first slot of digit b in a counting sort of the `kept` entries."""
    for b in range(RADIX):
        hist[b] = 0
    for i in range(kept):
        digit = T.Bind(digit_of(i))
        hist[digit] = hist[digit] + 1
    state[1] = 0  # the running total
    for b in range(RADIX):
        here = T.Bind(hist[b])
        hist[b] = state[1]
        state[1] = state[1] + here


@T.macro(hygienic=False)
def _key_pass(key_hist, src, dst, kept, pass_, index_bits):
    """One stable counting-sort pass of the packed keys by row digit `pass_` (above the
    index_bits of the point index; its histogram's first slots in key_hist[pass_ * RADIX:],
    advanced as the keys land)."""
    for i in range(kept):
        slot_of = T.Bind(pass_ * RADIX + _key_digit(src[i], T.Cast("int64", index_bits + pass_ * RADIX_BITS)))
        slot = T.Bind(key_hist[slot_of])
        dst[slot] = src[i]
        key_hist[slot_of] = slot + 1


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


def group_computes(kind: str, tile: int) -> dict:
    """Both grouping plans' kernels; N, D, the permutation's length P and the chunk count G
    symbolic; the chunk_* kernels take the chunk length as an argument (CHUNK, from the plan).
    `kind`: the target's (llvm, cuda), for the bitonic plan's per-element buffers; `tile`:
    the entries (a power of two) bitonic_tile sorts in one CUDA block's shared memory, a
    lane (thread) per entry (on the CPU a loop, a tile at a time)."""
    small = scratch_scope(kind)
    shared = "shared" if kind == "cuda" else "global"
    tile_loop = (lambda n: T.thread_binding(n, thread="blockIdx.x")) if kind == "cuda" else T.serial
    lane_loop = (lambda n: T.thread_binding(n, thread="threadIdx.x")) if kind == "cuda" else T.serial
    tile_bits = tile.bit_length() - 1

    @T.prim_func(s_tir=True)
    def group_rows(coors_h: T.handle, order_h: T.handle, scratch_h: T.handle, keys_h: T.handle,
                   keys_tmp_h: T.handle, bits_h: T.handle, start_h: T.handle, voxel_of_h: T.handle,
                   count_h: T.handle):
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
        count = T.match_buffer(count_h, (1,), "int32")
        for unit in range(1):
            with T.sblock("group"):
                T.reads(coors[0:N, 0:D])
                T.writes(order[0:P], scratch[0:P], keys[0:N], keys_tmp[0:N], bits[0:D], start[0:S], voxel_of[0:N],
                         count[0])
                hist = T.alloc_buffer((RADIX,), "int32", scope="local")
                key_hist = T.alloc_buffer((KEY_PASSES * RADIX,), "int32", scope="local")
                # the walks' running state: stack allocas LLVM keeps in registers (a workspace's
                # pointer is opaque to it: every access would be a load or a store)
                flag = T.alloc_buffer((1,), "int32", scope=small)
                key = T.alloc_buffer((1,), "int64", scope=small)
                state = T.alloc_buffer((4,), "int32", scope=small)
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
                # 2. each column's width in bits (of its largest value) and their total
                state[2] = 0
                for d in range(D):
                    state[3] = 0
                    while state[3] < INT_BITS and T.shift_right(bits[d], state[3]) > 0:
                        state[3] = state[3] + 1
                    bits[d] = state[3]
                    state[2] = state[2] + state[3]
                total = T.Bind(state[2])
                state[0] = 0  # from here: the voxels found
                # the width in bits of a point index (N - 1)
                state[3] = 1
                while state[3] < INT_BITS and T.shift_right(N - 1, state[3]) > 0:
                    state[3] = state[3] + 1
                index_bits = T.Bind(state[3])
                if total + index_bits <= KEY_BITS:
                    # 3. a row packed into one int64 key (column 0 highest) above its point's
                    # index, and, in the same sweep, every pass's digit histogram
                    passes = T.Bind((total + RADIX_BITS - 1) // RADIX_BITS)
                    for b in range(passes * RADIX):
                        key_hist[b] = 0
                    for i in range(kept):
                        key[0] = T.int64(0)
                        for d in range(D):
                            key[0] = T.bitwise_or(T.shift_left(key[0], T.Cast("int64", bits[d])),
                                                  T.Cast("int64", coors[order[i], d]))
                        keys[i] = T.bitwise_or(T.shift_left(key[0], T.Cast("int64", index_bits)),
                                               T.Cast("int64", order[i]))
                        for pass_ in range(passes):
                            digit = T.Bind(pass_ * RADIX + _key_digit(key[0], T.Cast("int64", pass_ * RADIX_BITS)))
                            key_hist[digit] = key_hist[digit] + 1
                    for pass_ in range(passes):  # each histogram into its digits' first slots
                        state[1] = 0
                        for b in range(RADIX):
                            here = T.Bind(key_hist[pass_ * RADIX + b])
                            key_hist[pass_ * RADIX + b] = state[1]
                            state[1] = state[1] + here
                    # the passes over the row's digits, least significant first, the index
                    # riding below them (the keys start in index order and every pass is
                    # stable), between keys and keys_tmp in turn; an odd count copies back
                    for pair in range((passes + 1) // 2):
                        _key_pass(key_hist, keys, keys_tmp, kept, 2 * pair, index_bits)
                        if 2 * pair + 1 < passes:
                            _key_pass(key_hist, keys_tmp, keys, kept, 2 * pair + 1, index_bits)
                        else:
                            for i in range(kept):
                                keys[i] = keys_tmp[i]
                    # 4. the sorted points; a row unlike the previous one starts a voxel
                    for i in range(kept):
                        order[i] = T.Cast("int32", T.bitwise_and(
                            keys[i], T.shift_left(T.int64(1), T.Cast("int64", index_bits)) - T.int64(1)))
                        if i == 0:
                            flag[0] = 1
                        else:
                            flag[0] = T.Select(T.shift_right(keys[i], T.Cast("int64", index_bits))
                                               != T.shift_right(keys[i - 1], T.Cast("int64", index_bits)), 1, 0)
                        if flag[0] == 1:
                            start[state[0]] = i
                            state[0] = state[0] + 1
                        voxel_of[i] = state[0]
                else:
                    # 3. rows too wide for one key: sorted column by column, the last first
                    for back in range(D):
                        d = T.Bind(D - 1 - back)
                        state[3] = 0
                        while state[3] < bits[d]:
                            shift = T.Bind(state[3])
                            _digit_counts(hist, kept, lambda i: _column_digit(coors, order[i], d, shift))
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
                for i in range(N - kept):
                    voxel_of[kept + i] = state[0]
                start[state[0]] = kept
                count[0] = state[0]

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

    fixed = {f"group_rows_d{d}": _with_columns(group_rows, d) for d in FIXED_COLUMNS}
    return {"group_rows": group_rows, **fixed, "bitonic_init": bitonic_init,
            "bitonic_step": bitonic_step, "bitonic_tile": bitonic_tile, "head_flags": head_flags,
            "chunk_totals": chunk_totals, "chunk_offsets": chunk_offsets, "chunk_scan": chunk_scan,
            "segment_starts": segment_starts}


def reduce_compute(dtype: str, reduce_type: str, lanes: int, ahead: int, kind: str):
    """voxel_feats[v, c] over voxel v's points in point order; `lanes` channels per vector
    (1: one channel at a time: C below the vector width, and CUDA); `ahead`: the prefetch
    distance; `kind`: the target's (llvm, cuda)."""
    scratch = scratch_scope(kind)
    f32 = "float32"
    ahead_lines = max(1, lanes // LINE_WORDS)  # the cache lines of one channel vector

    @T.prim_func(s_tir=True)
    def reduce(feats_h: T.handle, order_h: T.handle, start_h: T.handle, voxel_feats_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, C, P, S, M = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        feats = T.match_buffer(feats_h, (N, C), dtype)
        order = T.match_buffer(order_h, (P,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        voxel_feats = T.match_buffer(voxel_feats_h, (M, C), dtype)
        for v, o in T.grid(M, vectors(C, lanes)):
            with T.sblock("reduce"):
                vv, vo = T.axis.remap("SS", [v, o])
                T.reads(feats[0:N, 0:C], order[0:P], start[vv:vv + 2])
                T.writes(voxel_feats[vv, 0:C])
                acc = T.alloc_buffer((lanes,), f32, scope=scratch)
                for lane in T.vectorized(lanes):
                    acc[lane] = T.float32(float("-inf")) if reduce_type == "max" else T.float32(0)
                for i in range(start[vv], start[vv + 1]):
                    n = T.Bind(order[i])
                    if ahead > 0:  # the row `ahead` sorted points on: no hardware prefetcher follows
                        for line in range(ahead_lines):
                            T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(
                                feats[order[T.min(i + ahead, P - 1)], point(C, lanes, vo, line * LINE_WORDS)]),
                                0, 3, 1))
                    for lane in T.vectorized(lanes):
                        x = T.meta_var(T.Cast(f32, feats[n, point(C, lanes, vo, lane)]))
                        if reduce_type == "max":
                            acc[lane] = T.Select(x > acc[lane], x, acc[lane])
                        else:
                            acc[lane] = acc[lane] + x
                for lane in T.vectorized(lanes):
                    if reduce_type == "mean":
                        voxel_feats[vv, point(C, lanes, vo, lane)] = T.Cast(
                            dtype, acc[lane] / T.Cast(f32, start[vv + 1] - start[vv]))
                    else:
                        voxel_feats[vv, point(C, lanes, vo, lane)] = T.Cast(dtype, acc[lane])

    return reduce


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
    return kernels
