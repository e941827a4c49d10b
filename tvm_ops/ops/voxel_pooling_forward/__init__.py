"""voxel_pooling_forward (BEVDepth).

A point n of batch b with geom_xyz[b, n] = (x, y, z) is kept iff
0 <= x < X, 0 <= y < Y and 0 <= z < Z (x = 0 is a valid voxel).
    output_features[b, y, x, :] = sum of input_features[b, n, :] over kept points
    pos_memo[b, n] = (b, y, x) if kept else (-1, -1, -1)
Contract: specs/voxel_pooling_forward.yaml.

Kernels, launched in this order: `pos_memo` (CPU: tasks of `memo_chunk` points; CUDA: a
thread per (b, n, k)), then on the CPU
`pool` or `pool_first_touch` (owner = batch x band of output rows, every channel; at C = 64
and 80 their copies with C fixed, ops/fixed_channels.py), on CUDA `pool`
(a warp per point); with the CPU's `algorithm: sort`, `sort_points` and `segment_sum` instead
(the BEVPool route; the same bits, measured slower: docs/kernels/voxel_pooling_forward.md).
Coordinates of any int32 value are tested before the store, so nothing outside
output_features is ever written.

- llvm (owner computes, no atomics): a task owns the output rows of one of R bands of a
  batch (R = row_bands(): ceil(cores / B) by default), zero-fills them (`pool`) and walks
  all N points of its batch in order, `kept_list` at a time: it lists the points kept in
  its band (no branch), then adds their rows; with
  few points per row (first_touch()) `pool_first_touch` instead marks the rows its points
  reach, writes each row's first point over it and zero-fills only the rows left (past the
  caches in calls beyond about half the last-level cache: `stream_untouched`). Every
  output element is summed from zero in the order n = 0..N-1 whatever R and the thread
  count are: the bits are the same on every run, thread count and core count. A band
  reads every point's coordinates; its core streams the whole feature tensor (measured:
  docs/kernels/voxel_pooling_forward.md).
- cuda (BEVDepth's plan): atomicAdd into the output, zero-filled on the device before the
  launch; a warp walks `points_per_warp` consecutive points, its lanes over each point's
  channels 32 apart. TVM 0.27 has no schedule primitive that turns a store into an
  atomic, so this target has its own compute (the atomic is in it).
"""

from __future__ import annotations

from ... import policy
from ...checks import INT32_MAX
from ...errors import BadParamError
from .. import cpu_ir, fixed_channels
from ..knobs import flag, whole
from ..base import Operator

CUDA_LANES = 32
# the CPU's pool kernels (first-touch or not) and their fixed-channel copies
POOLS = ("pool", "pool_first_touch", *fixed_channels.names("pool"), *fixed_channels.names("pool_first_touch"))


def row_bands(sizes: dict, plan: dict) -> int:
    """R, the bands of output rows per batch of the CPU owner path (1: one owner per batch).

    "auto" = ceil(cores / B) from the target model's core count, so that every core has a
    task; capped at Y (a band holds at least one row). Any R gives the same bits."""
    bands = plan.get("row_bands", 1)
    if bands == "auto":  # the policy's task split: B batches cut so that every core has a task
        bands = policy.tasks_per_item(sizes["B"], plan["cores"])
    return max(1, min(int(bands), sizes["Y"]))


# zero_fill: how a CPU band owner starts its output rows (first_touch: pool_first_touch)
ZERO_FILLS = ("auto", "upfront", "first_touch")
# auto: first touches below this many points per output row of a batch (measured:
# docs/kernels/voxel_pooling_forward.md; 1.2 points per row 8-12% faster, 29 per row 2-3% slower)
FIRST_TOUCH_MAX_POINTS_PER_ROW = 4


def first_touch(sizes: dict, plan: dict) -> bool:
    """Whether the CPU band owners mark the rows their points reach instead of zero-filling
    their band first: with few points per output row most of the zero-fill is rewritten."""
    mode = plan["zero_fill"]
    if mode != "auto":
        return mode == "first_touch"
    return sizes["N"] < FIRST_TOUCH_MAX_POINTS_PER_ROW * sizes["Y"] * sizes["X"]


class VoxelPoolingForward(Operator):
    name = "voxel_pooling_forward"
    kernel_names = ("pos_memo", *POOLS, "sort_points", "segment_sum")

    def plan(self, model, knobs):
        """The policy of mlu-ops' design for voxel_pooling_forward (section 3.1), step by step.

        Nothing is staged on chip (the seed's NRAM point and channel buffers are registers
        and the caches here), so the plan is a task split and a vector width."""
        pol = policy.for_target(model)
        if model.kind == "cuda":
            # a warp per `points_per_warp` points, `threads` per block; `memo_threads` over
            # pos_memo's points
            pol.warps(int(knobs["threads"]))
            return {"vec": CUDA_LANES, "threads": int(knobs["threads"]),
                    "memo_threads": int(knobs["memo_threads"]), "points_per_warp": int(knobs["points_per_warp"])}
        # task split: a task owns a batch x one of R bands of its output rows; R = row_bands(),
        # "auto" = ceil(taskDim / B) at launch
        bands = "auto" if knobs["row_bands"] == "auto" else whole(knobs, "row_bands", 1, INT32_MAX)
        # V: the channels of one step, whole float32 vectors making a cache line (one AVX-512
        # register, two AVX2 ones), so that a streamed store of the zeros covers its line;
        # memo_chunk: pos_memo's points per task (the seed's nram_limit_pt_num)
        zero_fill = knobs["zero_fill"]
        if zero_fill not in ZERO_FILLS:
            raise ValueError(f"zero_fill must be one of {', '.join(ZERO_FILLS)}, got {zero_fill!r}")
        return {"vec": cpu_ir.line_vector(pol.lanes, "float32"), "algorithm": knobs["algorithm"], "row_bands": bands,
                "cores": pol.cores, "zero_fill": zero_fill,
                "memo_chunk": whole(knobs, "memo_chunk", 1, INT32_MAX),
                "kept_list": whole(knobs, "kept_list", 1, INT32_MAX),
                "stream_untouched": flag(knobs, "stream_untouched"),
                "stream_min_mib": whole(knobs, "stream_min_mib", 0, INT32_MAX)}

    def computes(self, dtype, plan, model):
        from . import compute

        if model.kind == "cuda":
            return compute.cuda_computes(dtype, plan["vec"])
        return compute.cpu_computes(dtype, plan["vec"], plan["memo_chunk"], model.lanes("float32"), plan["kept_list"],
                                    plan["stream_untouched"], plan["stream_min_mib"] * (1 << 20) // 4)

    def workspaces(self, problem, plan):
        s = problem.sizes
        if plan.get("algorithm") != "sort":
            return {}  # pool writes output_features directly
        # voxel boundaries [B, Y*X + 1] and the point indices sorted by voxel [B, N]
        return {"voxel_start": ((s["B"], s["Y"] * s["X"] + 1), "int32"), "sorted_points": ((s["B"], s["N"]), "int32")}

    def adds_in_any_order(self, problem, plan):
        return problem.device == "cuda"  # atomicAdd into output_features

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
        if problem.device == "cpu":  # every channel, R bands per batch
            pool = fixed_channels.pick("pool_first_touch" if first_touch(s, plan) else "pool", s["C"])
            kernels[pool](geom, feat, out, p["num_voxel_z"], row_bands(s, plan))
            return
        kernels["pool"](geom, feat, out, p["num_voxel_z"])


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
