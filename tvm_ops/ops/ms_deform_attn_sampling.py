"""What ms_deform_attn's forward and backward share: the checks of the level tables and the
sampling rule (position, strict validity test, per-corner validity), so both directions agree
on every sample.

The sampling position is the exact loc * size - 0.5 rounded once to the input precision:
what mmcv's CUDA kernel gets from nvcc's fused multiply-add. It is one fused multiply-add on
both targets (`fma_position`: llvm.fma; `cuda_fma_position`: __fmaf_rn), so they pick the
same cells. Without this the cell choice (where grad_sampling_loc is discontinuous) would
depend on whether LLVM or nvcc contract the multiply and subtract.
"""

from __future__ import annotations

import numpy as np

from .. import interop
from ..errors import BadParamError


def fma_position(dtype: str):
    """position(coord, size) on the CPU: one fused multiply-add (size rounded to float as in
    mmcv), LLVM's llvm.fma intrinsic, which TVM's vectoriser keeps in vector form."""
    from tvm import tirx  # here: the call path reads this module's checks without TVM

    assert dtype == "float32", dtype

    def position(coord, size):
        return tirx.call_llvm_pure_intrin(dtype, "llvm.fma", coord, tirx.Cast(dtype, size), tirx.const(-0.5, dtype))

    return position


def cuda_fma_position(dtype: str):
    """position(coord, size) on CUDA: one fused multiply-add (CUDA's __fmaf_rn), the same
    value as the CPU's fma_position."""
    from tvm import tirx
    from tvm.script import tirx as T

    assert dtype == "float32", dtype

    def position(coord, size):
        return T.call_pure_extern(dtype, "__fmaf_rn", coord, T.Cast(dtype, size), tirx.const(-0.5, dtype))

    return position


# the cell of a sample the validity test skips: every corner row and column of it falls
# below 0, so no corner is used
SKIPPED = -2


def cell_macro(dtype: str, position):
    """The per-sample half of the rule (the forward's CUDA compute): (y0, x0)[b, q, h, l, p],
    the top-left corner's cell, and (lh, lw), the position's offsets inside it (SKIPPED and 0
    for a sample the strict validity test skips); corner_of_cell_macro finishes the rule per
    corner. The position, its floor and the validity test run once per sample. The CUDA
    backward, a hand-written kernel, runs the same rule inline (its buffers are per thread).
    One buffer per value: a block writing a constant [0:2] region could not be computed at
    the consumer's loops."""
    from tvm import tirx
    from tvm.script import tirx as T

    zero, minus_one = tirx.const(0, dtype), tirx.const(-1, dtype)

    @T.macro
    def cell(shapes, loc, y0s, x0s, lhs, lws, vb, vq, vh, vl, vp):
        hl: T.let = shapes[vl, 0]
        wl: T.let = shapes[vl, 1]
        h_im: T.let = position(loc[vb, vq, vh, vl, vp, 1], hl)
        w_im: T.let = position(loc[vb, vq, vh, vl, vp, 0], wl)
        y0s[vb, vq, vh, vl, vp] = SKIPPED
        x0s[vb, vq, vh, vl, vp] = SKIPPED
        lhs[vb, vq, vh, vl, vp] = zero
        lws[vb, vq, vh, vl, vp] = zero
        if (h_im > minus_one and w_im > minus_one
                and h_im < T.Cast(dtype, hl) and w_im < T.Cast(dtype, wl)):
            y0: T.let = T.Cast("int32", T.floor(h_im))
            x0: T.let = T.Cast("int32", T.floor(w_im))
            y0s[vb, vq, vh, vl, vp] = y0
            x0s[vb, vq, vh, vl, vp] = x0
            lhs[vb, vq, vh, vl, vp] = h_im - T.Cast(dtype, y0)
            lws[vb, vq, vh, vl, vp] = w_im - T.Cast(dtype, x0)

    return cell


def corner_of_cell_macro(dtype: str):
    """Corner k = (k // 2, k % 2) of a sample from its cell (cell_macro): rows = its value
    row (-1: unused), w = its bilinear weight; the rule's per-corner half."""
    from tvm import tirx
    from tvm.script import tirx as T

    zero, one = tirx.const(0, dtype), tirx.const(1, dtype)

    @T.macro
    def corner(shapes, lsi, y0s, x0s, lhs, lws, rows, w, vb, vq, vh, vl, vp, vk, K):
        hl: T.let = shapes[vl, 0]
        wl: T.let = shapes[vl, 1]
        ky: T.let = vk // 2
        kx: T.let = vk % 2
        y: T.let = y0s[vb, vq, vh, vl, vp] + ky
        x: T.let = x0s[vb, vq, vh, vl, vp] + kx
        rows[vb, vq, vh, vl, vp, vk] = -1
        w[vb, vq, vh, vl, vp, vk] = zero
        if y >= 0 and y < hl and x >= 0 and x < wl:
            r: T.let = lsi[vl] + y * wl + x
            if r >= 0 and r < K:
                lh: T.let = lhs[vb, vq, vh, vl, vp]
                lw: T.let = lws[vb, vq, vh, vl, vp]
                fy: T.let = T.if_then_else(ky == 1, lh, one - lh)
                fx: T.let = T.if_then_else(kx == 1, lw, one - lw)
                rows[vb, vq, vh, vl, vp, vk] = r
                w[vb, vq, vh, vl, vp, vk] = fy * fx

    return corner


def block_corners_macro(dtype: str, queries: int, gradients: bool):
    """The CPU kernels' per-block half of the rule: for one (level l, point p) and the block
    of `queries` queries from q0, the queries in vector lanes (the last block's spare lanes
    redo query Q - 1; their results are never read), branch-free, into the buffers `cells`:
    rows [s, k, i] = corner k's value row (-1: unused or skipped) and weights [s, k, i] = its
    bilinear weight * attention (0 when unused); with `gradients` also, per sample, the
    offsets lh and lw [s, i], the attention [s, i] and inside [s, i] = 1 where the strict
    validity test passes (0: skipped), in that order. `s` is the caller's slot of (l, p).
    The same rows and weights as cell_macro and corner_of_cell_macro, bit for bit: the cell
    from the position clamped into [-1, size] (finite, NaN included, so floor() -> int32
    cannot overflow) is the true cell wherever the test passes, rows are checked against
    [0, K) in int64."""
    from tvm import tirx
    from tvm.script import tirx as T

    one, minus_one, zero = tirx.const(1, dtype), tirx.const(-1, dtype), tirx.const(0, dtype)
    position = fma_position(dtype)

    @T.macro
    def block_corners(shapes, lsi, loc, attn, cells, b, h, K, Q, l, p, q0, s):
        hl: T.let = shapes[l, 0]
        wl: T.let = shapes[l, 1]
        for i in T.vectorized(queries):
            q: T.let = T.min(q0 + i, Q - 1)
            h_im: T.let = position(loc[b, q, h, l, p, 1], hl)
            w_im: T.let = position(loc[b, q, h, l, p, 0], wl)
            # (no boolean lets: a vector of them does not compile in TVM 0.27)
            inside: T.let = T.Select(T.And(T.And(h_im > minus_one, w_im > minus_one),
                                           T.And(h_im < T.Cast(dtype, hl), w_im < T.Cast(dtype, wl))), 1, 0)
            y0: T.let = T.Cast("int32", T.floor(T.max(T.min(h_im, T.Cast(dtype, hl)), minus_one)))
            x0: T.let = T.Cast("int32", T.floor(T.max(T.min(w_im, T.Cast(dtype, wl)), minus_one)))
            lh: T.let = h_im - T.Cast(dtype, y0)
            lw: T.let = w_im - T.Cast(dtype, x0)
            a: T.let = attn[b, q, h, l, p]
            r00: T.let = T.Cast("int64", lsi[l]) + T.Cast("int64", y0) * T.Cast("int64", wl) + T.Cast("int64", x0)
            if gradients:
                cells[2][s, i] = lh
                cells[3][s, i] = lw
                cells[4][s, i] = a
                cells[5][s, i] = inside
            for k in T.unroll(4):
                r: T.let = r00 + T.Cast("int64", k // 2 * wl + k % 2)
                fy: T.let = T.if_then_else(k // 2 == 1, lh, one - lh)
                fx: T.let = T.if_then_else(k % 2 == 1, lw, one - lw)
                used: T.let = T.Select(T.And(T.And(inside > 0, T.Cast("uint64", r) < T.Cast("uint64", K)),
                                             T.And(T.Select(k // 2 == 1, y0 < hl - 1, y0 >= 0),
                                                   T.Select(k % 2 == 1, x0 < wl - 1, x0 >= 0))), 1, 0)
                cells[0][s, k, i] = T.Select(used > 0, T.Cast("int32", r), -1)
                cells[1][s, k, i] = T.Select(used > 0, fy * fx * a, zero)

    return block_corners


def private_slice(sizes: dict, plan: dict) -> bool:
    """Whether a CPU kernel works on a private contiguous [K, C] copy of each (b, h) slice
    (knobs private_slice, private_min_ratio of both directions). The copy costs one strided
    pass over the value slice per (b, h); it pays off only when the slice receives many
    samples (BEVFormer: Q*L*P = 309k per slice vs K = 31k rows; the Deformable-DETR decoder
    case: 3.6k samples vs K = 40k)."""
    mode = plan["private_slice"]
    if mode in ("always", "never"):
        return mode == "always"
    return sizes["Q"] * sizes["L"] * sizes["P"] >= plan["private_min_ratio"] * sizes["K"]


def cpu_kernel_name(base: str, private: bool, sizes: dict, plan: dict) -> str:
    """base[_private][_fixed_c]: the CPU kernel of a call (C compiled in when it matches; a
    plan's fixed_c 0 fixes none)."""
    name = base + "_private" if private else base
    fixed = int(plan["fixed_c"])
    return name + "_fixed_c" if fixed and sizes["C"] == fixed else name


class LevelChecks:
    """The checks of both directions beyond the spec: im2col_step divides the batch, and
    K == sum(h*w) of spatial_shapes (a value check, read on the host for host tensors and
    once per tensor and version for CUDA ones; the kernels guard every row by 0 <= row < K,
    so inconsistent level tables stay memory-safe)."""

    name = ""

    def rules(self, problem):
        op, sizes = self.name, problem.sizes
        step, batch = problem.params["im2col_step"], sizes["B"]
        if batch > 0:  # B == 0 is the zero-element rule's BAD_PARAM
            im2col = min(batch, step)
            if batch % im2col:
                raise BadParamError(f"{op}: im2col_step: min(B, im2col_step) = {im2col} must divide "
                                    f"value.shape[0] (B) = {batch}, got im2col_step={step}")

    def value_rules(self, problem, inputs):
        negative, total = interop.host_values(inputs["spatial_shapes"], level_problems)
        if negative is not None:
            raise BadParamError(f"{self.name}: spatial_shapes must be non-negative (h, w) pairs, got {negative}")
        if total != problem.sizes["K"]:
            raise BadParamError(f"{self.name}: value.shape[1] (K) must equal sum(h*w) of spatial_shapes = "
                                f"{total}, got {problem.sizes['K']}")


def level_problems(values: np.ndarray):
    """(the pairs if any is negative else None, sum(h*w)) of spatial_shapes' values."""
    shapes = np.asarray(values, np.int64).reshape(-1, 2)
    negative = shapes.tolist() if (shapes < 0).any() else None
    # Python ints: an int64 sum of several int32 products can wrap around onto K
    return negative, sum(h * w for h, w in shapes.tolist())
