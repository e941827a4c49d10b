"""Schedule recipes for dynamic_scatter_forward (knobs: schedules/dynamic_scatter_forward.yaml).

The serial kernels (group_rows, chunk_offsets) run as written: one task on the CPU, one
thread on CUDA (the radix kernels are built where the plan's sort is radix: the CPU's).
The bitonic tile kernel binds its own loops in the compute (a CUDA block per
tile, a thread per entry, shared memory between the steps; plain loops on the CPU). Every
other kernel is a loop of independent blocks: CPU tasks over the cores (but point_map, on
one core: its random writes would share lines between cores), CUDA threads.
"""

from __future__ import annotations

from . import GROUP_KERNELS, KERNELS

# (group_split's parts are parallel loops of its compute: the CPU's cores, serial on CUDA)
SERIAL = {**{kernel: "group" for kernel in GROUP_KERNELS["radix"]}, "chunk_offsets": "offsets"}
ELEMENTWISE = {"bitonic_init": "init", "bitonic_step": "step", "head_flags": "heads", "chunk_totals": "totals",
               "chunk_scan": "scan", "segment_starts": "starts", "voxel_rows": "rows", "point_map": "map"}
# the tile kernel binds its own loops (CUDA blocks and threads, CPU loops in the compute)
BOUND = {"bitonic_tile"}
# point_map's writes land at random points of the map: split over the CPU's cores, both
# write the same cache lines, which then move between the cores (3x slower than one core)
CPU_SERIAL = {"point_map"}


def _reduce_block(kernel):
    return "reduce" if kernel.startswith("reduce_") else None


def llvm(sch, kernel, model, plan):
    """Parallel tasks over the blocks; the reduce's channel vector is a lane loop of its
    compute (vectorised there), each task a voxel: its points' rows gathered in point order."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    if kernel in SERIAL or kernel in CPU_SERIAL or kernel in BOUND:
        return
    name = ELEMENTWISE.get(kernel) or _reduce_block(kernel)
    loops = sch.get_loops(sch.get_sblock(name))
    sch.parallel(loops[0])


def cuda(sch, kernel, model, plan):
    """A thread per block of the compute; the reduce: threadIdx.x over 32 consecutive channels
    (coalesced row reads), threadIdx.y over threads / 32 voxels, each thread's voxel walked
    in point order (no atomics: the same sums as the CPU)."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    threads = int(plan["threads"])
    if kernel in BOUND:
        return
    if kernel in SERIAL:
        (unit,) = sch.get_loops(sch.get_sblock(SERIAL[kernel]))
        sch.bind(unit, "threadIdx.x")
        return
    if kernel in ELEMENTWISE:
        (i,) = sch.get_loops(sch.get_sblock(ELEMENTWISE[kernel]))
        blocks, tx = sch.split(i, [None, threads])
        sch.bind(blocks, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return
    voxels, channels = sch.get_loops(sch.get_sblock("reduce"))
    bx, ty = sch.split(voxels, [None, threads // 32])
    c_outer, tx = sch.split(channels, [None, 32])
    sch.reorder(bx, ty, c_outer, tx)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
