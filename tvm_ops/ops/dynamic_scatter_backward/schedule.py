"""Schedule recipes for dynamic_scatter_backward (knobs: schedules/dynamic_scatter_backward.yaml).

CPU: owner-computes, no atomics. The traceback's owners are channel blocks of plan["vec"]
channels: each walks every point in index order and min-updates its slice of the voxel's
reduce_from row, so no two threads touch one element and min makes the order irrelevant
(identical bits on every thread count). init and the scatters: owners are rows.
CUDA: threadIdx.x = 32 consecutive channels, threadIdx.y = rows, blockIdx.x = row chunks;
the traceback's min-update becomes atomicMin on the int32 workspace.
"""

from tvm import s_tir, tirx

BLOCKS = {"max_init": "init", "max_traceback": "traceback"}  # the rest: "scatter"


def llvm(sch, kernel, model, plan):
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


def _atomic_min_traceback(sch, block_rv) -> None:
    """`rf[v,c] = min(rf[v,c], Select(eq, n, N))` -> `if eq: atomicMin(&rf[v,c], n)`, every
    iterator spatial and the (no-op) init dropped. TVM 0.27 has no Python IR mutator, so the
    body (Bind v; if valid: store) is rebuilt by hand and swapped in with state.replace."""
    block = sch.get(block_rv)

    def rebuild(stmt):
        if isinstance(stmt, tirx.SeqStmt):
            return tirx.SeqStmt([rebuild(x) for x in stmt.seq])
        if isinstance(stmt, tirx.IfThenElse):
            other = None if stmt.else_case is None else rebuild(stmt.else_case)
            return tirx.IfThenElse(stmt.condition, rebuild(stmt.then_case), other)
        if isinstance(stmt, tirx.BufferStore) and stmt.buffer.name == "reduce_from":
            update = stmt.value
            if not (isinstance(update, tirx.Min) and isinstance(update.b, tirx.Select)):
                raise ValueError(f"unexpected traceback update {update}")
            pointer = tirx.address_of(tirx.BufferLoad(stmt.buffer, stmt.indices))
            call = tirx.call_extern("int32", "atomicMin", pointer, update.b.true_value)
            return tirx.IfThenElse(update.b.condition, tirx.Evaluate(call), None)
        return stmt

    iters = [tirx.IterVar(iv.dom, iv.var, tirx.IterVar.DataPar) for iv in block.iter_vars]
    reads = [r for r in block.reads if r.source.name != "reduce_from"]
    new_block = s_tir.SBlock(iters, reads, block.writes, block.name_hint, rebuild(block.body),
                             None, block.alloc_buffers, block.match_buffers, block.annotations)
    sch.state.replace(sch.get_sref(block_rv), new_block, {block: new_block})


def cuda(sch, kernel, model, plan):
    block = sch.get_sblock(BLOCKS.get(kernel, "scatter"))
    if kernel == "max_traceback":
        _atomic_min_traceback(sch, block)
    rows, channels = sch.get_loops(block)
    # thread loops keep constant extents (32 and threads_y); the split predicates guard
    # rows >= N and channels >= C inside the thread
    bx, ty = sch.split(rows, [None, plan["threads_y"]])
    c_outer, tx = sch.split(channels, [None, plan["threads_x"]])
    sch.reorder(bx, ty, c_outer, tx)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
