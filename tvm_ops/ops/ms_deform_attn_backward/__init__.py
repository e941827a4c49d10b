"""ms_deform_attn_backward (Deformable DETR, BEVFormer).

For every sample (b, q, head, l, p) the forward bilinearly samples level l of
value[b, :, head, :] at sampling_loc[b, q, head, l, p] and weights it by
attn_weight[b, q, head, l, p]. The backward scatters grad_output * attn *
corner weight into the four corner rows of grad_value, and reduces over the
channels for grad_attn_weight and grad_sampling_loc. Semantics (strict sample
validity test, per-corner validity, w_l / h_l factors): docs/semantics.md; the
contract: specs/ms_deform_attn_backward.yaml.

Kernels (symbolic B, K, H, C, L, Q, P): `backward` and `backward_private`, one
library per (dtype, target), same arguments (the inputs, then the three outputs);
`*_fixed_c` are the same two with the channel count compiled in (the `fixed_c` knob,
default 32: every Deformable-DETR and BEVFormer configuration has 256 channels over 8
heads), used when C matches; on the CPU `*_in_cache` are the four compiled without their
prefetches, used when the call's tensors fit in the last-level cache (tensors_in_cache).
  CPU (cpu_backward_compute): ONE pass over the samples computes all three
      outputs. Owner computes: a parallel task owns a (batch, head) slice of
      grad_value (rows of one (b, h) only receive samples of that (b, h)), walks
      its samples level by level in (q, p) order, a block of query_block queries at a
      time (the block's cells, corner rows and weights first, the queries in vector
      lanes: block_corners_macro, the forward's too), and, per corner row, does the scatter
      grad_value[row] += w_k a g and the dot d_k = sum_c g v_k in the same
      vectorised channel loop; then grad_attn = sum_k w_k d_k and
      grad_loc = (w_l a sum_k dx_k d_k, h_l a sum_k dy_k d_k) (the reference's
      formulas regrouped per corner). Deterministic, no atomics on the data (the
      slices are handed out to the cores one at a time by a counter, task_queue).
      `backward_private` works on a contiguous [K, C] copy of the slice (picked by
      shape, policy_llvm); `backward` zero-fills grad_value in one parallel pass
      first. The kernel is a hand-written loop nest, TensorIR in its scheduled form
      rather than a compute plus a schedule: TensorIR's block rules cannot fuse the
      scatter (a reduction block with an init) with the per-sample channel dots, and
      the fused pass is what makes it fast (each random row is read once, not twice).
      It is portable as written, so it has no separate fallback: its LLVM IR (the task
      counter's atomicrmw, llvm.fma) is generic, and the channel loop takes the
      target's vector width (16 lanes with AVX-512, 8 with AVX2, 4 on aarch64's NEON);
      a CPU without FMA instructions gets LLVM's exact software fma, slower.
  CUDA (cuda_backward_compute): one pass too, a warp per (b, q, head) and a lane
      per channel: per sample the lanes load their four corner values before using
      any, atomicAdd w_k a g into grad_value and sum their shares of the three
      channel sums, which go over the warp together (6 shuffles). Also TensorIR in
      its scheduled form (compute.py says why): `backward` alone.
im2col_step only chunks the batch in mmcv / mlu-ops; the result does not depend
on it, so the kernels ignore it (checked on the host).

Precision: the sampling position is computed as the exact loc * h_l - 0.5
rounded once to float32 (ops/ms_deform_attn_sampling.py: one fused multiply-add on both
targets); the channel dots and the grad_value accumulation are float32, on the CPU in a
fixed order per (b, h) slice (on CUDA grad_value's atomics add in any order).

Safety: every value / grad_value access is guarded by corner validity AND
0 <= row < K, so any finite sampling location, and inconsistent
level_start_index values, never touch memory outside the tensors. NaN / Inf
locations fail the strict validity test: such samples get zero gradients and
contribute nothing (not supported by the spec, but safe).
"""

from __future__ import annotations

from ... import host_buffers, policy, targets
from ...errors import BadParamError
from ..base import Operator
from ..ms_deform_attn_sampling import LevelChecks, cpu_kernel_name, private_slice

# *_fixed_c: the same kernels with C compiled in (plan "fixed_c"; see compute.cpu_backward_compute);
# *_in_cache: compiled without prefetches, for calls whose tensors fit in the last-level cache
CPU_KERNELS = ("backward", "backward_private", "backward_fixed_c", "backward_private_fixed_c")
IN_CACHE = "_in_cache"
KERNELS = CPU_KERNELS + tuple(name + IN_CACHE for name in CPU_KERNELS)


def policy_llvm(sizes: dict, plan: dict) -> bool:
    """True: use the `backward_private` CPU kernel (ms_deform_attn_sampling.private_slice); its
    write-back of the private slice replaces the zero-fill of grad_value."""
    return private_slice(sizes, plan)


def cpu_kernel(sizes: dict, plan: dict, in_cache: bool = False) -> str:
    """Which CPU kernel a call runs, from its sizes, its library's plan and whether its
    tensors fit in the last-level cache (tensors_in_cache): there a kernel compiled without
    prefetches (none is built where the plan's prefetch is 0 already)."""
    name = cpu_kernel_name("backward", policy_llvm(sizes, plan), sizes, plan)
    return name + IN_CACHE if in_cache and int(plan["prefetch"]) else name


def tensors_in_cache(spec, problem) -> bool:
    """Whether a call's tensors (its theory io bytes) fit in this host's last-level cache,
    where the kernels' prefetches cost more than they hide: decoder-like calls that fit ran
    3-20% faster without them, larger ones up to 30% slower (docs/kernels/
    ms_deform_attn_backward.md)."""
    io_bytes, _ = spec.theory(problem.sizes, host_buffers.dtype_of(problem.dtype).itemsize, problem.params)
    return policy.cache_resident(io_bytes, targets.cache_bytes(3))


class MsDeformAttnBackward(LevelChecks, Operator):
    name = "ms_deform_attn_backward"
    kernel_names = KERNELS  # CUDA builds `backward` alone

    def rules(self, problem):
        super().rules(problem)
        # decided once per call signature, where its sizes are checked (launch runs per call);
        # only CPU kernels come in both kinds
        problem.notes["in_cache"] = problem.device == "cpu" and tensors_in_cache(self.spec, problem)

    # --- kernels ------------------------------------------------------------
    def plan(self, model, knobs):
        """The policy of mlu-ops' design for ms_deform_attn_backward (section 3.2-3.3), step by step.

        Task split: the seed splits B*Q*H*L evenly over taskDim and adds with atomics; the CPU
        owner is a (b, h) slice of grad_value, handed out by the shared task counter
        (ops/task_queue.py), so no atomics; CUDA blocks cover (Q, B, H / threads_h)."""
        pol = policy.for_target(model)
        plan = dict(knobs)
        if model.kind == "llvm":
            # deal_num over C: the channel loop in whole float32 vectors, C % lanes scalar
            plan["lanes"] = pol.lanes
        # (CUDA: a block is threads_h warps, a head each, a lane per channel; the corner
        # rows and weights stay in registers, nothing is staged in shared memory)
        return plan

    def computes(self, dtype, plan, model):
        from .compute import cpu_backward_compute, cuda_backward_compute

        if model.kind == "llvm":
            fixed = int(plan["fixed_c"])  # 0: no specialisation, no _fixed_c kernels (launch runs none)
            prefetch = int(plan["prefetch"])  # 0: no *_in_cache kernels either (the same code)
            return {name: cpu_backward_compute(dtype, plan["lanes"], "_private" in name,
                                               0 if name.endswith(IN_CACHE) else prefetch,
                                               fixed if "_fixed_c" in name else None,
                                               int(plan["prefetch_near_kb"]), int(plan["query_block"]))
                    for name in KERNELS
                    if (fixed or "_fixed_c" not in name) and (prefetch or not name.endswith(IN_CACHE))}
        return {"backward": cuda_backward_compute(dtype, int(plan["threads_h"]))}

    def adds_in_any_order(self, problem, plan):
        return problem.device == "cuda"  # grad_value by atomicAdd

    def zeroed(self, problem, plan):
        return ("grad_value",) if problem.device == "cuda" else ()  # atomicAdd accumulates into it

    def launch(self, kernels, problem, tensors):
        name = cpu_kernel(problem.sizes, kernels.plan, problem.notes["in_cache"]) if problem.device == "cpu" \
            else "backward"
        # the CPU kernels write every element of the three outputs (np.empty is fine)
        kernels[name](*(tensors[k] for k in (
            "value", "spatial_shapes", "level_start_index", "sampling_loc", "attn_weight", "grad_output",
            "grad_value", "grad_sampling_loc", "grad_attn_weight")))


OP = MsDeformAttnBackward()


def ms_deform_attn_backward(value, spatial_shapes, level_start_index, sampling_loc, attn_weight,
                            grad_output, im2col_step=64, *, target="llvm", out=None):
    """Backward of multi-scale deformable attention: (grad_value, grad_sampling_loc,
    grad_attn_weight).

    value [B, K, H, C] float32; spatial_shapes [L, 2] int32 (h, w) with
    K == sum(h*w); level_start_index [L] int32; sampling_loc [B, Q, H, L, P, 2]
    (x, y in [0, 1]; any finite value is safe, samples outside are skipped);
    attn_weight [B, Q, H, L, P]; grad_output [B, Q, H, C]. im2col_step only chunks
    the batch in mmcv: min(B, im2col_step) must divide B; the result does not
    depend on it. numpy in -> numpy out; torch in -> torch out. `out=` is a triple
    of caller buffers (None entries allowed).
    """
    if out is None:
        out = (None, None, None)
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise BadParamError(f"ms_deform_attn_backward: out must be a triple (grad_value, grad_sampling_loc, "
                            f"grad_attn_weight) of buffers or None, got {type(out).__name__}")
    names = ("grad_value", "grad_sampling_loc", "grad_attn_weight")
    return OP.call({"value": value, "spatial_shapes": spatial_shapes, "level_start_index": level_start_index,
                    "sampling_loc": sampling_loc, "attn_weight": attn_weight, "grad_output": grad_output},
                   {"im2col_step": im2col_step}, target, dict(zip(names, out)))
