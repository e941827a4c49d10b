"""Schedule recipes for three_interpolate_forward (knobs: schedules/three_interpolate_forward.yaml).

Kernels: `three_interpolate_forward_tiles` (the CPU's tiles plan), `three_interpolate_forward_lookup`
(the tiles plan's rows of up to 16 features, AVX-512), `three_interpolate_forward` (the CPU's
gather plan; a thread per output element on CUDA) and `three_interpolate_forward_small` (N
below the vector: one point at a time). CUDA builds the one compute; launch runs it."""

from __future__ import annotations

from .. import cpu_ir
from . import KERNELS
from .compute import gather_ir, row16_ir


def llvm(sch, kernel, model, plan):
    """The plans' kernels are written in their scheduled form (compute.tiles_compute,
    gather_compute, lookup_compute): a parallel task per (batch, block of channels); here
    their tasks go parallel and their IR is linked in (the gathers and deinterleaving loads;
    the lookup's masked row load and vpermps; the tiles plan's last C % lanes channels run
    the gather walk). The `_small` kernel is the compute, split the same way, c_tile
    channels per task, one point at a time."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    if kernel != "three_interpolate_forward_small":
        (task,) = sch.get_loops(sch.get_sblock("task"))
        sch.parallel(task)
        lanes = int(plan["vector"] if kernel == "three_interpolate_forward" else plan["lanes"])
        llvm_ir = gather_ir(lanes)
        if kernel == "three_interpolate_forward_lookup":
            llvm_ir += row16_ir() + cpu_ir.lookup16_ir(model.features(), [lanes])
        sch.annotate(task, "pragma_import_llvm", llvm_ir)
        return
    b, c, o, v = sch.get_loops(sch.get_sblock("out"))
    co, ci = sch.split(c, [None, int(plan["c_tile"])])
    sch.reorder(b, co, o, ci, v)
    sch.parallel(sch.fuse(b, co))
    sch.unroll(ci)


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
