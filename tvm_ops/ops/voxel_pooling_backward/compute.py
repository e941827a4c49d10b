"""TensorIR of voxel_pooling_backward's kernel `gather` (the operator's docstring says what
it computes), one compute per target kind, scheduled by schedule.py.

Both test a point's pos_memo row before they read grad_output: a point not kept reads
nothing and stores zeros, so no int32 in pos_memo reaches outside grad_output.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from .. import cpu_ir, fixed_channels
from ..prefetch import prefetch_words
from . import LINE_WORDS


def _gather_cpu(dtype: str, V: int, K: int, stream: bool, ahead: int, stream_min_words: int):
    """Task (b, t) = points [t * K, (t + 1) * K) of batch b, in order (a task within one
    batch: no division by N per point to find a point's batch, which cost the twin case more
    than its copies). Per point:
    pos_memo read once, then channels [0, C // V * V) as V-wide vectors (block `copy`,
    vectorised by the schedule) and the C % V tail (the V split is in the compute: TVM 0.27
    scalarises a predicated split of a symbolic loop). The grad_output row `ahead` points
    on is prefetched: the rows are random, no hardware prefetcher follows them.

    With `stream`, an output of stream_min_words words or more (about the last-level cache:
    it cannot stay there for its consumer anyway) whose rows are whole cache lines
    (grad_input_features on a line, C % 16 == 0) is stored past the caches: no read for
    ownership of the lines being overwritten. Each task then ends with the fence those
    weakly ordered stores need."""
    zero = tvm.tirx.const(0, dtype)
    streamed_path = stream and cpu_ir.whole_lines(V, "float32")
    stream_fn = f"tvm_ops_stream_x{V}_{dtype}"

    @T.prim_func(s_tir=True)
    def gather(grad_h: T.handle, memo_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, Y, X, C, N = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        grad = T.match_buffer(grad_h, (B, Y, X, C), dtype)
        memo = T.match_buffer(memo_h, (B, N, 3), "int32")
        out = T.match_buffer(out_h, (B, N, C), dtype)
        for b, t in T.grid(B, (N + K - 1) // K):
            with T.sblock("task"):
                vb, vt = T.axis.remap("SS", [b, t])
                T.reads(memo[vb, 0:N, 0:3], grad[vb, 0:Y, 0:X, 0:C])
                T.writes(out[vb, 0:N, 0:C])
                # (B * N * C < 2^31: the checks refuse larger tensors)
                lined: T.let[T.bool] = T.bool(streamed_path) and B * N * C >= stream_min_words and \
                    C % LINE_WORDS == 0 and cpu_ir.on_a_line(out[0, 0, 0])
                for j in range(T.min(K, N - vt * K)):
                    vn: T.let[T.int32] = vt * K + j
                    if ahead > 0 and vn + ahead < N:
                        # the row `ahead` points on, into the caches while this point is copied;
                        # any row of grad_output will do: a point not kept prefetches a row
                        # clamped into the grid (no branch on whether it is kept, which is as
                        # random as the points)
                        py: T.let[T.int32] = T.max(0, T.min(memo[vb, vn + ahead, 1], Y - 1))
                        px: T.let[T.int32] = T.max(0, T.min(memo[vb, vn + ahead, 2], X - 1))
                        prefetch_words(lambda w: grad[vb, py, px, w], C, 0)
                    # pos_memo read once per point
                    y: T.let[T.int32] = memo[vb, vn, 1]
                    x: T.let[T.int32] = memo[vb, vn, 2]
                    # a branch, not a select: TIR evaluates both arms of a Select, and the
                    # simplifier may rewrite a clamped index in the taken arm to the raw one
                    if memo[vb, vn, 0] == vb and y >= 0 and y < Y and x >= 0 and x < X:
                        if lined:
                            for c0 in range(C // V):
                                T.evaluate(T.call_extern("void", stream_fn, T.address_of(out[vb, vn, c0 * V]),
                                                         grad[vb, y, x, T.Ramp(c0 * V, 1, V)]))
                        else:
                            for c0, c1 in T.grid(C // V, V):
                                with T.sblock("copy"):
                                    vc0, vc1 = T.axis.remap("SS", [c0, c1])
                                    T.reads(grad[vb, y, x, vc0 * V + vc1])
                                    T.writes(out[vb, vn, vc0 * V + vc1])
                                    out[vb, vn, vc0 * V + vc1] = grad[vb, y, x, vc0 * V + vc1]
                        for ct in range(C % V):
                            out[vb, vn, C // V * V + ct] = grad[vb, y, x, C // V * V + ct]
                    else:
                        if lined:
                            for c0 in range(C // V):
                                T.evaluate(T.call_extern("void", stream_fn, T.address_of(out[vb, vn, c0 * V]),
                                                         T.Broadcast(zero, V)))
                        else:
                            # (a second vectorised block would make `task` one of two writers of
                            # out, which `parallel` refuses: this loop is vectorised here)
                            for c0 in range(C // V):
                                for c1 in T.vectorized(V):
                                    out[vb, vn, c0 * V + c1] = zero
                        for ct in range(C % V):
                            out[vb, vn, C // V * V + ct] = zero
                if lined:
                    T.evaluate(T.call_extern("void", "tvm_ops_store_fence"))
    return gather


def _gather_cuda(dtype: str):
    """One element (b, n, c) per thread; the schedule puts channels fastest, so a warp reads
    a contiguous grad_output row and writes a contiguous output row (pos_memo: the same three
    words for the warp, one transaction)."""
    zero = tvm.tirx.const(0, dtype)

    @T.prim_func(s_tir=True)
    def gather(grad_h: T.handle, memo_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, Y, X, C, N = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        grad = T.match_buffer(grad_h, (B, Y, X, C), dtype)
        memo = T.match_buffer(memo_h, (B, N, 3), "int32")
        out = T.match_buffer(out_h, (B, N, C), dtype)
        for b, n, c in T.grid(B, N, C):
            with T.sblock("gather"):
                vb, vn, vc = T.axis.remap("SSS", [b, n, c])
                T.reads(memo[vb, vn, 0:3], grad[vb, 0:Y, 0:X, vc])
                T.writes(out[vb, vn, vc])
                y: T.let[T.int32] = memo[vb, vn, 1]
                x: T.let[T.int32] = memo[vb, vn, 2]
                if memo[vb, vn, 0] == vb and y >= 0 and y < Y and x >= 0 and x < X:  # a branch: see above
                    out[vb, vn, vc] = grad[vb, y, x, vc]
                else:
                    out[vb, vn, vc] = zero
    return gather


def computes(dtype: str, plan: dict, kind: str) -> dict:
    """{kernel name: PrimFunc} for one dtype, plan and target kind: `gather`, and on the CPU
    its copies with grad_output's channels fixed (fixed_channels)."""
    if kind == "cuda":
        return {"gather": _gather_cuda(dtype)}
    gather = _gather_cpu(dtype, plan["vec"], plan["task_points"], plan["stream"], plan["prefetch_points"],
                         plan["stream_min_mib"] * (1 << 20) // 4)
    return {"gather": gather, **fixed_channels.copies("gather", gather, {0: (("B", "Y", "X", "C"), dtype)})}
