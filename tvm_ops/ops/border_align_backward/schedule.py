"""Schedule recipes for border_align_backward (knobs: schedules/border_align_backward.yaml)."""

from . import CAST, SCATTER, TAIL, TO_CHANNELS_FIRST


def llvm(sch, kernel, model, plan):
    # written in scheduled form: the cores take owners from a shared counter and the lane
    # loops are vectorised in the compute (they sit inside the owner block, between its
    # staging); to_channels_first too (ops/channels_last.py)
    if kernel not in (SCATTER, TAIL, TO_CHANNELS_FIRST):
        raise KeyError(kernel)


def cuda(sch, kernel, model, plan):
    # mlu-ops' plan: one thread per (n, k, s, c), channels fastest so a warp reads contiguous
    # grad_output/argmax and adds into consecutive grad_input words. Batch on blockIdx.y; the
    # symbolic (k, s, c) work is fused and split by a CONSTANT thread count (never a symbolic
    # extent on threadIdx): the split's predicate guards the end.
    threads = int(plan["threads"])
    block = sch.get_sblock("cast" if kernel == CAST else "scatter")
    n, *rest = sch.get_loops(block)
    bx, tx = sch.split(sch.fuse(*rest), [None, threads])
    sch.bind(n, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
