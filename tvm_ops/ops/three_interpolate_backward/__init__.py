"""three_interpolate_backward (PointNet++).

grad_features[b, c, m] = sum over (n, k) with indices[b, n, k] == m of
grad_output[b, c, n] * weights[b, n, k]; indices outside [0, M) contribute
nothing. Contract: specs/three_interpolate_backward.yaml.

Kernels: mlu-ops' owner-computes plan, an owner a (batch, M-block, C-block) tile of
grad_features that accumulates in a float32 on-chip tile while walking all of N, so owners
never write the same element (no atomics, the same bits on every run).
  CPU: `three_interpolate_backward` (c_tile channels, whole vectors) and `_vector` (one
      vector of channels) are written in their scheduled form (compute.transposed_compute:
      grad_output staged by register transposes, which no schedule of the compute emits);
      `_narrow` is the TensorIR compute with one channel per owner, for few channels
      against many rows (see launch).
  CUDA: the TensorIR compute (compute.tiled_compute), a block per owner; every name holds
      the same kernel but `_narrow` (one channel), and launch runs the first.
"""

from __future__ import annotations

from ... import policy
from ..base import Operator
from . import schedule
from .compute import KERNELS, tiled_compute, transposed_compute

WIDE_SHARE = 4  # measured: docs/kernels/three_interpolate_backward.md


def cpu_kernel(sizes: dict, plan: dict) -> str:
    """The CPU kernel of a call (measured: docs/kernels/three_interpolate_backward.md).

    The vector kernels pay, per owner, a zero-fill and a transposed store of its M rows;
    the narrow one pays a scalar update per channel and (n, k). So: narrow while its extra
    updates, (C - 1) * N, are at most M; the one-vector kernel up to WIDE_SHARE c_tile's worth of
    channels (more, smaller owners balance the cores and waste fewer tail lanes); then c_tile."""
    channels, points, rows = sizes["C"], sizes["N"], sizes["M"]
    if (channels - 1) * points <= rows:
        return KERNELS[2]
    return KERNELS[0] if channels >= WIDE_SHARE * int(plan["c_tile"]) else KERNELS[1]


class ThreeInterpolateBackward(Operator):
    name = "three_interpolate_backward"
    kernel_names = KERNELS
    recipe = schedule  # the per-target recipes (schedule.llvm, schedule.cuda)

    def plan(self, model, knobs):
        """The seed's policy (../shared/seeds/three_interpolate_backward.md, 3.3), step by step."""
        # budget: the on-chip memory the schedule file names (L2 per core; shared per block)
        pol = policy.for_target(model, self.schedules[model.kind].onchip)
        # Co and No: the knobs; go_t[No, Co] float32 is staged first (the seed sizes N first)
        # (CPU: c_tile in whole vectors, and go_t one [lanes, lanes] square per vector)
        c_tile = int(knobs["c_tile"])
        if model.kind == "llvm":
            if c_tile % pol.lanes:
                raise ValueError(f"c_tile={c_tile} is not a whole number of {pol.lanes}-lane vectors")
            n_tile = pol.lanes
        else:
            n_tile = int(knobs["n_tile"])
        # Mo = deal_num: acc[Mo, Co] float32 rows from the rest of acc_budget x budget, in
        # whole blocks of 32 rows (a warp of rows on CUDA, whole SIMD vectors on every CPU)
        m_tile = pol.deal_num(knobs["acc_budget"], n_tile * c_tile * 4, 1, 4 * c_tile, align=32)
        if m_tile == 0:
            raise ValueError(f"on-chip budget {pol.budget} B too small for c_tile={c_tile}")
        if knobs.get("m_tile_max"):  # CUDA: cap Mo so more, smaller owners keep more warps busy
            m_tile = min(m_tile, int(knobs["m_tile_max"]))
        # task split: the B x ceil(M / Mo) x ceil(C / Co) owners go to the cores (TVM's parallel
        # loop on the CPU, one block each on CUDA); the tiles live in the policy's scope
        return {"m_tile": m_tile, "c_tile": c_tile, "n_tile": n_tile, "scope": pol.scope}

    def computes(self, dtype, plan, model):
        wide, vector, narrow = KERNELS
        m_tile, c_tile, n_tile, scope = plan["m_tile"], plan["c_tile"], plan["n_tile"], plan["scope"]
        kernels = {narrow: tiled_compute(dtype, m_tile, 1, n_tile, scope, narrow)}
        if model.kind == "llvm":
            lanes = n_tile  # the CPU stages one [lanes, lanes] square per vector (plan)
            kernels[wide] = transposed_compute(dtype, lanes, c_tile // lanes, m_tile)
            kernels[vector] = transposed_compute(dtype, lanes, 1, m_tile)
        else:
            kernels[wide] = tiled_compute(dtype, m_tile, c_tile, n_tile, scope, wide)
            kernels[vector] = tiled_compute(dtype, m_tile, c_tile, n_tile, scope, vector)
        return kernels

    def launch(self, kernels, problem, tensors):
        name = cpu_kernel(problem.sizes, kernels.plan) if problem.device == "cpu" else KERNELS[0]
        kernels[name](tensors["grad_output"], tensors["indices"], tensors["weights"], tensors["grad_features"])


OP = ThreeInterpolateBackward()


def three_interpolate_backward(grad_output, indices, weights, m=None, *, target="llvm", out=None):
    """Gradient of three-NN interpolation: grad_features [B, C, M] from grad_output [B, C, N].

    `indices` / `weights` are [B, N, 3] (int32 / the dtype of grad_output; float32 or
    float16). Indices outside [0, m) contribute nothing. numpy in -> numpy out; torch in ->
    torch out (zero-copy). `out=` writes into a caller buffer of shape [B, C, M], which
    also gives `m` when it is omitted.
    """
    return OP.call({"grad_output": grad_output, "indices": indices, "weights": weights},
                   {"m": m}, target, {"grad_features": out})
