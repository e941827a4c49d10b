"""voxel_pooling_backward (BEVDepth voxel_pooling_train's backward).

With (b', y, x) = pos_memo[b, n] (voxel_pooling_forward's: (b, y, x) for a kept point,
(-1, -1, -1) for a dropped one), a point is kept iff b' == b, 0 <= y < Y and 0 <= x < X:
    grad_input_features[b, n, :] = grad_output[b, y, x, :] if kept else 0
Contract: specs/voxel_pooling_backward.yaml.

One kernel, `gather` (with its copies for C = 64 and 80, ops/fixed_channels.py, which
launch runs at those C): a gather, not a scatter. On the CPU a grad_output that is a
[B, Y, X, C] view of [B, C, Y, X] memory (the gradient of functional.voxel_pooling's
permuted output) is first rewritten channels-last by `to_channels_last`
(ops/channels_last.py) into a workspace. Each point owns its output row and writes it
once (no zero-fill, no atomics, the same bits on every run, thread count and target). Any
int32 in pos_memo is accepted: grad_output is read only under the test that the row is
kept, and a row that is not kept stores zeros.

- llvm: tasks of consecutive points are the parallel axis (each thread gets a contiguous
  run of them, so it writes one stretch of the output); per point pos_memo is read once and
  the row copied in cache-line vectors plus the C % 16 tail, the grad_output row a few
  points ahead prefetched; outputs beyond the last-level cache are stored past the caches
  (non-temporal stores; docs/kernels/voxel_pooling_backward.md has the measurements).
- cuda: one thread per (point, channel), channels fastest (coalesced row reads and writes).
"""

from __future__ import annotations

from ... import policy
from ...checks import INT32_MAX
from .. import cpu_ir, fixed_channels
from ..knobs import flag, whole
from ..base import Operator
from ...host_buffers import LINE_BYTES
from ..channels_last import is_channels_first_view, rewritten, to_channels_last_compute

LINE_WORDS = LINE_BYTES // 4  # float32 words of a cache line


class VoxelPoolingBackward(Operator):
    name = "voxel_pooling_backward"
    kernel_names = ("to_channels_last", "gather", *fixed_channels.names("gather"))

    def rules(self, problem):
        # the gradient of functional.voxel_pooling's [B, C, Y, X] view arrives as a [B, Y, X, C]
        # view of channels-first memory: on the CPU to_channels_last rewrites it (several times
        # faster than a generic copy) into a workspace the gather reads
        problem.notes["channels_first"] = (problem.device == "cpu"
                                           and is_channels_first_view(problem.inputs["grad_output"]))

    def taken_as_is(self, problem):
        return ("grad_output",) if problem.notes["channels_first"] else ()

    def workspaces(self, problem, plan):
        if not problem.notes["channels_first"]:
            return {}
        s = problem.sizes
        return {"grad_rows": ((s["B"], s["Y"], s["X"], s["C"]), problem.dtype)}

    def plan(self, model, knobs):
        """The seed's split of points over the cores, with nothing staged on chip: the plan is
        the channel step and the points of a task (CUDA: the threads of a block).

        V: a cache line of float32 words (whole SIMD registers: 1 on AVX-512, 2 on AVX2, 4 on
        NEON), so that a streamed vector store covers its line."""
        pol = policy.for_target(model)
        if model.kind == "cuda":
            return {"threads": int(knobs["threads"])}
        return {"vec": cpu_ir.line_vector(pol.lanes, "float32"),
                "task_points": whole(knobs, "task_points", 1, INT32_MAX),
                "stream": flag(knobs, "stream"), "prefetch_points": whole(knobs, "prefetch_points", 0, INT32_MAX),
                "stream_min_mib": whole(knobs, "stream_min_mib", 0, INT32_MAX)}

    def computes(self, dtype, plan, model):
        from . import compute

        kernels = compute.computes(dtype, plan, model.kind)
        if model.kind == "llvm":
            kernels["to_channels_last"] = to_channels_last_compute(dtype, model.lanes("float32"))
        return kernels

    def launch(self, kernels, problem, tensors):
        grad = tensors["grad_output"]
        if problem.notes["channels_first"]:
            grad = rewritten(kernels["to_channels_last"], grad, tensors["grad_rows"])
        gather = fixed_channels.pick("gather", problem.sizes["C"]) if problem.device == "cpu" else "gather"
        kernels[gather](grad, tensors["pos_memo"], tensors["grad_input_features"])


OP = VoxelPoolingBackward()


def voxel_pooling_backward(grad_output, pos_memo, *, target="llvm", out=None):
    """Gradient of voxel pooling: grad_input_features [B, N, C] from grad_output [B, Y, X, C].

    grad_output is float32 (the gradient of voxel_pooling_forward's output_features);
    pos_memo [B, N, 3] int32 is the forward's: point n of batch b takes the row
    grad_output[b, y, x] when pos_memo[b, n] = (b, y, x) lies in the grid, else zeros (any
    int32 value is safe). numpy in -> numpy out; torch in -> torch out; `out=` writes into a
    caller buffer of shape [B, N, C].
    """
    return OP.call({"grad_output": grad_output, "pos_memo": pos_memo}, {}, target, {"grad_input_features": out})
