"""Turn a CUDA scatter block into atomic updates: the one rewrite every CUDA scatter shares.

A scatter written as a reduction (`buf[idx] = buf[idx] + x`, or a min-update) cannot run
with its reduction iterators bound to threads: TensorIR has no primitive that turns the
accumulating store into an atomic. `atomicize` rebuilds the block with every iterator
data-parallel, no init (the caller zero-fills or pre-sets the buffer), the read of the
buffer hidden, and the store replaced by the CUDA atomic; it is swapped in with
ScheduleState.replace, so the schedule's block and loop handles stay valid.
"""

from __future__ import annotations


def _atomic_add(store):
    """`buf[idx] = buf[idx] + x` -> atomicAdd(&buf[idx], x)."""
    from tvm import tirx
    from tvm.backend.cuda.op import cuda_atomic_add
    from tvm.ir.expr import TensorLoad
    from tvm.ir.prim.expr import Add

    value = store.value
    if not (isinstance(value, Add) and isinstance(value.a, TensorLoad) and value.a.source.same_as(store.buffer)):
        raise ValueError(f"atomicize(add) expects buf[idx] = buf[idx] + x, got {value}")
    return tirx.Evaluate(cuda_atomic_add(tirx.address_of(tirx.BufferLoad(store.buffer, store.indices)), value.b))


def _atomic_min(store):
    """`buf[idx] = min(buf[idx], Select(hit, x, none))` -> `if hit: atomicMin(&buf[idx], x)`
    (int32 buffers: CUDA's atomicMin)."""
    from tvm import tirx

    value = store.value
    if not (isinstance(value, tirx.Min) and isinstance(value.b, tirx.Select)):
        raise ValueError(f"atomicize(min) expects min(buf[idx], Select(hit, x, none)), got {value}")
    pointer = tirx.address_of(tirx.BufferLoad(store.buffer, store.indices))
    return tirx.IfThenElse(value.b.condition,
                           tirx.Evaluate(tirx.call_extern("int32", "atomicMin", pointer, value.b.true_value)), None)


UPDATES = {"add": _atomic_add, "min": _atomic_min}


def atomicize(sch, block_name: str, update: str) -> None:
    """Rewrite block `block_name` of `sch` so its stores to the buffer it writes are atomic
    `update`s ("add" or "min")."""
    from tvm import tirx
    from tvm.s_tir.stmt import SBlock

    rv = sch.get_sblock(block_name)
    old = sch.get(rv)
    buf = old.writes[0].source
    atomic = UPDATES[update]

    def rewrite(stmt):
        if isinstance(stmt, tirx.SeqStmt):
            return tirx.SeqStmt([rewrite(s) for s in stmt.seq])
        if isinstance(stmt, tirx.IfThenElse):
            other = None if stmt.else_case is None else rewrite(stmt.else_case)
            return tirx.IfThenElse(stmt.condition, rewrite(stmt.then_case), other)
        if isinstance(stmt, tirx.BufferStore) and stmt.buffer.same_as(buf):
            return atomic(stmt)
        return stmt

    iters = [tirx.IterVar(iv.dom, iv.var, tirx.IterVar.DataPar) for iv in old.iter_vars]
    new = SBlock(iters, [r for r in old.reads if not r.source.same_as(buf)], old.writes, old.name_hint,
                 rewrite(old.body), None, old.alloc_buffers, old.match_buffers, old.annotations)
    sch.state.replace(sch.get_sref(rv), new, {old: new})
