"""three_interpolate_backward (PointNet++).

grad_features[b, c, m] = sum over (n, k) with indices[b, n, k] == m of
grad_output[b, c, n] * weights[b, n, k]; indices outside [0, M) contribute
nothing. Contract: specs/three_interpolate_backward.yaml.

Kernels on the CPU (and CUDA's with the knob `kernel: owner`): mlu-ops' owner-computes
plan, an owner a (batch, M-block, C-block) tile of grad_features that accumulates in a
float32 on-chip tile while walking all of N, so owners never write the same element (no
atomics, the same bits on every run).
  CPU: `three_interpolate_backward` (c_tile channels, whole vectors) and `_vector` (one
      vector of channels) are written in their scheduled form (compute.transposed_compute:
      grad_output staged by register transposes, which no schedule of the compute emits);
      `_narrow`, for few channels against many rows (see launch), has an owner per (b, c)
      row of grad_features: float32 zero-fills it and adds its terms straight into it (the
      TensorIR compute.scatter_compute with zero_rows), float16 sums in a float32 row
      rounded once (compute.rows_compute, in its scheduled form: vector conversions).
  CUDA: `_scatter` (compute.scatter_compute, mmcv's plan): a thread per (b, c, n) adds its
      three terms by float32 atomicAdd into the zero-filled output (float16: into a float32
      accumulator that `_cast` rounds once), so the sums are not bit-deterministic. With the
      schedule file's knob `kernel: owner`, the TensorIR owners (compute.tiled_compute, a
      block each; deterministic) as `three_interpolate_backward`.
"""

from __future__ import annotations

from ... import policy
from ..base import Operator

# the owners (wide, one vector, narrow), then CUDA's atomic scatter and its float16 rounding
OWNER_KERNELS = ("three_interpolate_backward", "three_interpolate_backward_vector", "three_interpolate_backward_narrow")
SCATTER, CAST = "three_interpolate_backward_scatter", "three_interpolate_backward_cast"
KERNELS = OWNER_KERNELS + (SCATTER, CAST)

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

    def plan(self, model, knobs):
        """The policy of mlu-ops' design for three_interpolate_backward (section 3.3), step by step."""
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
        plan = {"m_tile": m_tile, "c_tile": c_tile, "n_tile": n_tile, "scope": pol.scope}
        if model.kind == "cuda":
            pol.warps(int(knobs["threads"]))  # the scatter's blocks: whole warps
            plan.update(kernel=knobs["kernel"], threads=int(knobs["threads"]))
        return plan

    def computes(self, dtype, plan, model):
        from .compute import cast_compute, rows_compute, scatter_compute, tiled_compute, transposed_compute

        wide, vector, narrow = OWNER_KERNELS
        m_tile, c_tile, n_tile, scope = plan["m_tile"], plan["c_tile"], plan["n_tile"], plan["scope"]
        if model.kind != "llvm":  # what CUDA's launch runs: the owners (`kernel: owner`), or the scatter
            return {wide: tiled_compute(dtype, m_tile, c_tile, n_tile, scope, wide),
                    SCATTER: scatter_compute(dtype, SCATTER), CAST: cast_compute(dtype, CAST)}
        lanes = n_tile  # the CPU stages one [lanes, lanes] square per vector (plan)
        if dtype == "float32":  # nothing to round: the owners' rows are grad_features'
            narrow_compute = scatter_compute(dtype, narrow, zero_rows=True)
        else:  # a float32 row, rounded once
            narrow_compute = rows_compute(dtype, lanes)
        return {wide: transposed_compute(dtype, lanes, c_tile // lanes, m_tile),
                vector: transposed_compute(dtype, lanes, 1, m_tile), narrow: narrow_compute}

    def workspaces(self, problem, plan):
        if not _scatters(problem, plan) or problem.dtype == "float32":
            return {}
        s = problem.sizes  # float16: the atomics add in float32, `_cast` rounds once
        return {"accumulator": ((s["B"], s["C"], s["M"]), "float32")}

    def adds_in_any_order(self, problem, plan):
        return _scatters(problem, plan)  # the owners (CPU, CUDA's `kernel: owner`) add in a fixed order

    def zeroed(self, problem, plan):
        if not _scatters(problem, plan):
            return ()  # the owners zero their tiles
        return ("grad_features",) if problem.dtype == "float32" else ("accumulator",)

    def launch(self, kernels, problem, tensors):
        go, idx, w, out = (tensors[t] for t in ("grad_output", "indices", "weights", "grad_features"))
        if problem.device == "cpu":
            kernels[cpu_kernel(problem.sizes, kernels.plan)](go, idx, w, out)
        elif not _scatters(problem, kernels.plan):
            kernels[KERNELS[0]](go, idx, w, out)
        else:
            acc = tensors.get("accumulator", out)
            kernels[SCATTER](go, idx, w, acc)
            if acc is not out:
                kernels[CAST](acc, out)


GRID_YZ = 65535  # CUDA's largest grid y and z: the scatter's C and B


def _scatters(problem, plan) -> bool:
    """Whether the call runs the atomic scatter (CUDA, the schedule file's `kernel`, C and B
    within its grid; else the owners)."""
    sizes = problem.sizes
    return (problem.device != "cpu" and plan.get("kernel") == "atomic"
            and sizes["C"] <= GRID_YZ and sizes["B"] <= GRID_YZ)


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
