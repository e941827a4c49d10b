"""TensorIR compute of border_align_forward: a sample block and a max reduction.

    position[n, k, s, i, a]     where sample i of border s of box k lies (a = 0: x, 1: y)
    sample[n, k, s, i]          the four corner cells and bilinear weights of sample i of
                                border s of box k (sample rule: ops/border_align_sampling.py;
                                bilinear rule: docs/semantics.md), weights 0 for a sample
                                outside [-1, H] x [-1, W]
    border[n, k, s, i, c]       best = the max over i of the sample's value, argmax_idx = its
                                first i (sample 0 starts, a strictly greater value replaces:
                                mmcv's rule, NaN included), in float32
    output[n, k, s, c]          best rounded to the input dtype

Channels (`part`): "all" loops c over [0, C) (CUDA); on the CPU "main" covers the
C // V * V channels of whole V-lane vectors, "tail" the last V channels and "small" a C
below V (a split with a symbolic extent keeps a predicate, and a predicated vector loop
becomes scalar code, so the parts are kernels without one where they can be).
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from ..border_align_sampling import sample_xy


def _channel_loops(part: str, C, V: int):
    """(the two channel loops' extents, the channel of loop values (co, ci), whether (co, ci)
    is one) of a part. "tail" is the last V channels as one vector (C >= V): it recomputes
    channels "main" already wrote, with the same arithmetic per lane, so the same bits;
    "small" (C < V) loops over V with a predicate: scalar code, but registers of a constant
    size (a symbolic C % V would make them a heap workspace per border)."""
    if part == "all":
        return (1, C), lambda co, ci: ci, lambda co, ci: True
    if part == "main":
        return (C // V, V), lambda co, ci: co * V + ci, lambda co, ci: True
    if part == "tail":
        return (1, V), lambda co, ci: C - V + ci, lambda co, ci: True
    return (1, V), lambda co, ci: ci, lambda co, ci: ci < C


def forward_compute(dtype: str, part: str = "all", lanes: int = 1):
    EL = np.dtype(dtype).itemsize
    minus_inf = tirx.const(float("-inf"), "float32")
    zero, one = tirx.const(0, "float32"), tirx.const(1, "float32")

    @T.prim_func(s_tir=True)
    def border(input_h: T.handle, boxes_h: T.handle, out_h: T.handle, argmax_h: T.handle, pool_size: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, H, W, Q, K, C = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        feat = T.match_buffer(input_h, (N, H, W, Q), dtype, align=EL)
        boxes = T.match_buffer(boxes_h, (N, K, 4), dtype, align=EL)
        out = T.match_buffer(out_h, (N, K, 4, C), dtype, align=EL)
        argmax = T.match_buffer(argmax_h, (N, K, 4, C), "int32", align=4)
        cells = T.sblock_alloc_buffer((N, K, 4, pool_size + 1, 4), "int32")  # y_low, x_low, y_high, x_high
        weights = T.sblock_alloc_buffer((N, K, 4, pool_size + 1, 4), "float32")
        position = T.sblock_alloc_buffer((N, K, 4, pool_size + 1, 2), "float32")  # x, y
        best = T.sblock_alloc_buffer((N, K, 4, C), "float32")
        # the sample's position, staged once for its four corner parts: inline, each part's
        # cells and weight repeated it (its float64 step included) in every subexpression,
        # and the CPU library took 11.6 s to build instead of 4.2
        for n, k, s, i, a in T.grid(N, K, 4, pool_size + 1, 2):
            with T.sblock("position"):
                vn, vk, vs, vi, va = T.axis.remap("SSSSS", [n, k, s, i, a])
                T.reads(boxes[vn, vk, 0:4])
                T.writes(position[vn, vk, vs, vi, va])
                xy = T.meta_var(sample_xy(boxes, vn, vk, vs, vi, pool_size))
                position[vn, vk, vs, vi, va] = T.Select(va == 0, xy[0], xy[1])
        for n, k, s, i, j in T.grid(N, K, 4, pool_size + 1, 4):
            with T.sblock("sample"):
                # part j of sample i: j = 0..3 the cell y_low, x_low, y_high, x_high and the
                # weight of corner (y_low, x_low), (y_low, x_high), (y_high, x_low), (y_high,
                # x_high) (one block per part: compute_at cannot place a block that writes a
                # constant [0:4] region)
                vn, vk, vs, vi, vj = T.axis.remap("SSSSS", [n, k, s, i, j])
                T.reads(position[vn, vk, vs, vi, 0:2])
                T.writes(cells[vn, vk, vs, vi, vj], weights[vn, vk, vs, vi, vj])
                x: T.let = position[vn, vk, vs, vi, 0]
                y: T.let = position[vn, vk, vs, vi, 1]
                # positive comparisons: a NaN position fails them (NaN boxes, inf * 0)
                inside: T.let = (y >= T.float32(-1) and y <= T.Cast("float32", H)
                                 and x >= T.float32(-1) and x <= T.Cast("float32", W))
                yc: T.let = T.Select(inside, T.max(y, zero), zero)
                xc: T.let = T.Select(inside, T.max(x, zero), zero)
                yi: T.let = T.Cast("int32", yc)
                xi: T.let = T.Cast("int32", xc)
                # on the last row / column both corners are that row / column, weight 0 above
                ly: T.let = T.Select(yi >= H - 1, zero, yc - T.Cast("float32", yi))
                lx: T.let = T.Select(xi >= W - 1, zero, xc - T.Cast("float32", xi))
                high: T.let = vj // 2
                cells[vn, vk, vs, vi, vj] = T.Select(vj % 2 == 0, T.min(yi + high, H - 1), T.min(xi + high, W - 1))
                fy: T.let = T.Select(vj < 2, one - ly, ly)
                fx: T.let = T.Select(vj % 2 == 0, one - lx, lx)
                weights[vn, vk, vs, vi, vj] = T.Select(inside, fy * fx, zero)
        extents, channel, used = T.meta_var(_channel_loops(part, C, lanes))
        for n, k, s, i, co, ci in T.grid(N, K, 4, pool_size + 1, extents[0], extents[1]):
            with T.sblock("border"):
                vn, vk, vs, vi = T.axis.remap("SSSR", [n, k, s, i])
                vc = T.axis.spatial(C, channel(co, ci))
                T.where(used(co, ci))
                T.reads(cells[vn, vk, vs, vi, 0:4], weights[vn, vk, vs, vi, 0:4], feat[vn, 0:H, 0:W, vs * C + vc],
                        best[vn, vk, vs, vc], argmax[vn, vk, vs, vc])
                T.writes(best[vn, vk, vs, vc], argmax[vn, vk, vs, vc])
                with T.init():
                    best[vn, vk, vs, vc] = minus_inf
                    argmax[vn, vk, vs, vc] = 0
                yl: T.let = cells[vn, vk, vs, vi, 0]
                xl: T.let = cells[vn, vk, vs, vi, 1]
                yh: T.let = cells[vn, vk, vs, vi, 2]
                xh: T.let = cells[vn, vk, vs, vi, 3]
                q: T.let = vs * C + vc
                # a sample outside the map is 0 whatever the map holds (0 * inf would be NaN)
                value: T.let = T.Select(
                    weights[vn, vk, vs, vi, 0] + weights[vn, vk, vs, vi, 1] + weights[vn, vk, vs, vi, 2]
                    + weights[vn, vk, vs, vi, 3] > zero,
                    weights[vn, vk, vs, vi, 0] * T.Cast("float32", feat[vn, yl, xl, q])
                    + weights[vn, vk, vs, vi, 1] * T.Cast("float32", feat[vn, yl, xh, q])
                    + weights[vn, vk, vs, vi, 2] * T.Cast("float32", feat[vn, yh, xl, q])
                    + weights[vn, vk, vs, vi, 3] * T.Cast("float32", feat[vn, yh, xh, q]), zero)
                # sample 0 starts (even at NaN), a strictly greater value replaces (an inlined
                # expression: LLVM codegen cannot bind a let of a bool vector)
                take = T.meta_var(vi == 0 or value > best[vn, vk, vs, vc])
                argmax[vn, vk, vs, vc] = T.Select(take, vi, argmax[vn, vk, vs, vc])
                best[vn, vk, vs, vc] = T.Select(take, value, best[vn, vk, vs, vc])
        for n, k, s, co, ci in T.grid(N, K, 4, extents[0], extents[1]):
            with T.sblock("output"):
                vn, vk, vs = T.axis.remap("SSS", [n, k, s])
                vc = T.axis.spatial(C, channel(co, ci))
                T.where(used(co, ci))
                T.reads(best[vn, vk, vs, vc])
                T.writes(out[vn, vk, vs, vc])
                out[vn, vk, vs, vc] = T.Cast(dtype, best[vn, vk, vs, vc])

    return border


def to_nhwc_compute(dtype: str):
    """input [N, Q, H, W] (mmcv's NCHW) -> [N, H, W, Q]: the layout the border kernels read
    (their channel vectors are contiguous there), for callers whose input is channels-first."""
    EL = np.dtype(dtype).itemsize

    @T.prim_func(s_tir=True)
    def to_nhwc(src_h: T.handle, dst_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, Q, H, W = T.int32(), T.int32(), T.int32(), T.int32()
        src = T.match_buffer(src_h, (N, Q, H, W), dtype, align=EL)
        dst = T.match_buffer(dst_h, (N, H, W, Q), dtype, align=EL)
        for n, y, x, q in T.grid(N, H, W, Q):
            with T.sblock("to_nhwc"):
                vn, vy, vx, vq = T.axis.remap("SSSS", [n, y, x, q])
                dst[vn, vy, vx, vq] = src[vn, vq, vy, vx]

    return to_nhwc
