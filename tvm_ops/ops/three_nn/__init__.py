"""three_nn (PointNet++ feature propagation).

For each unknown point, the three nearest known points of its batch by squared Euclidean
distance, ascending: dist2[b, n, k] (float32) and idx[b, n, k] (int32). The scan runs
m = 0..M-1 and replaces only on a strictly smaller distance (mmcv's rule), so of equal
distances the lower index ranks first. Distances are computed and kept in float32 for
float32 and float16 inputs (mmcv computes in the input dtype), and dist2 is float32 for
both. M < 3 is BAD_PARAM (mmcv returns index 0 and distance 1e40 there). Semantics:
docs/semantics.md; the contract: specs/three_nn.yaml.

Kernels (a TensorIR compute scheduled per target; B, N and M symbolic): `three_nn` and, on
the CPU, `three_nn_small` (N below the vector width: one point at a time).
  CPU: a parallel task per (batch, vector of points); each known point is broadcast to the
      vector's lanes and the running top-3 stays in registers.
  CUDA: a thread per unknown point, the known points read through L1 (mmcv's plan).

Safety: every load index is in range for any values; a NaN or inf distance (NaN or inf
coordinates) compares false against the running top-3 and never ranks. A point with no
finite distance keeps dist2 = inf and idx = -1 (an index three_interpolate ignores).
"""

from __future__ import annotations

from ...errors import BadParamError
from ..base import Operator
from ..point_vectors import plan_vector

KERNELS = ("three_nn", "three_nn_small")


class ThreeNN(Operator):
    name = "three_nn"
    kernel_names = KERNELS

    def rules(self, problem):
        m = problem.sizes["M"]
        if m < 3:
            raise BadParamError(f"{self.name}: known.shape[1] (M) must be at least 3 (three neighbours per "
                                f"point), got {m}")

    def plan(self, model, knobs):
        """mlu-ops would split B * N points over taskDim; here a CPU task is a (batch, vector
        of points), the vector a multiple of the target's lanes; a CUDA block `threads`
        points of one batch."""
        return plan_vector(model, knobs)

    def computes(self, dtype, plan, model):
        from .compute import nn_compute

        if model.kind != "llvm":  # a thread per point: one kernel
            return {"three_nn": nn_compute(dtype, 1, model.kind)}
        return {"three_nn": nn_compute(dtype, int(plan["vector"]), model.kind),
                "three_nn_small": nn_compute(dtype, 1, model.kind)}

    def launch(self, kernels, problem, tensors):
        args = [tensors[t] for t in ("unknown", "known", "dist2", "idx")]
        small = problem.device == "cpu" and problem.sizes["N"] < int(kernels.plan["vector"])
        kernels["three_nn_small" if small else "three_nn"](*args)


OP = ThreeNN()


def three_nn(unknown, known, *, target="llvm", out=None):
    """The three nearest known points of each unknown point: (dist2, idx), each [B, N, 3],
    dist2 float32 squared distances ascending, idx int32 (lower index first on ties).

    unknown [B, N, 3] and known [B, M, 3] (float32 or float16, the same), M >= 3. numpy in ->
    numpy out; torch in -> torch out; `out=` a pair (dist2, idx) of caller buffers, either
    may be None. mmcv's function (sqrt distances): tvm_ops.functional.three_nn.
    """
    if out is None:
        out = (None, None)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise BadParamError("three_nn: out must be a pair (dist2, idx), either may be None; "
                            f"got {type(out).__name__}")
    return OP.call({"unknown": unknown, "known": known}, {}, target, {"dist2": out[0], "idx": out[1]})
