"""Kernels of ms_deform_attn_backward: hand-written loop nests for the CPU and for CUDA.

Both are TensorIR written in its scheduled form, not a compute plus a schedule, because
TensorIR's block rules cannot fuse the scatter (a reduction block with an init) with the
per-sample channel dots, and the fused pass is what makes them fast.

The CPU kernel (`cpu_backward_compute`) needs no fallback for other CPUs: its LLVM IR
(task_queue's atomicrmw, the sampling rule's llvm.fma) is generic, so nothing here belongs in
ops/cpu_ir.py, and its lanes are the target's (TargetModel.lanes: 4 on aarch64).

The CUDA kernel (`cuda_backward_compute`) also sums its three channel sums over the warp
together, in 6 shuffles (_warp_sums_of_three); a reduction block per sum would give an
all-reduce each (5 shuffles apiece, one after the other). The compute it replaced, two block
nests (corner + scatter; corner + channel dots + finalize) scheduled as two kernels, ran
2.2-3.7x slower (docs/kernels/ms_deform_attn_backward.md). It is generic CUDA C (warp
shuffles, float atomicAdd, __fmaf_rn) for every NVIDIA architecture TVM targets, so it needs
no fallback either.
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.backend.cuda.op import cuda_atomic_add
from tvm.script import tirx as T

from ...one_core import BARRIER, LAUNCH_POINT
from .. import task_queue
from ..ms_deform_attn_sampling import block_corners_macro, cuda_fma_position
from ..prefetch import prefetch_words

# rows ahead that the private kernel's slice copy and write-back prefetch
SLICE_ROWS_AHEAD = 16


def queries_ahead(samples: int, P):
    """Prefetch distance in queries of one level: `samples` samples, at least one query."""
    return tirx.max(1, samples // tirx.max(P, 1))


# --------------------------------------------------------------------------
# compute
# --------------------------------------------------------------------------


WARP = 32


@T.macro
def _warp_sums_of_three(t, out, lane):
    """The sums over the warp of three per-lane values t[0:3], reduced together: 6 shuffles
    where three separate reductions take 15. Each half-warp keeps two of (t0, t1, t2, 0) and
    trades the other two (xor 16), each quarter keeps one of its two (xor 8), then three
    butterflies. out[0] of lane 0 ends as sum(t0), of lane 8 as sum(t1), of lane 16 as
    sum(t2). Every lane of the warp must take part."""
    full = T.meta_var(T.uint32(0xFFFFFFFF))
    zero = T.meta_var(T.float32(0))
    upper: T.let = (lane & 16) != 0
    u0: T.let = T.Select(upper, t[2], t[0]) + T.tvm_warp_shuffle_xor(full, T.Select(upper, t[0], t[2]), 16, WARP, WARP)
    u1: T.let = T.Select(upper, zero, t[1]) + T.tvm_warp_shuffle_xor(full, T.Select(upper, t[1], zero), 16, WARP, WARP)
    odd: T.let = (lane & 8) != 0
    v0: T.let = T.Select(odd, u1, u0) + T.tvm_warp_shuffle_xor(full, T.Select(odd, u0, u1), 8, WARP, WARP)
    v1: T.let = v0 + T.tvm_warp_shuffle_xor(full, v0, 4, WARP, WARP)
    v2: T.let = v1 + T.tvm_warp_shuffle_xor(full, v1, 2, WARP, WARP)
    out[0] = v2 + T.tvm_warp_shuffle_xor(full, v2, 1, WARP, WARP)


def cuda_backward_compute(dtype: str, heads_per_block: int):
    """The CUDA kernel, written in its scheduled form (see the module docstring): one pass,
    a warp per (b, q, h), a lane per channel (C > 32: lanes loop over channels), a block
    per (q, b) and `heads_per_block` heads.

    Per sample, every lane: the position (one fused multiply-add, the CPU's rule), the four
    corners' rows and weights, its channel's four corner values loaded before any is used
    (each under its corner's guard: TVM's CUDA C keeps a guarded load as a branch),
    atomicAdd of w_k * a * g into grad_value, and its share of the three sums over channels
    (grad_attn_weight and the two location terms, from the four corner dots d_k = g * v_k as
    the CPU groups them). The three go over the warp together (_warp_sums_of_three) and
    lanes 0, 8 and 16 store them. A skipped sample is the same for every lane of a warp, so
    the whole warp skips it and lane 0 stores its zeros."""
    assert dtype == "float32", dtype
    TH = heads_per_block
    one, zero = T.float32(1), T.float32(0)
    position = cuda_fma_position(dtype)

    @T.prim_func(s_tir=True)
    def backward(value_h: T.handle, shapes_h: T.handle, lsi_h: T.handle, loc_h: T.handle,
                 attn_h: T.handle, gout_h: T.handle, gv_h: T.handle, gloc_h: T.handle,
                 gattn_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, K, H, C, L, Q, P = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        value = T.match_buffer(value_h, (B, K, H, C), dtype)
        shapes = T.match_buffer(shapes_h, (L, 2), "int32")
        lsi = T.match_buffer(lsi_h, (L,), "int32")
        loc = T.match_buffer(loc_h, (B, Q, H, L, P, 2), dtype)
        attn = T.match_buffer(attn_h, (B, Q, H, L, P), dtype)
        gout = T.match_buffer(gout_h, (B, Q, H, C), dtype)
        gv = T.match_buffer(gv_h, (B, K, H, C), dtype)
        gloc = T.match_buffer(gloc_h, (B, Q, H, L, P, 2), dtype)
        gattn = T.match_buffer(gattn_h, (B, Q, H, L, P), dtype)
        for q in T.thread_binding(Q, thread="blockIdx.x"):
            for b in T.thread_binding(B, thread="blockIdx.y"):
                for hg in T.thread_binding((H + TH - 1) // TH, thread="blockIdx.z"):
                    for hi in T.thread_binding(TH, thread="threadIdx.y"):
                        for lane in T.thread_binding(WARP, thread="threadIdx.x"):
                            with T.sblock("warp"):
                                T.reads()
                                T.writes()
                                rows = T.alloc_buffer((4,), "int32", scope="local")
                                w = T.alloc_buffer((4,), dtype, scope="local")
                                d = T.alloc_buffer((4,), dtype, scope="local")
                                acc = T.alloc_buffer((3,), dtype, scope="local")
                                total = T.alloc_buffer((1,), dtype, scope="local")
                                h: T.let = hg * TH + hi
                                if h < H:  # the same for the whole warp
                                    for l, p in T.grid(L, P):
                                        hl: T.let = shapes[l, 0]
                                        wl: T.let = shapes[l, 1]
                                        h_im: T.let = position(loc[b, q, h, l, p, 1], hl)
                                        w_im: T.let = position(loc[b, q, h, l, p, 0], wl)
                                        # strict validity test (NaN / Inf fail it); only in-range
                                        # values reach floor() -> int32
                                        if (h_im > T.float32(-1) and w_im > T.float32(-1)
                                                and h_im < T.Cast(dtype, hl) and w_im < T.Cast(dtype, wl)):
                                            y0: T.let = T.Cast("int32", T.floor(h_im))
                                            x0: T.let = T.Cast("int32", T.floor(w_im))
                                            lh: T.let = h_im - T.Cast(dtype, y0)
                                            lw: T.let = w_im - T.Cast(dtype, x0)
                                            a: T.let = attn[b, q, h, l, p]
                                            for k in T.unroll(4):
                                                y: T.let = y0 + k // 2
                                                x: T.let = x0 + k % 2
                                                r: T.let = lsi[l] + y * wl + x
                                                # per-corner validity; 0 <= row < K whatever
                                                # level_start_index says
                                                rows[k] = T.Select(y >= 0 and y < hl and x >= 0 and x < wl
                                                                   and r >= 0 and r < K, r, -1)
                                                w[k] = (T.if_then_else(k // 2 == 1, lh, one - lh)
                                                        * T.if_then_else(k % 2 == 1, lw, one - lw))
                                            for i in T.unroll(3):
                                                acc[i] = zero
                                            for c0 in range((C + WARP - 1) // WARP):
                                                c: T.let = c0 * WARP + lane
                                                if c < C:
                                                    g: T.let = gout[b, q, h, c]
                                                    for k in T.unroll(4):
                                                        # K >= 1 when a kernel runs: row 0 exists
                                                        d[k] = T.Select(rows[k] >= 0,
                                                                        g * value[b, T.max(rows[k], 0), h, c], zero)
                                                    for k in T.unroll(4):
                                                        if rows[k] >= 0:
                                                            T.evaluate(cuda_atomic_add(
                                                                T.address_of(gv[b, rows[k], h, c]), w[k] * a * g))
                                                    acc[0] = acc[0] + ((one - lh) * ((one - lw) * d[0] + lw * d[1])
                                                                       + lh * ((one - lw) * d[2] + lw * d[3]))
                                                    acc[1] = acc[1] + ((one - lh) * (d[1] - d[0]) + lh * (d[3] - d[2]))
                                                    acc[2] = acc[2] + ((one - lw) * (d[2] - d[0]) + lw * (d[3] - d[1]))
                                            _warp_sums_of_three(acc, total, lane)
                                            if lane == 0:
                                                gattn[b, q, h, l, p] = total[0]
                                            if lane == 8:
                                                gloc[b, q, h, l, p, 0] = T.Cast(dtype, wl) * a * total[0]
                                            if lane == 16:
                                                gloc[b, q, h, l, p, 1] = T.Cast(dtype, hl) * a * total[0]
                                        else:
                                            if lane == 0:
                                                gattn[b, q, h, l, p] = zero
                                                gloc[b, q, h, l, p, 0] = zero
                                                gloc[b, q, h, l, p, 1] = zero

    return backward


def _four_lane_sums(acc, V: int):
    """The lane sums of the four V-lane rows of acc [4, V] as one V-lane vector (row k's sum
    in lanes k*V/4 .. k*V/4 + V/4 - 1): two rounds of two-vector shuffles fold the rows into
    one vector of four V/4-lane groups, then butterflies sum within the groups. 8 shuffles and
    5 adds at V = 16, where four separate halving trees took 16 and 16."""
    assert V >= 4 and V & (V - 1) == 0, V

    def pick(a, b, idx):
        return tirx.Shuffle([a, b], [tirx.IntImm("int32", i) for i in idx])

    rows = [acc[k, tirx.Ramp(0, 1, V)] for k in range(4)]
    h, q = V // 2, V // 4
    lo = list(range(h)) + [V + i for i in range(h)]  # the low halves of two rows, side by side
    hi = list(range(h, V)) + [V + h + i for i in range(h)]
    pairs = [pick(rows[0], rows[1], lo) + pick(rows[0], rows[1], hi),
             pick(rows[2], rows[3], lo) + pick(rows[2], rows[3], hi)]
    even = [g * q + i for g in (0, 2) for i in range(q)]
    odd = [g * q + i for g in (1, 3) for i in range(q)]
    out = (pick(pairs[0], pairs[1], even + [V + i for i in even])
           + pick(pairs[0], pairs[1], odd + [V + i for i in odd]))
    step = q // 2
    while step:
        out = out + tirx.Shuffle([out], [tirx.IntImm("int32", i ^ step) for i in range(V)])
        step //= 2
    return out


def cpu_backward_compute(dtype: str, lanes: int, private: bool, prefetch: int, channels: int | None = None,
                         near_kb: int = 0, query_block: int = 16):
    """The CPU kernel, written in its scheduled form (see the module docstring): one pass
    over the samples computes all three outputs.

    Task = one (b, h) slice (parallel over B*H); inside it the samples are walked level
    by level in (q, p) order, so every grad_value row gets its contributions in a fixed
    order (deterministic, no atomics). The queries go in blocks of `query_block`: first
    each sample's cell, corner rows and weights * attention for the whole block, the
    queries in vector lanes and the rule branch-free (block_corners_macro, bit for bit the
    per-sample rule), then the samples. Per sample the four corners are unrolled; per corner
    the channel loop is vectorised (`lanes`, scalar tail for C % lanes) and does both
    the scatter into grad_value and the dot d_k = sum_c g * v_k (a [4, lanes]
    accumulator; the four lane sums in one shuffle tree, _four_lane_sums). Rows are
    addressed through 2-D [rows, C] views: row r of the (b, h) slice is row
    (b*K + r)*H + h of value / grad_value, or row r of the private copy.

    private: the task first copies its value slice into a contiguous [K, C]
    workspace and accumulates into a zeroed [K, C] one, which it writes back at the
    end (that write-back is also the zero-fill of the slice). Pays off when a slice
    receives many samples (BEVFormer); otherwise grad_value is zero-filled by one
    parallel pass over contiguous rows first.
    prefetch (samples ahead, 0: off): with A = max(1, prefetch // P) queries, while
    on sample (q, l, p) prefetch into L2 the corner rows of sample (q + A, l, p) (clamped
    into the slice, so the address is always in bounds), and while on (q, l) the
    rows of (q + 2A, l) (so the locations that prefetch reads are in cache). The corner
    rows only on levels whose value + gradient rows exceed near_kb: a smaller level stays
    in the caches once touched. The op's *_in_cache kernels are compiled with prefetch 0:
    its launch runs them where the call's tensors fit in the last-level cache, there the
    prefetches cost more than they hide.
    channels: C as a constant (None: symbolic). The channel loop is then straight-line
    code with no tail, and the corner accumulators stay in registers (BEVFormer kernel,
    interleaved: see the schedule file).
    """
    V = lanes
    # element alignment only: the kernels take any contiguous numpy / torch view, and with
    # a constant C the default 64-byte claim would let LLVM emit aligned vector moves
    EL = np.dtype(dtype).itemsize
    zero, one = tirx.const(0, dtype), tirx.const(1, dtype)
    channel_count = tirx.Var("C", "int32") if channels is None else tirx.IntImm("int32", channels)
    # C a known multiple of the vector width: no scalar channel tail, so each corner's dot is
    # its lane sum alone
    whole_vectors = channels is not None and channels % V == 0

    QB = query_block
    block_corners = block_corners_macro(dtype, QB, gradients=True)

    @T.macro
    def one_sample(vbuf, gbuf, scale, offset, shapes, lsi, loc, gout, gloc, gattn, cells, b, h, K, Q, L, P, C, ahead,
                   far, q, l, p, i):
        with T.sblock("sample"):
            T.reads()
            T.writes()
            # small constant-size buffers: stack allocas that LLVM keeps in
            # registers (scope "local" would become heap workspace on the CPU)
            rows = T.sblock_alloc_buffer((4,), "int32")
            acc = T.sblock_alloc_buffer((4, V), dtype)
            sums = T.sblock_alloc_buffer((V,), dtype)
            d = T.sblock_alloc_buffer((4,), dtype)
            hl: T.let = shapes[l, 0]
            wl: T.let = shapes[l, 1]
            if prefetch > 0 and far and q + ahead < Q:
                # only an address: the position in plain float arithmetic, the cell clamped into
                # the level and each row into [0, K), in int64 so that no level_start_index
                # wraps it (always in bounds; a corner past the level's edge prefetches a
                # neighbouring row)
                hn: T.let = loc[b, q + ahead, h, l, p, 1] * T.Cast(dtype, hl) - T.Cast(dtype, 0.5)
                wn: T.let = loc[b, q + ahead, h, l, p, 0] * T.Cast(dtype, wl) - T.Cast(dtype, 0.5)
                yn: T.let = T.Cast("int32", T.max(T.min(hn, T.Cast(dtype, hl - 1)), zero))
                xn: T.let = T.Cast("int32", T.max(T.min(wn, T.Cast(dtype, wl - 1)), zero))
                rn00: T.let = T.Cast("int64", lsi[l]) + T.Cast("int64", yn * wl + xn)
                for k in T.unroll(4):
                    rn: T.let = T.Cast("int32", T.max(T.min(rn00 + T.Cast("int64", k // 2 * wl + k % 2),
                                                            T.Cast("int64", K - 1)), T.int64(0))) * scale + offset
                    # one prefetch per 16 words, and the last word's line when a row need not
                    # start on one (in place: numpy rows start 16 bytes in; or C % 16 != 0)
                    for e in range((C + 15) // 16):
                        T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(vbuf[rn, e * 16]), 0, 2, 1))
                        T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(gbuf[rn, e * 16]), 1, 2, 1))
                    if not private or C % 16 != 0:
                        T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(vbuf[rn, C - 1]), 0, 2, 1))
                        T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(gbuf[rn, C - 1]), 1, 2, 1))
            # the sample's cell, rows and weights from its query block (block_corners)
            if cells[5][p, i] > 0:
                lh: T.let = cells[2][p, i]
                lw: T.let = cells[3][p, i]
                a: T.let = cells[4][p, i]
                for k in T.unroll(4):
                    rows[k] = cells[0][p, k, i]
                    if not whole_vectors:
                        d[k] = zero
                    for j in T.vectorized(V):
                        acc[k, j] = zero
                for k in T.unroll(4):
                    if rows[k] >= 0:
                        row: T.let = rows[k] * scale + offset
                        wa: T.let = cells[1][p, k, i]
                        for c0 in range(C // V):
                            for j in T.vectorized(V):
                                acc[k, j] = acc[k, j] + gout[b, q, h, c0 * V + j] * vbuf[row, c0 * V + j]
                            for j in T.vectorized(V):
                                gbuf[row, c0 * V + j] = gbuf[row, c0 * V + j] + wa * gout[b, q, h, c0 * V + j]
                        for c in range(C % V):
                            cc: T.let = C // V * V + c
                            d[k] = d[k] + gout[b, q, h, cc] * vbuf[row, cc]
                            gbuf[row, cc] = gbuf[row, cc] + wa * gout[b, q, h, cc]
                # the four corners' lane sums at once (acc rows of unused corners stay 0)
                sums[T.Ramp(0, 1, V)] = _four_lane_sums(acc, V)
                for k in T.unroll(4):
                    if whole_vectors:
                        d[k] = sums[k * (V // 4)]
                    else:
                        d[k] = d[k] + sums[k * (V // 4)]
                # d_k = 0 for unused corners; the reference's sums regrouped per corner
                gattn[b, q, h, l, p] = ((one - lh) * ((one - lw) * d[0] + lw * d[1])
                                        + lh * ((one - lw) * d[2] + lw * d[3]))
                gloc[b, q, h, l, p, 0] = T.Cast(dtype, wl) * a * ((one - lh) * (d[1] - d[0]) + lh * (d[3] - d[2]))
                gloc[b, q, h, l, p, 1] = T.Cast(dtype, hl) * a * ((one - lw) * (d[2] - d[0]) + lw * (d[3] - d[1]))
            else:
                gattn[b, q, h, l, p] = zero
                gloc[b, q, h, l, p, 0] = zero
                gloc[b, q, h, l, p, 1] = zero


    @T.macro
    def samples(vbuf, gbuf, scale, offset, shapes, lsi, loc, attn, gout, gloc, gattn, cells, b, h, K, Q, L, P, C, H,
                flat):
        # every sample of the (b, h) slice, level by level, then in (q, p) order: while on a
        # level only its rows are touched (BEVFormer's three smaller levels fit in L2). A
        # grad_value row belongs to one level, so it gets its contributions in the same (q, p)
        # order as in a (q, l, p) walk: the same bits. Slice row r is row r*scale + offset
        # of vbuf / gbuf. The queries go in blocks of QB: the block's cells, rows and weights
        # first (block_corners, the queries in vector lanes), then its samples.
        ahead: T.let = queries_ahead(prefetch, P)
        for l in range(L):
            # corner rows are prefetched only on levels whose value + gradient rows exceed
            # near_kb (a smaller one stays in the caches once touched)
            far: T.let = T.Cast("int64", shapes[l, 0]) * T.Cast("int64", shapes[l, 1]) * (C * 2 * EL) > near_kb * 1024
            for q0 in range((Q + QB - 1) // QB):
                for p in range(P):
                    block_corners(shapes, lsi, loc, attn, cells, b, h, K, Q, l, p, q0 * QB, p)
                for i in range(T.min(QB, Q - q0 * QB)):
                    q: T.let = q0 * QB + i
                    with T.sblock("query"):
                        T.reads()
                        T.writes()
                        if prefetch > 0 and q + 2 * ahead < Q:
                            # the rows of (query q + 2 * ahead, level l): its locations (read by
                            # one_sample to prefetch that query's corner rows, so they must not
                            # miss), weights, gradient, and the output rows it writes; a query's
                            # rows are H rows apart, 1-2 KB in BEVFormer, which the hardware
                            # prefetchers did not follow (the location loads were the kernel's
                            # hottest spot)
                            qa: T.let = (b * Q + q + 2 * ahead) * H + h
                            prefetch_words(lambda w: flat[0][(qa * L + l) * P * 2 + w], P * 2, 0)
                            prefetch_words(lambda w: flat[3][(qa * L + l) * P * 2 + w], P * 2, 1)
                            prefetch_words(lambda w: flat[1][(qa * L + l) * P + w], P, 0)
                            prefetch_words(lambda w: flat[4][(qa * L + l) * P + w], P, 1)
                            prefetch_words(lambda w: flat[2][qa * C + w], C, 0)
                        for p in range(P):
                            one_sample(vbuf, gbuf, scale, offset, shapes, lsi, loc, gout, gloc, gattn, cells, b, h, K,
                                       Q, L, P, C, ahead, far, q, l, p, i)

    @T.prim_func(s_tir=True)
    def backward(value_h: T.handle, shapes_h: T.handle, lsi_h: T.handle, loc_h: T.handle,
                 attn_h: T.handle, gout_h: T.handle, gv_h: T.handle, gloc_h: T.handle,
                 gattn_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, K, H, L, Q, P = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        C = T.meta_var(channel_count)
        value = T.match_buffer(value_h, (B, K, H, C), dtype, align=EL)
        shapes = T.match_buffer(shapes_h, (L, 2), "int32", align=EL)
        lsi = T.match_buffer(lsi_h, (L,), "int32", align=EL)
        loc = T.match_buffer(loc_h, (B, Q, H, L, P, 2), dtype, align=EL)
        attn = T.match_buffer(attn_h, (B, Q, H, L, P), dtype, align=EL)
        gout = T.match_buffer(gout_h, (B, Q, H, C), dtype, align=EL)
        gv = T.match_buffer(gv_h, (B, K, H, C), dtype, align=EL)
        gloc = T.match_buffer(gloc_h, (B, Q, H, L, P, 2), dtype, align=EL)
        gattn = T.match_buffer(gattn_h, (B, Q, H, L, P), dtype, align=EL)
        # flat views of the per-query inputs and outputs, for the prefetches
        flat = T.meta_var([T.decl_buffer((B * Q * H * L * P * 2,), dtype, data=loc.data, align=EL),
                           T.decl_buffer((B * Q * H * L * P,), dtype, data=attn.data, align=EL),
                           T.decl_buffer((B * Q * H * C,), dtype, data=gout.data, align=EL),
                           T.decl_buffer((B * Q * H * L * P * 2,), dtype, data=gloc.data, align=EL),
                           T.decl_buffer((B * Q * H * L * P,), dtype, data=gattn.data, align=EL)])
        value_rows = T.decl_buffer((B * K * H, C), dtype, data=value.data, align=EL)
        gv_rows = T.decl_buffer((B * K * H, C), dtype, data=gv.data, align=EL)
        gv_flat = T.decl_buffer((B * K * H * C,), dtype, data=gv.data, align=EL)
        value_flat = T.decl_buffer((B * K * H * C,), dtype, data=value.data, align=EL)
        # slices are handed out one at a time (task_queue): a slower core takes fewer
        next_slice = T.alloc_buffer((1,), "int32")
        next_slice[0] = 0
        if not private:
            for i in range(B * K * H * C % V):  # the fill's tail
                gv_flat[B * K * H * C // V * V + i] = zero
        # one parallel launch: grad_value's fill, a barrier, the slices (torch callers' sleeping
        # workers are woken once: docs/kernels/ms_deform_attn_backward.md)
        with T.attr(0, LAUNCH_POINT, 1):
            if not private:
                # grad_value is contiguous: one flat fill (per row, a symbolic C became a
                # memset call per 128-byte row)
                with T.attr(0, BARRIER, 1):
                    for i in T.parallel(B * K * H * C // V):
                        for j in T.vectorized(V):
                            gv_flat[i * V + j] = zero
            for _worker in T.parallel(task_queue.WORKERS, annotations=task_queue.worker_annotations()):
                with T.sblock("worker"):
                    T.reads()
                    T.writes()
                    bh = T.sblock_alloc_buffer((1,), "int32")
                    bh[0] = task_queue.next_task(next_slice)
                    while bh[0] < B * H:
                        with T.sblock("slice"):
                            # opaque: nothing schedules these blocks (they only scope the workspaces)
                            T.reads()
                            T.writes()
                            b: T.let = bh[0] // H
                            h: T.let = bh[0] % H
                            # a query block's cells (block_corners), slot p: rows, weights * attention,
                            # lh, lw, attention, 1 where the sample passes the validity test
                            cells = T.meta_var([T.sblock_alloc_buffer((P, 4, QB), "int32"),
                                                T.sblock_alloc_buffer((P, 4, QB), dtype),
                                                T.sblock_alloc_buffer((P, QB), dtype),
                                                T.sblock_alloc_buffer((P, QB), dtype),
                                                T.sblock_alloc_buffer((P, QB), dtype),
                                                T.sblock_alloc_buffer((P, QB), "int32")])
                            if private:
                                vbuf = T.sblock_alloc_buffer((K, C), dtype)
                                gbuf = T.sblock_alloc_buffer((K, C), dtype)
                                for r in range(K):
                                    # the slice's rows are H rows apart: prefetching them (here and in
                                    # the write-back) beat leaving the strided stream to the hardware
                                    if r + SLICE_ROWS_AHEAD < K:
                                        ahead_row = T.meta_var(((b * K + r + SLICE_ROWS_AHEAD) * H + h) * C)
                                        prefetch_words(lambda w: value_flat[ahead_row + w], C, 0)
                                    for c0 in range(C // V):
                                        for j in T.vectorized(V):
                                            vbuf[r, c0 * V + j] = value[b, r, h, c0 * V + j]
                                            gbuf[r, c0 * V + j] = zero
                                    for c in range(C % V):
                                        vbuf[r, C // V * V + c] = value[b, r, h, C // V * V + c]
                                        gbuf[r, C // V * V + c] = zero
                                samples(vbuf, gbuf, 1, 0, shapes, lsi, loc, attn, gout, gloc, gattn, cells, b, h, K, Q,
                                        L, P, C, H, flat)
                                for r in range(K):
                                    if r + SLICE_ROWS_AHEAD < K:
                                        ahead_row = T.meta_var(((b * K + r + SLICE_ROWS_AHEAD) * H + h) * C)
                                        prefetch_words(lambda w: gv_flat[ahead_row + w], C, 1)
                                    for c0 in range(C // V):
                                        for j in T.vectorized(V):
                                            gv[b, r, h, c0 * V + j] = gbuf[r, c0 * V + j]
                                    for c in range(C % V):
                                        gv[b, r, h, C // V * V + c] = gbuf[r, C // V * V + c]
                            else:
                                samples(value_rows, gv_rows, H, b * K * H + h, shapes, lsi, loc, attn, gout, gloc,
                                        gattn, cells, b, h, K, Q, L, P, C, H, flat)
                        bh[0] = task_queue.next_task(next_slice)

    return backward
