"""Schedule recipes for voxel_pooling_forward (knobs: schedules/voxel_pooling_forward.yaml)."""

from .. import cpu_ir


def vectorize_channels(sch, loop, model, plan):
    """The channel-vector loop (plan["vec"] wide) in SIMD registers of the target's width."""
    lanes = model.lanes("float32")
    if lanes < plan["vec"]:
        _, loop = sch.split(loop, [None, lanes])
    sch.vectorize(loop)


def _vectorize_own_lane_adds(sch, block, model, plan):
    """A block out[.., c] += x[.., c] over its innermost channel loop: each lane reads and writes
    only its own element, so hiding the read of `out` (read 0) is safe and lets `vectorize`
    accept the block."""
    sch.unsafe_hide_buffer_access(block, "read", [0])
    vectorize_channels(sch, sch.get_loops(block)[-1], model, plan)


def llvm(sch, kernel, model, plan):
    if kernel == "sort_points":  # owner = a batch (its start/order rows); serial inside
        (b,) = sch.get_loops(sch.get_sblock("sort_points"))
        sch.parallel(b)
        return
    if kernel == "segment_sum":
        # owner = a voxel: (b, y, x) fused over the thread pool; channel vectors per point
        b, y, x = sch.get_loops(sch.get_sblock("segment"))
        sch.parallel(sch.fuse(b, y, x))
        _vectorize_own_lane_adds(sch, sch.get_sblock("segment_add"), model, plan)
        return
    if kernel == "pos_memo":  # tasks of memo_chunk points of a batch (compute._pos_memo_tasks)
        sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock("task"))))
        return
    # pool, pool_first_touch: owner = (batch, band of output rows); channel vectors per kept point
    b, r = sch.get_loops(sch.get_sblock("band"))
    t = sch.fuse(b, r)
    sch.parallel(t)
    # (float32: the op's one dtype)
    ir = cpu_ir.stream_ir_if(model.features(), plan["vec"], "float32", plan["stream_untouched"]) \
        if "first_touch" in kernel else ""
    if ir:
        sch.annotate(t, "pragma_import_llvm", ir)
    _vectorize_own_lane_adds(sch, sch.get_sblock("band_add"), model, plan)


def cuda(sch, kernel, model, plan):
    if kernel == "pos_memo":  # a thread per point, its three coordinates unrolled
        b, n, c = sch.get_loops(sch.get_sblock("pos_memo"))
        bx, tx = sch.split(n, [None, plan["memo_threads"]])
        sch.unroll(c)
        sch.bind(b, "blockIdx.y")
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return
    # pool: a warp per `points_per_warp` consecutive points: batch on blockIdx.y, points over
    # blockIdx.x / threadIdx.y / a loop in the thread, the lanes on threadIdx.x, each lane's
    # steps over the channels a loop inside that
    b, n, lane = sch.get_loops(sch.get_sblock("pool"))
    bx, ty, each = sch.split(n, [None, plan["threads"] // 32, plan["points_per_warp"]])
    sch.reorder(ty, lane, each)
    sch.bind(b, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
