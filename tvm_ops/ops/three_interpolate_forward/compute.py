"""TensorIR compute of three_interpolate_forward: one block per output element.

    out[b, c, n]   sum over k < 3 of weights[b, n, k] * features[b, c, indices[b, n, k]],
                   an index outside [0, M) contributing nothing; float32 sums, rounded once

Each output element is written by one block instance and reads three gathered features, so
every schedule is a plain gather (no reduction across tasks, the same bits everywhere). On
the CPU the point axis is split into vectors of V with the last vector ending at N
(ops/point_vectors.py: no predicate, so the lane loop becomes vector code); `lanes` 1 is one
point per iteration (N < V on the CPU, and CUDA).
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from ..lane_transpose import transpose_macro
from ..point_vectors import point, scratch_scope, vectors


def _clamped(i, M):
    """Index i clamped into a row of M features: a load through it never leaves the row."""
    return T.max(T.min(i, M - 1), 0)


def _term(i, w, f, M):
    """w * f in float32 for the feature f loaded through _clamped(i), 0 for an index outside
    [0, M): a Select, so a NaN / inf weight or feature at such an index is dropped too (the
    backward's rule)."""
    return T.Select(tirx.all(i >= 0, i < M), T.Cast("float32", w) * T.Cast("float32", f), tirx.const(0, "float32"))


def forward_compute(dtype: str, lanes: int):
    """The kernel for one dtype; `lanes` points per vector (1: one at a time)."""
    EL = np.dtype(dtype).itemsize

    @T.prim_func(s_tir=True)
    def three_interpolate_forward(feat_h: T.handle, idx_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, C, M, N = T.int32(), T.int32(), T.int32(), T.int32()
        features = T.match_buffer(feat_h, (B, C, M), dtype, align=EL)
        indices = T.match_buffer(idx_h, (B, N, 3), "int32", align=4)
        weights = T.match_buffer(w_h, (B, N, 3), dtype, align=EL)
        out = T.match_buffer(out_h, (B, C, N), dtype, align=EL)
        for b, c, o, v in T.grid(B, C, vectors(N, lanes), lanes):
            with T.sblock("out"):
                vb, vc, vo, vv = T.axis.remap("SSSS", [b, c, o, v])
                T.reads(features[vb, vc, 0:M], indices[vb, 0:N, 0:3], weights[vb, 0:N, 0:3])
                T.writes(out[vb, vc, 0:N])
                n = T.meta_var(point(N, lanes, vo, vv))
                # every load first, none behind a condition (a Select over loads compiles to
                # branches, which issue them one after another): the three indices and weights
                # are independent loads, the features wait only for their index
                i0, i1, i2 = T.Bind(indices[vb, n, 0]), T.Bind(indices[vb, n, 1]), T.Bind(indices[vb, n, 2])
                w0, w1, w2 = T.Bind(weights[vb, n, 0]), T.Bind(weights[vb, n, 1]), T.Bind(weights[vb, n, 2])
                f0, f1, f2 = (T.Bind(features[vb, vc, _clamped(i0, M)]), T.Bind(features[vb, vc, _clamped(i1, M)]),
                              T.Bind(features[vb, vc, _clamped(i2, M)]))
                out[vb, vc, n] = T.Cast(dtype, _term(i0, w0, f0, M) + _term(i1, w1, f1, M) + _term(i2, w2, f2, M))

    return three_interpolate_forward


def _vector_term(IDX, W, fetch, M, k, lanes):
    """_term for the `lanes` points of a vector at once: index vector IDX[k], weight vector
    W[k] (float32), the features fetched for the indices clamped into the row (`fetch`: a
    vector gather, or a lookup in the row held in a register), the term dropped by a Select
    where the index is outside [0, M)."""
    i = IDX[k, T.Ramp(0, 1, lanes)]
    inside = tirx.all(i >= T.Broadcast(0, lanes), i < T.Broadcast(M, lanes))
    clamped = T.max(T.min(i, T.Broadcast(M - 1, lanes)), T.Broadcast(0, lanes))
    return T.Select(inside, W[k, T.Ramp(0, 1, lanes)] * fetch(clamped), T.Broadcast(T.float32(0), lanes))


def _vector_sum(IDX, W, fetch, M, lanes, dtype):
    """The output vector of one channel: the three _vector_terms summed in k order, cast once."""
    return T.Cast(f"{dtype}x{lanes}", _vector_term(IDX, W, fetch, M, 0, lanes) + _vector_term(
        IDX, W, fetch, M, 1, lanes) + _vector_term(IDX, W, fetch, M, 2, lanes))


def _gathered(dtype: str, lanes: int):
    """fetch_of(features, b, c, M) for _walk_points_macro: the row's features at a vector of
    indices by one llvm.masked.gather (gather_ir)."""
    gather = f"tvm_ops_gather_{'f16' if dtype == 'float16' else 'f32'}_x{lanes}"

    def fetch_of(features, b, c, M):
        return lambda clamped: T.call_extern(f"float32x{lanes}", gather, T.address_of(features[b, c, 0]), clamped)

    return fetch_of


def _looked_up(dtype: str, lanes: int):
    """fetch_of(features, b, c, M) for _walk_points_macro where M <= 16: the row's M features
    in one register (row16_ir: a masked load, nothing read past them), each index's feature
    picked from it by one vpermps per 16 lanes (cpu_ir.lookup16_ir)."""
    row = f"tvm_ops_row16_{'f16' if dtype == 'float16' else 'f32'}"

    def fetch_of(features, b, c, M):
        table = T.call_pure_extern("float32x16", row, T.address_of(features[b, c, 0]), M)
        return lambda clamped: T.call_pure_extern(f"float32x{lanes}", f"tvm_ops_lookup16_x{lanes}", table, clamped)

    return fetch_of


def _walk_points_macro(dtype: str, lanes: int, fetch_of):
    """The gather plan's walk of one (batch, channel block): per vector of `lanes` points (the
    last moved back to end at N) its neighbours' indices and weights read once (column k of
    its rows: one load and a deinterleaving shuffle each, _every3_ir), then one output vector
    per channel of the block (`unrolled`: the channels unrolled, else a loop), its features
    fetched by `fetch_of` (_gathered, _looked_up)."""
    kind = "f16" if dtype == "float16" else "f32"
    # column k of `lanes` rows of indices / weights: gather_ir's deinterleaving loads, one per k
    index_column = [f"tvm_ops_every3_i32_x{lanes}_{k}" for k in range(3)]
    weight_column = [f"tvm_ops_every3_{kind}_x{lanes}_{k}" for k in range(3)]
    ivec, fvec = f"int32x{lanes}", f"float32x{lanes}"

    @T.macro
    def walk_points(IDX, W, features, indices, weights, out, b, c0, channels, M, N, unrolled):
        for o in range(T.ceildiv(N, lanes)):
            n0 = T.Bind(T.min(o * lanes, N - lanes))
            IDX[0, T.Ramp(0, 1, lanes)] = T.call_extern(ivec, index_column[0], T.address_of(indices[b, n0, 0]))
            IDX[1, T.Ramp(0, 1, lanes)] = T.call_extern(ivec, index_column[1], T.address_of(indices[b, n0, 0]))
            IDX[2, T.Ramp(0, 1, lanes)] = T.call_extern(ivec, index_column[2], T.address_of(indices[b, n0, 0]))
            W[0, T.Ramp(0, 1, lanes)] = T.call_extern(fvec, weight_column[0], T.address_of(weights[b, n0, 0]))
            W[1, T.Ramp(0, 1, lanes)] = T.call_extern(fvec, weight_column[1], T.address_of(weights[b, n0, 0]))
            W[2, T.Ramp(0, 1, lanes)] = T.call_extern(fvec, weight_column[2], T.address_of(weights[b, n0, 0]))
            for ci in T.unroll(channels) if unrolled else T.serial(channels):
                out[b, c0 + ci, T.Ramp(n0, 1, lanes)] = _vector_sum(IDX, W, fetch_of(features, b, c0 + ci, M), M,
                                                                    lanes, dtype)

    return walk_points


def gather_compute(dtype: str, lanes: int, c_tile: int):
    """The CPU kernel of the gather plan (written in its scheduled form): a block per
    (batch, block of c_tile channels); per vector of `lanes` points (the last moved back to
    end at N, as point_vectors does) the indices and weights of the 3 neighbours are
    read once (deinterleaving loads, _every3_ir), then per channel the 3 features are gathered
    and the sum stored as one vector (a whole block's channels unrolled, the last block's
    C % c_tile in a loop). The same float32 terms in the same order as forward_compute: the
    same bits. The gathers are calls of gather_ir's functions (TVM's LLVM codegen turns a
    per-lane load into lanes scalar loads and inserts)."""
    return _walk_kernel(dtype, lanes, c_tile, _gathered(dtype, lanes))


def lookup_compute(dtype: str, lanes: int, c_tile: int):
    """The CPU kernel for M <= 16 where a 16-entry lane lookup is one instruction (AVX-512:
    cpu_ir.has_lane_lookup): the gather plan's walk with each channel's feature row held in
    one register and the neighbours' features picked from it by lane permutes (_looked_up),
    no gather and no transposes. The same terms in the same order: the same bits."""
    return _walk_kernel(dtype, lanes, c_tile, _looked_up(dtype, lanes))


def row16_ir() -> str:
    """LLVM IR of tvm_ops_row16_{f32,f16}(row, m): the row's first min(m, 16) elements in a
    <16 x float> (float16 widened), the other lanes 0, by a masked load: nothing past them is
    read (generic IR; on x86 a masked vmovups)."""
    text = []
    lanes = ", ".join(f"i32 {lane}" for lane in range(16))
    for name, element, align in (("f32", "float", 4), ("f16", "half", 2)):
        widen = "  %w = fpext <16 x half> %r to <16 x float>\n  ret <16 x float> %w\n" if element == "half" \
            else "  ret <16 x float> %r\n"
        text.append(f"declare <16 x {element}> @llvm.masked.load.v16{name}.p0(ptr, i32, <16 x i1>, <16 x {element}>)\n"
                    f"define <16 x float> @tvm_ops_row16_{name}(ptr %row, i32 %m) alwaysinline {{\nentry:\n"
                    f"  %s = insertelement <16 x i32> poison, i32 %m, i64 0\n"
                    f"  %all = shufflevector <16 x i32> %s, <16 x i32> poison, <16 x i32> zeroinitializer\n"
                    f"  %mask = icmp slt <16 x i32> <{lanes}>, %all\n"
                    f"  %r = call <16 x {element}> @llvm.masked.load.v16{name}.p0(ptr %row, i32 {align}, "
                    f"<16 x i1> %mask, <16 x {element}> zeroinitializer)\n" + widen + "}\n")
    return "".join(text)


def _walk_kernel(dtype: str, lanes: int, c_tile: int, fetch_of):
    """A task per (batch, block of c_tile channels) walking its points (_walk_points_macro)."""
    scratch = scratch_scope("llvm")
    walk_points = _walk_points_macro(dtype, lanes, fetch_of)

    @T.macro
    def block(features, indices, weights, out, b, c0, C, M, N):
        IDX = T.alloc_buffer((3, lanes), "int32", scope=scratch)
        W = T.alloc_buffer((3, lanes), "float32", scope=scratch)
        # a whole block's channels unrolled; the last block of C % c_tile channels (all of
        # them when C < c_tile) in a loop (filling the block by repeating channel C - 1 costs
        # a one-channel call c_tile times its work)
        if c0 + c_tile <= C:
            walk_points(IDX, W, features, indices, weights, out, b, c0, c_tile, M, N, True)
        else:
            walk_points(IDX, W, features, indices, weights, out, b, c0, C - c0, M, N, False)

    return _channel_block_kernel(dtype, c_tile, block)


def tiles_compute(dtype: str, lanes: int, channel_vectors: int):
    """The CPU kernel of the tiles plan: no gather instruction (on AMD's Zen 4 the gather
    plan ran 2.5-4.5x slower). A block per (batch, block of CW = channel_vectors * lanes
    channels), L = `lanes`:

    1. its features [CW, M] transposed into a workspace S [M, CW] in float32 (L x L squares
       through ops/lane_transpose.py; the last square moved back to end at M), so that a
       neighbour's channels are contiguous vectors;
    2. per block of L points (the last moved back to end at N): per point its three indices
       and weights, then its CW channels as three loads from S into the squares A[v]
       [point, channel] (the indices' tests and the weights shared by the block's
       channels); each A[v] transposed in place and stored as L output rows.

    The same float32 terms in the same order as forward_compute: the same bits. Needs
    M >= L and N >= L (else the gather plan, or the _small kernel below a vector of
    points); the last block's whole vectors of channels run one at a time, its last C % L
    channels the gather plan's walk."""
    L, CW = lanes, channel_vectors * lanes
    scratch = scratch_scope("llvm")
    walk_points = _walk_points_macro(dtype, lanes, _gathered(dtype, lanes))
    transpose = transpose_macro(L)
    zero = tirx.const(0, "float32")

    def term(S, i, w, M, v):
        return T.Select(tirx.all(i >= 0, i < M), w * S[_clamped(i, M), T.Ramp(v * L, 1, L)],
                        T.Broadcast(zero, L))

    def tile_block(vectors):
        @T.macro
        def block(features, indices, weights, out, S, A, x_lo, x_hi, y_lo, y_hi, b, c0, M, N):
            for mb in range(T.ceildiv(M, L)):  # S: the features transposed
                m0 = T.Bind(T.min(mb * L, M - L))
                for v in T.unroll(vectors):
                    transpose(features, (b, c0 + v * L, m0), S, (m0, v * L), x_lo, x_hi, y_lo, y_hi)
            for o in range(T.ceildiv(N, L)):
                n0 = T.Bind(T.min(o * L, N - L))
                for j in range(L):
                    i0, i1, i2 = (T.Bind(indices[b, n0 + j, 0]), T.Bind(indices[b, n0 + j, 1]),
                                  T.Bind(indices[b, n0 + j, 2]))
                    w0, w1, w2 = (T.Bind(T.Cast("float32", weights[b, n0 + j, 0])),
                                  T.Bind(T.Cast("float32", weights[b, n0 + j, 1])),
                                  T.Bind(T.Cast("float32", weights[b, n0 + j, 2])))
                    for v in T.unroll(vectors):
                        A[v, j, T.Ramp(0, 1, L)] = (term(S, i0, w0, M, v) + term(S, i1, w1, M, v)
                                                    + term(S, i2, w2, M, v))
                for v in T.unroll(vectors):
                    transpose(A, (v, 0, 0), out, (b, c0 + v * L, n0), x_lo, x_hi, y_lo, y_hi)

        return block

    whole_block, one_vector = tile_block(channel_vectors), tile_block(1)

    @T.macro
    def block(features, indices, weights, out, b, c0, C, M, N):
        S = T.alloc_buffer((M, CW), "float32")  # the block's features, a neighbour per row
        A = T.alloc_buffer((channel_vectors, L, L), "float32")  # squares [point, channel]
        x_lo = T.alloc_buffer((L // 2, L), "float32", scope=scratch)
        x_hi = T.alloc_buffer((L // 2, L), "float32", scope=scratch)
        y_lo = T.alloc_buffer((L // 2, L), "float32", scope=scratch)
        y_hi = T.alloc_buffer((L // 2, L), "float32", scope=scratch)
        if c0 + CW <= C:
            whole_block(features, indices, weights, out, S, A, x_lo, x_hi, y_lo, y_hi, b, c0, M, N)
        else:
            for v in range((C - c0) // L):
                one_vector(features, indices, weights, out, S, A, x_lo, x_hi, y_lo, y_hi, b, c0 + v * L, M, N)
            if (C - c0) % L > 0:
                IDX = T.alloc_buffer((3, lanes), "int32", scope=scratch)
                W = T.alloc_buffer((3, lanes), "float32", scope=scratch)
                walk_points(IDX, W, features, indices, weights, out, b, C - (C - c0) % L, (C - c0) % L, M, N,
                            False)

    return _channel_block_kernel(dtype, CW, block)


def _channel_block_kernel(dtype: str, width: int, block):
    """The CPU plans' kernel: a task per (batch, block of `width` channels), the schedule's
    parallel loop; `block` (a macro) computes one task's output rows."""
    @T.prim_func(s_tir=True)
    def three_interpolate_forward(feat_h: T.handle, idx_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, C, M, N = T.int32(), T.int32(), T.int32(), T.int32()
        features = T.match_buffer(feat_h, (B, C, M), dtype)
        indices = T.match_buffer(idx_h, (B, N, 3), "int32")
        weights = T.match_buffer(w_h, (B, N, 3), dtype)
        out = T.match_buffer(out_h, (B, C, N), dtype)
        for task in range(B * T.ceildiv(C, width)):
            with T.sblock("task"):
                vt = T.axis.remap("S", [task])
                T.reads(features[0:B, 0:C, 0:M], indices[0:B, 0:N, 0:3], weights[0:B, 0:N, 0:3])
                T.writes(out[0:B, 0:C, 0:N])
                b = T.Bind(vt // T.ceildiv(C, width))
                c0 = T.Bind(vt % T.ceildiv(C, width) * width)
                block(features, indices, weights, out, b, c0, C, M, N)

    return three_interpolate_forward


def gather_ir(lanes: int) -> str:
    """LLVM IR of tvm_ops_gather_{f32,f16,i32}_x<lanes>(base, <lanes x i32> index): the
    elements base[index[l]] (f16 widened to float) by llvm.masked.gather, generic IR that
    every CPU compiles (x86: vgatherdps / vpgatherdd with AVX2 or AVX-512).

    float16 has no gather instruction (LLVM expands a half gather into scalar loads, 3-4x
    slower than float32 here), so its lanes gather the 32-bit word of halves
    (index - 1, index), or (0, 1) at index 0, and keep the high half, or the low one at
    index 0: one vpgatherdd, a shift and a conversion. The word reads base[max(index, 1)]
    at most: the caller keeps that inside its buffer (three_interpolate_forward: M >= 2,
    or the portable kernel)."""
    mask = ", ".join(["i1 true"] * lanes)
    splat = lambda value: "<" + ", ".join([f"i32 {value}"] * lanes) + ">"  # noqa: E731
    v32, vf, vp = f"<{lanes} x i32>", f"<{lanes} x float>", f"<{lanes} x ptr>"
    i32_gather = f"@llvm.masked.gather.v{lanes}i32.v{lanes}p0"
    f32_gather = f"@llvm.masked.gather.v{lanes}f32.v{lanes}p0"
    return _every3_ir(lanes) + (f"declare {v32} {i32_gather}({vp}, i32, <{lanes} x i1>, {v32})\n"
            f"declare {vf} {f32_gather}({vp}, i32, <{lanes} x i1>, {vf})\n"
            f"define {vf} @tvm_ops_gather_f32_x{lanes}(ptr %base, {v32} %index) alwaysinline {{\nentry:\n"
            f"  %p = getelementptr float, ptr %base, {v32} %index\n"
            f"  %g = call {vf} {f32_gather}({vp} %p, i32 4, <{lanes} x i1> <{mask}>, {vf} poison)\n"
            f"  ret {vf} %g\n}}\n"
            f"define {v32} @tvm_ops_gather_i32_x{lanes}(ptr %base, {v32} %index) alwaysinline {{\nentry:\n"
            f"  %p = getelementptr i32, ptr %base, {v32} %index\n"
            f"  %g = call {v32} {i32_gather}({vp} %p, i32 4, <{lanes} x i1> <{mask}>, {v32} poison)\n"
            f"  ret {v32} %g\n}}\n"
            f"define {vf} @tvm_ops_gather_f16_x{lanes}(ptr %base, {v32} %index) alwaysinline {{\nentry:\n"
            f"  %high = icmp sgt {v32} %index, zeroinitializer\n"
            f"  %before = sub {v32} %index, {splat(1)}\n"
            f"  %word = select <{lanes} x i1> %high, {v32} %before, {v32} zeroinitializer\n"
            f"  %p = getelementptr i16, ptr %base, {v32} %word\n"
            f"  %g = call {v32} {i32_gather}({vp} %p, i32 2, <{lanes} x i1> <{mask}>, {v32} poison)\n"
            f"  %shift = select <{lanes} x i1> %high, {v32} {splat(16)}, {v32} zeroinitializer\n"
            f"  %half_bits = lshr {v32} %g, %shift\n"
            f"  %t = trunc {v32} %half_bits to <{lanes} x i16>\n"
            f"  %h = bitcast <{lanes} x i16> %t to <{lanes} x half>\n"
            f"  %w = fpext <{lanes} x half> %h to {vf}\n"
            f"  ret {vf} %w\n}}\n")


def _every3_ir(lanes: int) -> str:
    """LLVM IR of tvm_ops_every3_{i32,f32,f16}_x<lanes>_<k>(base), k < 3: the elements
    base[k + 3 l], l < lanes (f16 widened to float), i.e. column k of `lanes` rows of an
    [N, 3] tensor: one load of the 3 * lanes contiguous elements and a deinterleaving
    shuffle (a few permutes), where a stride-3 gather is one slow instruction per vector (on
    AMD's Zen 4 ~10x the permutes). Reads exactly those rows."""
    text = []
    for name, element, widen in (("i32", "i32", None), ("f32", "float", None), ("f16", "half", "float")):
        wide, out = f"<{3 * lanes} x {element}>", f"<{lanes} x {element}>"
        result = f"<{lanes} x {widen}>" if widen else out
        for k in range(3):
            mask = ", ".join(f"i32 {k + 3 * lane}" for lane in range(lanes))
            body = (f"  %rows = load {wide}, ptr %base, align 1\n"
                    f"  %column = shufflevector {wide} %rows, {wide} poison, <{lanes} x i32> <{mask}>\n")
            body += (f"  %wide = fpext {out} %column to {result}\n  ret {result} %wide\n" if widen
                     else f"  ret {out} %column\n")
            text.append(f"define {result} @tvm_ops_every3_{name}_x{lanes}_{k}(ptr %base) alwaysinline {{\nentry:\n"
                        f"{body}}}\n")
    return "".join(text)
