"""Schedule recipes for ms_deform_attn_backward (knobs: schedules/ms_deform_attn_backward.yaml).

Kernels: grad_value, grad_loc_attn, and their `*_private` twins (on the CPU: a
(b, h)-private contiguous [K, C] slice; on CUDA the same schedule as the plain ones).
"""

from __future__ import annotations


def _vectorize_channels(sch, loop, lanes):
    """Split the (symbolic) channel loop by the SIMD width: the main part is vectorised,
    the C % lanes tail is split off by LoopPartition (hint) and stays scalar. (A
    predicated vectorised loop would lower to scalar code.)"""
    c_o, c_i = sch.split(loop, [None, lanes])
    sch.vectorize(c_i)
    sch.annotate(c_o, "pragma_loop_partition_hint", 1)
    return c_o, c_i


def llvm(sch, kernel, model, plan):
    """Owner computes: one (batch, head) slice per parallel task (B*H tasks, static chunks
    over the cores); within it every (q, l, p) sample is walked in order and the channel
    loop is vectorised. grad_value rows of a (b, h) slice only receive samples of that
    slice, so no two tasks write one element: no atomics, deterministic."""
    private = kernel.endswith("_private")
    base = kernel.removesuffix("_private")
    lanes = plan["lanes"]
    if base == "grad_value":
        blk = sch.get_sblock("grad_value")
        b, h, q, l, p, k, c = sch.get_loops(blk)
        if plan["level_outer"]:
            sch.reorder(l, q)
        bh = sch.fuse(b, h)
        sch.parallel(bh)
        sch.compute_at(sch.get_sblock("corner"), sch.get_loops(blk)[3])
        sch.unroll(sch.get_loops(sch.get_sblock("corner"))[-1])
        if private:
            wb = sch.cache_write(blk, 0, "global")
            sch.reverse_compute_at(wb, bh)
            _vectorize_channels(sch, sch.get_loops(wb)[-1], lanes)
        _vectorize_channels(sch, sch.get_loops(blk)[-1], lanes)
        sch.decompose_reduction(blk, sch.get_loops(blk)[1])
        if plan["unroll_corners"]:
            # a constant corner index -> rows / w promoted to registers
            sch.unroll(sch.get_loops(blk)[-3])
    elif base == "grad_loc_attn":
        # vectorise the channel reduction: rfactor over the inner lanes gives a
        # [4, dot_lanes] accumulator per sample; the final lane sum is unrolled.
        dot = sch.get_sblock("corner_dot")
        c_o, c_i = sch.split(sch.get_loops(dot)[-1], [None, plan["dot_lanes"]])
        rf = sch.rfactor(c_i, 6)  # before compute_at (TVM 0.27)
        fin = sch.get_sblock("finalize")
        b, h, q, l, p = sch.get_loops(fin)
        if plan["level_outer"]:
            sch.reorder(l, q)
        bh = sch.fuse(b, h)
        sch.parallel(bh)
        anchor = sch.get_loops(fin)[-1]
        sch.compute_at(dot, anchor)
        sch.compute_at(rf, anchor)
        sch.compute_at(sch.get_sblock("corner"), anchor)
        sch.unroll(sch.get_loops(sch.get_sblock("corner"))[-1])
        # compute_at regenerates loops in block-iter order: rf (ci, k, co), sum (ci, k)
        rf_ci, rf_k, rf_co = sch.get_loops(rf)[-3:]
        sch.reorder(rf_k, rf_co, rf_ci)
        sch.vectorize(rf_ci)
        sch.annotate(rf_co, "pragma_loop_partition_hint", 1)
        sch.decompose_reduction(rf, rf_co)
        # lane sum unrolled: the [4, lanes] accumulator and the four d_k stay in
        # registers (a rolled loop keeps them on the stack)
        sch.unroll(rf_k)
        ci_f, k_f = sch.get_loops(dot)[-2:]
        sch.reorder(k_f, ci_f)
        sch.decompose_reduction(dot, k_f)
        sch.unroll(k_f)
        sch.unroll(ci_f)
        if private:
            reads = [r.source.name for r in sch.get(rf).reads]  # 0.27: TensorRegion.source
            rd = sch.cache_read(rf, reads.index("value"), "global")
            sch.compute_at(rd, bh)
            _vectorize_channels(sch, sch.get_loops(rd)[-1], lanes)
    else:
        raise KeyError(kernel)


def _atomicize(sch, block_name):
    """Turn the scatter block `block_name` (`buf[idx] = buf[idx] + x` under reduction
    iters) into conflicting-write form: every iter spatial, no init (the host
    zero-fills), the accumulating store replaced by
    T.cuda.atomic_add(T.address_of(buf[idx]), x) and the read of buf hidden. TensorIR
    has no primitive for this; the block is rebuilt and swapped in with
    ScheduleState.replace (srefs stay valid)."""
    from tvm import tirx as tx
    from tvm.backend.cuda.op import cuda_atomic_add
    from tvm.ir.expr import TensorLoad
    from tvm.ir.prim.expr import Add
    from tvm.s_tir.stmt import SBlock

    rv = sch.get_sblock(block_name)
    old = sch.get(rv)
    buf = old.writes[0].source

    def rewrite(s):
        if isinstance(s, tx.SeqStmt):
            return tx.SeqStmt([rewrite(x) for x in s.seq])
        if isinstance(s, tx.IfThenElse):
            return tx.IfThenElse(s.condition, rewrite(s.then_case),
                                 rewrite(s.else_case) if s.else_case is not None else None)
        if isinstance(s, tx.BufferStore) and s.buffer.same_as(buf):
            v = s.value
            assert (isinstance(v, Add) and isinstance(v.a, TensorLoad)
                    and v.a.source.same_as(buf)), "expects buf[idx] = buf[idx] + x"
            return tx.Evaluate(cuda_atomic_add(tx.address_of(tx.BufferLoad(buf, s.indices)), v.b))
        return s

    iters = [tx.IterVar(iv.dom, iv.var, 0) for iv in old.iter_vars]  # 0 = data parallel
    new = SBlock(iters, [r for r in old.reads if not r.source.same_as(buf)], old.writes,
                 old.name_hint, rewrite(old.body), None, old.alloc_buffers,
                 old.match_buffers, old.annotations)
    sch.state.replace(sch.get_sref(rv), new, {old: new})


def cuda(sch, kernel, model, plan):
    """mmcv strategy. Thread block = (query, batch, head group): blockIdx extents are the
    full symbolic Q and B (exact grid, no guard needed); the thread loops have constant
    extents (threads_h heads x threads_c channels) and keep their split predicates as
    guards. grad_value: atomicAdd of w_k * a * g[c] into the four corner rows (launch
    zero-fills). grad_loc_attn: the four corner dots reduce over channels across
    threadIdx.x (cross-thread reduction -> warp shuffles)."""
    base = kernel.removesuffix("_private")
    tc, th = int(plan["threads_c"]), int(plan["threads_h"])
    if base == "grad_value":
        _atomicize(sch, "grad_value")
        blk = sch.get_sblock("grad_value")
        b, h, q, l, p, k, c = sch.get_loops(blk)
        h_o, h_i = sch.split(h, [None, th])
        c_o, c_i = sch.split(c, [None, tc])
        sch.reorder(q, b, h_o, h_i, c_i, l, p, k, c_o)
        sch.bind(q, "blockIdx.x")
        sch.bind(b, "blockIdx.y")
        sch.bind(h_o, "blockIdx.z")
        sch.bind(h_i, "threadIdx.y")
        sch.bind(c_i, "threadIdx.x")
        cor = sch.get_sblock("corner")
        sch.compute_at(cor, p)
        for buf in range(4):
            sch.set_scope(cor, buf, "local")
        sch.unroll(k)
    elif base == "grad_loc_attn":
        fin = sch.get_sblock("finalize")
        b, h, q, l, p = sch.get_loops(fin)
        h_o, h_i = sch.split(h, [None, th])
        sch.reorder(q, b, h_o, h_i, l, p)
        sch.bind(q, "blockIdx.x")
        sch.bind(b, "blockIdx.y")
        sch.bind(h_o, "blockIdx.z")
        sch.bind(h_i, "threadIdx.y")
        dot = sch.get_sblock("corner_dot")
        sch.compute_at(dot, p)
        k, c = sch.get_loops(dot)[-2:]
        c_o, c_i = sch.split(c, [None, tc])
        sch.reorder(k, c_i, c_o)  # cross-thread reduction wants c_i, c_o innermost
        sch.bind(c_i, "threadIdx.x")
        sch.set_scope(dot, 0, "local")
        cor = sch.get_sblock("corner")
        sch.compute_at(cor, p)
        for buf in range(4):
            sch.set_scope(cor, buf, "local")
        # finalize per sample on a unit loop bound to threadIdx.x: every lane of the
        # warp computes and stores the same value (a benign same-value store)
        unit = sch.add_unit_loop(fin)
        sch.bind(unit, "threadIdx.x")
    else:
        raise KeyError(kernel)
