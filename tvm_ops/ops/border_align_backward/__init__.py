"""border_align_backward (BorderDet).

For each (n, k, border s, channel c), i = argmax_idx[n, k, s, c]; when 0 <= i <= pool_size,
grad_output[n, k, s, c] is spread bilinearly at the border sample start_s + i * step_s of box
k (sample pool_size: exactly the border's end corner; the rule: ops/border_align_sampling.py) into
grad_input[n, :, :, s*C + c]. Layout (the seed's NHWC): grad_output [N, K, 4, C],
boxes [N, K, 4] (x0, y0, x1, y1), argmax_idx [N, K, 4, C] int32, grad_input [N, H, W, 4C]
with K == H*W. Border s: 0 top, 1 left, 2 bottom, 3 right. Contract:
specs/border_align_backward.yaml.

Work is N*K*4*C samples: each (n, k, s, c) adds the 4 bilinear corners of the one sample
its argmax names. Kernels (one set per dtype and target, every dimension symbolic; V is the
llvm knob owner_lanes, at most register_lanes (64 on AVX2), 16 on CUDA; launch reads V from
the library's plan):
  scatter       channels [0, C // V * V)
  scatter_tail  the C % V tail channels (launched only when C % V != 0)
  cast          float32 accumulator -> grad_input (CUDA float16 only; see below)

- llvm (owner computes, no atomics, deterministic; a hand-written loop nest, TensorIR in its
  scheduled form rather than a compute plus a schedule, because the task counter, the staged
  per-box values, the per-lane lookups and the streamed stores are not schedule primitives):
  an owner (n, s, V-channel group) zeroes a private float32 tile [H, W, V], walks
  k = 0..K-1 in order adding every sample into it, then stores the tile into its columns of
  grad_input (rounding once for float16; streamed past the caches when grad_input starts on
  a cache line, as our own outputs do). Different (s, c) columns never collide, so owners
  need no atomics, and every element is summed in the same order whatever the thread count.
  Corner adds (knob corner_adds):
    per_position (default): a border moves along one axis, so its samples' corners are a
      range of cells on that axis crossed with two fixed rows. Each such map position gets
      one contiguous V-lane tile row add, each lane's weight looked up (AVX-512 vpermps) in
      the position's 16-entry table of per-sample weights: ~23 row adds per box on the
      network case instead of per_sample's 44. pool_size < 15 and finite gradients (a lane
      adds g * 0 where its sample has no corner); otherwise per_sample, in the same kernel.
    per_sample: the V lanes of one (n, k, s) share the box, so their samples are among the
      border's pool_size + 1; the geometry is computed 16 samples per vector, only for the
      blocks of 16 that hold some lane's argmax (a vector min over the lanes finds the next
      one: the work follows the argmax values, never pool_size), then per sample the lanes
      whose argmax names it add their gradient at its 4 corners, each a contiguous V-lane
      tile row (vector load/FMA/store); other lanes add +0.
    per_lane: each lane computes its own sample (vectors), then its 4 corner adds are per
      lane (TVM scalarises the scatter across tile rows).
  All three give the same bits (each lane gets its own sample's products g * (hy * hx), one
  per tile position; +0 changes no bit in a tile that starts at +0 with weights >= 0).
  Portable fallback (ops/cpu_ir.py holds the x86-only IR, chosen by the target's LLVM
  features): without AVX-512 (an AVX2 x86, aarch64) the plan takes per_sample for
  per_position, and without x86's non-temporal stores and SFENCE (aarch64) the tile rows
  are plain stores; same results, slower.
- cuda (mlu-ops' plan): one thread per (n, k, s, c), channels fastest, atomicAdd of the 4
  weighted corners into grad_input (float32, zeroed first) or into a zeroed float32 workspace
  that `cast` rounds once into grad_input (float16: accumulate in float32, round once).

out= may also be a channels-first view on the CPU: [N, H, W, 4C] of contiguous [N, 4C, H, W]
memory, the layout of the NCHW feature map a torch caller differentiates (functional.border_align
gives its gradient so, where autograd would otherwise copy it into the map's layout, a slow
strided copy: 3.6 ms of a 13 ms training step on its largest network case). The owners then
write a [N, H, W, 4C] workspace, which `to_channels_first` (ops/channels_last.py's transposer,
squares of lanes x lanes through registers) rewrites into the view's memory.

No write can leave grad_input, the tile or the workspace, whatever the boxes or argmax
values: an argmax outside [0, pool_size] and a sample outside [-1, H] x [-1, W] (tested as
positive comparisons, so NaN coordinates from NaN boxes or 0 * inf fail them) contribute 0
at the safe corner (0, 0) on the CPU, and nothing on CUDA; a sample that passes the test has
every corner inside the map, so its int casts are safe. Why this design:
docs/kernels/border_align_backward.md.
"""

from __future__ import annotations

from ...errors import BadParamError
from .. import cpu_ir
from ..base import Operator
from ..channels_last import channels_first, is_channels_first_view, to_channels_last_compute

SCATTER = "border_align_backward_scatter"
TAIL = "border_align_backward_scatter_tail"
CAST = "border_align_backward_cast"
TO_CHANNELS_FIRST = "border_align_backward_to_channels_first"

# C is split into C // 16 full groups (one AVX-512 float32 vector) and a tail of C % 16
# channels with a kernel of its own: TVM 0.27 scalarises a predicated split of a symbolic
# loop, and loop_partition refuses dynamic extents.
CHANNEL_GROUP = 16


def register_lanes(model) -> int:
    """The most channels an llvm owner takes (V, in whole channel groups). An owner holds its
    lanes' argmax and gradient through every sample of a box: 2 * V / lanes vector registers,
    capped at the register file. 256 with AVX-512's 32 registers of 16 lanes (the default 128
    stands); 64 with AVX2's 16 of 8, where 128 lanes read both back from the stack for every
    sample: 10-20% slower (docs/kernels/border_align_backward.md)."""
    lanes = model.lanes("float32") * model.vector_registers // 2
    return max(CHANNEL_GROUP, lanes // CHANNEL_GROUP * CHANNEL_GROUP)


class BorderAlignBackward(Operator):
    name = "border_align_backward"
    kernel_names = (SCATTER, TAIL, CAST, TO_CHANNELS_FIRST)

    def rules(self, problem):
        s = problem.sizes
        op = self.name
        where = ("out['grad_input'].shape[3]" if "grad_input" in problem.outs else "grad_input.shape[3]")
        if s["Q"] % 4 != 0:
            raise BadParamError(f"{op}: {where} must be a multiple of 4 (4 borders x C), got {s['Q']}")
        if s["Q"] // 4 != s["C"]:
            raise BadParamError(f"{op}: {where} / 4 must equal grad_output.shape[3] (C) = {s['C']}, "
                                f"got {s['Q']} / 4 = {s['Q'] // 4}")
        if s["H"] * s["W"] != s["K"]:
            raise BadParamError(f"{op}: height * width must equal grad_output.shape[1] (K) = {s['K']}, "
                                f"got {s['H']} * {s['W']} = {s['H'] * s['W']}")
        given = problem.outs.get("grad_input")
        problem.notes["channels_first"] = given is not None and not given.contiguous  # output_taken_as_is

    def output_taken_as_is(self, name, info):
        # a channels-first view on the CPU: launch transposes the kernels' rows into it
        return name == "grad_input" and info.device == "cpu" and is_channels_first_view(info)

    def output_layouts(self, name):
        return ("a channels-first view on the CPU (a contiguous [N, 4C, H, W] tensor permuted to [N, H, W, 4C]: "
                "mmcv's layout)" if name == "grad_input" else "")

    def plan(self, model, knobs):
        """The policy of mlu-ops' design for border_align_backward (section 3.2), step by step.

        Task split: the seed splits the N*K*4 borders evenly over taskDim; here a task is an
        owner (n, border, owner_lanes channels), handed out by the shared task counter on the
        CPU (ops/task_queue.py), and one thread per (n, k, border, channel) on CUDA."""
        # deal_num, the channels of one pass: owner_lanes (V), in whole channel groups of 16
        # (one AVX-512 float32 vector); its private tile [H, W, V] float32 stays in L2
        plan = {"channel_group": CHANNEL_GROUP, **knobs}
        if model.kind == "cuda":
            plan["owner_lanes"] = CHANNEL_GROUP  # the CUDA kernels split C at 16 (main | tail)
        else:
            if plan.get("corner_adds") == "per_position" and not cpu_ir.has_lane_lookup(model.features()):
                plan["corner_adds"] = "per_sample"  # its lookup is AVX-512's 16-lane vpermps
            # and no more lanes than keep their argmax and gradient in registers
            plan["owner_lanes"] = min(int(plan["owner_lanes"]), register_lanes(model))
        return plan

    def computes(self, dtype, plan, model):
        from . import compute

        kernels = compute.computes(dtype, model.kind, plan, model.features())
        if model.kind == "llvm":  # [N, H*W, 4C] rows -> [N, 4C, H*W] (a channels-first out=)
            kernels[TO_CHANNELS_FIRST] = to_channels_last_compute(dtype, model.lanes("float32"))
        return kernels

    def workspaces(self, problem, plan):
        s = problem.sizes
        if problem.notes["channels_first"]:  # the kernels' rows, before to_channels_first
            return {"grad_rows": ((s["N"], s["H"], s["W"], s["Q"]), problem.dtype)}
        if problem.device != "cuda" or problem.dtype == "float32":
            return {}
        # CUDA float16: the atomics accumulate in float32, `cast` rounds once into grad_input
        return {"accumulator": ((s["N"], s["H"], s["W"], s["Q"]), "float32")}

    def adds_in_any_order(self, problem, plan):
        return problem.device == "cuda"  # atomicAdd into grad_input (or its float32 accumulator)

    def zeroed(self, problem, plan):
        if problem.device != "cuda":
            return ()  # the CPU owners zero their tiles
        return ("grad_input",) if problem.dtype == "float32" else ("accumulator",)  # atomics add into zeros

    def launch(self, kernels, problem, tensors):
        c = problem.sizes["C"]
        pool = problem.params["pool_size"]
        go, bx, am, out = (tensors[t] for t in ("grad_output", "boxes", "argmax_idx", "grad_input"))
        rows = tensors.get("grad_rows", out)  # [N, H, W, 4C] rows of a channels-first out=
        acc = tensors.get("accumulator", rows)
        lanes = kernels.plan["owner_lanes"]  # the main kernel covers C // lanes * lanes channels
        if c >= lanes:
            kernels[SCATTER](go, bx, am, acc, pool)
        if c % lanes:
            kernels[TAIL](go, bx, am, acc, pool)
        if acc is not rows:
            kernels[CAST](acc, rows)
        if rows is not out:
            n, h, w, q = rows.shape
            kernels[TO_CHANNELS_FIRST](rows.reshape(n, h * w, q), channels_first(out))


OP = BorderAlignBackward()


def border_align_backward(grad_output, boxes, argmax_idx, pool_size, *, height=None, width=None,
                          target="llvm", out=None):
    """Gradient of BorderAlign (BorderDet): grad_input [N, H, W, 4C] from grad_output [N, K, 4, C].

    boxes [N, K, 4] (x0, y0, x1, y1, the dtype of grad_output: float32 or float16),
    argmax_idx [N, K, 4, C] int32 (sample index in [0, pool_size]; other values contribute
    nothing), pool_size > 0, K == height * width. height and width are required unless
    `out` (a [N, H, W, 4C] buffer) gives them: C-contiguous, or on the CPU a channels-first
    view, [N, H, W, 4C] of contiguous [N, 4C, H, W] memory (`nchw.permute(0, 2, 3, 1)`, the
    layout of the map BorderAlign read). float16 accumulates in float32 and is rounded once.
    numpy in -> numpy out; torch in -> torch out.
    """
    shape = getattr(grad_output, "shape", None)
    # grad_input's last dim (4C) for the spec's symbol Q; an out= buffer gives it instead
    q = 4 * int(shape[3]) if out is None and shape is not None and len(shape) == 4 else None
    return OP.call({"grad_output": grad_output, "boxes": boxes, "argmax_idx": argmax_idx},
                   {"pool_size": pool_size, "height": height, "width": width, "out_channels": q},
                   target, {"grad_input": out})
