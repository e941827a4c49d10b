"""border_align_forward (BorderDet).

For each (n, k, border s, channel c): output = the max over samples i = 0..pool_size of the
bilinear sample of input[n, :, :, s*C + c] at sample i of border s of box k, argmax_idx =
the first i reaching it (sample 0 starts, a strictly greater value replaces: mmcv's rule).
Sample positions come from the expression the backward uses (ops/border_align_sampling.py),
so border_align_backward of this argmax is the exact gradient of this output, and the
bilinear rule is the backward's (a sample outside [-1, H] x [-1, W] is 0). Layout (the
seed's NHWC): input [N, H, W, 4C], boxes [N, K, 4] (x0, y0, x1, y1), output and argmax_idx
[N, K, 4, C], K == H*W; borders 0 top, 1 left, 2 bottom, 3 right. float16 samples and
compares in float32 and rounds the max once. Contract: specs/border_align_forward.yaml.

Kernels (a TensorIR compute scheduled per target in schedule.py; every dimension and
pool_size symbolic): `border`; a channels-first input (mmcv's NCHW memory seen as NHWC) into
the NHWC workspace the others read, `to_channels_last` on the CPU (ops/channels_last.py),
`to_nhwc` on CUDA; on the CPU `border_tail` (the last vector of channels again when
C % vector != 0: same bits) and `border_small` (C < vector, scalar).
  CPU: owner computes, a box per parallel task; its samples' cells and weights once, then
      per (border, channel vector) the max over the samples in registers.
  CUDA: a thread per (n, k, border, channel), as mmcv.
Deterministic on both (no reduction across threads). pool_size is at most MAX_POOL_SIZE:
a call's work is (pool_size + 1) samples per output element.

Safety: a sample outside the map reads the safe cell (0, 0) and contributes 0 (Select, not
0 * value); every cell index is clamped into the map, so no box value (NaN, inf, huge)
reads outside `input`.
"""

from __future__ import annotations

from ...errors import BadParamError
from ..base import Operator
from ..channels_last import channels_first, is_channels_first_view, rewritten, to_channels_last_compute
from ..point_vectors import plan_vector

KERNELS = ("border", "border_tail", "border_small", "to_channels_last", "to_nhwc")

MAX_POOL_SIZE = 1024  # samples per border - 1: BorderDet uses 10


class BorderAlignForward(Operator):
    name = "border_align_forward"
    kernel_names = KERNELS

    def rules(self, problem):
        s, op = problem.sizes, self.name
        if s["Q"] != 4 * s["C"]:
            raise BadParamError(f"{op}: input.shape[3] must be 4 * C (4 borders x C channels), got {s['Q']}")
        if s["H"] * s["W"] != s["K"]:
            raise BadParamError(f"{op}: input.shape[1] * input.shape[2] (H * W) must equal boxes.shape[1] (K) = "
                                f"{s['K']}, got {s['H']} * {s['W']} = {s['H'] * s['W']}")
        pool = problem.params["pool_size"]
        if pool > MAX_POOL_SIZE:
            raise BadParamError(f"{op}: pool_size must be at most {MAX_POOL_SIZE} (the work per output is "
                                f"pool_size + 1 samples), got {pool}")
        problem.notes["channels_first"] = is_channels_first_view(problem.inputs["input"])

    def taken_as_is(self, problem):
        # a channels-last view of contiguous NCHW memory (mmcv's layout, functional.border_align)
        # is converted by to_channels_last (CPU) or to_nhwc (CUDA), faster than a generic copy
        return ("input",) if problem.notes["channels_first"] else ()

    def workspaces(self, problem, plan):
        if not problem.notes["channels_first"]:
            return {}
        s = problem.sizes
        return {"input_nhwc": ((s["N"], s["H"], s["W"], s["Q"]), problem.dtype)}

    def plan(self, model, knobs):
        """mlu-ops splits the N*K*4 borders over taskDim; here a CPU task is a box (n, k) (its
        samples' geometry computed once for its 4 borders and C channels), channels in
        vectors of `vector` (a multiple of the target's lanes); CUDA blocks as mmcv."""
        return plan_vector(model, knobs)

    def computes(self, dtype, plan, model):
        from .compute import forward_compute, to_nhwc_compute

        if model.kind == "llvm":
            v = int(plan["vector"])
            borders = {f"border{suffix}": forward_compute(dtype, part, v)
                       for suffix, part in (("", "main"), ("_tail", "tail"), ("_small", "small"))}
            return {**borders, "to_channels_last": to_channels_last_compute(dtype, model.lanes("float32"))}
        # CUDA: every channel in one kernel
        return {"border": forward_compute(dtype), "to_nhwc": to_nhwc_compute(dtype)}

    def launch(self, kernels, problem, tensors):
        feat = tensors["input"]
        if problem.notes["channels_first"]:
            nhwc = tensors["input_nhwc"]
            if problem.device == "cpu":
                feat = rewritten(kernels["to_channels_last"], feat, nhwc)
            else:
                n, h, w, q = feat.shape
                kernels["to_nhwc"](channels_first(feat).reshape(n, q, h, w), nhwc)
                feat = nhwc
        args = [feat] + [tensors[t] for t in ("boxes", "output", "argmax_idx")] + [problem.params["pool_size"]]
        c = problem.sizes["C"]
        if problem.device == "cuda":
            kernels["border"](*args)
            return
        v = int(kernels.plan["vector"])
        if c < v:
            kernels["border_small"](*args)
            return
        kernels["border"](*args)
        if c % v:
            kernels["border_tail"](*args)  # the last v channels again, as one vector


OP = BorderAlignForward()


def border_align_forward(input, boxes, pool_size, *, target="llvm", out=None):
    """BorderAlign (BorderDet): (output, argmax_idx), each [N, K, 4, C], from input
    [N, H, W, 4C] (NHWC; float32 or float16) and boxes [N, K, 4] (x0, y0, x1, y1, input's
    dtype), K == H * W, 1 <= pool_size <= 1024. numpy in -> numpy out; torch in -> torch
    out; `out=` a pair (output, argmax_idx) of caller buffers, either may be None. The
    differentiable torch function with mmcv's NCHW layout: tvm_ops.functional.border_align.
    """
    if out is None:
        out = (None, None)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise BadParamError("border_align_forward: out must be a pair (output, argmax_idx), either may be None; "
                            f"got {type(out).__name__}")
    shape = getattr(input, "shape", None)
    # C for the spec's symbol (outputs [N, K, 4, C]); rules() checks input.shape[3] == 4 * C
    channels = int(shape[3]) // 4 if shape is not None and len(shape) == 4 else None
    return OP.call({"input": input, "boxes": boxes}, {"pool_size": pool_size, "channels": channels},
                   target, {"output": out[0], "argmax_idx": out[1]})
