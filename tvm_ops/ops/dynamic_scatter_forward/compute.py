"""TensorIR of dynamic_scatter_forward: group the points by coordinate row, then reduce.

Grouping (two plans, the schedule file's `sort` knob picks one per target):
  radix (CPU)    sort_rows: the kept points (every coordinate >= 0) in index order, then an
                 LSD radix sort of them by row, last column first, 11-bit digits, as many
                 passes per column as its largest value needs (stable: each voxel's points
                 stay in point order); the dropped points after them. segments: one walk
                 over the sorted points marks each voxel's first point (a row unlike the
                 previous one), numbers the voxels and records where each starts.
  bitonic (CUDA) bitonic_init + bitonic_step: a bitonic network over the P >= N (a power of
                 two) entries of a point permutation, one launch per step, ordered by
                 (kept before dropped before padding, row, point index): unique keys, so
                 the result is the stable order above. head_flags marks voxel starts;
                 chunk_totals, chunk_offsets and chunk_scan number the voxels (an inclusive
                 scan in chunks of plan["chunk"]); segment_starts records where each starts
                 and the voxel count.
Both leave order[0:N] (sorted point indices), start[0:M+1] (voxel v's points are
order[start[v]:start[v+1]], start[M] = the kept points), voxel_of[i] (1 + the voxel of
sorted position i < start[M]) and count[0] = M.

Filling (after the host has read M and allocated the [M, ...] outputs):
  reduce_{max,sum,mean}   a block per (voxel, channel vector): the voxel's points in point
                 order, max by `x > acc` (a NaN never wins: mmcv's comparison), sum in float32,
                 mean = that sum / count; the same order on every target, so the same bits
  voxel_rows     voxel_coors (the first point's row) and voxel_points_count
  point_map      point2voxel_map[order[i]] = voxel of sorted position i, -1 for dropped points

The sort and segment kernels are serial programs in a block (the radix sort's histogram and
the scan carry state from one point to the next), not computes a schedule can reshape; the
bitonic and scan kernels and the fill are blocks a schedule places. Every index the kernels
store through comes from a permutation the kernels built, never from input values, and
point_map checks it against N all the same.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..point_vectors import point, vectors

RADIX_BITS = 11
RADIX = 1 << RADIX_BITS
INT_BITS = 31  # a coordinate of a kept point is a non-negative int32
GROUP_KERNELS = {"radix": ("sort_rows", "segments"),
                 "bitonic": ("bitonic_init", "bitonic_step", "head_flags", "chunk_totals", "chunk_offsets",
                             "chunk_scan", "segment_starts")}
REDUCE_TYPES = ("max", "sum", "mean")
FILL_KERNELS = ("voxel_rows", "point_map") + tuple(f"reduce_{r}" for r in REDUCE_TYPES) + tuple(
    f"reduce_{r}_small" for r in REDUCE_TYPES)
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


def group_computes() -> dict:
    """Both grouping plans' kernels; N, D, the permutation's length P and the chunk count G
    symbolic. `chunk` is fixed per library by the plan (chunk_* kernels read it)."""

    @T.prim_func(s_tir=True)
    def sort_rows(coors_h: T.handle, order_h: T.handle, scratch_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, D, P = T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        scratch = T.match_buffer(scratch_h, (P,), "int32")
        for unit in range(1):
            with T.sblock("sort"):
                T.reads(coors[0:N, 0:D])
                T.writes(order[0:P], scratch[0:P])
                hist = T.alloc_buffer((RADIX,), "int32", scope="local")
                flag = T.alloc_buffer((1,), "int32", scope="local")
                # kept, dropped, the column's largest value, the digit's shift
                state = T.alloc_buffer((4,), "int32", scope="local")
                state[0] = 0
                state[1] = 0
                for n in range(N):
                    _dropped_into(flag, coors, n, D)
                    if flag[0] == 0:
                        order[state[0]] = n
                        state[0] = state[0] + 1
                    else:
                        scratch[state[1]] = n
                        state[1] = state[1] + 1
                kept = T.Bind(state[0])
                for i in range(N - kept):
                    order[kept + i] = scratch[i]
                for back in range(D):
                    d = T.Bind(D - 1 - back)
                    state[2] = 0
                    for i in range(kept):
                        state[2] = T.max(state[2], coors[order[i], d])
                    state[3] = 0
                    while state[3] < INT_BITS and T.shift_right(state[2], state[3]) > 0:
                        shift = T.Bind(state[3])
                        for b in range(RADIX):
                            hist[b] = 0
                        for i in range(kept):
                            digit = T.Bind(T.bitwise_and(T.shift_right(coors[order[i], d], shift), RADIX - 1))
                            hist[digit] = hist[digit] + 1
                        state[1] = 0  # the running total: hist becomes each digit's first slot
                        for b in range(RADIX):
                            count = T.Bind(hist[b])
                            hist[b] = state[1]
                            state[1] = state[1] + count
                        for i in range(kept):
                            digit = T.Bind(T.bitwise_and(T.shift_right(coors[order[i], d], shift), RADIX - 1))
                            scratch[hist[digit]] = order[i]
                            hist[digit] = hist[digit] + 1
                        for i in range(kept):
                            order[i] = scratch[i]
                        state[3] = shift + RADIX_BITS

    @T.prim_func(s_tir=True)
    def segments(coors_h: T.handle, order_h: T.handle, start_h: T.handle, voxel_of_h: T.handle,
                 count_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, D, P, S = T.int32(), T.int32(), T.int32(), T.int32()
        coors = T.match_buffer(coors_h, (N, D), "int32")
        order = T.match_buffer(order_h, (P,), "int32")
        start = T.match_buffer(start_h, (S,), "int32")
        voxel_of = T.match_buffer(voxel_of_h, (N,), "int32")
        count = T.match_buffer(count_h, (1,), "int32")
        for unit in range(1):
            with T.sblock("segments"):
                T.reads(coors[0:N, 0:D], order[0:N])
                T.writes(start[0:S], voxel_of[0:N], count[0])
                flag = T.alloc_buffer((1,), "int32", scope="local")
                state = T.alloc_buffer((2,), "int32", scope="local")  # voxels so far, kept points
                state[0] = 0
                state[1] = 0
                for i in range(N):
                    n = T.Bind(order[i])
                    _dropped_into(flag, coors, n, D)
                    if flag[0] == 0:
                        state[1] = i + 1
                        if i > 0:
                            _rows_differ_into(flag, coors, n, order[i - 1], D)
                        else:
                            flag[0] = 1
                        if flag[0] == 1:
                            start[state[0]] = i
                            state[0] = state[0] + 1
                    voxel_of[i] = state[0]
                start[state[0]] = state[1]
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
                # rank[0], rank[1]: 0 kept, 1 dropped, 2 padding; order[0] < 0: a before b
                rank = T.alloc_buffer((2,), "int32", scope="local")
                flag = T.alloc_buffer((1,), "int32", scope="local")
                order = T.alloc_buffer((1,), "int32", scope="local")
                a = T.Bind(src[vi])
                b = T.Bind(src[T.bitwise_xor(vi, j)])
                rank[0] = 2
                rank[1] = 2
                if a < N:
                    _dropped_into(flag, coors, a, D)
                    rank[0] = flag[0]
                if b < N:
                    _dropped_into(flag, coors, b, D)
                    rank[1] = flag[0]
                order[0] = rank[0] - rank[1]
                if order[0] == 0 and rank[0] == 0:
                    for d in range(D):
                        if order[0] == 0:
                            order[0] = T.Select(coors[a, d] < coors[b, d], -1,
                                                T.Select(coors[a, d] > coors[b, d], 1, 0))
                if order[0] == 0:
                    order[0] = T.Select(a < b, -1, 1)
                # the lower slot of an ascending pair (and the upper of a descending) keeps
                # the smaller entry; the top step (k = P) sorts ascending
                # (booleans compared as int32: LLVM codegen cannot compare i1 values)
                lower = T.meta_var(T.Select(T.bitwise_and(vi, j) == 0, 1, 0))
                ascending = T.meta_var(T.Select(T.bitwise_and(vi, k) == 0, 1, 0))
                smaller_here = T.meta_var(T.Select(lower == ascending, 1, 0))
                dst[vi] = T.Select(T.Select(order[0] < 0, 1, 0) == smaller_here, a, b)

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
                flag = T.alloc_buffer((1,), "int32", scope="local")
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
                acc = T.alloc_buffer((1,), "int32", scope="local")
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
                acc = T.alloc_buffer((1,), "int32", scope="local")
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
                acc = T.alloc_buffer((1,), "int32", scope="local")
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
                flag = T.alloc_buffer((1,), "int32", scope="local")
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

    return {"sort_rows": sort_rows, "segments": segments, "bitonic_init": bitonic_init,
            "bitonic_step": bitonic_step, "head_flags": head_flags, "chunk_totals": chunk_totals,
            "chunk_offsets": chunk_offsets, "chunk_scan": chunk_scan, "segment_starts": segment_starts}


def reduce_compute(dtype: str, reduce_type: str, lanes: int):
    """voxel_feats[v, c] over voxel v's points in point order; `lanes` channels per vector
    (1: one channel at a time: C below the vector width, and CUDA)."""
    f32 = "float32"

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
                acc = T.alloc_buffer((lanes,), f32, scope="local")
                for lane in T.vectorized(lanes):
                    acc[lane] = T.float32(float("-inf")) if reduce_type == "max" else T.float32(0)
                for i in range(start[vv], start[vv + 1]):
                    n = T.Bind(order[i])
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


def fill_computes(dtype: str, lanes: int) -> dict:
    """The kernels that write the outputs once M is known."""

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
        kernels[f"reduce_{reduce_type}"] = reduce_compute(dtype, reduce_type, lanes)
        kernels[f"reduce_{reduce_type}_small"] = reduce_compute(dtype, reduce_type, 1)
    return kernels
