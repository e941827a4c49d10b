"""Schedule recipes for three_interpolate_backward (knobs: schedules/three_interpolate_backward.yaml)."""


from ..atomics import atomicize
from . import CAST, KERNELS, SCATTER


def llvm(sch, kernel, model, plan):
    # owners -> the CPU thread pool; TVM hands each worker a contiguous chunk of
    # ceil(owners / cores) owners. The kernels written in their scheduled form (the vector
    # kernels, compute.transposed_compute, and float16's rows, compute.rows_compute) have a
    # "task" block: only their tasks go parallel here.
    if kernel not in KERNELS:
        raise KeyError(kernel)
    if [sch.get(block).name_hint for block in sch.get_child_blocks(sch.get_sblock("root"))] == ["task"]:
        (task,) = sch.get_loops(sch.get_sblock("task"))
        sch.parallel(task)
        return
    # float32's narrow kernel (compute.scatter_compute with zero_rows): an owner per (b, c) row
    b, c, _n, k = sch.get_loops(sch.get_sblock("scatter"))
    sch.parallel(sch.fuse(b, c))
    sch.unroll(k)


def cuda(sch, kernel, model, plan):
    if kernel == SCATTER:
        # a thread per (b, c, n), its three terms unrolled, each an atomicAdd; b and c on
        # their own grid axes (a fused index would divide by N and C in every thread), n over
        # blockIdx.x and the threads (a warp reads consecutive grad_output words)
        atomicize(sch, "scatter", "add")
        b, c, n, k = sch.get_loops(sch.get_sblock("scatter"))
        blocks, threads = sch.split(n, [None, plan["threads"]])
        sch.bind(b, "blockIdx.z")
        sch.bind(c, "blockIdx.y")
        sch.bind(blocks, "blockIdx.x")
        sch.bind(threads, "threadIdx.x")
        sch.unroll(k)
        return
    if kernel == CAST:  # float16: a thread per element of the flat [B, C, M]
        blocks, threads = sch.split(sch.fuse(*sch.get_loops(sch.get_sblock("cast"))), [None, plan["threads"]])
        sch.bind(blocks, "blockIdx.x")
        sch.bind(threads, "threadIdx.x")
        return
    # one thread block per owner, one thread per channel of the tile; acc and the
    # staged grad_output slice sit in shared memory (plan["scope"]).
    batch, m_block, c_block = sch.get_loops(sch.get_sblock("tile"))
    sch.bind(batch, "blockIdx.z")
    sch.bind(m_block, "blockIdx.y")
    sch.bind(c_block, "blockIdx.x")
    for block in ("load", "scatter"):
        sch.bind(sch.get_loops(sch.get_sblock(block))[-1], "threadIdx.x")
    channel, _m = sch.get_loops(sch.get_sblock("store"))[-2:]
    sch.bind(channel, "threadIdx.x")
