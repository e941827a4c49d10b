"""ms_deform_attn_forward (Deformable DETR, BEVFormer).

output[b, q, h, :] = sum over (l, p) of attn_weight[b, q, h, l, p] * the bilinear sample of
level l of value[b, :, h, :] at sampling_loc[b, q, h, l, p], by the sampling rule the
backward uses (ops/ms_deform_attn_sampling.py: strict validity test, per-corner validity,
unused corners contribute nothing), so forward and backward agree on every sample.
Semantics: docs/semantics.md; the contract: specs/ms_deform_attn_forward.yaml.

Kernels (symbolic B, K, H, C, L, Q, P): `forward` and `forward_private`, and `*_fixed_c`,
the same two with the channel count compiled in (knob fixed_c, default 32: every
Deformable-DETR and BEVFormer configuration has 256 channels over 8 heads), used when C
matches.
  CPU (cpu_forward_compute, a hand-written loop nest: the query blocks' clamped spare lanes
      have no compute form): owner computes, a (batch, head) slice per parallel task, its
      queries in blocks of query_block; per block the rows and weights of every corner
      first, the queries in vector lanes, then each query's output row summed in registers
      (fixed C) over (level, point, corner), channels in vectors. `forward_private` gathers
      from a contiguous copy of the slice's value rows, picked by shape (policy_llvm).
  CUDA (forward_compute, a TensorIR compute scheduled in schedule.py): a thread per output
      element, as mmcv's im2col, a sample's four corner loads before its adds: `forward`
      alone.
No atomics: each output element is summed by one thread in (l, p, k) order, the same
bits on every run.

Safety: every value access is guarded by corner validity and 0 <= row < K (row computed
in int64), so any finite sampling location and any level_start_index stay in bounds; NaN /
Inf locations fail the strict validity test and contribute nothing.
"""

from __future__ import annotations

from ... import policy
from ..base import Operator
from ..ms_deform_attn_sampling import LevelChecks, cpu_kernel_name, cuda_fma_position, private_slice

# *_private: gather from a contiguous copy of the (batch, head) slice (CPU; on CUDA the same
# kernel); *_fixed_c: C compiled in (plan "fixed_c")
KERNELS = ("forward", "forward_private", "forward_fixed_c", "forward_private_fixed_c")


def policy_llvm(sizes: dict, plan: dict) -> bool:
    """True: use the `forward_private` CPU kernel (ms_deform_attn_sampling.private_slice)."""
    return private_slice(sizes, plan)


def cpu_kernel(sizes: dict, plan: dict) -> str:
    """Which CPU kernel a call runs, from its sizes and its library's plan."""
    return cpu_kernel_name("forward", policy_llvm(sizes, plan), sizes, plan)


class MsDeformAttnForward(LevelChecks, Operator):
    name = "ms_deform_attn_forward"
    kernel_names = KERNELS

    def plan(self, model, knobs):
        """mlu-ops splits B*Q*H evenly over taskDim; here a CPU task is a (b, h) slice (its
        value rows stay in the core's caches while its queries run) and a CUDA block one
        (b, q) with threads_h x threads_c threads."""
        pol = policy.for_target(model)
        plan = dict(knobs)
        if model.kind == "llvm":
            plan["lanes"] = pol.lanes  # the channel loop in whole vectors
        return plan

    def computes(self, dtype, plan, model):
        from .compute import cpu_forward_compute, forward_compute

        if model.kind == "llvm":
            fixed = int(plan["fixed_c"])  # 0: no specialisation, no _fixed_c kernels (launch runs none)
            return {name: cpu_forward_compute(dtype, plan["lanes"], "_private" in name, int(plan["query_block"]),
                                              fixed if name.endswith("_fixed_c") else None)
                    for name in KERNELS if fixed or not name.endswith("_fixed_c")}
        return {"forward": forward_compute(dtype, cuda_fma_position(dtype))}

    def launch(self, kernels, problem, tensors):
        name = cpu_kernel(problem.sizes, kernels.plan) if problem.device == "cpu" else "forward"
        kernels[name](*(tensors[k] for k in (
            "value", "spatial_shapes", "level_start_index", "sampling_loc", "attn_weight", "output")))


OP = MsDeformAttnForward()


def ms_deform_attn_forward(value, spatial_shapes, level_start_index, sampling_loc, attn_weight, im2col_step=64,
                           *, target="llvm", out=None):
    """Multi-scale deformable attention: output [B, Q, H, C].

    value [B, K, H, C] float32; spatial_shapes [L, 2] int32 (h, w) with K == sum(h*w);
    level_start_index [L] int32; sampling_loc [B, Q, H, L, P, 2] (x, y in [0, 1]; any
    finite value is safe, samples outside contribute nothing); attn_weight [B, Q, H, L, P].
    im2col_step only chunks the batch in mmcv: min(B, im2col_step) must divide B; the
    result does not depend on it. numpy in -> numpy out; torch in -> torch out; `out=` a
    caller buffer. The differentiable torch function: tvm_ops.functional.ms_deform_attn.
    """
    return OP.call({"value": value, "spatial_shapes": spatial_shapes, "level_start_index": level_start_index,
                    "sampling_loc": sampling_loc, "attn_weight": attn_weight},
                   {"im2col_step": im2col_step}, target, {"output": out})
