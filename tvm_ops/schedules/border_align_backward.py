"""Schedule recipes for border_align_backward (knobs: schedules/border_align_backward.yaml)."""

from tvm_ops.ops.border_align_backward import CHANNEL_GROUP, GEOMETRY, LAYOUT, SCATTER, TAIL


def llvm(sch, kernel, model, plan):
    lanes = plan["lanes"]
    if kernel == SCATTER:
        # owner computes: a task owns (n, s[, block of groups]) and its tile WS[n, s, g, :, :]
        main = sch.get_sblock("scatter")
        n, s, g, lane, k, i = sch.get_loops(main)
        gpt = int(plan["groups_per_task"])
        if gpt > 0:
            g_task, g_in = sch.split(g, [None, gpt])
            sch.reorder(n, s, g_task, k, i, g_in, lane)
            sch.parallel(sch.fuse(n, s, g_task))
        else:
            sch.reorder(n, s, g, k, i, lane)
            sch.parallel(sch.fuse(n, s))
            if plan["stage_inputs"]:
                # grad_output / argmax vectors of (n, k, s, group) staged once per k
                for index in (0, 1):
                    staged = sch.cache_read(main, index, "local")
                    sch.compute_at(staged, k)
                    sch.vectorize(sch.get_loops(staged)[-1])
        if lanes < CHANNEL_GROUP:
            _, lane = sch.split(lane, [None, lanes])
        sch.vectorize(lane)
        init = sch.decompose_reduction(main, k)
        init_lane = sch.get_loops(init)[-1]
        if lanes < CHANNEL_GROUP:
            _, init_lane = sch.split(init_lane, [None, lanes])
        sch.vectorize(init_lane)
    elif kernel == GEOMETRY:
        n, k, _s, _i = sch.get_loops(sch.get_sblock("geometry"))
        sch.parallel(sch.fuse(n, k))
    elif kernel == TAIL:
        tail = sch.get_sblock("scatter_tail")
        n, s, t, k, _i = sch.get_loops(tail)
        sch.parallel(sch.fuse(n, s, t))
        sch.decompose_reduction(tail, k)
    elif kernel == LAYOUT:
        n, h, w, _s, _g, lane = sch.get_loops(sch.get_sblock("layout"))
        sch.parallel(sch.fuse(n, h, w))
        if lanes < CHANNEL_GROUP:
            _, lane = sch.split(lane, [None, lanes])
        sch.vectorize(lane)
        n, h, w, _s, _t = sch.get_loops(sch.get_sblock("layout_tail"))
        sch.parallel(sch.fuse(n, h, w))
    else:
        raise KeyError(kernel)


def cuda(sch, kernel, model, plan):
    # Owner computes (see the schedule file: the atomicAdd variant is not written yet).
    # Thread loops always have a constant extent; symbolic work goes to blockIdx, and the
    # flat kernels' split keeps its guard.
    threads = int(plan["threads"])

    def flat(block):
        fused = sch.fuse(*sch.get_loops(block))
        bx, tx = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")

    if kernel == GEOMETRY:
        flat(sch.get_sblock("geometry"))
    elif kernel == SCATTER:
        main = sch.get_sblock("scatter")
        n, s, g, lane, k, _i = sch.get_loops(main)
        sch.bind(sch.fuse(n, s, g), "blockIdx.x")
        sch.bind(lane, "threadIdx.x")          # CHANNEL_GROUP threads
        sch.decompose_reduction(main, k)
    elif kernel == TAIL:
        tail = sch.get_sblock("scatter_tail")
        n, s, t, k, _i = sch.get_loops(tail)    # t: CHANNEL_GROUP threads, guarded by t < C % 16
        sch.bind(sch.fuse(n, s), "blockIdx.x")
        sch.bind(t, "threadIdx.x")
        sch.decompose_reduction(tail, k)
    elif kernel == LAYOUT:
        for name in ("layout", "layout_tail"):
            flat(sch.get_sblock(name))
    else:
        raise KeyError(kernel)
