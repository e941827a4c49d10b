"""Channels-last rows from channels-first memory, on the CPU.

An input the kernels read as [B, ..., C] rows sometimes arrives as a channels-last view of
channels-first memory: the gradient of a permuted output (voxel_pooling's [B, C, Y, X]
view of its [B, Y, X, C] result). A generic copy of such a view walks one side a whole
plane apart per element (torch's permute-copy of voxel_pooling's [2, 80, 128, 128]
gradient: 4-8 ms). `to_channels_last` rewrites [B, C, P] as [B, P, C] in squares of lanes x
lanes transposed in registers (lane_transpose.py): each square reads `lanes` rows of
`lanes` consecutive positions (whole vectors) and writes `lanes` rows of `lanes` channels.
A task (a batch's run of CHUNK positions) walks one block of `lanes` channels over the
whole run before the next: `lanes` source rows stream at a time, which the hardware
prefetchers follow (all C rows advancing together, square by square, ran 2-3x slower from
memory). Written in its scheduled form for the reason lane_transpose.py gives: no schedule
primitive emits lane shuffles. The last P % lanes positions and C % lanes channels are
copied element by element.

The same kernel turns [N, P, C] rows into channels-first [N, C, P] memory (read with P as its
C and C as its P): border_align_backward writes an NCHW map's gradient so (a channels-first
out=).
"""

from __future__ import annotations

import numpy as np

from .point_vectors import scratch_scope

CHUNK = 1024  # positions per parallel task (4 KB of each source row)


def is_channels_first_view(info) -> bool:
    """Whether a checked input (checks.TensorInfo) of shape [B, *plane, C] is a channels-last
    view of contiguous [B, C, *plane] memory: what a permuted output's gradient is."""
    if info.ready or len(info.shape) < 3:
        return False
    value = info.value
    if isinstance(value, np.ndarray):
        if not (value.dtype.isnative and value.flags.writeable):
            return False
        strides = tuple(s // value.itemsize for s in value.strides)
    else:
        strides = tuple(value.stride())
    batch, *plane, channels = info.shape
    expected, step = [], 1
    for size in reversed(plane):  # the plane's dims contiguous, the last fastest
        expected.insert(0, step)
        step *= size
    expected = [channels * step, *expected, step]
    # sizes of 1 may carry any stride; only the others must match
    return all(size == 1 or stride == want for size, stride, want in zip(info.shape, strides, expected))


def channels_first(value):
    """The contiguous [B, C, P] memory behind a channels-first view [B, *plane, C] (no copy)."""
    batch, channels = value.shape[0], value.shape[-1]
    order = (0, value.ndim - 1, *range(1, value.ndim - 1))
    if isinstance(value, np.ndarray):
        return value.transpose(order).reshape(batch, channels, -1)  # contiguous once transposed: a view
    return value.permute(order).reshape(batch, channels, -1)


def rewritten(to_channels_last, value, rows):
    """`rows` (contiguous, of value's shape [B, *plane, C]) filled by the to_channels_last
    kernel from the channels-first view `value`, and returned: the same values, channels last."""
    to_channels_last(channels_first(value), rows.reshape(value.shape[0], -1, value.shape[-1]))
    return rows


def to_channels_last_compute(dtype: str, lanes: int):
    """src [B, C, P] -> dst [B, P, C] of one dtype: whole squares through registers, the edges
    element by element; a task per (batch, CHUNK positions)."""
    # imported here: the call path reads this module's host functions without TVM
    from tvm.script import tirx as T

    from .lane_transpose import transpose_macro

    transpose = transpose_macro(lanes)
    scratch = scratch_scope("llvm")
    V = lanes
    EL = np.dtype(dtype).itemsize

    @T.prim_func(s_tir=True)
    def to_channels_last(src_h: T.handle, dst_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, C, P = T.int32(), T.int32(), T.int32()
        src = T.match_buffer(src_h, (B, C, P), dtype, align=EL)
        dst = T.match_buffer(dst_h, (B, P, C), dtype, align=EL)
        for task in T.parallel(B * T.ceildiv(P, CHUNK)):
            x_lo = T.alloc_buffer((V // 2, V), "float32", scope=scratch)
            x_hi = T.alloc_buffer((V // 2, V), "float32", scope=scratch)
            y_lo = T.alloc_buffer((V // 2, V), "float32", scope=scratch)
            y_hi = T.alloc_buffer((V // 2, V), "float32", scope=scratch)
            b = T.Bind(task // T.ceildiv(P, CHUNK))
            first = T.Bind(task % T.ceildiv(P, CHUNK) * CHUNK)
            size = T.Bind(T.min(CHUNK, P - first))
            for c0 in range(C // V):
                for square in range(size // V):
                    transpose(src, (b, c0 * V, first + square * V), dst, (b, first + square * V, c0 * V),
                              x_lo, x_hi, y_lo, y_hi)
            for p in range(size):  # the last C % V channels of every position
                for c in range(C % V):
                    dst[b, first + p, C // V * V + c] = src[b, C // V * V + c, first + p]
            for p in range(size % V):  # the last size % V positions, their whole channel vectors
                for c in range(C // V * V):
                    dst[b, first + size // V * V + p, c] = src[b, c, first + size // V * V + p]

    return to_channels_last
