"""Schedule recipes for three_interpolate_forward (knobs: schedules/three_interpolate_forward.yaml).

Kernels: `three_interpolate_forward` (points in vectors on the CPU; a thread per output
element on CUDA) and `three_interpolate_forward_small` (N below the vector: one point at a
time; on CUDA the same as the first, never launched)."""

from __future__ import annotations

from .compute import KERNELS, gather_ir


def llvm(sch, kernel, model, plan):
    """A parallel task per (batch, block of c_tile channels). It walks the points in vectors
    and, per vector, its c_tile channels (unrolled): the vector's indices and weights are
    gathered once for the channels, the features gathered from c_tile rows of M values (in
    L1 / L2 for the network's M), and each channel's output vector stored contiguously. The
    main kernel is written so (compute.gather_compute: only the tasks go parallel here);
    the `_small` kernel is the compute, split the same way, one point at a time."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    if kernel == "three_interpolate_forward":  # the gather kernel: its tasks, the gathers' IR
        (task,) = sch.get_loops(sch.get_sblock("task"))
        sch.parallel(task)
        sch.annotate(task, "pragma_import_llvm", gather_ir(int(plan["vector"])))
        return
    if kernel == "three_interpolate_forward_tiles":  # its tasks, the gathers' IR (the channel tail)
        (task,) = sch.get_loops(sch.get_sblock("task"))
        sch.parallel(task)
        sch.annotate(task, "pragma_import_llvm", gather_ir(int(plan["lanes"])))
        return
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
