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

from ..point_vectors import point, vectors

KERNELS = ("three_interpolate_forward", "three_interpolate_forward_small")


def _term(features, indices, weights, b, c, n, k, M):
    """weights[b, n, k] * features[b, c, indices[b, n, k]] in float32, 0 for an index outside
    [0, M): a Select, so a NaN / inf weight at such an index is dropped too (the backward's
    rule); the load's index is clamped into the row, so it never leaves `features`."""
    i = indices[b, n, k]
    value = T.Cast("float32", weights[b, n, k]) * T.Cast("float32", features[b, c, T.max(T.min(i, M - 1), 0)])
    return T.Select(tirx.all(i >= 0, i < M), value, tirx.const(0, "float32"))


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
                out[vb, vc, n] = T.Cast(dtype, _term(features, indices, weights, vb, vc, n, 0, M)
                                        + _term(features, indices, weights, vb, vc, n, 1, M)
                                        + _term(features, indices, weights, vb, vc, n, 2, M))

    return three_interpolate_forward
