"""voxel_pooling_forward (BEVDepth).

A point n of batch b with geom_xyz[b, n] = (x, y, z) is kept iff
0 <= x < X, 0 <= y < Y and 0 <= z < Z (x = 0 is a valid voxel).
    output_features[b, y, x, :] = sum of input_features[b, n, :] over kept points
    pos_memo[b, n] = (b, y, x) if kept else (-1, -1, -1)
Contract: specs/voxel_pooling_forward.yaml.

Kernels, launched in this order: `pos_memo` (spatial over (b, n, k)), then on the
default path `pool` (channels [0, C // V * V)) and `pool_tail` (channels
[C // V * V, C), launched only when C % V != 0); when the CPU knob `point_splits` gives
S > 1 point ranges per batch (see point_splits()), `pool_split` (owner = batch x range, into
a private slice of the workspace range_sums [B, S, Y, X, C]) and `combine` (slices summed in
the order s = 0..S-1) instead: deterministic for a given S, other bits than S = 1; with
`algorithm: sort` `sort_points` and `segment_sum` instead (the BEVPool route; same bits as
S = 1, measured slower: docs/kernels/voxel_pooling_forward.md). Coordinates of any int32
value are tested before the store, so nothing outside output_features is ever written.

- llvm (owner computes, no atomics): the scatter is written as a reduction
  over n. Each task owns an output slice (a batch, or a batch x channel-vector
  group), zero-fills it in the block's init and walks all N points of its batch
  in order, so every output element is summed in the order n = 0..N-1 whatever
  the thread count: the bits are the same on every run and thread count.
  The V split is in the compute (TVM 0.27 scalarises a predicated split of a
  symbolic loop), and the tail is its own PrimFunc because decompose_reduction
  needs the only writer of `out` in a function. With S > 1 point ranges (B < cores)
  the owner is (batch, range) and its slice is private (range_sums), summed by
  `combine` in a fixed order: the bits depend on S, never on the thread count.
- cuda (mlu-ops / BEVDepth): one thread per (point, channel) doing atomicAdd;
  the output is zero-filled on the device before the launch. TVM 0.27 has no
  schedule primitive that turns a store into an atomic, so this target has its
  own compute (the atomic is in it).
"""

from __future__ import annotations

from ... import policy
from ...errors import BadParamError
from ..base import Operator
from . import compute, schedule


def point_splits(sizes: dict, plan: dict) -> int:
    """S, the point ranges per batch of the CPU owner path (1: one owner per batch).

    "auto" = ceil(cores / B) from the target model's core count, never the runtime thread
    count: S fixes the summation order, so one S gives the same bits on every thread count.
    Capped at N (a range holds at least one point) and so that the workspace stays below
    2^31 elements, like every tensor the int32-indexed kernels touch."""
    splits = plan.get("point_splits", 1)
    if splits == "auto":  # the policy's task split: B batches cut so that every core has a task
        splits = policy.tasks_per_item(sizes["B"], plan["cores"])
    grid = sizes["B"] * sizes["Y"] * sizes["X"] * sizes["C"]
    return max(1, min(int(splits), sizes["N"], (2**31 - 1) // grid))


class VoxelPoolingForward(Operator):
    name = "voxel_pooling_forward"
    kernel_names = ("pos_memo", "pool", "pool_tail", "pool_split", "combine", "sort_points",
                    "segment_sum")
    recipe = schedule

    def plan(self, model, knobs):
        """The seed's policy (../shared/seeds/voxel_pooling_forward.md, 3.1), step by step.

        Nothing is staged on chip (the seed's NRAM point and channel buffers are registers
        and the caches here), so the plan is a task split and a vector width."""
        pol = policy.for_target(model)
        if model.kind == "cuda":
            # one thread per (point, channel), channels split at a warp (main | tail kernel);
            # blocks of `threads` over the fused (n, c), `memo_threads` over pos_memo's points
            return {"vec": compute.CUDA_VEC, "threads": int(knobs["threads"]), "memo_threads": int(knobs["memo_threads"])}
        # task split: a task owns a batch (x c_vecs_per_task vectors of channels when > 0) x
        # one of S point ranges; S = point_splits(), "auto" = ceil(taskDim / B) at launch
        splits = knobs["point_splits"]
        if splits != "auto" and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
            raise ValueError(f"point_splits must be 'auto' or a positive integer, got {splits!r}")
        # V: the channels of one step, one float32 vector (16 on AVX-512, 8 on AVX2);
        # memo_chunk: pos_memo's points per task (the seed's nram_limit_pt_num)
        return {"vec": pol.vector(), "algorithm": knobs["algorithm"],
                "point_splits": splits, "cores": pol.cores,
                "c_vecs_per_task": int(knobs["c_vecs_per_task"]),
                "memo_chunk": int(knobs["memo_chunk"]), "unroll_points": int(knobs["unroll_points"])}

    def computes(self, dtype, plan, model):
        return compute.computes(dtype, plan["vec"], model.kind)

    def workspaces(self, problem, plan):
        s = problem.sizes
        if plan.get("algorithm") != "sort":
            splits = point_splits(s, plan)
            if splits == 1:
                return {}  # pool writes output_features directly
            # a private float32 slice of the output grid per point range
            return {"range_sums": ((s["B"], splits, s["Y"], s["X"], s["C"]), problem.dtype)}
        # voxel boundaries [B, Y*X + 1] and the point indices sorted by voxel [B, N]
        return {"voxel_start": ((s["B"], s["Y"] * s["X"] + 1), "int32"), "sorted_points": ((s["B"], s["N"]), "int32")}

    def zeroed(self, problem, plan):
        # CUDA atomics accumulate into the output; the llvm kernels zero their own slices
        return ("output_features",) if problem.device == "cuda" else ()

    def launch(self, kernels, problem, tensors):
        s, p, plan = problem.sizes, problem.params, kernels.plan
        geom, feat = tensors["geom_xyz"], tensors["input_features"]
        out, memo = tensors["output_features"], tensors["pos_memo"]
        kernels["pos_memo"](geom, memo, s["X"], s["Y"], p["num_voxel_z"])
        if plan.get("algorithm") == "sort":
            start, order = tensors["voxel_start"], tensors["sorted_points"]
            kernels["sort_points"](geom, start, order, s["X"], s["Y"], p["num_voxel_z"])
            kernels["segment_sum"](feat, start, order, out)
            return
        if point_splits(s, plan) > 1:
            part = tensors["range_sums"]
            kernels["pool_split"](geom, feat, part, p["num_voxel_z"])
            kernels["combine"](part, out)
            return
        kernels["pool"](geom, feat, out, p["num_voxel_z"])
        if s["C"] % plan["vec"]:
            kernels["pool_tail"](geom, feat, out, p["num_voxel_z"])


OP = VoxelPoolingForward()


def voxel_pooling_forward(geom_xyz, input_features, num_voxel_x, num_voxel_y, num_voxel_z, *,
                          target="llvm", out=None):
    """BEV voxel pooling: (output_features [B, Y, X, C], pos_memo [B, N, 3]).

    geom_xyz [B, N, 3] int32 holds (x, y, z) voxel coordinates; input_features [B, N, C]
    float32. A point is kept iff 0 <= x < num_voxel_x, 0 <= y < num_voxel_y and
    0 <= z < num_voxel_z; its features are summed into output_features[b, y, x] and
    pos_memo[b, n] = (b, y, x), else (-1, -1, -1). numpy in -> numpy out; torch in ->
    torch out. `out=` is a pair (output_features, pos_memo) of caller buffers; either may be
    None.
    """
    if out is None:
        out = (None, None)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise BadParamError("voxel_pooling_forward: out must be a pair (output_features, pos_memo), "
                            f"either may be None; got {type(out).__name__}")
    return OP.call({"geom_xyz": geom_xyz, "input_features": input_features},
                   {"num_voxel_x": num_voxel_x, "num_voxel_y": num_voxel_y, "num_voxel_z": num_voxel_z},
                   target, {"output_features": out[0], "pos_memo": out[1]})
