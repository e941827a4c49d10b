"""Schedule recipes for three_interpolate_forward (knobs: schedules/three_interpolate_forward.yaml).

Kernels: `three_interpolate_forward` (points in vectors on the CPU; a thread per output
element on CUDA) and `three_interpolate_forward_small` (N below the vector: one point at a
time; on CUDA the same as the first, never launched)."""

from __future__ import annotations

from .compute import KERNELS


def llvm(sch, kernel, model, plan):
    """A parallel task per (batch, block of c_tile channels). It walks the points in vectors
    and, per vector, its c_tile channels (unrolled): the vector's indices and weights are
    loaded once for the channels (LLVM merges the unrolled loads), the features gathered
    from c_tile rows of M values (in L1 / L2 for the network's M), and each channel's output
    vector stored contiguously. The channel split's predicate (C % c_tile) does not depend
    on the lane, so the lane loop stays vector code."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    block = sch.get_sblock("out")
    b, c, o, v = sch.get_loops(block)
    co, ci = sch.split(c, [None, int(plan["c_tile"])])
    sch.reorder(b, co, o, ci, v)
    sch.parallel(sch.fuse(b, co))
    sch.unroll(ci)
    if kernel == "three_interpolate_forward":
        sch.vectorize(v)


def cuda(sch, kernel, model, plan):
    """A thread per output element (b, c, n), consecutive threads on consecutive points (the
    output stores coalesce); grid: point blocks x channels x batches."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    b, c, o, _v = sch.get_loops(sch.get_sblock("out"))
    blocks, threads = sch.split(o, [None, int(plan["threads"])])
    sch.bind(b, "blockIdx.z")
    sch.bind(c, "blockIdx.y")
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")
