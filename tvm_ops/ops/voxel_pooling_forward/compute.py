"""TensorIR of voxel_pooling_forward's kernels (the operator's docstring lists them).

The CPU kernels are computes scheduled by schedule.py; CUDA has a pool compute of its own
(`_pool_warp`, an atomicAdd per lane) because TVM 0.27 has no schedule primitive that turns
a store into an atomic add.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.script import tirx as T

from .. import cpu_ir, fixed_channels


def _pos_memo_cuda():
    """CUDA's pos_memo: an element (batch, point, coordinate) per thread (schedule.cuda)."""

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


def _pos_memo_tasks(K: int, V: int):
    """The CPU's pos_memo: task (b, t) = points [t * K, (t + 1) * K) of batch b, the same values
    as `_pos_memo_cuda`. The batch and the task's first point are found once per task: with the
    schedule fusing the batch and point loops over the thread pool, the batch was an integer
    division in every point (~12 cycles a point). V points at a time: their 3V coordinate
    words as three V-lane loads, dealt into x, y and z by lane shuffles (tirx.Shuffle: two-
    source permutes) and the rows put back the same way (5x the scalar walk, which LLVM did
    not vectorise over the stride-3 rows); the task's last points one at a time."""
    deal = [[tirx.IntImm("int32", 3 * i + k) for i in range(V)] for k in range(3)]  # x, y, z of the words
    # word j of the rows' part p: point (p V + j) // 3, coordinate (p V + j) % 3 of the three
    # V-lane rows (batch or -1, y, x) side by side
    put = [[tirx.IntImm("int32", (p * V + j) % 3 * V + (p * V + j) // 3) for j in range(V)] for p in range(3)]
    lanes_u32 = f"uint32x{V}"

    @T.macro
    def memo_row(memo, vb, vn, x, y, z, X, Y, Z):
        # one unsigned comparison per coordinate (a negative one wraps past its size)
        kept: T.let = T.Cast("uint32", x) < T.Cast("uint32", X) and \
            T.Cast("uint32", y) < T.Cast("uint32", Y) and T.Cast("uint32", z) < T.Cast("uint32", Z)
        memo[vb, vn, 0] = T.Select(kept, vb, -1)
        memo[vb, vn, 1] = T.Select(kept, y, -1)
        memo[vb, vn, 2] = T.Select(kept, x, -1)

    @T.prim_func(s_tir=True)
    def pos_memo(geom_h: T.handle, memo_h: T.handle, X: T.int32, Y: T.int32, Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N = T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        memo = T.match_buffer(memo_h, (B, N, 3), "int32")
        for b, t in T.grid(B, (N + K - 1) // K):
            with T.sblock("task"):
                vb, vt = T.axis.remap("SS", [b, t])
                T.reads(geom[vb, 0:N, 0:3])
                T.writes(memo[vb, 0:N, 0:3])
                # the rows as flat words ((B * N * 3 < 2^31: the checks refuse larger tensors)
                words = T.decl_buffer((B * N * 3,), "int32", data=geom.data)
                rows = T.decl_buffer((B * N * 3,), "int32", data=memo.data)
                count = T.Bind(T.min(K, N - vt * K))
                for block in range(count // V):
                    at = T.Bind((vb * N + vt * K + block * V) * 3)
                    parts = T.meta_var([words[T.Ramp(at + p * V, 1, V)] for p in range(3)])
                    x = T.meta_var(tirx.Shuffle(parts, deal[0]))
                    y = T.meta_var(tirx.Shuffle(parts, deal[1]))
                    kept = T.meta_var(tirx.And(tirx.And(
                        T.Cast(lanes_u32, x) < T.Broadcast(T.Cast("uint32", X), V),
                        T.Cast(lanes_u32, y) < T.Broadcast(T.Cast("uint32", Y), V)),
                        T.Cast(lanes_u32, tirx.Shuffle(parts, deal[2])) < T.Broadcast(T.Cast("uint32", Z), V)))
                    none = T.meta_var(T.Broadcast(-1, V))
                    out = T.meta_var([T.Select(kept, T.Broadcast(vb, V), none), T.Select(kept, y, none),
                                      T.Select(kept, x, none)])
                    rows[T.Ramp(at, 1, V)] = tirx.Shuffle(out, put[0])
                    rows[T.Ramp(at + V, 1, V)] = tirx.Shuffle(out, put[1])
                    rows[T.Ramp(at + 2 * V, 1, V)] = tirx.Shuffle(out, put[2])
                for j in range(count // V * V, count):
                    vn = T.Bind(vt * K + j)
                    memo_row(memo, vb, vn, geom[vb, vn, 0], geom[vb, vn, 1], geom[vb, vn, 2], X, Y, Z)
    return pos_memo


def _zero_unless(dtype: str):
    """zero_unless(cond, value): value where cond holds, else +0, as a bitwise and of value's
    bits with a mask of cond. The same bits as T.Select(cond, value, 0), but of a loaded
    vector LLVM makes a select a masked load, and on a znver5 host the pool walk with masked
    loads took 2.2x as long (docs/kernels/voxel_pooling_forward.md); the and stays a plain
    load and a vpandd."""
    bits = {"float32": "int32", "float16": "int16"}[dtype]

    def zero_unless(cond, value):
        if cond is True:
            return value
        mask = T.Select(cond, tvm.tirx.const(-1, bits), tvm.tirx.const(0, bits))
        return T.reinterpret(dtype, T.bitwise_and(T.reinterpret(bits, value), mask))
    return zero_unless


def _pool_bands(dtype: str, V: int, first_touch: bool, listed: int = 0, stream: bool = False,
                stream_min_words: int = 0):
    """The CPU's owner computes: owner = (batch b, band r of `bands` bands of output rows y),
    bands = R chosen by launch; band r is rows [r * ceil(Y / R), min((r + 1) * ceil(Y / R), Y)).
    It walks every point of its batch in order and adds the kept points whose y falls in its
    band: channels [0, C // V * V) in V-wide vectors, then the C % V tail. Every voxel is
    summed from zero in point order whatever R is, so R (and the thread count) never changes
    the bits. (Writing pos_memo in the same walk, each owner its 1/R of the points, was slower
    than its own kernel: docs/kernels/voxel_pooling_forward.md.)

    first_touch False (`pool`, for many points per voxel): the band's rows are zero-filled
    first; then, `listed` points at a time, the band lists its kept points (every point's
    index stored, the kept ones counted: no branch on whether a point is kept, which is as
    random as its coordinates) and adds the listed rows. Only the band's own rows are added,
    and the feature rows are read in increasing order, the hardware prefetching them.

    first_touch True (`pool_first_touch`, for few points per voxel, a cache-resident walk
    where a branch per point costs less than listing): the kept points only; a byte per row
    of the band marks the rows written so far; a row's first point stores feat + 0 (the bits
    of 0 + feat, -0 included), later points add, and the rows no point reached are
    zero-filled at the end: no zero-fill of the rows that receive points, and no read of them
    before their first point. With `stream`, in calls whose features and output reach
    stream_min_words (about half the last-level cache) and whose rows are whole cache lines
    on a line, those zeros are stored past the caches (no read for ownership of lines that
    will not be read here; a fence ends the task); in smaller calls a repeated call finds its
    output in the cache, and streaming it out measured slower."""
    zero = tvm.tirx.const(0, dtype)
    zero_unless = _zero_unless(dtype)
    stream_fn = f"tvm_ops_stream_x{V}_{dtype}"

    def rows_lined(out, B, N, Y, X, C):
        """Whether the untouched rows' zeros are streamed: asked for, vectors of whole lines,
        a call whose features and output (in words) reach stream_min_words, rows of whole
        vectors, and the output on a line (its rows all are then)."""
        if not (stream and cpu_ir.whole_lines(V, dtype)):
            return tvm.tirx.const(False)
        words = T.Cast("int64", B) * (T.Cast("int64", N) + T.Cast("int64", Y) * X) * C
        return tvm.tirx.all(words >= stream_min_words, C % V == 0, cpu_ir.on_a_line(out[0, 0, 0, 0]))

    @T.macro
    def add_row(out, feat, vb, y, x, n, C, seen):
        # out[y, x] += feat[n], or out[y, x] = feat[n] + 0 at the row's first point (not seen)
        for c0, c1 in T.grid(C // V, V):
            with T.sblock("band_add"):
                vc0, vc1 = T.axis.remap("SS", [c0, c1])
                T.reads(out[vb, y, x, vc0 * V + vc1], feat[vb, n, vc0 * V + vc1])
                T.writes(out[vb, y, x, vc0 * V + vc1])
                out[vb, y, x, vc0 * V + vc1] = zero_unless(seen, out[vb, y, x, vc0 * V + vc1]) + \
                    feat[vb, n, vc0 * V + vc1]
        for ct in range(C % V):
            out[vb, y, x, C // V * V + ct] = zero_unless(seen, out[vb, y, x, C // V * V + ct]) + \
                feat[vb, n, C // V * V + ct]

    @T.prim_func(s_tir=True)
    def pool(geom_h: T.handle, feat_h: T.handle, out_h: T.handle, Z: T.int32, bands: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N, C, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        feat = T.match_buffer(feat_h, (B, N, C), dtype)
        out = T.match_buffer(out_h, (B, Y, X, C), dtype)
        for b, r in T.grid(B, bands):
            with T.sblock("band"):
                vb, vr = T.axis.remap("SS", [b, r])
                T.reads(geom[vb, 0:N, 0:3], feat[vb, 0:N, 0:C])
                T.writes(out[vb, 0:Y, 0:X, 0:C])
                first: T.let[T.int32] = vr * ((Y + bands - 1) // bands)
                end: T.let[T.int32] = T.min(Y, first + (Y + bands - 1) // bands)  # the last bands may be empty
                if first_touch:
                    # touched[(y - first) * X + x] != 0 once row (y, x) has had its first add
                    touched = T.sblock_alloc_buffer(((Y + bands - 1) // bands * X,), "int8")
                    for i in range((Y + bands - 1) // bands * X):
                        touched[i] = T.int8(0)
                    if first < end:
                        for point in range(N):
                            n: T.let[T.int32] = point  # lets: the add block may read them
                            x: T.let[T.int32] = geom[vb, n, 0]
                            y: T.let[T.int32] = geom[vb, n, 1]
                            z: T.let[T.int32] = geom[vb, n, 2]
                            if x >= 0 and x < X and y >= first and y < end and z >= 0 and z < Z:
                                seen: T.let = touched[(y - first) * X + x] != T.int8(0)
                                touched[(y - first) * X + x] = T.int8(1)
                                add_row(out, feat, vb, y, x, n, C, seen)
                    lined: T.let[T.bool] = rows_lined(out, B, N, Y, X, C)
                    for yy, xx in T.grid(T.max(0, end - first), X):
                        row: T.let[T.int32] = yy * X + xx  # a let: the fill may read it
                        if touched[row] == T.int8(0):
                            if lined:
                                for c0 in range(C // V):
                                    T.evaluate(T.call_extern("void", stream_fn,
                                                             T.address_of(out[vb, first + row // X, row % X, c0 * V]),
                                                             T.Broadcast(zero, V)))
                            else:
                                for c0 in range(C // V):
                                    for c1 in T.vectorized(V):
                                        out[vb, first + row // X, row % X, c0 * V + c1] = zero
                                for ct in range(C % V):
                                    out[vb, first + row // X, row % X, C // V * V + ct] = zero
                    if lined:
                        T.evaluate(T.call_extern("void", "tvm_ops_store_fence"))
                else:
                    kept_points = T.sblock_alloc_buffer((listed,), "int32")
                    count = T.sblock_alloc_buffer((1,), "int32")  # constant size: a register
                    for yy, xx, c in T.grid(T.max(0, end - first), X, C):
                        out[vb, first + yy, xx, c] = zero
                    if first < end:
                        for chunk in range((N + listed - 1) // listed):
                            count[0] = 0
                            for j in range(T.min(listed, N - chunk * listed)):
                                pn: T.let[T.int32] = chunk * listed + j
                                px: T.let[T.int32] = geom[vb, pn, 0]
                                py: T.let[T.int32] = geom[vb, pn, 1]
                                pz: T.let[T.int32] = geom[vb, pn, 2]
                                kept_points[count[0]] = pn
                                count[0] = count[0] + T.Cast("int32", px >= 0 and px < X and py >= first and
                                                             py < end and pz >= 0 and pz < Z)
                            total: T.let[T.int32] = count[0]  # a let: the loop's extent reads no buffer
                            for i in range(total):
                                n: T.let[T.int32] = kept_points[i]
                                x: T.let[T.int32] = geom[vb, n, 0]
                                y: T.let[T.int32] = geom[vb, n, 1]
                                add_row(out, feat, vb, y, x, n, C, True)
    return pool


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


def _pool_warp(dtype: str, L: int):
    """CUDA (BEVDepth's plan): per point, L lanes (a warp; the schedule gives each warp a run
    of consecutive points) add its channels into the (zeroed) output with atomicAdd, L
    apart, so one kernel covers every C and a point's coordinates are read and tested once
    per warp."""
    @T.prim_func(s_tir=True)
    def pool(geom_h: T.handle, feat_h: T.handle, out_h: T.handle, Z: T.int32):
        T.func_attr({"tirx.noalias": True})
        B, N, C, Y, X = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        geom = T.match_buffer(geom_h, (B, N, 3), "int32")
        feat = T.match_buffer(feat_h, (B, N, C), dtype)
        out = T.match_buffer(out_h, (B, Y, X, C), dtype)
        for b, n, lane in T.grid(B, N, L):
            with T.sblock("pool"):
                vb, vn, vl = T.axis.remap("SSS", [b, n, lane])
                T.reads(geom[vb, vn, 0:3], feat[vb, vn, 0:C])
                T.writes(out[vb, 0:Y, 0:X, 0:C])
                x: T.let[T.int32] = geom[vb, vn, 0]
                y: T.let[T.int32] = geom[vb, vn, 1]
                z: T.let[T.int32] = geom[vb, vn, 2]
                if x >= 0 and x < X and y >= 0 and y < Y and z >= 0 and z < Z:
                    for step in range(T.ceildiv(C - vl, L)):  # this lane's channels vl, vl + L, ...
                        T.evaluate(T.cuda.atomic_add(T.address_of(out[vb, y, x, step * L + vl]),
                                                     feat[vb, vn, step * L + vl]))
    return pool


def cuda_computes(dtype: str, V: int) -> dict:
    """{kernel name: PrimFunc} of the CUDA plan for one dtype and lane count V."""
    return {"pos_memo": _pos_memo_cuda(), "pool": _pool_warp(dtype, V)}


def cpu_computes(dtype: str, V: int, memo_chunk: int, lanes: int, listed: int, stream: bool,
                 stream_min_words: int) -> dict:
    """{kernel name: PrimFunc} of the CPU plans for one dtype, channel vector V, pos_memo's
    points per task, the target's 32-bit lanes, the zero-filled walk's points per list and
    the first-touch walk's streaming: the pools (first touch or not) with their
    fixed-channel copies (fixed_channels), pos_memo, and the sort plan's two kernels."""
    shared = {"pos_memo": _pos_memo_tasks(memo_chunk, lanes), "sort_points": _sort_points(),
              "segment_sum": _segment_sum(dtype, V)}
    pools = {"pool": _pool_bands(dtype, V, False, listed=listed),
             "pool_first_touch": _pool_bands(dtype, V, True, stream=stream, stream_min_words=stream_min_words)}
    fixed = {}
    for name, func in pools.items():  # geom [B, N, 3], then feat [B, N, C]
        fixed |= fixed_channels.copies(name, func, {1: (("B", "N", "C"), dtype)})
    return pools | fixed | shared
