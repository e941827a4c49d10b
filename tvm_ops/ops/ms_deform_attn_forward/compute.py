"""Kernels of ms_deform_attn_forward: a hand-written CPU loop nest and the TensorIR compute.

The CPU kernel (`cpu_forward_compute`) is TensorIR written in its scheduled form, not a
compute plus a schedule: it works on blocks of queries, first every corner's row and weight
of the block with the queries in vector lanes (the last block's spare lanes recompute the
last query and are never used), then each query's gather. Those clamped spare lanes have no
compute form over [0, Q); the same compute scheduled that way (sample and corner blocks at
the query block) keeps the tail's predicate, which TVM's vectoriser scalarises and LLVM
vectorises with gathers of the level tables, ~1.7x slower (docs/kernels/
ms_deform_attn_forward.md). It is portable as written (llvm.fma, the target's vector
width), so it needs no fallback. CUDA schedules the compute below (schedule.py).

The compute (`forward_compute`):

    sample[b, q, h, l, p]     the sample's cell (y0, x0) and offsets (lh, lw), or SKIPPED
    corner[b, q, h, l, p, k]  row and weight (bilinear weight * attention) of corner k of
                              the sample, from its cell: together the sampling rule both
                              directions share (ops/ms_deform_attn_sampling.py)
    term[b, q, h, c, l, p, k] weight * value[b, row, h, c] of corner k, 0 for an unused
                              corner (row -1, not loaded)
    output[b, q, h, c]        sum over (l, p, k) of the terms

Each output element is written by one iteration of its spatial loops, so every schedule is
a gather without atomics, and the sum runs in (l, p, k) order on every target: the same
bits wherever the tasks run. `channels` compiles C in (None: symbolic).

The position, its floor and the validity test run once per sample (the sample block), the
rest per corner: TensorIR's compute_at cannot place a block that writes a constant [0:4]
region (all four corners at once) at the consumer's point loop, so corners stay a block
each, and the sample block writes one buffer per value for the same reason. The terms are
a block of their own so that a schedule can load a sample's four corners before it adds any
(CUDA: their loads no longer wait for each other's adds).
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from ..ms_deform_attn_sampling import block_corners_macro, cell_macro, corner_of_cell_macro


def forward_compute(dtype: str, position, channels: int | None = None):
    """The forward with sampling positions by `position` (CUDA: cuda_fma_position)."""
    zero = tirx.const(0, dtype)
    cell = cell_macro(dtype, position)
    corner = corner_of_cell_macro(dtype)
    channel_count = tirx.Var("C", "int32") if channels is None else tirx.IntImm("int32", channels)
    # element alignment only: the kernels take any contiguous numpy / torch view
    EL = np.dtype(dtype).itemsize

    @T.prim_func(s_tir=True)
    def forward(value_h: T.handle, shapes_h: T.handle, lsi_h: T.handle, loc_h: T.handle,
                attn_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, K, H, L, Q, P = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        C = T.meta_var(channel_count)
        value = T.match_buffer(value_h, (B, K, H, C), dtype, align=EL)
        shapes = T.match_buffer(shapes_h, (L, 2), "int32", align=4)
        lsi = T.match_buffer(lsi_h, (L,), "int32", align=4)
        loc = T.match_buffer(loc_h, (B, Q, H, L, P, 2), dtype, align=EL)
        attn = T.match_buffer(attn_h, (B, Q, H, L, P), dtype, align=EL)
        out = T.match_buffer(out_h, (B, Q, H, C), dtype, align=EL)
        y0s = T.sblock_alloc_buffer((B, Q, H, L, P), "int32")
        x0s = T.sblock_alloc_buffer((B, Q, H, L, P), "int32")
        lhs = T.sblock_alloc_buffer((B, Q, H, L, P), dtype)
        lws = T.sblock_alloc_buffer((B, Q, H, L, P), dtype)
        rows = T.sblock_alloc_buffer((B, Q, H, L, P, 4), "int32")
        weight = T.sblock_alloc_buffer((B, Q, H, L, P, 4), dtype)
        terms = T.sblock_alloc_buffer((B, Q, H, C, L, P, 4), dtype)
        for b, q, h, l, p in T.grid(B, Q, H, L, P):
            with T.sblock("sample"):
                vb, vq, vh, vl, vp = T.axis.remap("SSSSS", [b, q, h, l, p])
                T.reads(shapes[vl, 0:2], loc[vb, vq, vh, vl, vp, 0:2])
                T.writes(y0s[vb, vq, vh, vl, vp], x0s[vb, vq, vh, vl, vp], lhs[vb, vq, vh, vl, vp],
                         lws[vb, vq, vh, vl, vp])
                cell(shapes, loc, y0s, x0s, lhs, lws, vb, vq, vh, vl, vp)
        for b, q, h, l, p, k in T.grid(B, Q, H, L, P, 4):
            with T.sblock("corner"):
                vb, vq, vh, vl, vp, vk = T.axis.remap("SSSSSS", [b, q, h, l, p, k])
                T.reads(shapes[vl, 0:2], lsi[vl], y0s[vb, vq, vh, vl, vp], x0s[vb, vq, vh, vl, vp],
                        lhs[vb, vq, vh, vl, vp], lws[vb, vq, vh, vl, vp], attn[vb, vq, vh, vl, vp])
                T.writes(rows[vb, vq, vh, vl, vp, vk], weight[vb, vq, vh, vl, vp, vk])
                corner(shapes, lsi, y0s, x0s, lhs, lws, rows, weight, vb, vq, vh, vl, vp, vk, K)
                weight[vb, vq, vh, vl, vp, vk] = weight[vb, vq, vh, vl, vp, vk] * attn[vb, vq, vh, vl, vp]
        for b, q, h, c, l, p, k in T.grid(B, Q, H, C, L, P, 4):
            with T.sblock("term"):
                # corner k's term of the sum: the load only for a used corner (r is -1
                # otherwise); a block of its own so that a schedule can load a sample's four
                # corners before it adds any
                vb, vq, vh, vc, vl, vp, vk = T.axis.remap("SSSSSSS", [b, q, h, c, l, p, k])
                T.reads(rows[vb, vq, vh, vl, vp, vk], weight[vb, vq, vh, vl, vp, vk], value[vb, 0:K, vh, vc])
                T.writes(terms[vb, vq, vh, vc, vl, vp, vk])
                r: T.let = rows[vb, vq, vh, vl, vp, vk]
                terms[vb, vq, vh, vc, vl, vp, vk] = T.if_then_else(
                    r >= 0, weight[vb, vq, vh, vl, vp, vk] * value[vb, T.max(r, 0), vh, vc], zero)
        for b, q, h, c, l, p, k in T.grid(B, Q, H, C, L, P, 4):
            with T.sblock("output"):
                vb, vq, vh, vc, vl, vp, vk = T.axis.remap("SSSSRRR", [b, q, h, c, l, p, k])
                T.reads(terms[vb, vq, vh, vc, vl, vp, vk])
                T.writes(out[vb, vq, vh, vc])
                with T.init():
                    out[vb, vq, vh, vc] = zero
                out[vb, vq, vh, vc] = out[vb, vq, vh, vc] + terms[vb, vq, vh, vc, vl, vp, vk]

    return forward


def cpu_forward_compute(dtype: str, lanes: int, private: bool, query_block: int, channels: int | None = None):
    """The CPU kernel, written in its scheduled form (see the module docstring).

    Task = one (b, h) slice (parallel over B*H), its queries in blocks of `query_block`.
    Per block: every (level, point, corner) of its queries gets its row (-1: unused) and
    weight (bilinear weight * attention), the queries in vector lanes and the sampling rule
    branch-free (the backward's rule: strict validity test, per-corner validity, rows in
    int64 checked against [0, K)); then each query sums its used corners' rows in (l, p, k)
    order, the channels in vectors, only used corners loaded (a select with zero would add
    0.0 on every corner: no FMA, a longer dependency chain). Rows are addressed through a
    2-D [rows, C] view: row r of the (b, h) slice is row (b*K + r)*H + h of `value`, or row
    r of the private copy.

    private: the task first copies its value slice into a contiguous [K, C] workspace (pays
    off when a slice receives many samples: BEVFormer). channels: C as a constant (None:
    symbolic); the output row then sums in registers, otherwise in place.
    """
    V, QB = lanes, query_block
    EL = np.dtype(dtype).itemsize
    zero = tirx.const(0, dtype)
    channel_count = tirx.Var("C", "int32") if channels is None else tirx.IntImm("int32", channels)
    block_corners = block_corners_macro(dtype, QB, gradients=False)

    @T.macro
    def block_gathers(vbuf, scale, offset, rows, weights, out, b, h, Q, L, P, C, q0):
        for i in range(T.min(QB, Q - q0)):
            with T.sblock("query"):
                T.reads()
                T.writes()
                if channels is not None:
                    # a small constant-size buffer: a stack alloca that LLVM keeps in registers
                    acc = T.sblock_alloc_buffer((C,), dtype)
                    for c in T.vectorized(C):
                        acc[c] = zero
                    for s, k in T.grid(L * P, 4):
                        if rows[s, k, i] >= 0:
                            row: T.let = rows[s, k, i] * scale + offset
                            for c in T.vectorized(C):
                                acc[c] = acc[c] + weights[s, k, i] * vbuf[row, c]
                    for c in T.vectorized(C):
                        out[b, q0 + i, h, c] = acc[c]
                else:
                    for c in range(C):
                        out[b, q0 + i, h, c] = zero
                    for s, k in T.grid(L * P, 4):
                        if rows[s, k, i] >= 0:
                            row: T.let = rows[s, k, i] * scale + offset
                            for c0 in range(C // V):
                                for j in T.vectorized(V):
                                    out[b, q0 + i, h, c0 * V + j] = (out[b, q0 + i, h, c0 * V + j]
                                                                      + weights[s, k, i] * vbuf[row, c0 * V + j])
                            for c in range(C % V):
                                out[b, q0 + i, h, C // V * V + c] = (out[b, q0 + i, h, C // V * V + c]
                                                                      + weights[s, k, i] * vbuf[row, C // V * V + c])

    @T.macro
    def slice_blocks(vbuf, scale, offset, shapes, lsi, loc, attn, rows, weights, out, b, h, K, Q, L, P, C):
        for q0 in range((Q + QB - 1) // QB):
            for l, p in T.grid(L, P):
                block_corners(shapes, lsi, loc, attn, [rows, weights], b, h, K, Q, l, p, q0 * QB, l * P + p)
            block_gathers(vbuf, scale, offset, rows, weights, out, b, h, Q, L, P, C, q0 * QB)

    @T.macro
    def one_slice(value, value_rows, shapes, lsi, loc, attn, out, bh, K, H, Q, L, P, C):
        with T.sblock("slice"):
            # opaque: nothing schedules these blocks (they only scope the workspaces)
            T.reads()
            T.writes()
            b: T.let = bh // H
            h: T.let = bh % H
            # slot l * P + p: the block's rows and weights of (level l, point p)
            rows = T.sblock_alloc_buffer((L * P, 4, QB), "int32")
            weights = T.sblock_alloc_buffer((L * P, 4, QB), dtype)
            if private:
                vbuf = T.sblock_alloc_buffer((K, C), dtype)
                for r in range(K):
                    if channels is not None:
                        for c in T.vectorized(C):
                            vbuf[r, c] = value[b, r, h, c]
                    else:
                        for c in range(C):
                            vbuf[r, c] = value[b, r, h, c]
                slice_blocks(vbuf, 1, 0, shapes, lsi, loc, attn, rows, weights, out, b, h, K, Q, L, P, C)
            else:
                slice_blocks(value_rows, H, b * K * H + h, shapes, lsi, loc, attn, rows, weights, out, b, h, K, Q, L,
                             P, C)

    @T.prim_func(s_tir=True)
    def forward(value_h: T.handle, shapes_h: T.handle, lsi_h: T.handle, loc_h: T.handle,
                attn_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, K, H, L, Q, P = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        C = T.meta_var(channel_count)
        value = T.match_buffer(value_h, (B, K, H, C), dtype, align=EL)
        shapes = T.match_buffer(shapes_h, (L, 2), "int32", align=4)
        lsi = T.match_buffer(lsi_h, (L,), "int32", align=4)
        loc = T.match_buffer(loc_h, (B, Q, H, L, P, 2), dtype, align=EL)
        attn = T.match_buffer(attn_h, (B, Q, H, L, P), dtype, align=EL)
        out = T.match_buffer(out_h, (B, Q, H, C), dtype, align=EL)
        value_rows = T.decl_buffer((B * K * H, C), dtype, data=value.data, align=EL)
        for bh in T.parallel(B * H):
            one_slice(value, value_rows, shapes, lsi, loc, attn, out, bh, K, H, Q, L, P, C)

    return forward
