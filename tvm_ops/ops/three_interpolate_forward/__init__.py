"""three_interpolate_forward (PointNet++ feature propagation).

out[b, c, n] = sum over k < 3 of weights[b, n, k] * features[b, c, indices[b, n, k]];
indices outside [0, M) contribute nothing (three_interpolate_backward's rule, which also
drops NaN / inf weights at those positions), so this is the exact adjoint of
three_interpolate_backward. float16 multiplies and sums in float32 and rounds once.
Semantics: docs/semantics.md; the contract: specs/three_interpolate_forward.yaml.

Kernels (B, C, M and N symbolic): `three_interpolate_forward` (both targets) and, on the
CPU, `three_interpolate_forward_tiles`, `three_interpolate_forward_lookup` (AVX-512) and
`three_interpolate_forward_small` (N below the vector width, or float16 with M < 2 where
there is no lookup: one point at a time).
  CPU, tiles plan (the default): a parallel task per (batch, block of `lanes` channels)
      transposes its features into a [M, lanes] float32 workspace, so that each neighbour's
      channels are one vector load; per block of `lanes` points it sums the three
      neighbours' vectors per point into a tile, then transposes the tile into the output
      (lane shuffles, ops/lane_transpose.py). No gather instruction: on AMD's Zen 4 the gather
      plan ran 2.5-4.5x slower (docs/kernels/three_interpolate_forward.md). Below a vector of
      channels or features, and for the last C % lanes channels, the gather plan; below a
      vector of points the `_small` kernel. With M <= 16 on AVX-512 the lookup kernel
      instead: the gather plan's walk with each channel's row of features in one register
      (a masked load) and the neighbours picked from it by lane permutes (vpermps): no
      transposes, which cost such small rows more than their sums.
  CPU, gather plan: points in vectors, the three features of each lane fetched by one
      vector gather (llvm.masked.gather), outputs stored as whole vectors. Both written in
      their scheduled form (compute.tiles_compute, gather_compute, lookup_compute): TVM's LLVM codegen
      scalarises a per-lane load of the compute below (16 loads and inserts per vector,
      which bounded the kernel at 10-20% of the bandwidth); the compute (forward_compute)
      stays the portable form, run as the `_small` kernel and on CUDA, and all give the
      same bits.
  CUDA: a thread per output element (forward_compute).
No atomics: every output element is one thread's sum of three terms in k order.

Safety: every feature load's index is clamped into [0, M) (the term is dropped by a
Select when the index is outside), so no index value reads outside `features`.
"""

from __future__ import annotations

from ..base import Operator
from ..cpu_ir import has_lane_lookup
from ..point_vectors import plan_vector

KERNELS = ("three_interpolate_forward", "three_interpolate_forward_small", "three_interpolate_forward_tiles",
           "three_interpolate_forward_lookup")
# the lookup kernel's rows: one register of float32 lanes (AVX-512's vpermps table)
LOOKUP_FEATURES = 16


class ThreeInterpolateForward(Operator):
    name = "three_interpolate_forward"
    kernel_names = KERNELS

    def plan(self, model, knobs):
        """mlu-ops would split B * C over taskDim; here a CPU task is a (batch, channel block)
        whose points run in vectors (a multiple of the target's lanes); CUDA blocks of
        `threads` points of one (batch, channel)."""
        plan = plan_vector(model, knobs)
        if model.kind == "llvm":
            plan["lanes"] = model.lanes("float32")
        return plan

    def computes(self, dtype, plan, model):
        from .compute import forward_compute, gather_compute, lookup_compute, tiles_compute

        portable = forward_compute(dtype, 1)
        if model.kind != "llvm":  # CUDA: a thread per output element, one kernel
            return {KERNELS[0]: portable}
        computes = {KERNELS[0]: gather_compute(dtype, int(plan["vector"]), int(plan["c_tile"])), KERNELS[1]: portable,
                    KERNELS[2]: tiles_compute(dtype, int(plan["lanes"]), int(plan["channel_vectors"]))}
        if has_lane_lookup(model.features()):
            computes[KERNELS[3]] = lookup_compute(dtype, int(plan["lanes"]), int(plan["c_tile"]))
        return computes

    def launch(self, kernels, problem, tensors):
        args = [tensors[t] for t in ("features", "indices", "weights", "output")]
        kernel = KERNELS[0] if problem.device != "cpu" else cpu_kernel(kernels, problem.dtype, problem.sizes)
        kernels[kernel](*args)


def cpu_kernel(kernels, dtype: str, sizes: dict) -> str:
    """The kernel a CPU call of these sizes runs, from the library `kernels` (its plan, and
    whether it holds the lookup kernel)."""
    plan, lanes = kernels.plan, int(kernels.plan["lanes"])
    # the portable kernel below one vector of points
    if sizes["N"] < int(plan["vector"]):
        return KERNELS[1]
    # a row of at most 16 features in a register (AVX-512): in place of the tiles, whose
    # transposes cost more than such rows' lookups
    if plan["plan"] == "tiles" and sizes["M"] <= LOOKUP_FEATURES and KERNELS[3] in kernels:
        return KERNELS[3]
    # float16 with one feature column: the vector kernel's half gathers read a pair of
    # columns (gather_ir)
    if dtype == "float16" and sizes["M"] < 2:
        return KERNELS[1]
    if plan["plan"] == "tiles" and sizes["M"] >= lanes and sizes["C"] >= lanes:
        return KERNELS[2]
    return KERNELS[0]


OP = ThreeInterpolateForward()


def three_interpolate_forward(features, indices, weights, *, target="llvm", out=None):
    """Three-nearest-neighbour interpolation: output [B, C, N] from features [B, C, M].

    indices [B, N, 3] int32 and weights [B, N, 3] (the dtype of features: float32 or
    float16); indices outside [0, M) contribute nothing. numpy in -> numpy out; torch in ->
    torch out; `out=` a caller buffer [B, C, N]. The differentiable torch function:
    tvm_ops.functional.three_interpolate.
    """
    return OP.call({"features": features, "indices": indices, "weights": weights}, {}, target, {"output": out})
