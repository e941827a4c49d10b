"""dynamic_scatter_forward (mmcv dynamic_point_to_voxel forward, MVXNet's dynamic voxelisation).

A point whose coordinate row has a negative entry is dropped (point2voxel_map -1); the
voxels are the distinct rows of the other points in lexicographic order (mmcv's
torch.unique over rows); voxel_feats[v] reduces voxel v's points' features in point order:
max (a NaN feature never wins, as in mmcv's comparisons; -inf where every one is NaN), sum
in float32, or mean = that sum / count. The order is the same on every target, so sum and
mean give the same bits on every run, CPU and CUDA (mmcv's CUDA float atomics do not).
Semantics: docs/semantics.md; the contract: specs/dynamic_scatter_forward.yaml.

The number of voxels M is data-dependent: a call first groups the points (`count`: the
grouping kernels, then M read on the host: on CUDA the one synchronisation of the call),
then allocates the [M, ...] outputs (or checks the out= buffers against M) and fills them
(`launch`). Grouping plans (compute.py): a radix sort on the CPU (on two cores from the
plan's split_min_points points on, else serial), a bitonic network and a chunked scan on
CUDA (which the CPU also runs with the knob sort=bitonic, so the tests check the GPU's
grouping here).
"""

from __future__ import annotations

from ... import policy
from ...checks import INT32_MAX
from ...errors import BadParamError
from .. import fixed_channels
from ..knobs import whole
from ..base import Operator
from ..fixed_channels import VOXEL_ENCODER_CHANNELS
from ..point_vectors import plan_vector

RADIX_BITS = 14
# the CPU's grouping also comes with D fixed (its per-point column loops unrolled: a third
# faster at D = 3): MVXNet's (z, y, x) and mmdet3d's batched (b, z, y, x)
FIXED_COLUMNS = (3, 4)
# the two-part grouping (group_split): points cut in SPLIT_PARTS parts, the keys in as many
# sides by the row's top COARSE_BITS bits; SHARED_WORDS words of shared state (compute.py)
SPLIT_PARTS = 2
# group_split's parallel loops (A-G in compute.py: one launch, barriers between them; B and D
# work on one thread while the other waits). The one-core threshold counts all seven: with
# TVM's workers asleep (torch callers) the two-core call at 4294 points still took 147 us
# against 97 on one core (docs/performance.md, "small calls on one core")
GROUP_SPLIT_LOOPS = 7
COARSE_BITS = 10
COARSE = 1 << COARSE_BITS
SHARED_WORDS = 9
GROUP_KERNELS = {"radix": tuple(f"{name}{d}" for name in ("group_rows", "group_split")
                                for d in ("",) + tuple(f"_d{d}" for d in FIXED_COLUMNS)),
                 "bitonic": ("bitonic_init", "bitonic_step", "bitonic_tile", "head_flags",
                             "chunk_totals", "chunk_offsets", "chunk_scan", "segment_starts")}
REDUCE_TYPES = ("max", "sum", "mean")
REDUCE_WIDTHS = ("", "_lanes", "_small")  # channel vectors of the plan's width, the target's lanes, one
FILL_KERNELS = ("voxel_rows", "point_map") + tuple(f"reduce_{r}{w}" for r in REDUCE_TYPES for w in REDUCE_WIDTHS) \
    + tuple(name for r in REDUCE_TYPES for name in fixed_channels.names(f"reduce_{r}_rows", VOXEL_ENCODER_CHANNELS))
KERNELS = GROUP_KERNELS["radix"] + GROUP_KERNELS["bitonic"] + FILL_KERNELS

SORTS = ("radix", "bitonic")  # the grouping plans (the knob `sort`)
CHUNK = 256  # points per chunk of the bitonic plan's scan


def _groups_in_two_parts(points: int, settings: dict) -> bool:
    """Whether the radix plan groups `points` points with group_split (on two cores), for the
    knobs or the plan (both hold `sort` and `split_min_points`)."""
    return settings["sort"] == "radix" and points >= int(settings["split_min_points"])


def _reduces_whole_rows(problem) -> bool:
    """Whether the CPU's reduce runs with C fixed (a voxel encoder's channels), whole rows at a
    time, writing voxel_rows' outputs too."""
    return problem.device == "cpu" and problem.sizes["C"] in VOXEL_ENCODER_CHANNELS


MAX_TILE = 1024  # the bitonic plan's tile: a CUDA block's threads


class DynamicScatterForward(Operator):
    name = "dynamic_scatter_forward"
    kernel_names = KERNELS
    host_workspaces = ("count",)  # the voxel count; the others only kernels take

    def plan(self, model, knobs):
        """The seed's split of points (grouping) and voxels (filling) over the cores is the
        CPU's parallel loops and the CUDA grid; the plan sizes the reduce's channel vector
        (whole SIMD registers) and names the grouping plan."""
        if knobs["sort"] not in SORTS:  # launch and zeroed branch on it
            raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {knobs['sort']!r}")
        # the kernels' buffers are sized for these ranges (a Variant may be given any number)
        tile = whole(knobs, "tile", 2, MAX_TILE)
        if tile & (tile - 1):  # the bitonic network's steps within a tile
            raise ValueError(f"tile must be a power of two, got {tile}")
        plan = {"sort": knobs["sort"], "chunk": CHUNK, "tile": tile}
        if model.kind == "cuda":
            policy.for_target(model).warps(int(knobs["threads"]))  # a whole number of warps
            return dict(plan, threads=int(knobs["threads"]))
        return dict(plan, vector=plan_vector(model, knobs)["vector"], lanes=model.lanes("float32"),
                    prefetch_points=whole(knobs, "prefetch_points", 0, 1 << 20),
                    split_min_points=whole(knobs, "split_min_points", 0, INT32_MAX),
                    small_sort_keys=whole(knobs, "small_sort_keys", 0, INT32_MAX),
                    # the histograms hold 2^RADIX_BITS counts
                    small_radix_bits=whole(knobs, "small_radix_bits", 1, RADIX_BITS))

    def computes(self, dtype, plan, model):
        from .compute import fill_computes, group_computes

        grouping = GROUP_KERNELS[plan["sort"]]  # the plan's grouping kernels alone
        group = {name: func for name, func in group_computes(
            model.kind, int(plan["tile"]), int(plan.get("small_sort_keys", 0)),
            int(plan.get("small_radix_bits", RADIX_BITS))).items() if name in grouping}
        if model.kind == "cuda":  # a thread per channel: one width (launch runs reduce_<type>)
            fill = fill_computes(dtype, (1, 1, 1), 0, model.kind)
            return {**group, **{name: func for name, func in fill.items() if not name.endswith(REDUCE_WIDTHS[1:])}}
        widths = (int(plan["vector"]), int(plan["lanes"]), 1)
        return {**group, **fill_computes(dtype, widths, int(plan["prefetch_points"]), model.kind)}

    def workspaces(self, problem, plan):
        n = problem.sizes["N"]
        spaces = {"start": ((n + 1,), "int32"), "voxel_of": ((n,), "int32"), "count": ((1,), "int32")}
        if plan["sort"] == "radix":
            columns = problem.sizes["D"]
            spaces = dict(spaces, order=((n,), "int32"), scratch=((n,), "int32"), keys=((n,), "int64"),
                          keys_tmp=((n,), "int64"), keys_alt=((n,), "int64"), column_bits=((columns,), "int32"),
                          part_max=((SPLIT_PARTS, columns), "int32"), coarse=((SPLIT_PARTS, COARSE), "int32"),
                          split_shared=((SHARED_WORDS,), "int32"))
            if "point2voxel_map" in problem.outs:
                # the grouping writes the map as it numbers the voxels, but a caller's buffer
                # is written only once the counted size has been checked (point_map writes it in launch)
                spaces["early_map"] = ((n,), "int32")
            return spaces
        padded = 1 << max(n - 1, 0).bit_length()  # the bitonic network's power of two
        chunks = -(-n // plan["chunk"])
        return dict(spaces, order=((padded,), "int32"), scratch=((padded,), "int32"), flags=((n,), "int32"),
                    totals=((chunks,), "int32"), offsets=((chunks,), "int32"))

    def parallel_loops(self, problem, knobs):
        """group_split's parallel regions where it runs (N from split_min_points on), then
        voxel_rows' and the reduce's loops, one where the reduce writes voxel_rows' outputs
        (point_map, where it runs, is serial)."""
        fill = 1 if _reduces_whole_rows(problem) else 2
        return (GROUP_SPLIT_LOOPS if _groups_in_two_parts(problem.sizes["N"], knobs) else 0) + fill

    def zeroed(self, problem, plan):
        # the bitonic plan writes start and count only where a voxel ends: with no kept
        # point, M = 0 and start[0] = 0 must come from here
        return ("start", "count") if plan["sort"] == "bitonic" else ()

    def count(self, kernels, problem, tensors):
        """Group the points (order, start, voxel_of, count in the workspaces) and return
        {"M": the number of voxels}, read on the host."""
        coors = tensors["coors"]
        if kernels.plan["sort"] == "radix":
            columns = problem.sizes["D"]
            fixed = f"_d{columns}" if columns in FIXED_COLUMNS else ""
            # (group_split's parts made serial do more work than group_rows: one-core libraries
            # group serially)
            split = _groups_in_two_parts(problem.sizes["N"], kernels.plan) and not kernels.one_core
            point_map = tensors.get("early_map", tensors["point2voxel_map"])
            if split:
                kernels["group_split" + fixed](coors, *(tensors[k] for k in (
                    "order", "keys", "keys_tmp", "keys_alt", "column_bits", "part_max", "coarse", "split_shared",
                    "start", "voxel_of")), point_map, tensors["count"])
            if not split or int(tensors["count"][0]) < 0:
                # few points, or rows too wide for one key (count -1): the serial kernel
                kernels["group_rows" + fixed](coors, *(tensors[k] for k in (
                    "order", "scratch", "keys", "keys_tmp", "column_bits", "start", "voxel_of")), point_map,
                    tensors["count"])
        else:
            self._bitonic_sort(kernels, tensors)
            order, flags, chunk = tensors["order"], tensors["flags"], kernels.plan["chunk"]
            kernels["head_flags"](coors, order, flags)
            kernels["chunk_totals"](flags, tensors["totals"], chunk)
            kernels["chunk_offsets"](tensors["totals"], tensors["offsets"])
            kernels["chunk_scan"](flags, tensors["offsets"], tensors["voxel_of"], chunk)
            kernels["segment_starts"](coors, order, flags, tensors["voxel_of"], tensors["start"], tensors["count"])
        return {"M": int(tensors["count"][0])}

    @staticmethod
    def _bitonic_sort(kernels, tensors):
        """The network's steps, ping-ponging between order and scratch; leaves the sorted
        permutation in tensors["order"]. The steps with j < tile run inside tiles (one launch
        sorts every tile; one per later stage k finishes it there), the others one launch each:
        log2(P / tile) (log2(P / tile) + 1) / 2 + 1 + log2(P / tile) launches instead of
        log2(P) (log2(P) + 1) / 2 (21 instead of 120 at P = 32768, tile 1024)."""
        src, dst = tensors["order"], tensors["scratch"]
        kernels["bitonic_init"](src)
        padded, tile, k = src.shape[0], int(kernels.plan["tile"]), 2
        tiled = padded >= tile
        if tiled:  # every stage k <= tile inside the tiles
            kernels["bitonic_tile"](tensors["coors"], src, dst, 1, tile.bit_length() - 1)
            src, dst = dst, src
            k = 2 * tile
        while k <= padded:
            j = k // 2
            while j >= (tile if tiled else 1):
                kernels["bitonic_step"](tensors["coors"], src, dst, k, j)
                src, dst = dst, src
                j //= 2
            if tiled:  # the stage's steps with j < tile inside the tiles
                stage_bits = k.bit_length() - 1
                kernels["bitonic_tile"](tensors["coors"], src, dst, stage_bits, stage_bits)
                src, dst = dst, src
            k *= 2
        tensors["order"], tensors["scratch"] = src, dst

    def launch(self, kernels, problem, tensors):
        order, start = tensors["order"], tensors["start"]
        voxels = tensors["voxel_points_count"].shape[0]
        if kernels.plan["sort"] != "radix" or "early_map" in tensors:  # else the grouping wrote it
            kernels["point_map"](order, tensors["voxel_of"], start, tensors["point2voxel_map"], voxels)
        if voxels == 0:  # every point dropped: the [0, ...] outputs hold nothing to write
            return
        reduce, channels = f"reduce_{problem.params['reduce_type']}", problem.sizes["C"]
        feats, coors, voxel_coors, counts = (tensors[name] for name in ("feats", "coors", "voxel_coors",
                                                                          "voxel_points_count"))
        if _reduces_whole_rows(problem):  # whole rows, C fixed, voxel_rows' outputs with them
            rows = fixed_channels.pick(f"{reduce}_rows", channels, VOXEL_ENCODER_CHANNELS)
            kernels[rows](feats, coors, order, start, tensors["voxel_feats"], voxel_coors, counts)
            return
        kernels["voxel_rows"](coors, order, start, voxel_coors, counts)
        if channels == 0:  # no channel: voxel_feats is [M, 0]
            return
        if problem.device == "cpu" and channels < int(kernels.plan["vector"]):  # the widest vector C holds
            reduce += "_lanes" if channels >= int(kernels.plan["lanes"]) else "_small"
        kernels[reduce](feats, order, start, tensors["voxel_feats"])


OP = DynamicScatterForward()


def dynamic_scatter_forward(feats, coors, reduce_type="max", *, target="llvm", out=None):
    """Scatter points into voxels (mmcv's dynamic_point_to_voxel forward):
    (voxel_feats [M, C], voxel_coors [M, D], point2voxel_map [N], voxel_points_count [M]).

    feats [N, C] float32 and coors [N, D] int32; a point with a negative coordinate is
    dropped (map -1); the M voxels are the distinct rows of the others, in lexicographic
    order; reduce_type "max", "sum" or "mean" over each voxel's points (in point order: the
    same bits every run). numpy in -> numpy out; torch in -> torch out; `out=` a 4-tuple of
    caller buffers, any may be None (one for an [M, ...] output must have the M the kernels
    count, else BadParamError before any output is written). The differentiable torch
    function: tvm_ops.functional.dynamic_scatter.
    """
    if out is None:
        out = (None,) * 4
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        raise BadParamError("dynamic_scatter_forward: out must be a 4-tuple (voxel_feats, voxel_coors, "
                            f"point2voxel_map, voxel_points_count), any may be None; got {type(out).__name__}")
    names = ("voxel_feats", "voxel_coors", "point2voxel_map", "voxel_points_count")
    return OP.call({"feats": feats, "coors": coors}, {"reduce_type": reduce_type}, target, dict(zip(names, out)))
