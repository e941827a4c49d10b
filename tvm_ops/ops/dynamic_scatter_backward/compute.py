"""TensorIR computes of dynamic_scatter_backward: schedule-free, scheduled per target by
schedule.py (the CUDA traceback becomes an atomicMin there)."""

from __future__ import annotations

from tvm.script import tirx as T

from .. import fixed_channels
from ..point_vectors import point, scratch_scope, vectors
from ..prefetch import prefetch_words

def kernel_computes(dtype: str) -> dict:
    """Schedule-free TensorIR of the five kernels; N, M and C stay symbolic and
    voxel_num is a runtime int32 argument of every kernel that reads voxels."""

    @T.prim_func(s_tir=True)
    def max_init(reduce_from_h: T.handle, n_points: T.int32):
        T.func_attr({"tirx.noalias": True})
        M, C = T.int32(), T.int32()
        reduce_from = T.match_buffer(reduce_from_h, (M, C), "int32")
        for m, c in T.grid(M, C):
            with T.sblock("init"):
                vm, vc = T.axis.remap("SS", [m, c])
                reduce_from[vm, vc] = n_points

    @T.prim_func(s_tir=True)
    def max_traceback(feats_h: T.handle, voxel_feats_h: T.handle, map_h: T.handle,
                      reduce_from_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        feats = T.match_buffer(feats_h, (N, C), dtype)
        voxel_feats = T.match_buffer(voxel_feats_h, (M, C), dtype)
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        reduce_from = T.match_buffer(reduce_from_h, (M, C), "int32")
        for n, c in T.grid(N, C):
            with T.sblock("traceback"):
                # n is a min-reduction into reduce_from as max_init left it (hence the
                # empty init); the row written is data-dependent.
                vn, vc = T.axis.remap("RS", [n, c])
                T.reads(point2voxel_map[vn], feats[vn, vc], voxel_feats[0:M, vc], reduce_from[0:M, vc])
                T.writes(reduce_from[0:M, vc])
                with T.init():
                    T.evaluate(0)
                v = T.Bind(point2voxel_map[vn])  # an immutable let: keeps the channel loop vectorisable
                if 0 <= v and v < T.min(voxel_num, M):
                    reduce_from[v, vc] = T.min(reduce_from[v, vc],
                                               T.Select(feats[vn, vc] == voxel_feats[v, vc], vn, N))

    @T.prim_func(s_tir=True)
    def max_scatter(grad_voxel_feats_h: T.handle, reduce_from_h: T.handle, map_h: T.handle,
                    grad_feats_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
        reduce_from = T.match_buffer(reduce_from_h, (M, C), "int32")
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
        for n, c in T.grid(N, C):
            with T.sblock("scatter"):
                vn, vc = T.axis.remap("SS", [n, c])
                T.reads(point2voxel_map[vn], reduce_from[0:M, vc], grad_voxel_feats[0:M, vc])
                T.writes(grad_feats[vn, vc])
                v = T.Bind(point2voxel_map[vn])
                if 0 <= v and v < T.min(voxel_num, M):
                    grad_feats[vn, vc] = T.Select(reduce_from[v, vc] == vn, grad_voxel_feats[v, vc],
                                                  T.cast(0, dtype))
                else:
                    grad_feats[vn, vc] = T.cast(0, dtype)

    @T.prim_func(s_tir=True)
    def sum_scatter(grad_voxel_feats_h: T.handle, map_h: T.handle, grad_feats_h: T.handle,
                    voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
        for n, c in T.grid(N, C):
            with T.sblock("scatter"):
                vn, vc = T.axis.remap("SS", [n, c])
                T.reads(point2voxel_map[vn], grad_voxel_feats[0:M, vc])
                T.writes(grad_feats[vn, vc])
                v = T.Bind(point2voxel_map[vn])
                if 0 <= v and v < T.min(voxel_num, M):
                    grad_feats[vn, vc] = grad_voxel_feats[v, vc]
                else:
                    grad_feats[vn, vc] = T.cast(0, dtype)

    @T.prim_func(s_tir=True)
    def mean_scatter(grad_voxel_feats_h: T.handle, count_h: T.handle, map_h: T.handle,
                     grad_feats_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
        voxel_points_count = T.match_buffer(count_h, (M,), "int32")
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
        for n, c in T.grid(N, C):
            with T.sblock("scatter"):
                vn, vc = T.axis.remap("SS", [n, c])
                T.reads(point2voxel_map[vn], voxel_points_count[0:M], grad_voxel_feats[0:M, vc])
                T.writes(grad_feats[vn, vc])
                v = T.Bind(point2voxel_map[vn])
                if 0 <= v and v < T.min(voxel_num, M):
                    grad_feats[vn, vc] = grad_voxel_feats[v, vc] / T.cast(voxel_points_count[v], dtype)
                else:
                    grad_feats[vn, vc] = T.cast(0, dtype)

    return {"max_init": max_init, "max_traceback": max_traceback, "max_scatter": max_scatter,
            "sum_scatter": sum_scatter, "mean_scatter": mean_scatter}


def voxel_owner_computes(dtype: str, widths: tuple, kind: str, ahead: int) -> dict:
    """The CPU's max plan by voxel owners: `max_buckets` (serial) lists each valid voxel's
    points in index order (a counting sort of point2voxel_map: order, start), then
    `max_voxels` walks each voxel's points per channel vector twice: the first point whose
    feature equals the voxel's max (exactly, so NaN never matches) is found, then each of
    its points' gradient row written (g there, 0 elsewhere); `max_unbucketed` zeroes the
    rows of points in no valid voxel. The same winner as the traceback's min (the smallest
    matching index): the same bits. `widths`: channels per vector of max_voxels and
    max_voxels_small; `kind`: the target's (llvm, cuda); `ahead`: max_voxels prefetches its
    vector's lines of feats (to read) and grad_feats (to write) of the point `ahead` bucket
    positions on (a voxel's points lie anywhere: no hardware prefetcher follows them; 0: none).
    On the CPU also max_voxels_rows_c<C> at a voxel encoder's channels (fixed_channels):
    max_voxels with the whole row one vector, without the prefetch."""
    scratch = scratch_scope(kind)

    @T.prim_func(s_tir=True)
    def max_buckets(map_h: T.handle, order_h: T.handle, start_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M1 = T.int32(), T.int32()
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        order = T.match_buffer(order_h, (N,), "int32")
        start = T.match_buffer(start_h, (M1,), "int32")  # M + 1
        for unit in range(1):
            with T.sblock("buckets"):
                T.reads(point2voxel_map[0:N])
                T.writes(order[0:N], start[0:M1])
                valid = T.Bind(T.min(voxel_num, M1 - 1))
                for v in range(M1):
                    start[v] = 0
                for n in range(N):  # start[v + 1]: the points of voxel v
                    v = T.Bind(point2voxel_map[n])
                    if 0 <= v and v < valid:
                        start[v + 1] = start[v + 1] + 1
                for v in range(M1 - 1):
                    start[v + 1] = start[v + 1] + start[v]
                for n in range(N):  # start[v] advances to voxel v's end while it fills
                    v = T.Bind(point2voxel_map[n])
                    if 0 <= v and v < valid:
                        order[start[v]] = n
                        start[v] = start[v] + 1
                for back in range(M1 - 1):  # back to the starts: start[v] = the end of v - 1
                    start[M1 - 1 - back] = start[M1 - 2 - back]
                start[0] = 0

    def voxels(lanes, ahead):
        @T.prim_func(s_tir=True)
        def max_voxels(grad_voxel_feats_h: T.handle, feats_h: T.handle, voxel_feats_h: T.handle,
                       order_h: T.handle, start_h: T.handle, grad_feats_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            N, M, C, M1 = T.int32(), T.int32(), T.int32(), T.int32()
            grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
            feats = T.match_buffer(feats_h, (N, C), dtype)
            voxel_feats = T.match_buffer(voxel_feats_h, (M, C), dtype)
            order = T.match_buffer(order_h, (N,), "int32")
            start = T.match_buffer(start_h, (M1,), "int32")
            grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
            for v, o in T.grid(M, vectors(C, lanes)):
                with T.sblock("voxel"):
                    vv, vo = T.axis.remap("SS", [v, o])
                    T.reads(grad_voxel_feats[vv, 0:C], feats[0:N, 0:C], voxel_feats[vv, 0:C], order[0:N],
                            start[vv:vv + 2])
                    T.writes(grad_feats[0:N, 0:C])
                    first = T.alloc_buffer((lanes,), "int32", scope=scratch)
                    for lane in T.vectorized(lanes):
                        first[lane] = N
                    for i in range(start[vv], start[vv + 1]):
                        n = T.Bind(order[i])
                        if ahead > 0:  # this vector's lines of the point `ahead` on (rows at random)
                            later = T.Bind(order[T.min(i + ahead, start[M1 - 1] - 1)])
                            prefetch_words(lambda w: feats[later, point(C, lanes, vo, w)], lanes, 0)
                            prefetch_words(lambda w: grad_feats[later, point(C, lanes, vo, w)], lanes, 1)
                        for lane in T.vectorized(lanes):
                            c = T.meta_var(point(C, lanes, vo, lane))
                            first[lane] = T.Select(first[lane] == N and feats[n, c] == voxel_feats[vv, c], n,
                                                   first[lane])
                    for i in range(start[vv], start[vv + 1]):
                        n = T.Bind(order[i])
                        for lane in T.vectorized(lanes):
                            c = T.meta_var(point(C, lanes, vo, lane))
                            grad_feats[n, c] = T.Select(first[lane] == n, grad_voxel_feats[vv, c], T.cast(0, dtype))

        return max_voxels

    @T.prim_func(s_tir=True)
    def max_unbucketed(map_h: T.handle, grad_feats_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, C = T.int32(), T.int32()
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
        for n, c in T.grid(N, C):
            with T.sblock("zero"):
                vn, vc = T.axis.remap("SS", [n, c])
                T.reads(point2voxel_map[vn])
                T.writes(grad_feats[vn, vc])
                v = T.Bind(point2voxel_map[vn])
                # M is grad_feats' business here: voxel_num <= M (the rules), so this is the
                # complement of max_buckets' test
                if not (0 <= v and v < voxel_num):
                    grad_feats[vn, vc] = T.cast(0, dtype)

    kernels = {"max_buckets": max_buckets, "max_voxels": voxels(widths[0], ahead),
               "max_voxels_small": voxels(widths[1], 0),
               "max_unbucketed": max_unbucketed}
    if kind == "llvm":
        # whole rows at a voxel encoder's channels: max_voxels with its vector the row (C
        # fixed; the first-match state stays in registers), one pair of walks per voxel
        # instead of one per channel vector
        for channels in fixed_channels.VOXEL_ENCODER_CHANNELS:
            kernels |= fixed_channels.copies("max_voxels_rows", voxels(channels, 0), {0: (("M", "C"), dtype)},
                                             (channels,))
    return kernels


@T.macro
def _row_into(grad_feats, n, value, C, V):
    """grad_feats[n, c] = value(c) for every channel: V-wide vectors, then the C % V tail."""
    for c0 in range(C // V):
        for c1 in T.vectorized(V):
            grad_feats[n, c0 * V + c1] = value(c0 * V + c1)
    for ct in range(C % V):
        grad_feats[n, C // V * V + ct] = value(C // V * V + ct)


def row_gather_computes(dtype: str, V: int, ahead: int) -> dict:
    """The CPU's sum and mean as row gathers: each point, in order, copies its voxel's
    gradient row (mean: divided by the voxel's count) as V-wide vectors, or zeros when it is
    in no valid voxel, and prefetches the row of the point `ahead` on (voxels at random: no
    hardware prefetcher follows them). Plus copies with C fixed at a dynamic voxel encoder's
    channels (fixed_channels): a row of straight-line vector moves. The same arithmetic as
    sum_scatter / mean_scatter, so the same bits."""
    zero = T.cast(0, dtype)

    def gather(mean: bool):
        @T.prim_func(s_tir=True)
        def rows(grad_voxel_feats_h: T.handle, count_h: T.handle, map_h: T.handle, grad_feats_h: T.handle,
                 voxel_num: T.int32):
            T.func_attr({"tirx.noalias": True})
            M, C, N = T.int32(), T.int32(), T.int32()
            grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
            voxel_points_count = T.match_buffer(count_h, (M,), "int32")
            point2voxel_map = T.match_buffer(map_h, (N,), "int32")
            grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
            for n in range(N):
                with T.sblock("point"):
                    vn = T.axis.remap("S", [n])
                    T.reads(point2voxel_map[0:N], voxel_points_count[0:M], grad_voxel_feats[0:M, 0:C])
                    T.writes(grad_feats[vn, 0:C])
                    if ahead > 0 and M > 0:
                        # a clamped row, no branch on whether that point is kept (as random as
                        # the points); a prefetch reads nothing, the clamp keeps its address in
                        # the buffer
                        later = T.Bind(T.max(0, T.min(point2voxel_map[T.min(vn + ahead, N - 1)], M - 1)))
                        prefetch_words(lambda w: grad_voxel_feats[later, w], C, 0)
                    v = T.Bind(point2voxel_map[vn])
                    if 0 <= v and v < T.min(voxel_num, M):
                        if mean:
                            count = T.Bind(T.cast(voxel_points_count[v], dtype))
                            _row_into(grad_feats, vn, lambda c: grad_voxel_feats[v, c] / count, C, V)
                        else:
                            _row_into(grad_feats, vn, lambda c: grad_voxel_feats[v, c], C, V)
                    else:
                        _row_into(grad_feats, vn, lambda c: zero, C, V)
        return rows

    kernels = {"sum_rows": gather(False), "mean_rows": gather(True)}
    for name, func in list(kernels.items()):
        kernels |= fixed_channels.copies(name, func, {0: (("M", "C"), dtype)}, fixed_channels.VOXEL_ENCODER_CHANNELS)
    return kernels
