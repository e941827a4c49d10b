"""voxel_pooling_forward (BEVDepth).

A point n of batch b with geom_xyz[b, n] = (x, y, z) is kept iff
0 <= x < X, 0 <= y < Y and 0 <= z < Z (x = 0 is a valid voxel).
    output_features[b, y, x, :] = sum of input_features[b, n, :] over kept points
    pos_memo[b, n] = (b, y, x) if kept else (-1, -1, -1)
Contract: specs/voxel_pooling_forward.yaml.

Kernels, launched in this order: `pos_memo` (spatial over (b, n, k)), then on the
default path `pool` (channels [0, C // V * V)) and `pool_tail` (channels
[C // V * V, C), launched only when C % V != 0); when the CPU knob `point_splits` gives
S > 1 point ranges per batch (see point_splits()), `pool_split` (owner = batch x range, into
a private slice of the workspace range_sums [B, S, Y, X, C]) and `combine` (slices summed in
the order s = 0..S-1) instead: deterministic for a given S, other bits than S = 1; with
`algorithm: sort` `sort_points` and `segment_sum` instead (the BEVPool route; same bits as
S = 1, measured slower: schedules/voxel_pooling_forward.yaml). Coordinates of any int32
value are tested before the store, so nothing outside output_features is ever written.

- llvm (owner computes, no atomics): the scatter is written as a reduction
  over n. Each task owns an output slice (a batch, or a batch x channel-vector
  group), zero-fills it in the block's init and walks all N points of its batch
  in order, so every output element is summed in the order n = 0..N-1 whatever
  the thread count: the bits are the same on every run and thread count.
  The V split is in the compute (TVM 0.27 scalarises a predicated split of a
  symbolic loop), and the tail is its own PrimFunc because decompose_reduction
  needs the only writer of `out` in a function. With S > 1 point ranges (B < cores)
  the owner is (batch, range) and its slice is private (range_sums), summed by
  `combine` in a fixed order: the bits depend on S, never on the thread count.
- cuda (mlu-ops / BEVDepth): one thread per (point, channel) doing atomicAdd;
  the output is zero-filled on the device before the launch. TVM 0.27 has no
  schedule primitive that turns a store into an atomic, so this target has its
  own compute (the atomic is in it).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm.script import tirx as T

from .base import Operator, peer_tensor

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


def _kept(geom: np.ndarray, X: int, Y: int, Z: int) -> np.ndarray:
    x, y, z = geom[..., 0], geom[..., 1], geom[..., 2]
    return (x >= 0) & (x < X) & (y >= 0) & (y < Y) & (z >= 0) & (z < Z)


def point_splits(sizes: dict, plan: dict) -> int:
    """S, the point ranges per batch of the CPU owner path (1: one owner per batch).

    "auto" = ceil(cores / B) from the target model's core count, never the runtime thread
    count: S fixes the summation order, so one S gives the same bits on every thread count.
    Capped at N (a range holds at least one point) and so that the workspace stays below
    2^31 elements, like every tensor the int32-indexed kernels touch."""
    splits = plan.get("point_splits", 1)
    if splits == "auto":
        splits = -(-plan["cores"] // sizes["B"])
    grid = sizes["B"] * sizes["Y"] * sizes["X"] * sizes["C"]
    return max(1, min(int(splits), sizes["N"], (2**31 - 1) // grid))


class VoxelPoolingForward(Operator):
    name = "voxel_pooling_forward"
    kernel_names = ("pos_memo", "pool", "pool_tail", "pool_split", "combine", "sort_points",
                    "segment_sum")

    def plan(self, model, knobs):
        if model.kind == "cuda":
            return {"vec": CUDA_VEC, "threads": int(knobs["threads"]), "memo_threads": int(knobs["memo_threads"])}
        # V = one SIMD register of float32 (16 on AVX-512, 8 on AVX2)
        splits = knobs["point_splits"]
        if splits != "auto" and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
            raise ValueError(f"point_splits must be 'auto' or a positive integer, got {splits!r}")
        return {"vec": max(model.vector_bytes // 4, 4), "algorithm": knobs["algorithm"],
                "point_splits": splits, "cores": model.cores,
                "c_vecs_per_task": int(knobs["c_vecs_per_task"]),
                "memo_chunk": int(knobs["memo_chunk"]), "unroll_points": int(knobs["unroll_points"])}

    def computes(self, dtype, plan, model):
        V = plan["vec"]
        # every library holds every kernel name; the CUDA launch never calls the CPU-only
        # sets (split ranges, sort): it takes the atomic path
        shared = {"pool_split": _pool_split(dtype, V), "combine": _combine(dtype, V), "sort_points": _sort_points(),
                  "segment_sum": _segment_sum(dtype, V)}
        if model.kind == "cuda":
            return {"pos_memo": _pos_memo(), "pool": _pool_atomic(dtype, V, False),
                    "pool_tail": _pool_atomic(dtype, V, True), **shared}
        return {"pos_memo": _pos_memo(), "pool": _pool(dtype, V), "pool_tail": _pool_tail(dtype, V), **shared}

    def workspaces(self, problem, plan):
        s = problem.sizes
        if plan.get("algorithm") != "sort":
            splits = point_splits(s, plan)
            if splits == 1:
                return {}  # pool writes output_features directly
            # a private float32 slice of the output grid per point range
            return {"range_sums": ((s["B"], splits, s["Y"], s["X"], s["C"]), problem.dtype)}
        # voxel boundaries [B, Y*X + 1] and the point indices sorted by voxel [B, N]
        return {"voxel_start": ((s["B"], s["Y"] * s["X"] + 1), "int32"), "sorted_points": ((s["B"], s["N"]), "int32")}

    def zeroed(self, problem, plan):
        # CUDA atomics accumulate into the output; the llvm kernels zero their own slices
        return ("output_features",) if problem.device == "cuda" else ()

    def launch(self, kernels, problem, tensors):
        s, p, plan = problem.sizes, problem.params, kernels.plan
        geom, feat = tensors["geom_xyz"], tensors["input_features"]
        out, memo = tensors["output_features"], tensors["pos_memo"]
        kernels["pos_memo"](geom, memo, s["X"], s["Y"], p["num_voxel_z"])
        if plan.get("algorithm") == "sort":
            start, order = tensors["voxel_start"], tensors["sorted_points"]
            kernels["sort_points"](geom, start, order, s["X"], s["Y"], p["num_voxel_z"])
            kernels["segment_sum"](feat, start, order, out)
            return
        if point_splits(s, plan) > 1:
            part = tensors["range_sums"]
            kernels["pool_split"](geom, feat, part, p["num_voxel_z"])
            kernels["combine"](part, out)
            return
        kernels["pool"](geom, feat, out, p["num_voxel_z"])
        if s["C"] % plan["vec"]:
            kernels["pool_tail"](geom, feat, out, p["num_voxel_z"])

    # --- testing and benchmarking ---------------------------------------------
    def make_inputs(self, case, dtype, rng):
        """Coordinates spill `spill` voxels beyond each x/y edge; a `z_out` fraction of the
        points get z = Z or z = -1 (out of range)."""
        s = case.shape
        B, N, C, X, Y, Z = (s[k] for k in ("B", "N", "C", "X", "Y", "Z"))
        spill = case.extra.get("spill", 0)
        geom = np.empty((B, N, 3), np.int32)
        geom[..., 0] = rng.integers(-spill, X + spill, (B, N))
        geom[..., 1] = rng.integers(-spill, Y + spill, (B, N))
        geom[..., 2] = rng.integers(0, max(Z, 1), (B, N))
        z_out = rng.random((B, N)) < case.extra.get("z_out", 0.0)
        geom[..., 2][z_out] = np.where(rng.random(int(z_out.sum())) < 0.5, Z, -1)
        feat = rng.uniform(-1, 1, (B, N, C)).astype(dtype)
        return ({"geom_xyz": geom, "input_features": feat},
                {"num_voxel_x": X, "num_voxel_y": Y, "num_voxel_z": Z})

    def reference(self, inputs, params):
        """float64, from the SPEC_NOTES math: kept mask, then a grouped sum per voxel."""
        geom = np.asarray(inputs["geom_xyz"]).astype(np.int64)
        feat = np.asarray(inputs["input_features"])
        X, Y, Z = params["num_voxel_x"], params["num_voxel_y"], params["num_voxel_z"]
        B, N, C = feat.shape
        kept = _kept(geom, X, Y, Z)
        b = np.broadcast_to(np.arange(B)[:, None], (B, N))
        memo = np.full((B, N, 3), -1, np.int64)
        memo[kept] = np.stack([b[kept], geom[..., 1][kept], geom[..., 0][kept]], -1)
        voxel = ((b * Y + geom[..., 1]) * X + geom[..., 0])[kept]
        rows = feat[kept].astype(np.float64)
        out = np.zeros((B * Y * X, C))
        if voxel.size:
            order = np.argsort(voxel, kind="stable")
            voxel, rows = voxel[order], rows[order]
            starts = np.flatnonzero(np.r_[True, voxel[1:] != voxel[:-1]])
            out[voxel[starts]] = np.add.reduceat(rows, starts, axis=0)
        return {"output_features": out.reshape(B, Y, X, C), "pos_memo": memo}

    def torch_peer(self, inputs, params):
        """PyTorch eager from the same inputs: mask, voxel index, index_put_(accumulate=True), pos_memo."""
        import torch

        g = peer_tensor(inputs["geom_xyz"])
        f = peer_tensor(inputs["input_features"])
        X, Y, Z = params["num_voxel_x"], params["num_voxel_y"], params["num_voxel_z"]
        B, N, C = f.shape

        def run():
            x, y, z = g[..., 0], g[..., 1], g[..., 2]
            kept = (x >= 0) & (x < X) & (y >= 0) & (y < Y) & (z >= 0) & (z < Z)
            b = torch.arange(B, dtype=torch.int32).view(B, 1).expand(B, N)
            voxel = (b.long() * Y + y.long()) * X + x.long()
            out = torch.zeros(B * Y * X, C, dtype=f.dtype)
            out.index_put_((voxel[kept],), f[kept], accumulate=True)
            memo = torch.where(kept.unsqueeze(-1), torch.stack([b, y, x], -1), torch.full((), -1, dtype=torch.int32))
            return out.view(B, Y, X, C), memo

        return run


OP = VoxelPoolingForward()


def voxel_pooling_forward(geom_xyz, input_features, num_voxel_x, num_voxel_y, num_voxel_z, *,
                          target="llvm", out=None):
    """BEV voxel pooling: (output_features [B, Y, X, C], pos_memo [B, N, 3]).

    geom_xyz [B, N, 3] int32 holds (x, y, z) voxel coordinates; input_features [B, N, C]
    float32. A point is kept iff 0 <= x < num_voxel_x, 0 <= y < num_voxel_y and
    0 <= z < num_voxel_z; its features are summed into output_features[b, y, x] and
    pos_memo[b, n] = (b, y, x), else (-1, -1, -1). numpy in -> numpy out; torch in ->
    torch out. `out=` is a pair (output_features, pos_memo) of caller buffers; either may be
    None.
    """
    if out is None:
        out = (None, None)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        from ..errors import BadParamError

        raise BadParamError("voxel_pooling_forward: out must be a pair (output_features, pos_memo), "
                            f"either may be None; got {type(out).__name__}")
    return OP.call({"geom_xyz": geom_xyz, "input_features": input_features},
                   {"num_voxel_x": num_voxel_x, "num_voxel_y": num_voxel_y, "num_voxel_z": num_voxel_z},
                   target, {"output_features": out[0], "pos_memo": out[1]})
