"""Schedule recipes for three_interpolate_backward (knobs: schedules/three_interpolate_backward.yaml)."""


def llvm(sch, kernel, model, plan):
    # owners (b, m-block, c-block) -> the CPU thread pool; TVM hands each worker a
    # contiguous chunk of ceil(owners / cores) owners.
    tile = sch.get_sblock("tile")
    owner = sch.fuse(*sch.get_loops(tile))
    sch.parallel(owner)
    _n, k, lane = sch.get_loops(sch.get_sblock("scatter"))[-3:]
    sch.unroll(k)
    if kernel == "three_interpolate_backward":  # the narrow kernel's lane loop is one channel
        sch.vectorize(lane)


def cuda(sch, kernel, model, plan):
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
