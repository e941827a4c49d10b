"""TensorIR compute of three_nn: a block per (batch, vector of V points) whose body scans
the known points with the vector's running top-3 in registers.

    nn[b, o]   points n = min(o*V, N - V) + v, v < V (ops/point_vectors.py): the squared
               distances to known[b, m] for m = 0..M-1 in order, the three smallest kept in
               float32 with their indices; written to dist2[b, n, :], idx[b, n, :]

The top-3 is not a TensorIR reduction (three values and three indices per point, updated
together), so the scan is a serial loop in the block's body and the schedules place the
blocks (CPU: parallel tasks; CUDA: a thread each, V = 1). The lane loop is written in the
body, vectorised there, inside the scan: a known point is loaded once and broadcast to the
V lanes. (A block per lane, vectorised by the schedule, does not work: TVM compacts the
block's [3, V] state to the block's own lane and allocates it outside the vector loop,
one scalar slot that every lane then writes.)

The update is branch-free selects (a vector of points takes different branches): with
c_k = d < best_k (strictly smaller: an equal distance never displaces an earlier index,
mmcv's rule; a NaN distance compares false and never ranks), slot 2 takes best_1 if c_1,
else d if c_2; slot 1 takes best_0 if c_0, else d if c_1; slot 0 takes d if c_0. Slots are
written 2, 1, 0 so each reads the lower slots' old values. The conditions are inlined
expressions (LLVM codegen cannot bind a let of a bool vector; LLVM merges the repeats).
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from ..point_vectors import point, scratch_scope, vectors

NO_INDEX = -1  # the index of a slot no known point reached (NaN / inf distances only)


def nn_compute(dtype: str, lanes: int, kind: str):
    """The kernel for one input dtype; `lanes` points per vector (1: one at a time); `kind`
    the target's (llvm, cuda)."""
    EL = np.dtype(dtype).itemsize
    scratch = scratch_scope(kind)
    f32 = "float32"
    inf = tirx.const(float("inf"), f32)

    @T.prim_func(s_tir=True)
    def three_nn(unknown_h: T.handle, known_h: T.handle, dist2_h: T.handle, idx_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, N, M = T.int32(), T.int32(), T.int32()
        unknown = T.match_buffer(unknown_h, (B, N, 3), dtype, align=EL)
        known = T.match_buffer(known_h, (B, M, 3), dtype, align=EL)
        dist2 = T.match_buffer(dist2_h, (B, N, 3), f32, align=4)
        idx = T.match_buffer(idx_h, (B, N, 3), "int32", align=4)
        for b, o in T.grid(B, vectors(N, lanes)):
            with T.sblock("nn"):
                vb, vo = T.axis.remap("SS", [b, o])
                T.reads(unknown[vb, 0:N, 0:3], known[vb, 0:M, 0:3])
                T.writes(dist2[vb, 0:N, 0:3], idx[vb, 0:N, 0:3])
                # the vector's points and its running top-3, a lane axis each: registers
                pt = T.alloc_buffer((3, lanes), f32, scope=scratch)
                best = T.alloc_buffer((3, lanes), f32, scope=scratch)
                best_i = T.alloc_buffer((3, lanes), "int32", scope=scratch)
                for k, v in T.grid(3, lanes):
                    pt[k, v] = T.Cast(f32, unknown[vb, point(N, lanes, vo, v), k])
                    best[k, v] = inf
                    best_i[k, v] = NO_INDEX
                for m in range(M):
                    for v in T.vectorized(lanes):
                        dx: T.let = pt[0, v] - T.Cast(f32, known[vb, m, 0])
                        dy: T.let = pt[1, v] - T.Cast(f32, known[vb, m, 1])
                        dz: T.let = pt[2, v] - T.Cast(f32, known[vb, m, 2])
                        d: T.let = dx * dx + dy * dy + dz * dz
                        c0 = T.meta_var(d < best[0, v])
                        c1 = T.meta_var(d < best[1, v])
                        c2 = T.meta_var(d < best[2, v])
                        best_i[2, v] = T.Select(c1, best_i[1, v], T.Select(c2, m, best_i[2, v]))
                        best[2, v] = T.Select(c1, best[1, v], T.Select(c2, d, best[2, v]))
                        best_i[1, v] = T.Select(c0, best_i[0, v], T.Select(c1, m, best_i[1, v]))
                        best[1, v] = T.Select(c0, best[0, v], T.Select(c1, d, best[1, v]))
                        best_i[0, v] = T.Select(c0, m, best_i[0, v])
                        best[0, v] = T.Select(c0, d, best[0, v])
                for k, v in T.grid(3, lanes):
                    dist2[vb, point(N, lanes, vo, v), k] = best[k, v]
                    idx[vb, point(N, lanes, vo, v), k] = best_i[k, v]

    return three_nn
