"""dynamic_scatter_backward (mmcv dynamic_point_to_voxel backward, MVXNet).

v = point2voxel_map[n]; a point takes part when 0 <= v < voxel_num (voxel_num <= M).
- max: the gradient of (voxel v, channel c) goes whole to the smallest point index n
  with map[n] == v and feats[n, c] == voxel_feats[v, c] (exact equality: NaN never
  matches); every other entry is 0; no match -> nothing is written.
- sum: grad_feats[n] = grad_voxel_feats[v]; mean: the same divided by voxel_points_count[v].
Contract: specs/dynamic_scatter_backward.yaml.

The mlu-ops structure: a traceback kernel finds, per (voxel, channel), the winning point
index in an int32 workspace reduce_from[M, C] (sentinel N = no match), then a scatter
kernel sends each voxel's gradient to that point. The traceback is written as a
min-reduction, so it is order-free: any schedule (channel owners on a CPU, atomicMin on a
GPU, any thread count) gives the same bits. The scatter is written in its owner-computes
(gather) form: each point owns its output row and takes g[v, c] exactly when
reduce_from[v, c] == n, which is bit-identical to mlu-ops' scatter (each (v, c) names one
point) and writes every output element once: no zero-fill, no write conflicts.
The CPU's max runs by voxel owners instead (knob max_owners: voxels, compute.
voxel_owner_computes): a counting sort lists each voxel's points in index order, and a
task per voxel and channel vector (at a voxel encoder's C = 64, 128: the whole row) takes its
first point equal to the max and writes its points' rows: the same winner, and each output
row written by one task. The CPU's sum and
mean are row gathers (compute.row_gather_computes: each point copies its voxel's row,
prefetching the row of a point further on), with copies for a voxel encoder's channels.
All indexed accesses sit under the validity test of v, reduce_from is compared, never
used as an index, and the voxel lists index only points a valid v bucketed, so no input
(map entries of -1, >= voxel_num, >= M) reaches outside a buffer.
"""

from __future__ import annotations

import numpy as np

from ... import policy
from ...errors import BadParamError
from ... import interop
from ...interop import zero as _zero
from .. import fixed_channels
from ..base import Operator
from ..fixed_channels import VOXEL_ENCODER_CHANNELS


def voxel_num_value(voxel_num):
    """None, an int, or a one-element int32 array/tensor -> None or a Python int (or the
    value unchanged for the generic integer check to reject)."""
    if voxel_num is None or isinstance(voxel_num, (bool, np.bool_, int, np.integer)):
        return voxel_num
    if isinstance(voxel_num, np.ndarray) or hasattr(voxel_num, "__dlpack__"):
        shape = tuple(voxel_num.shape)
        dtype = voxel_num.dtype.newbyteorder("=") if isinstance(voxel_num, np.ndarray) else voxel_num.dtype
        dtype = str(dtype).replace("torch.", "")  # numpy's in either byte order (big-endian inputs just work)
        if dtype != "int32":
            raise BadParamError(f"dynamic_scatter_backward: voxel_num must be an int or a one-element "
                                f"int32 array, got dtype {dtype}")
        if int(np.prod(shape)) != 1:
            raise BadParamError(f"dynamic_scatter_backward: voxel_num must be an int or a one-element "
                                f"int32 array, got shape {list(shape)}")
        if isinstance(voxel_num, np.ndarray) or interop._is_torch(voxel_num):
            # a CUDA tensor is read once per tensor and version (interop.host_values)
            return interop.host_values(voxel_num, _first_int)
        return int(np.from_dlpack(voxel_num).reshape(-1)[0])
    return voxel_num  # not an integer: the spec's check names it


def _first_int(values) -> int:
    """The one element of a one-element array (a module-level function: host_values keys its
    cache of small host tensors by the converter too)."""
    return int(values.reshape(-1)[0])


def whole_rows(model) -> list:
    """The voxel encoder's channel counts whose max runs max_voxels_rows_c<C> (a voxel's
    whole row at once): those whose first-match indices and voxel max, C / lanes registers
    each, take at most half the target's SIMD registers. Past that the row spills: on a
    znver3 (AVX2, 16 registers) the whole rows ran net_17176x128_m13743 at 5.2 ms against
    3.4 ms in channel vectors, C = 64 1.2 against 0.9 ms."""
    lanes = model.lanes("float32")
    return [c for c in VOXEL_ENCODER_CHANNELS if 2 * (c // lanes) <= model.vector_registers // 2]


class DynamicScatterBackward(Operator):
    name = "dynamic_scatter_backward"
    kernel_names = ("max_init", "max_traceback", "max_scatter", "sum_scatter", "mean_scatter", "max_buckets",
                    "max_voxels", "max_voxels_small", *fixed_channels.names("max_voxels_rows", VOXEL_ENCODER_CHANNELS),
                    "max_unbucketed", "sum_rows", "mean_rows",
                    *fixed_channels.names("sum_rows", VOXEL_ENCODER_CHANNELS),
                    *fixed_channels.names("mean_rows", VOXEL_ENCODER_CHANNELS))

    # --- contract -----------------------------------------------------------
    def rules(self, problem):
        sizes = problem.sizes
        if sizes["N"] < sizes["M"]:
            raise BadParamError(f"{self.name}: feats.shape[0] (N) must be >= grad_voxel_feats.shape[0] "
                                f"(M) = {sizes['M']}, got {sizes['N']}")
        voxel_num = problem.params.get("voxel_num")
        if voxel_num is None:
            voxel_num = sizes["M"]
        if voxel_num > sizes["M"]:
            raise BadParamError(f"{self.name}: voxel_num must be <= M (voxel_feats.shape[0]) = "
                                f"{sizes['M']}, got {voxel_num}")
        problem.notes["voxel_num"] = voxel_num

    # --- kernels ------------------------------------------------------------
    def plan(self, model, knobs):
        """The policy of mlu-ops' design for dynamic_scatter_backward (section 3.3), step by step.

        The seed splits the points (traceback) and the voxels (scatter) evenly over the cores;
        here the CPU's parallel loops and the CUDA grid do that split, and the plan sizes
        the channel step. Nothing is staged on chip: reduce_from[M, C] stays in memory."""
        pol = policy.for_target(model)
        if model.kind == "cuda":
            # a warp of consecutive channels (coalesced) x threads / 32 rows per block
            return {"threads_x": policy.WARP, "threads_y": pol.warps(int(knobs["threads"]))}
        # channels per owner step: lanes_mult whole SIMD registers (the NFU alignment)
        return {"vec": pol.vector(int(knobs["lanes_mult"])), "unroll_points": int(knobs["unroll_points"]),
                "max_owners": knobs["max_owners"], "prefetch_points": int(knobs["prefetch_points"]),
                "max_prefetch_points": int(knobs["max_prefetch_points"]),
                "whole_rows": whole_rows(model)}

    def computes(self, dtype, plan, model):
        from .compute import kernel_computes, row_gather_computes, voxel_owner_computes

        scatters = kernel_computes(dtype)
        if model.kind != "llvm":
            return scatters
        rows = row_gather_computes(dtype, plan["vec"], plan["prefetch_points"])  # sum and mean
        if plan["max_owners"] == "voxels":  # the traceback's three kernels are not launched
            owners = voxel_owner_computes(dtype, (plan["vec"], 1), model.kind, plan["max_prefetch_points"])
            return {**rows, **owners}
        return {**rows, **{name: scatters[name] for name in ("max_init", "max_traceback", "max_scatter")}}

    def _by_voxels(self, problem, plan) -> bool:
        return problem.device == "cpu" and plan.get("max_owners") == "voxels"

    def workspaces(self, problem, plan):
        if problem.params["reduce_type"] != "max" or problem.notes["voxel_num"] == 0:
            return {}
        if self._by_voxels(problem, plan):  # each voxel's points: order[start[v]:start[v + 1]]
            return {"order": ((problem.sizes["N"],), "int32"), "start": ((problem.sizes["M"] + 1,), "int32")}
        # the traceback: the index of the first point reaching each (voxel, channel) maximum,
        # M*C*4 bytes (mlu-ops uses N*C*4)
        return {"reduce_from": ((problem.sizes["M"], problem.sizes["C"]), "int32")}

    def launch(self, kernels, problem, tensors):
        voxel_num = problem.notes["voxel_num"]
        reduce_type = problem.params["reduce_type"]
        out = tensors["grad_feats"]
        if voxel_num == 0:  # no voxel takes part: all zeros, no kernel
            _zero(out)
            return
        p2v, g = tensors["point2voxel_map"], tensors["grad_voxel_feats"]
        if reduce_type == "max" and self._by_voxels(problem, kernels.plan):
            feats, order, start = tensors["feats"], tensors["order"], tensors["start"]
            kernels["max_buckets"](p2v, order, start, voxel_num)
            channels = problem.sizes["C"]
            if channels in kernels.plan["whole_rows"]:  # whole rows, C fixed
                voxels = fixed_channels.pick("max_voxels_rows", channels, VOXEL_ENCODER_CHANNELS)
            else:
                voxels = "max_voxels_small" if channels < kernels.plan["vec"] else "max_voxels"
            kernels[voxels](g, feats, tensors["voxel_feats"], order, start, out)
            kernels["max_unbucketed"](p2v, out, voxel_num)
        elif reduce_type == "max":
            reduce_from = tensors["reduce_from"]
            kernels["max_init"](reduce_from, problem.sizes["N"])
            kernels["max_traceback"](tensors["feats"], tensors["voxel_feats"], p2v, reduce_from, voxel_num)
            kernels["max_scatter"](g, reduce_from, p2v, out, voxel_num)
        elif problem.device == "cpu":  # sum / mean: row gathers, C fixed at an encoder's channels
            rows = fixed_channels.pick(f"{reduce_type}_rows", problem.sizes["C"], VOXEL_ENCODER_CHANNELS)
            kernels[rows](g, tensors["voxel_points_count"], p2v, out, voxel_num)
        elif reduce_type == "sum":
            kernels["sum_scatter"](g, p2v, out, voxel_num)
        else:
            kernels["mean_scatter"](g, tensors["voxel_points_count"], p2v, out, voxel_num)


OP = DynamicScatterBackward()


def dynamic_scatter_backward(grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count,
                             voxel_num=None, reduce_type="max", *, target="llvm", out=None):
    """Gradient of mmcv's dynamic_point_to_voxel: grad_feats [N, C] from grad_voxel_feats [M, C].

    feats [N, C] and voxel_feats [M, C] (the forward's output) are float32;
    point2voxel_map [N] (-1 = dropped point) and voxel_points_count [M] are int32.
    voxel_num (valid voxels, <= M; an int or a one-element int32 array) defaults to M.
    reduce_type "max" (bit-exact: the smallest matching point index takes the whole
    gradient), "sum" or "mean". numpy in -> numpy out; torch in -> torch out; `out=` writes
    into a caller buffer of shape [N, C].
    """
    return OP.call({"grad_voxel_feats": grad_voxel_feats, "feats": feats, "voxel_feats": voxel_feats,
                    "point2voxel_map": point2voxel_map, "voxel_points_count": voxel_points_count},
                   {"voxel_num": voxel_num_value(voxel_num), "reduce_type": reduce_type}, target,
                   {"grad_feats": out})
