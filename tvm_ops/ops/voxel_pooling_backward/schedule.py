"""Schedule recipes for voxel_pooling_backward (knobs: schedules/voxel_pooling_backward.yaml)."""

from ..voxel_pooling_forward.schedule import vectorize_channels
from .. import cpu_ir


def llvm(sch, kernel, model, plan):
    if kernel == "to_channels_last":  # written in its scheduled form (ops/channels_last.py)
        return
    # owner = a task of consecutive points of a batch: the thread pool gives each thread a
    # contiguous run of the (batch, task) pairs, so each thread writes one contiguous
    # stretch of grad_input_features
    t = sch.fuse(*sch.get_loops(sch.get_sblock("task")))
    sch.parallel(t)
    ir = cpu_ir.stream_ir_if(model.features(), plan["vec"], "float32", plan["stream"])
    if ir:
        sch.annotate(t, "pragma_import_llvm", ir)
    vectorize_channels(sch, sch.get_loops(sch.get_sblock("copy"))[-1], model, plan)


def cuda(sch, kernel, model, plan):
    # batch on blockIdx.y; (point, channel) fused, channels fastest, split by a CONSTANT thread
    # count (its predicate guards the end)
    b, n, c = sch.get_loops(sch.get_sblock("gather"))
    bx, tx = sch.split(sch.fuse(n, c), [None, plan["threads"]])
    sch.bind(b, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
