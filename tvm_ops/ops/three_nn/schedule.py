"""Schedule recipes for three_nn (knobs: schedules/three_nn.yaml).

Kernels: `three_nn` (points in vectors of plan["vector"] lanes; on CUDA a thread per point)
and, on the CPU, `three_nn_small` (N below the vector: one point at a time)."""

from __future__ import annotations

from . import KERNELS


def llvm(sch, kernel, model, plan):
    """A parallel task per (batch, point vector). The block's lane loop (vectorised in the
    compute) runs inside its scan: each step broadcasts one known point (12 bytes of
    the batch's known rows, which stay in L1 / L2 across the batch's vectors) and updates the
    vector's top-3, held in registers (3 distances + 3 indices per lane). A vector of
    2 x the target's lanes (knob) is two register vectors per step: two independent update
    chains to overlap the compare -> select latency."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    b, o = sch.get_loops(sch.get_sblock("nn"))
    sch.parallel(sch.fuse(b, o))


def cuda(sch, kernel, model, plan):
    """A thread per unknown point (mmcv's plan), its top-3 in registers. The known points
    are read straight from global memory: every thread of a warp reads the same known point
    at the same step, one broadcast transaction served by L1 (no shared-memory staging)."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    b, o = sch.get_loops(sch.get_sblock("nn"))
    blocks, threads = sch.split(o, [None, int(plan["threads"])])
    sch.bind(b, "blockIdx.y")
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")
