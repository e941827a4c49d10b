"""Schedule recipes for dynamic_scatter_backward (knobs: schedules/dynamic_scatter_backward.yaml).

CPU: owner-computes, no atomics. max, by default (knob max_owners: voxels): a counting
sort lists each voxel's points, then a task per voxel finds each channel's first matching
point and writes its points' rows (compute.voxel_owner_computes). max_owners: channels,
the traceback's owners are channel blocks of plan["vec"] channels: each walks every point
in index order and min-updates its slice of the voxel's reduce_from row, so no two
threads touch one element and min makes the order irrelevant (identical bits on every
thread count). init and the scatters: owners are rows; sum / mean (sum_rows, mean_rows): a task
per point.
CUDA: threadIdx.x = 32 consecutive channels, threadIdx.y = rows, blockIdx.x = row chunks;
the traceback's min-update becomes atomicMin on the int32 workspace.
"""

from ..atomics import atomicize

BLOCKS = {"max_init": "init", "max_traceback": "traceback", "max_unbucketed": "zero"}  # the rest: "scatter"
# the CPU's max plan by voxels (and max_voxels_rows_c<C>, its copies over whole rows)
VOXEL_OWNERS = ("max_buckets", "max_voxels", "max_voxels_small")


def llvm(sch, kernel, model, plan):
    if kernel.startswith(("sum_rows", "mean_rows")):  # a task per point (its vectors are in the compute)
        sch.parallel(sch.get_loops(sch.get_sblock("point"))[0])
        return
    if kernel in VOXEL_OWNERS or kernel.startswith("max_voxels_rows"):
        # max_buckets: one serial walk; max_voxels: a task per voxel (its lane loop is
        # vectorised in the compute)
        if kernel != "max_buckets":
            sch.parallel(sch.get_loops(sch.get_sblock("voxel"))[0])
        return
    vec = plan["vec"]
    block = sch.get_sblock(BLOCKS.get(kernel, "scatter"))
    rows, channels = sch.get_loops(block)
    c_block, c_vec = sch.split(channels, [None, vec])
    if kernel == "max_traceback":
        sch.reorder(c_block, rows, c_vec)
        if plan["unroll_points"] > 1:
            _, inner = sch.split(rows, [None, plan["unroll_points"]])
            sch.unroll(inner)
        sch.parallel(c_block)
    else:
        sch.parallel(rows)
    sch.vectorize(c_vec)
    # LoopPartition peels the C % vec tail, so the main part vectorises without a predicate
    # (sch.loop_partition rejects symbolic extents).
    sch.annotate(c_block, "pragma_loop_partition_hint", 1)


def cuda(sch, kernel, model, plan):
    if kernel == "max_traceback":
        atomicize(sch, "traceback", "min")
    block = sch.get_sblock(BLOCKS.get(kernel, "scatter"))
    rows, channels = sch.get_loops(block)
    # thread loops keep constant extents (32 and threads_y); the split predicates guard
    # rows >= N and channels >= C inside the thread
    bx, ty = sch.split(rows, [None, plan["threads_y"]])
    c_outer, tx = sch.split(channels, [None, plan["threads_x"]])
    sch.reorder(bx, ty, c_outer, tx)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
