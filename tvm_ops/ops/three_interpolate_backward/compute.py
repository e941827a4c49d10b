"""Kernels of three_interpolate_backward: mlu-ops' owner-computes plan, and a scatter.

An owner is a (batch, M-block, C-block) tile of grad_features that accumulates in a
float32 on-chip tile while walking all of N, so owners never write the same element.
`tiled_compute` is the TensorIR compute (CUDA's owners);
`transposed_compute` the CPU kernel written in its scheduled form (why: its docstring);
`scatter_compute` each (b, c, n, k) term added into a float32 accumulator, which the CUDA
schedule turns into atomicAdd (ops/atomics.py; mmcv's plan), and `cast_compute` its
rounding for float16; with its rows zero-filled in the compute, an owner per (b, c) row, it
is also the CPU's narrow kernel for float32 (`rows_compute` that of float16).
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..lane_transpose import transpose_macro


def scatter_compute(dtype: str, name: str, zero_rows: bool = False):
    """acc[b, c, indices[b, n, k]] += grad_output[b, c, n] * weights[b, n, k] (in float32) for
    every term whose index is in [0, M), into an acc the caller zero-filled: grad_features
    itself in float32, a float32 accumulator that cast_compute rounds once for float16 (half
    adds would round at every term). The terms meet at random elements in no fixed order:
    the CUDA schedule makes each add atomic (not bit-deterministic).

    zero_rows: each (b, c) row is zero-filled by the compute itself (the reduction's init),
    so that a (b, c) row is one owner's: the CPU's narrow kernel for float32, whose owners
    add their terms in n, k order straight into grad_features."""
    @T.prim_func(s_tir=True)
    def three_interpolate_backward_scatter(go_h: T.handle, idx_h: T.handle, w_h: T.handle, acc_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        B, C, N, M = T.int32(), T.int32(), T.int32(), T.int32()
        grad_output = T.match_buffer(go_h, (B, C, N), dtype)
        indices = T.match_buffer(idx_h, (B, N, 3), "int32")
        weights = T.match_buffer(w_h, (B, N, 3), dtype)
        acc = T.match_buffer(acc_h, (B, C, M), "float32")
        for b, c, n, k in T.grid(B, C, N, 3):
            with T.sblock("scatter"):
                vb, vc, vn, vk = T.axis.remap("SSRR", [b, c, n, k])
                T.reads(grad_output[vb, vc, vn], indices[vb, vn, vk], weights[vb, vn, vk], acc[vb, vc, 0:M])
                T.writes(acc[vb, vc, 0:M])
                if zero_rows:  # a Python bool: the init is there or not
                    with T.init():
                        for row in range(M):
                            acc[vb, vc, row] = T.float32(0)
                m = T.Bind(indices[vb, vn, vk])
                if 0 <= m and m < M:
                    acc[vb, vc, m] = acc[vb, vc, m] + T.Cast("float32", grad_output[vb, vc, vn]) * T.Cast(
                        "float32", weights[vb, vn, vk])

    return three_interpolate_backward_scatter


def cast_compute(dtype: str, name: str):
    """grad_features = the float32 accumulator rounded once to dtype."""
    @T.prim_func(s_tir=True)
    def three_interpolate_backward_cast(acc_h: T.handle, out_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        B, C, M = T.int32(), T.int32(), T.int32()
        acc = T.match_buffer(acc_h, (B, C, M), "float32")
        grad_features = T.match_buffer(out_h, (B, C, M), dtype)
        for b, c, m in T.grid(B, C, M):
            with T.sblock("cast"):
                vb, vc, vm = T.axis.remap("SSS", [b, c, m])
                grad_features[vb, vc, vm] = T.Cast(dtype, acc[vb, vc, vm])

    return three_interpolate_backward_cast


def tiled_compute(dtype: str, m_tile: int, c_tile: int, n_tile: int, scope: str, name: str):
    """The kernel `name` for one dtype and tile plan; B, C, N and M stay symbolic."""
    acc_t = "float32"  # float16 accumulates in float32 and rounds once at the end

    @T.prim_func(s_tir=True)
    def three_interpolate_backward(go_h: T.handle, idx_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        B, C, N, M = T.int32(), T.int32(), T.int32(), T.int32()
        grad_output = T.match_buffer(go_h, (B, C, N), dtype)
        indices = T.match_buffer(idx_h, (B, N, 3), "int32")
        weights = T.match_buffer(w_h, (B, N, 3), dtype)
        grad_features = T.match_buffer(out_h, (B, C, M), dtype)
        for b, mb, cb in T.grid(B, T.ceildiv(M, m_tile), T.ceildiv(C, c_tile)):
            with T.sblock("tile"):
                vb, vmb, vcb = T.axis.remap("SSS", [b, mb, cb])
                T.reads(indices[vb, 0:N, 0:3], weights[vb, 0:N, 0:3], grad_output[vb, 0:C, 0:N])
                T.writes(grad_features[vb, vcb * c_tile:vcb * c_tile + c_tile,
                                       vmb * m_tile:vmb * m_tile + m_tile])
                acc = T.alloc_buffer((m_tile, c_tile), acc_t, scope=scope)
                go_t = T.alloc_buffer((n_tile, c_tile), acc_t, scope=scope)
                for nb in range(T.ceildiv(N, n_tile)):
                    # Stage a transposed [n_tile, c_tile] slice; clamped reads past C or N
                    # fill lanes whose results are never stored.
                    for ni, ci in T.grid(n_tile, c_tile):
                        with T.sblock("load"):
                            vnb, vni, vci = T.axis.remap("SSS", [nb, ni, ci])
                            go_t[vni, vci] = T.Cast(acc_t, grad_output[
                                vb, T.min(vcb * c_tile + vci, C - 1), T.min(vnb * n_tile + vni, N - 1)])
                    for ni, k, ci in T.grid(n_tile, 3, c_tile):
                        with T.sblock("scatter"):
                            vn = T.axis.reduce(T.ceildiv(N, n_tile) * n_tile, nb * n_tile + ni)
                            vk, vci = T.axis.remap("RS", [k, ci])
                            T.reads(indices[vb, vn, vk], weights[vb, vn, vk], go_t[vn % n_tile, vci],
                                    acc[0:m_tile, vci])
                            T.writes(acc[0:m_tile, vci])
                            with T.init():
                                for mi in range(T.min(m_tile, M - vmb * m_tile)):
                                    acc[mi, vci] = T.float32(0)
                            if vn < N:
                                j = indices[vb, vn, vk] - vmb * m_tile
                                if 0 <= j and j < m_tile and j + vmb * m_tile < M:
                                    acc[j, vci] = acc[j, vci] + go_t[vn % n_tile, vci] * T.Cast(
                                        acc_t, weights[vb, vn, vk])
                # The channel loop keeps its constant extent (a GPU binds it to threads) and
                # guards the tail instead.
                for ci, mi in T.grid(c_tile, T.min(m_tile, M - vmb * m_tile)):
                    with T.sblock("store"):
                        vci, vmi = T.axis.remap("SS", [ci, mi])
                        if vcb * c_tile + vci < C:
                            grad_features[vb, vcb * c_tile + vci, vmb * m_tile + vmi] = T.Cast(dtype, acc[vmi, vci])

    return three_interpolate_backward


def rows_compute(dtype: str, lanes: int):
    """The CPU's narrow kernel for float16, written in its scheduled form: an owner per (b, c)
    row of grad_features, as scatter_compute's rows for float32, summing in a float32 row that
    is rounded once. Per block of `lanes` points, their 3 * lanes weights and `lanes` values of
    grad_output are converted to float32 a vector at a time into stack arrays: converted one
    at a time, each half scalar is loaded by `vpinsrw` into the register of the previous
    term's value, and every term waited on that conversion chain. Written so because a split
    of the symbolic N loop into whole blocks gets a predicate, which TVM's vectoriser
    scalarises; the N tail (N % lanes points) is converted one point at a time. Each element
    sums its (n, k) terms in n order, as the other owners do: the same bits."""
    acc_t, V = "float32", lanes

    @T.prim_func(s_tir=True)
    def three_interpolate_backward_rows(go_h: T.handle, idx_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, C, N, M = T.int32(), T.int32(), T.int32(), T.int32()
        grad_output = T.match_buffer(go_h, (B, C, N), dtype)
        indices = T.match_buffer(idx_h, (B, N, 3), "int32")
        weights = T.match_buffer(w_h, (B, N, 3), dtype)
        grad_features = T.match_buffer(out_h, (B, C, M), dtype)
        weight_words = T.decl_buffer((B * N * 3,), dtype, data=weights.data)
        for task in range(B * C):
            with T.sblock("task"):
                vt = T.axis.remap("S", [task])
                T.reads(grad_output[0:B, 0:C, 0:N], indices[0:B, 0:N, 0:3], weights[0:B, 0:N, 0:3])
                T.writes(grad_features[0:B, 0:C, 0:M])
                acc = T.alloc_buffer((M,), acc_t)
                block_weights = T.alloc_buffer((3 * V,), acc_t)
                block_grads = T.alloc_buffer((V,), acc_t)
                b = T.Bind(vt // C)
                c = T.Bind(vt % C)
                for m in range(M):
                    acc[m] = T.float32(0)
                for nb in range(N // V):
                    for i in T.vectorized(3 * V):
                        block_weights[i] = T.Cast(acc_t, weight_words[(b * N + nb * V) * 3 + i])
                    for i in T.vectorized(V):
                        block_grads[i] = T.Cast(acc_t, grad_output[b, c, nb * V + i])
                    for i in range(V):
                        for k in T.unroll(3):
                            row = T.meta_var(indices[b, nb * V + i, k])
                            if T.Cast("uint32", row) < T.Cast("uint32", M):
                                acc[row] = acc[row] + block_grads[i] * block_weights[i * 3 + k]
                for n in range(N // V * V, N):
                    for k in T.unroll(3):
                        row = T.meta_var(indices[b, n, k])
                        if T.Cast("uint32", row) < T.Cast("uint32", M):
                            acc[row] = acc[row] + T.Cast(acc_t, grad_output[b, c, n]) * T.Cast(acc_t, weights[b, n, k])
                for mb in range(M // V):
                    for j in T.vectorized(V):
                        grad_features[b, c, mb * V + j] = T.Cast(dtype, acc[mb * V + j])
                for m in range(M % V):
                    grad_features[b, c, M // V * V + m] = T.Cast(dtype, acc[M // V * V + m])

    return three_interpolate_backward_rows


def transposed_compute(dtype: str, lanes: int, vectors: int, m_tile: int):
    """The CPU kernel, written in its scheduled form: the same owners as tiled_compute, with
    c_tile = vectors * lanes channels, and grad_output staged by register transposes.

    Per block of `lanes` points, the owner loads a [lanes, lanes] square of grad_output per
    vector of channels (one contiguous vector per channel row) and transposes it in
    registers (ops/lane_transpose.py), so that each (n, k) entry is `vectors` vector FMAs
    into its acc row; acc goes back to grad_features through the same transposes. Written
    so because the tiled compute's transposed staging, vectorised by TVM, became per-lane
    gathers and scatters (vgatherdps / vscatterqps), which bounded it: no schedule
    primitive emits the lane shuffles. The N tail (N % lanes points) is staged one point
    at a time. Each acc element sums its (n, k) terms in n order, as tiled_compute does."""
    acc_t = "float32"
    V, c_tile = lanes, vectors * lanes
    transpose = transpose_macro(V)

    @T.prim_func(s_tir=True)
    def three_interpolate_backward(go_h: T.handle, idx_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, C, N, M = T.int32(), T.int32(), T.int32(), T.int32()
        grad_output = T.match_buffer(go_h, (B, C, N), dtype)
        indices = T.match_buffer(idx_h, (B, N, 3), "int32")
        weights = T.match_buffer(w_h, (B, N, 3), dtype)
        grad_features = T.match_buffer(out_h, (B, C, M), dtype)
        for task in range(B * T.ceildiv(C, c_tile) * T.ceildiv(M, m_tile)):
            with T.sblock("task"):
                vt = T.axis.remap("S", [task])
                T.reads(grad_output[0:B, 0:C, 0:N], indices[0:B, 0:N, 0:3], weights[0:B, 0:N, 0:3])
                T.writes(grad_features[0:B, 0:C, 0:M])
                acc = T.alloc_buffer((m_tile, c_tile), acc_t)
                square = T.alloc_buffer((vectors, V, V), acc_t)
                x_lo = T.alloc_buffer((V // 2, V), acc_t)
                x_hi = T.alloc_buffer((V // 2, V), acc_t)
                y_lo = T.alloc_buffer((V // 2, V), acc_t)
                y_hi = T.alloc_buffer((V // 2, V), acc_t)
                point = T.alloc_buffer((vectors, V), acc_t)
                blocks = T.Bind(T.ceildiv(M, m_tile))
                b = T.Bind(vt // (T.ceildiv(C, c_tile) * blocks))
                c0 = T.Bind(vt // blocks % T.ceildiv(C, c_tile) * c_tile)
                m0 = T.Bind(vt % blocks * m_tile)
                rows = T.Bind(T.min(m_tile, M - m0))
                for m, g in T.grid(rows, vectors):
                    for j in T.vectorized(V):
                        acc[m, g * V + j] = T.float32(0)
                for nb in range(N // V):
                    # channels past C read row C - 1: lanes whose results are never stored
                    for g in T.unroll(vectors):
                        for i in T.unroll(V):
                            for j in T.vectorized(V):
                                square[g, i, j] = T.Cast(acc_t, grad_output[b, T.min(c0 + g * V + i, C - 1), nb * V + j])
                        transpose(square, (g, 0, 0), square, (g, 0, 0), x_lo, x_hi, y_lo, y_hi)
                    for ni in range(V):
                        # the point's channel vectors in a stack array (registers): read from
                        # the square, LLVM reloaded them after every acc store (may alias)
                        for g in T.unroll(vectors):
                            for j in T.vectorized(V):
                                point[g, j] = square[g, ni, j]
                        for k in T.unroll(3):
                            # one unsigned comparison: 0 <= index - m0 < rows
                            row = T.meta_var(indices[b, nb * V + ni, k] - m0)
                            if T.Cast("uint32", row) < T.Cast("uint32", rows):
                                for g in T.unroll(vectors):
                                    for j in T.vectorized(V):
                                        acc[row, g * V + j] = acc[row, g * V + j] + point[g, j] * T.Cast(
                                            acc_t, weights[b, nb * V + ni, k])
                for n in range(N // V * V, N):
                    for k in T.unroll(3):
                        row = T.meta_var(indices[b, n, k] - m0)
                        if T.Cast("uint32", row) < T.Cast("uint32", rows):
                            for g in T.unroll(vectors):
                                for j in T.vectorized(V):
                                    acc[row, g * V + j] = acc[row, g * V + j] + T.Cast(
                                        acc_t, grad_output[b, T.min(c0 + g * V + j, C - 1), n]) * T.Cast(
                                        acc_t, weights[b, n, k])
                # acc back to [C, M] in transposed squares: a whole vector of channels straight
                # from acc to grad_features, the last one through the square, its rows past C dropped
                for g in range(vectors):
                    for mb in range(rows // V):
                        if c0 + g * V + V <= C:
                            transpose(acc, (mb * V, g * V), grad_features, (b, c0 + g * V, m0 + mb * V),
                                      x_lo, x_hi, y_lo, y_hi)
                        else:
                            for i in T.unroll(V):
                                for j in T.vectorized(V):
                                    square[g, i, j] = acc[mb * V + i, g * V + j]
                            transpose(square, (g, 0, 0), square, (g, 0, 0), x_lo, x_hi, y_lo, y_hi)
                            for i in T.unroll(V):
                                if c0 + g * V + i < C:
                                    for j in T.vectorized(V):
                                        grad_features[b, c0 + g * V + i, m0 + mb * V + j] = T.Cast(
                                            dtype, square[g, i, j])
                for m, c in T.grid(rows % V, c_tile):
                    if c0 + c < C:
                        grad_features[b, c0 + c, m0 + rows // V * V + m] = T.Cast(dtype, acc[rows // V * V + m, c])

    return three_interpolate_backward
