"""TensorIR of voxel_pooling_forward's kernels (the operator's docstring lists them).

The CPU kernels are computes scheduled by schedule.py; CUDA has computes of its own
(`_pool_atomic`) because TVM 0.27 has no schedule primitive that turns a store into an
atomic add.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

CUDA_VEC = 32  # CUDA main/tail channel split: a warp of channels


def _pos_memo():
    @T.prim_func(s_tir=True)
    def pos_memo(geom_h: T.handle, memo_h: T.handle, X: T.int32, Y: T.int32, Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N = T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        memo = T.match_buffer(memo_h, (B, N, 3), "int32")
        for b, n, k in T.grid(B, N, 3):
            with T.sblock("pos_memo"):
                vb, vn, vk = T.axis.remap("SSS", [b, n, k])
                T.reads(geom[vb, vn, 0:3])
                T.writes(memo[vb, vn, vk])
                x: T.let[T.int32] = geom[vb, vn, 0]
                y: T.let[T.int32] = geom[vb, vn, 1]
                z: T.let[T.int32] = geom[vb, vn, 2]
                memo[vb, vn, vk] = T.if_then_else(
                    x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z,
                    T.if_then_else(vk == 0, vb, T.if_then_else(vk == 1, y, x)), -1)
    return pos_memo


def _pool(dtype: str, V: int):
    """Owner-computes scatter of channels [0, C // V * V): n is the reduction axis; the
    block declares its whole (b, :, :, c) output column and its init zero-fills it."""
    zero = tvm.tirx.const(0, dtype)

    @T.prim_func(s_tir=True)
    def pool(geom_h: T.handle, feat_h: T.handle, out_h: T.handle, Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N, C, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        feat = T.match_buffer(feat_h, (B, N, C), dtype)
        out = T.match_buffer(out_h, (B, Y, X, C), dtype)
        for b, c0, n, c1 in T.grid(B, C // V, N, V):
            with T.sblock("pool"):
                vb, vc0, vn, vc1 = T.axis.remap("SSRS", [b, c0, n, c1])
                T.reads(geom[vb, vn, 0:3], feat[vb, vn, vc0 * V + vc1], out[vb, 0:Y, 0:X, vc0 * V + vc1])
                T.writes(out[vb, 0:Y, 0:X, vc0 * V + vc1])
                with T.init():
                    for yy, xx in T.grid(Y, X):
                        out[vb, yy, xx, vc0 * V + vc1] = zero
                x: T.let[T.int32] = geom[vb, vn, 0]
                y: T.let[T.int32] = geom[vb, vn, 1]
                z: T.let[T.int32] = geom[vb, vn, 2]
                if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                    out[vb, y, x, vc0 * V + vc1] = out[vb, y, x, vc0 * V + vc1] + feat[vb, vn, vc0 * V + vc1]
    return pool


def _pool_tail(dtype: str, V: int):
    zero = tvm.tirx.const(0, dtype)

    @T.prim_func(s_tir=True)
    def pool_tail(geom_h: T.handle, feat_h: T.handle, out_h: T.handle, Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N, C, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        feat = T.match_buffer(feat_h, (B, N, C), dtype)
        out = T.match_buffer(out_h, (B, Y, X, C), dtype)
        for b, n, ct in T.grid(B, N, C % V):
            with T.sblock("pool_tail"):
                vb, vn, vct = T.axis.remap("SRS", [b, n, ct])
                T.reads(geom[vb, vn, 0:3], feat[vb, vn, C // V * V + vct], out[vb, 0:Y, 0:X, C // V * V + vct])
                T.writes(out[vb, 0:Y, 0:X, C // V * V + vct])
                with T.init():
                    for yy, xx in T.grid(Y, X):
                        out[vb, yy, xx, C // V * V + vct] = zero
                x: T.let[T.int32] = geom[vb, vn, 0]
                y: T.let[T.int32] = geom[vb, vn, 1]
                z: T.let[T.int32] = geom[vb, vn, 2]
                if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                    out[vb, y, x, C // V * V + vct] = (out[vb, y, x, C // V * V + vct]
                                                       + feat[vb, vn, C // V * V + vct])
    return pool_tail


def _pool_split(dtype: str, V: int):
    """Owner = (batch b, point range s), S = part.shape[1] ranges chosen by launch: range s is
    points [s * ceil(N / S), min((s + 1) * ceil(N / S), N)). It zero-fills its own slice
    part[b, s] and adds its kept points' rows into it in point order: channels
    [0, C // V * V) in V-wide vectors, then the C % V tail. `combine` sums the slices."""
    zero = tvm.tirx.const(0, dtype)

    @T.prim_func(s_tir=True)
    def pool_split(geom_h: T.handle, feat_h: T.handle, part_h: T.handle, Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N, C, S, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        feat = T.match_buffer(feat_h, (B, N, C), dtype)
        part = T.match_buffer(part_h, (B, S, Y, X, C), dtype)
        for b, s in T.grid(B, S):
            with T.sblock("pool_split"):
                vb, vs = T.axis.remap("SS", [b, s])
                T.reads(geom[vb, 0:N, 0:3], feat[vb, 0:N, 0:C])
                T.writes(part[vb, vs, 0:Y, 0:X, 0:C])
                for yy, xx, c in T.grid(Y, X, C):
                    part[vb, vs, yy, xx, c] = zero
                # the last ranges may be short or empty
                for j in range(T.max(0, T.min((N + S - 1) // S, N - vs * ((N + S - 1) // S)))):
                    n: T.let[T.int32] = vs * ((N + S - 1) // S) + j
                    x: T.let[T.int32] = geom[vb, n, 0]
                    y: T.let[T.int32] = geom[vb, n, 1]
                    z: T.let[T.int32] = geom[vb, n, 2]
                    if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                        for c0, c1 in T.grid(C // V, V):
                            with T.sblock("pool_split_add"):
                                vc0, vc1 = T.axis.remap("SS", [c0, c1])
                                T.reads(part[vb, vs, y, x, vc0 * V + vc1], feat[vb, n, vc0 * V + vc1])
                                T.writes(part[vb, vs, y, x, vc0 * V + vc1])
                                part[vb, vs, y, x, vc0 * V + vc1] = (part[vb, vs, y, x, vc0 * V + vc1]
                                                                     + feat[vb, n, vc0 * V + vc1])
                        for ct in range(C % V):
                            part[vb, vs, y, x, C // V * V + ct] = (part[vb, vs, y, x, C // V * V + ct]
                                                                   + feat[vb, n, C // V * V + ct])
    return pool_split


def _combine(dtype: str, V: int):
    """output_features[b, y, x, :] = ((part[b, 0] + part[b, 1]) + ...) + part[b, S - 1] at
    (y, x): a fixed order, so the bits depend on S only. Owner = a voxel (b, y, x); channels
    [0, C // V * V) in V-wide vectors, then the C % V tail."""

    @T.prim_func(s_tir=True)
    def combine(part_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, S, C, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        part = T.match_buffer(part_h, (B, S, Y, X, C), dtype)
        out = T.match_buffer(out_h, (B, Y, X, C), dtype)
        for b, y, x in T.grid(B, Y, X):
            with T.sblock("combine"):
                vb, vy, vx = T.axis.remap("SSS", [b, y, x])
                T.reads(part[vb, 0:S, vy, vx, 0:C])
                T.writes(out[vb, vy, vx, 0:C])
                # one block writes `out` (a second writer would break the vectorize check):
                # slice 0 is copied, slices 1..S-1 added
                for s, c0, c1 in T.grid(S, C // V, V):
                    with T.sblock("combine_add"):
                        vs, vc0, vc1 = T.axis.remap("SSS", [s, c0, c1])
                        T.reads(out[vb, vy, vx, vc0 * V + vc1], part[vb, vs, vy, vx, vc0 * V + vc1])
                        T.writes(out[vb, vy, vx, vc0 * V + vc1])
                        out[vb, vy, vx, vc0 * V + vc1] = T.if_then_else(
                            vs == 0, part[vb, 0, vy, vx, vc0 * V + vc1],
                            out[vb, vy, vx, vc0 * V + vc1] + part[vb, vs, vy, vx, vc0 * V + vc1])
                for ct in range(C % V):
                    out[vb, vy, vx, C // V * V + ct] = part[vb, 0, vy, vx, C // V * V + ct]
                    for s in range(1, S):
                        out[vb, vy, vx, C // V * V + ct] = (out[vb, vy, vx, C // V * V + ct]
                                                            + part[vb, s, vy, vx, C // V * V + ct])
    return combine


def _sort_points():
    """Stable counting sort of each batch's kept points by voxel v = y * X + x.

    One owner per batch (start[b, :] and order[b, :] are its own rows). Histogram:
    start[b, v + 1] = points in voxel v; exclusive prefix sum: start[b, v + 1] = first
    slot of voxel v; placement in point order: order[b, start[b, v + 1]++] = n. After
    placement start[b, v + 1] is the end of voxel v, i.e. voxel v's points are
    order[b, start[b, v]:start[b, v + 1]], in increasing n (stable)."""

    @T.prim_func(s_tir=True)
    def sort_points(geom_h: T.handle, start_h: T.handle, order_h: T.handle, X: T.int32, Y: T.int32,
                    Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N, V1 = T.int32(), T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        start = T.match_buffer(start_h, (B, V1), "int32")  # V1 = Y * X + 1
        order = T.match_buffer(order_h, (B, N), "int32")
        for b in range(B):
            with T.sblock("sort_points"):
                vb = T.axis.spatial(B, b)
                T.reads(geom[vb, 0:N, 0:3])  # start[vb] is zeroed here before it is read
                T.writes(start[vb, 0:V1], order[vb, 0:N])
                running = T.sblock_alloc_buffer((1,), "int32", scope="local")
                for v in range(V1):
                    start[vb, v] = 0
                for n in range(N):
                    x: T.let[T.int32] = geom[vb, n, 0]
                    y: T.let[T.int32] = geom[vb, n, 1]
                    z: T.let[T.int32] = geom[vb, n, 2]
                    if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                        start[vb, y * X + x + 1] = start[vb, y * X + x + 1] + 1
                running[0] = 0
                for v in range(V1 - 1):
                    count: T.let[T.int32] = start[vb, v + 1]
                    start[vb, v + 1] = running[0]
                    running[0] = running[0] + count
                for n in range(N):
                    x: T.let[T.int32] = geom[vb, n, 0]
                    y: T.let[T.int32] = geom[vb, n, 1]
                    z: T.let[T.int32] = geom[vb, n, 2]
                    if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                        slot: T.let[T.int32] = start[vb, y * X + x + 1]
                        order[vb, slot] = n
                        start[vb, y * X + x + 1] = slot + 1
    return sort_points


def _segment_sum(dtype: str, V: int):
    """Each voxel (b, y, x) owns its output row: zero it, then add the feature rows of its
    points order[b, start[v]:start[v + 1]] in that (point) order, channels [0, C // V * V)
    in V-wide vectors and the C % V tail after them. The sums are the owner kernel's bits:
    the same additions from zero in the same point order."""
    zero = tvm.tirx.const(0, dtype)

    @T.prim_func(s_tir=True)
    def segment_sum(feat_h: T.handle, start_h: T.handle, order_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, N, C, Y, X, V1 = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        feat = T.match_buffer(feat_h, (B, N, C), dtype)
        start = T.match_buffer(start_h, (B, V1), "int32")
        order = T.match_buffer(order_h, (B, N), "int32")
        out = T.match_buffer(out_h, (B, Y, X, C), dtype)
        for b, y, x in T.grid(B, Y, X):
            with T.sblock("segment"):
                vb, vy, vx = T.axis.remap("SSS", [b, y, x])
                T.reads(start[vb, vy * X + vx:vy * X + vx + 2], order[vb, 0:N], feat[vb, 0:N, 0:C])
                T.writes(out[vb, vy, vx, 0:C])
                for c in range(C):
                    out[vb, vy, vx, c] = zero
                for k in range(start[vb, vy * X + vx], start[vb, vy * X + vx + 1]):
                    n: T.let[T.int32] = order[vb, k]
                    for c0, c1 in T.grid(C // V, V):
                        with T.sblock("segment_add"):
                            vc0, vc1 = T.axis.remap("SS", [c0, c1])
                            T.reads(out[vb, vy, vx, vc0 * V + vc1], feat[vb, n, vc0 * V + vc1])
                            T.writes(out[vb, vy, vx, vc0 * V + vc1])
                            out[vb, vy, vx, vc0 * V + vc1] = (out[vb, vy, vx, vc0 * V + vc1]
                                                              + feat[vb, n, vc0 * V + vc1])
                    for ct in range(C % V):
                        out[vb, vy, vx, C // V * V + ct] = (out[vb, vy, vx, C // V * V + ct]
                                                            + feat[vb, n, C // V * V + ct])
    return segment_sum


def _pool_atomic(dtype: str, V: int, tail: bool):
    """CUDA: every (b, n, c) adds its feature into the (zeroed) output with atomicAdd;
    channels [0, C // V * V) for `pool`, the C % V tail for `pool_tail`."""
    if not tail:
        @T.prim_func(s_tir=True)
        def pool(geom_h: T.handle, feat_h: T.handle, out_h: T.handle, Z: T.int32):
            T.func_attr({"tirx.noalias": True})
            B, N, C, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
            geom = T.match_buffer(geom_h, (B, N, 3), "int32")
            feat = T.match_buffer(feat_h, (B, N, C), dtype)
            out = T.match_buffer(out_h, (B, Y, X, C), dtype)
            for b, n, c in T.grid(B, N, C // V * V):
                with T.sblock("pool"):
                    vb, vn, vc = T.axis.remap("SSS", [b, n, c])
                    T.reads(geom[vb, vn, 0:3], feat[vb, vn, vc])
                    T.writes(out[vb, 0:Y, 0:X, vc])
                    x: T.let[T.int32] = geom[vb, vn, 0]
                    y: T.let[T.int32] = geom[vb, vn, 1]
                    z: T.let[T.int32] = geom[vb, vn, 2]
                    if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                        T.evaluate(T.cuda.atomic_add(T.address_of(out[vb, y, x, vc]), feat[vb, vn, vc]))
        return pool

    @T.prim_func(s_tir=True)
    def pool_tail(geom_h: T.handle, feat_h: T.handle, out_h: T.handle, Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N, C, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        feat = T.match_buffer(feat_h, (B, N, C), dtype)
        out = T.match_buffer(out_h, (B, Y, X, C), dtype)
        for b, n, c in T.grid(B, N, C % V):
            with T.sblock("pool_tail"):
                vb, vn, vc = T.axis.remap("SSS", [b, n, c])
                T.reads(geom[vb, vn, 0:3], feat[vb, vn, C // V * V + vc])
                T.writes(out[vb, 0:Y, 0:X, C // V * V + vc])
                x: T.let[T.int32] = geom[vb, vn, 0]
                y: T.let[T.int32] = geom[vb, vn, 1]
                z: T.let[T.int32] = geom[vb, vn, 2]
                if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                    T.evaluate(T.cuda.atomic_add(T.address_of(out[vb, y, x, C // V * V + vc]),
                                                 feat[vb, vn, C // V * V + vc]))
    return pool_tail


def computes(dtype: str, V: int, kind: str) -> dict:
    """{kernel name: PrimFunc} for one dtype, channel vector V and target kind."""
    # every library holds every kernel name; the CUDA launch never calls the CPU-only
    # sets (split ranges, sort): it takes the atomic path
    shared = {"pool_split": _pool_split(dtype, V), "combine": _combine(dtype, V), "sort_points": _sort_points(),
              "segment_sum": _segment_sum(dtype, V)}
    if kind == "cuda":
        return {"pos_memo": _pos_memo(), "pool": _pool_atomic(dtype, V, False),
                "pool_tail": _pool_atomic(dtype, V, True), **shared}
    return {"pos_memo": _pos_memo(), "pool": _pool(dtype, V), "pool_tail": _pool_tail(dtype, V), **shared}
