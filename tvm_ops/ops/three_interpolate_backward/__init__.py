"""three_interpolate_backward (PointNet++).

grad_features[b, c, m] = sum over (n, k) with indices[b, n, k] == m of
grad_output[b, c, n] * weights[b, n, k]; indices outside [0, M) contribute
nothing. Contract: specs/three_interpolate_backward.yaml.

The compute is mlu-ops' owner-computes plan written as TensorIR: an owner is a
(batch, M-block, C-block) tile of grad_features that accumulates in a float32
on-chip tile while walking all of N, so owners never write the same element.
"""

from __future__ import annotations

from ... import policy
from ..base import Operator
from . import schedule
from .compute import tiled_compute


NARROW_SHARE = 4  # measured: see docs/kernels/three_interpolate_backward.md


class ThreeInterpolateBackward(Operator):
    name = "three_interpolate_backward"
    # the second: one channel per owner step (CPU, C far below c_tile: see launch)
    kernel_names = ("three_interpolate_backward", "three_interpolate_backward_narrow")
    recipe = schedule  # the per-target recipes (schedule.llvm, schedule.cuda)

    def plan(self, model, knobs):
        """The seed's policy (../shared/seeds/three_interpolate_backward.md, 3.3), step by step."""
        # budget: the on-chip memory the schedule file names (L2 per core; shared per block)
        pol = policy.for_target(model, self.schedules[model.kind].onchip)
        # Co and No: the knobs; go_t[No, Co] float32 is staged first (the seed sizes N first)
        c_tile, n_tile = int(knobs["c_tile"]), int(knobs["n_tile"])
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
        wide, narrow = self.kernel_names
        return {wide: tiled_compute(dtype, plan["m_tile"], plan["c_tile"], plan["n_tile"], plan["scope"], wide),
                narrow: tiled_compute(dtype, plan["m_tile"], 1, plan["n_tile"], plan["scope"], narrow)}

    def launch(self, kernels, problem, tensors):
        # A tile's c_tile lanes cost the same with one real channel as with c_tile: below
        # NARROW_SHARE of them the CPU runs one channel per step (C = 1: 61 -> 12 us).
        narrow = problem.device == "cpu" and problem.sizes["C"] * NARROW_SHARE <= int(kernels.plan["c_tile"])
        kernels[self.kernel_names[1] if narrow else self.kernel_names[0]](
            tensors["grad_output"], tensors["indices"], tensors["weights"], tensors["grad_features"])


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
