"""border_align_backward (BorderDet).

For each (n, k, border s, channel c), i = argmax_idx[n, k, s, c]; when 0 <= i <= pool_size,
grad_output[n, k, s, c] is spread bilinearly at the border sample start_s + i * step_s of box
k into grad_input[n, :, :, s*C + c]. Layout (the seed's NHWC): grad_output [N, K, 4, C],
boxes [N, K, 4] (x0, y0, x1, y1), argmax_idx [N, K, 4, C] int32, grad_input [N, H, W, 4C]
with K == H*W. Border s: 0 top, 1 left, 2 bottom, 3 right. Contract:
specs/border_align_backward.yaml.

Kernels, launched in this order (one set per dtype, every dimension symbolic):
  geometry      per (n, k, s, i): the 4 corner pixels p = y*W + x and bilinear weights;
                PIX = -1 marks a sample that contributes nothing
  scatter       owner computes (no atomics): (n, s, 16-channel group) owns a float32 column
                block WS[n, s, g, :, :] of a workspace, zeroed by T.init, and walks all (k, i)
  scatter_tail  the same for the C % 16 tail channels into WT[n, s, t, :]
  layout        WS/WT -> grad_input in the output dtype (for float16 the single rounding:
                everything before it accumulates in float32)

No write can leave grad_input or the workspaces, whatever the boxes or argmax values:
an argmax outside [0, pool_size] never equals a sample index, and a sample contributes only
when -1 <= y <= H and -1 <= x <= W, written as positive comparisons so NaN coordinates (NaN
boxes, 0 * inf) fail them; after that test every corner is inside the map, so the int casts
are safe. Why this design (owner-major workspace, geometry table, 16-channel groups):
schedules/border_align_backward.yaml.
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from .. import interop
from ..errors import BadParamError
from .base import Operator

GEOMETRY = "border_align_backward_geometry"
SCATTER = "border_align_backward_scatter"
TAIL = "border_align_backward_scatter_tail"
LAYOUT = "border_align_backward_layout"

# C is split into C // 16 full groups (one AVX-512 float32 vector, 16 CUDA threads) and a
# tail of C % 16 channels with a kernel of its own: TVM 0.27 scalarises a predicated split
# of a symbolic loop, and loop_partition refuses dynamic extents.
CHANNEL_GROUP = 16


def _geometry_func(dtype: str):
    """Sample geometry per (n, k, s, i): the 4 corner pixels (p = y*W + x) and weights.

    PIX[..., 0] == -1 marks an invalid sample (outside [-1, H] x [-1, W] or NaN); it then
    contributes nothing.  Positive comparisons, so NaN coordinates fail them."""

    @T.prim_func(s_tir=True)
    def border_align_backward_geometry(bx_h: T.handle, pix_h: T.handle, wgt_h: T.handle,
                                       height: T.int32, width: T.int32):
        T.func_attr({"tirx.noalias": True})
        N = T.int32()
        K = T.int32()
        P1 = T.int32()                     # pool_size + 1
        BX = T.match_buffer(bx_h, (N, K, 4), dtype)
        PIX = T.match_buffer(pix_h, (N, K, 4, P1, 4), "int32")
        WGT = T.match_buffer(wgt_h, (N, K, 4, P1, 4), "float32")
        for n, k, s, i in T.grid(N, K, 4, P1):
            with T.sblock("geometry"):
                vn, vk, vs, vi = T.axis.remap("SSSS", [n, k, s, i])
                H = T.meta_var(height)
                W = T.meta_var(width)
                x0 = T.meta_var(T.Cast("float32", BX[vn, vk, 0]))
                y0 = T.meta_var(T.Cast("float32", BX[vn, vk, 1]))
                x1 = T.meta_var(T.Cast("float32", BX[vn, vk, 2]))
                y1 = T.meta_var(T.Cast("float32", BX[vn, vk, 3]))
                fi = T.meta_var(T.Cast("float32", vi))
                fp = T.meta_var(T.Cast("float32", P1 - 1))
                # top: (x0,y0)+i*(w/p,0); left: (x0,y0)+i*(0,h/p);
                # bottom: (x1,y1)-i*(w/p,0); right: (x1,y1)-i*(0,h/p).  The zero step is a
                # literal 0 (not 0*width), so an infinite width cannot make it NaN.
                step_x = T.meta_var(T.Select(vs == 0, (x1 - x0) / fp,
                                             T.Select(vs == 2, (x0 - x1) / fp, T.float32(0))))
                step_y = T.meta_var(T.Select(vs == 1, (y1 - y0) / fp,
                                             T.Select(vs == 3, (y0 - y1) / fp, T.float32(0))))
                x: T.let[T.float32] = T.Select(vs < 2, x0, x1) + fi * step_x
                y: T.let[T.float32] = T.Select(vs < 2, y0, y1) + fi * step_y
                if (y >= T.float32(-1)) and (y <= T.Cast("float32", H)) and (
                        x >= T.float32(-1)) and (x <= T.Cast("float32", W)):
                    # in range: the int casts are safe, every corner is inside the map
                    yc: T.let[T.float32] = T.max(y, T.float32(0))
                    xc: T.let[T.float32] = T.max(x, T.float32(0))
                    yi: T.let[T.int32] = T.Cast("int32", yc)
                    xi: T.let[T.int32] = T.Cast("int32", xc)
                    y_low: T.let[T.int32] = T.min(yi, H - 1)
                    x_low: T.let[T.int32] = T.min(xi, W - 1)
                    y_high: T.let[T.int32] = T.min(yi + 1, H - 1)
                    x_high: T.let[T.int32] = T.min(xi + 1, W - 1)
                    ly: T.let[T.float32] = T.Select(yi >= H - 1, T.float32(0),
                                                    yc - T.Cast("float32", yi))
                    lx: T.let[T.float32] = T.Select(xi >= W - 1, T.float32(0),
                                                    xc - T.Cast("float32", xi))
                    PIX[vn, vk, vs, vi, 0] = y_low * W + x_low
                    PIX[vn, vk, vs, vi, 1] = y_low * W + x_high
                    PIX[vn, vk, vs, vi, 2] = y_high * W + x_low
                    PIX[vn, vk, vs, vi, 3] = y_high * W + x_high
                    WGT[vn, vk, vs, vi, 0] = (T.float32(1) - ly) * (T.float32(1) - lx)
                    WGT[vn, vk, vs, vi, 1] = (T.float32(1) - ly) * lx
                    WGT[vn, vk, vs, vi, 2] = ly * (T.float32(1) - lx)
                    WGT[vn, vk, vs, vi, 3] = ly * lx
                else:
                    for j in range(4):
                        PIX[vn, vk, vs, vi, j] = -1
                        WGT[vn, vk, vs, vi, j] = T.float32(0)

    return border_align_backward_geometry


def _scatter_funcs(dtype: str, guarded_tail: bool):
    """Owner-computes scatter into float32 workspaces (zero-filled by T.init).

    Block spatial iters (n, s, c) own a column of the workspace, reduction iters (k, i): for
    every box k and sample i, channel c contributes where(argmax == i, grad, 0) at the 4
    corners of sample i.  Argmax outside [0, pool_size] never equals i: no contribution."""
    V = CHANNEL_GROUP

    @T.macro(hygienic=False)
    def contribution(GO, AM, PIX, WGT, OUT, vn, vs, vc, vk, vi, o0, o1, o2, o3):
        # corner indices bound to scalars (T.let): keeps the block a reduction block and the
        # channel loop vectorisable.  Select (not if_then_else) for the lane-dependent mask.
        p0: T.let[T.int32] = PIX[vn, vk, vs, vi, 0]
        if p0 >= 0:
            p1: T.let[T.int32] = PIX[vn, vk, vs, vi, 1]
            p2: T.let[T.int32] = PIX[vn, vk, vs, vi, 2]
            p3: T.let[T.int32] = PIX[vn, vk, vs, vi, 3]
            g = T.meta_var(T.Select(AM[vn, vk, vs, vc] == vi,
                                    T.Cast("float32", GO[vn, vk, vs, vc]), T.float32(0)))
            if o3 is None:
                OUT[o0, o1, o2, p0] = OUT[o0, o1, o2, p0] + WGT[vn, vk, vs, vi, 0] * g
                OUT[o0, o1, o2, p1] = OUT[o0, o1, o2, p1] + WGT[vn, vk, vs, vi, 1] * g
                OUT[o0, o1, o2, p2] = OUT[o0, o1, o2, p2] + WGT[vn, vk, vs, vi, 2] * g
                OUT[o0, o1, o2, p3] = OUT[o0, o1, o2, p3] + WGT[vn, vk, vs, vi, 3] * g
            else:
                OUT[o0, o1, o2, p0, o3] = OUT[o0, o1, o2, p0, o3] + WGT[vn, vk, vs, vi, 0] * g
                OUT[o0, o1, o2, p1, o3] = OUT[o0, o1, o2, p1, o3] + WGT[vn, vk, vs, vi, 1] * g
                OUT[o0, o1, o2, p2, o3] = OUT[o0, o1, o2, p2, o3] + WGT[vn, vk, vs, vi, 2] * g
                OUT[o0, o1, o2, p3, o3] = OUT[o0, o1, o2, p3, o3] + WGT[vn, vk, vs, vi, 3] * g

    @T.prim_func(s_tir=True)
    def border_align_backward_scatter(go_h: T.handle, am_h: T.handle, pix_h: T.handle,
                                      wgt_h: T.handle, ws_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int32()
        K = T.int32()
        C = T.int32()
        P1 = T.int32()
        GO = T.match_buffer(go_h, (N, K, 4, C), dtype)
        AM = T.match_buffer(am_h, (N, K, 4, C), "int32")
        PIX = T.match_buffer(pix_h, (N, K, 4, P1, 4), "int32")
        WGT = T.match_buffer(wgt_h, (N, K, 4, P1, 4), "float32")
        # owner-major workspace: channel g*V + l of border s at pixel p is WS[n, s, g, p, l]
        WS = T.match_buffer(ws_h, (N, 4, C // V, K, V), "float32")
        for n, s, g, l, k, i in T.grid(N, 4, C // V, V, K, P1):
            with T.sblock("scatter"):
                vn, vs, vg, vl, vk, vi = T.axis.remap("SSSSRR", [n, s, g, l, k, i])
                T.reads(GO[vn, vk, vs, vg * V + vl], AM[vn, vk, vs, vg * V + vl],
                        PIX[vn, vk, vs, vi, 0:4], WGT[vn, vk, vs, vi, 0:4],
                        WS[vn, vs, vg, 0:K, vl])
                T.writes(WS[vn, vs, vg, 0:K, vl])
                with T.init():
                    for p in range(K):
                        WS[vn, vs, vg, p, vl] = T.float32(0)
                contribution(GO, AM, PIX, WGT, WS, vn, vs, vg * V + vl, vk, vi,
                             vn, vs, vg, vl)

    @T.prim_func(s_tir=True)
    def border_align_backward_scatter_tail(go_h: T.handle, am_h: T.handle, pix_h: T.handle,
                                           wgt_h: T.handle, wt_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int32()
        K = T.int32()
        C = T.int32()
        P1 = T.int32()
        GO = T.match_buffer(go_h, (N, K, 4, C), dtype)
        AM = T.match_buffer(am_h, (N, K, 4, C), "int32")
        PIX = T.match_buffer(pix_h, (N, K, 4, P1, 4), "int32")
        WGT = T.match_buffer(wgt_h, (N, K, 4, P1, 4), "float32")
        # channel tail C // V * V + t (t < C % V) of border s at pixel p is WT[n, s, t, p]
        # V rows, of which C % V are used (never 0-sized; the CUDA threads index up to V - 1)
        WT = T.match_buffer(wt_h, (N, 4, V, K), "float32")
        for n, s, t, k, i in T.grid(N, 4, V if guarded_tail else C % V, K, P1):
            with T.sblock("scatter_tail"):
                vn, vs, vt, vk, vi = T.axis.remap("SSSRR", [n, s, t, k, i])
                T.reads(GO[vn, vk, vs, C // V * V + vt], AM[vn, vk, vs, C // V * V + vt],
                        PIX[vn, vk, vs, vi, 0:4], WGT[vn, vk, vs, vi, 0:4],
                        WT[vn, vs, vt, 0:K])
                T.writes(WT[vn, vs, vt, 0:K])
                # guarded form (CUDA): the thread loop has the constant extent V and the
                # lanes past C % V do nothing; on the CPU the loop is exactly C % V long
                with T.init():
                    if vt < C % V:
                        for p in range(K):
                            WT[vn, vs, vt, p] = T.float32(0)
                if vt < C % V:
                    contribution(GO, AM, PIX, WGT, WT, vn, vs, C // V * V + vt, vk, vi,
                                 vn, vs, vt, None)

    return border_align_backward_scatter, border_align_backward_scatter_tail


def _layout_func(dtype: str):
    """Workspaces (owner-major float32) -> grad_input [N, H, W, 4C] in dtype (one rounding)."""
    V = CHANNEL_GROUP

    @T.prim_func(s_tir=True)
    def border_align_backward_layout(ws_h: T.handle, wt_h: T.handle, gi_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N = T.int32()
        C = T.int32()
        H = T.int32()
        W = T.int32()
        GI = T.match_buffer(gi_h, (N, H, W, 4, C), dtype)   # [N, H, W, 4C] viewed 5-D
        WS = T.match_buffer(ws_h, (N, 4, C // V, H * W, V), "float32")
        WT = T.match_buffer(wt_h, (N, 4, V, H * W), "float32")
        for n, h, w, s, g, l in T.grid(N, H, W, 4, C // V, V):
            with T.sblock("layout"):
                vn, vh, vw, vs, vg, vl = T.axis.remap("SSSSSS", [n, h, w, s, g, l])
                GI[vn, vh, vw, vs, vg * V + vl] = T.Cast(dtype, WS[vn, vs, vg, vh * W + vw, vl])
        for n, h, w, s, t in T.grid(N, H, W, 4, C % V):
            with T.sblock("layout_tail"):
                vn, vh, vw, vs, vt = T.axis.remap("SSSSS", [n, h, w, s, t])
                GI[vn, vh, vw, vs, C // V * V + vt] = T.Cast(dtype, WT[vn, vs, vt, vh * W + vw])

    return border_align_backward_layout


def computes(dtype: str, guarded_tail: bool) -> dict:
    main, tail = _scatter_funcs(dtype, guarded_tail)
    return {GEOMETRY: _geometry_func(dtype), SCATTER: main, TAIL: tail, LAYOUT: _layout_func(dtype)}


def workspace_shapes(n: int, h: int, w: int, c: int) -> tuple:
    v = CHANNEL_GROUP
    return (n, 4, c // v, h * w, v), (n, 4, v, h * w)


def _compact_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class BorderAlignBackward(Operator):
    name = "border_align_backward"
    kernel_names = (GEOMETRY, SCATTER, TAIL, LAYOUT)

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

    def plan(self, model, knobs):
        return {"channel_group": CHANNEL_GROUP, "lanes": model.lanes("float32"), **knobs}

    def computes(self, dtype, plan, model):
        return computes(dtype, guarded_tail=model.kind == "cuda")

    def launch(self, kernels, problem, tensors):
        s = problem.sizes
        n, k, c, h, w = s["N"], s["K"], s["C"], s["H"], s["W"]
        p1 = problem.params["pool_size"] + 1
        ws_shape, wt_shape = workspace_shapes(n, h, w, c)

        def workspace(shape, dtype):
            if 0 not in shape:
                return interop.empty_like_kind(problem.kind, problem.device, shape, dtype, zero=False)
            # C < 16 leaves WS empty; TVM wants even an empty tensor to have compact strides,
            # which neither numpy nor torch give a 0-sized array by default
            strides = _compact_strides(shape)
            if problem.kind == "torch":
                import torch

                return torch.empty_strided(shape, strides, dtype=getattr(torch, dtype), device=problem.device)
            item = np.dtype(dtype).itemsize
            return np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape, [s * item for s in strides])

        pix = workspace((n, k, 4, p1, 4), "int32")
        wgt = workspace((n, k, 4, p1, 4), "float32")
        ws, wt = workspace(ws_shape, "float32"), workspace(wt_shape, "float32")
        out = tensors["grad_input"]
        out5 = out.reshape(n, h, w, 4, c) if isinstance(out, np.ndarray) else out.view(n, h, w, 4, c)
        kernels[GEOMETRY](tensors["boxes"], pix, wgt, h, w)
        kernels[SCATTER](tensors["grad_output"], tensors["argmax_idx"], pix, wgt, ws)
        kernels[TAIL](tensors["grad_output"], tensors["argmax_idx"], pix, wgt, wt)
        kernels[LAYOUT](ws, wt, out5)

    # --- testing and benchmarking ---------------------------------------------
    def make_inputs(self, case, dtype, rng):
        s = case.shape
        n, k, c, h, w = s["N"], s["K"], s["C"], s["H"], s["W"]
        x = case.extra
        pool = int(x.get("pool_size", 10))
        grad_output = rng.uniform(-1, 1, (n, k, 4, c)).astype(dtype)
        boxes = box_layout(x.get("boxes", "inside"), n, k, h, w, rng).astype(dtype)
        spill = int(x.get("argmax_spill", 0))
        argmax = rng.integers(-spill, pool + 1 + spill, (n, k, 4, c)).astype(np.int32)
        params = {"pool_size": pool, "height": h, "width": w, "out_channels": s["Q"]}
        return {"grad_output": grad_output, "boxes": boxes, "argmax_idx": argmax}, params

    def reference(self, inputs, params):
        return {"grad_input": reference(inputs["grad_output"], inputs["boxes"], inputs["argmax_idx"],
                                        params["pool_size"], params["height"], params["width"])}

    def torch_peer(self, inputs, params):
        import torch

        go, bx, am = (torch.from_numpy(np.asarray(inputs[t])) for t in ("grad_output", "boxes", "argmax_idx"))
        pool, h, w = params["pool_size"], params["height"], params["width"]
        return lambda: torch_gradient(go, bx, am, pool, h, w)


def box_layout(kind: str, n: int, k: int, h: int, w: int, rng) -> np.ndarray:
    """Boxes [n, k, 4] (x0, y0, x1, y1) for the test cases."""
    if kind == "inside":          # inside the map [0, W-1] x [0, H-1], x0 <= x1, y0 <= y1
        xs = np.sort(rng.uniform(0, max(w - 1, 0), (n, k, 2)), -1)
        ys = np.sort(rng.uniform(0, max(h - 1, 0), (n, k, 2)), -1)
    elif kind == "partly_outside":  # around the map, corners often outside [-1, W] x [-1, H]
        xs = np.sort(rng.uniform(-0.6 * w - 2, 1.6 * w + 2, (n, k, 2)), -1)
        ys = np.sort(rng.uniform(-0.6 * h - 2, 1.6 * h + 2, (n, k, 2)), -1)
    elif kind == "outside":        # wholly outside: every sample is skipped
        xs = rng.uniform(w + 1.5, 2 * w + 5, (n, k, 2))
        ys = rng.uniform(-2 * h - 5, -1.5, (n, k, 2))
    elif kind == "degenerate":     # zero width or height (or both): repeated samples
        x0 = rng.uniform(-1, w, (n, k))
        y0 = rng.uniform(-1, h, (n, k))
        x1 = np.where(rng.random((n, k)) < 0.5, x0, rng.uniform(-1, w, (n, k)))
        y1 = np.where(rng.random((n, k)) < 0.5, y0, rng.uniform(-1, h, (n, k)))
        return np.stack([x0, y0, x1, y1], -1)
    elif kind == "edges":          # samples exactly on -1, 0, H-1, H, W-1, W
        cand_x = np.array([-1.0, 0.0, w - 1.0, float(w), w - 0.5, -0.5])
        cand_y = np.array([-1.0, 0.0, h - 1.0, float(h), h - 0.5, -0.5])
        xs = rng.choice(cand_x, (n, k, 2))
        ys = rng.choice(cand_y, (n, k, 2))
    else:
        raise ValueError(f"unknown box layout {kind!r}")
    return np.stack([xs[..., 0], ys[..., 0], xs[..., 1], ys[..., 1]], -1)


def reference(grad_output, boxes, argmax_idx, pool_size, height, width):
    """float64 numpy reference written from SPEC_NOTES (np.bincount scatter)."""
    go = np.asarray(grad_output, dtype=np.float64)
    bx = np.asarray(boxes, dtype=np.float64)
    am = np.asarray(argmax_idx).astype(np.int64)
    n, _k, _, c = go.shape
    h, w, p = int(height), int(width), int(pool_size)
    x0, y0, x1, y1 = (bx[..., j] for j in range(4))            # [N, K]
    zero = np.zeros_like(x0)
    with np.errstate(invalid="ignore", over="ignore"):
        wdt, hgt = x1 - x0, y1 - y0
        sx = np.stack([x0, x0, x1, x1], -1)[..., None]           # [N, K, 4, 1]
        sy = np.stack([y0, y0, y1, y1], -1)[..., None]
        dx = np.stack([wdt / p, zero, -wdt / p, zero], -1)[..., None]
        dy = np.stack([zero, hgt / p, zero, -hgt / p], -1)[..., None]
        ok = (am >= 0) & (am <= p)
        ii = np.where(ok, am, 0).astype(np.float64)
        # the axis a border does not move along has step 0 (not 0 * width): i * 0 = 0
        x = sx + np.where(dx == 0, 0.0, ii * dx)
        y = sy + np.where(dy == 0, 0.0, ii * dy)
        ok &= (y >= -1) & (y <= h) & (x >= -1) & (x <= w)        # NaN -> False
    x = np.where(ok, np.maximum(x, 0), 0)
    y = np.where(ok, np.maximum(y, 0), 0)
    yi = y.astype(np.int64)
    xi = x.astype(np.int64)
    ytop = yi >= h - 1
    xtop = xi >= w - 1
    y_low = np.where(ytop, h - 1, yi)
    x_low = np.where(xtop, w - 1, xi)
    y_high = np.where(ytop, h - 1, yi + 1)
    x_high = np.where(xtop, w - 1, xi + 1)
    ly = np.where(ytop, 0.0, y - yi)
    lx = np.where(xtop, 0.0, x - xi)
    hy, hx = 1 - ly, 1 - lx
    g = np.where(ok, go, 0.0)
    n_idx = np.arange(n)[:, None, None, None]
    col = np.arange(4)[None, None, :, None] * c + np.arange(c)[None, None, None, :]
    idx, val = [], []
    for yy, xx, ww in ((y_low, x_low, hy * hx), (y_low, x_high, hy * lx),
                       (y_high, x_low, ly * hx), (y_high, x_high, ly * lx)):
        idx.append((((n_idx * h + yy) * w + xx) * (4 * c) + col)[ok])
        val.append((g * ww)[ok])
    out = np.bincount(np.concatenate(idx), weights=np.concatenate(val), minlength=n * h * w * 4 * c)
    return out.reshape(n, h, w, 4 * c)


def torch_gradient(go, bx, am, pool_size, height, width):
    """PyTorch eager: the same gradient with index_put_(accumulate=True), in the input dtype."""
    import torch

    am = am.long()
    n, _k, _, c = go.shape
    h, w, p = int(height), int(width), int(pool_size)
    x0, y0, x1, y1 = bx.unbind(-1)
    wdt, hgt = x1 - x0, y1 - y0
    zero = torch.zeros_like(x0)
    sx = torch.stack([x0, x0, x1, x1], -1)[..., None]
    sy = torch.stack([y0, y0, y1, y1], -1)[..., None]
    dx = torch.stack([wdt / p, zero, -wdt / p, zero], -1)[..., None]
    dy = torch.stack([zero, hgt / p, zero, -hgt / p], -1)[..., None]
    ok = (am >= 0) & (am <= p)
    ii = torch.where(ok, am, 0).to(go.dtype)
    x = sx + ii * dx
    y = sy + ii * dy
    ok &= (y >= -1) & (y <= h) & (x >= -1) & (x <= w)
    x = torch.where(ok, x.clamp(min=0), 0)
    y = torch.where(ok, y.clamp(min=0), 0)
    yi, xi = y.long(), x.long()
    ytop, xtop = yi >= h - 1, xi >= w - 1
    y_low = torch.where(ytop, h - 1, yi)
    x_low = torch.where(xtop, w - 1, xi)
    y_high = torch.where(ytop, h - 1, yi + 1)
    x_high = torch.where(xtop, w - 1, xi + 1)
    ly = torch.where(ytop, 0, y - yi)
    lx = torch.where(xtop, 0, x - xi)
    hy, hx = 1 - ly, 1 - lx
    g = torch.where(ok, go, 0)
    out = torch.zeros(n, h, w, 4 * c, dtype=go.dtype)
    nn = torch.arange(n)[:, None, None, None].expand_as(am)
    cc = (torch.arange(4)[:, None] * c + torch.arange(c)[None, :]).expand_as(am)
    for yy, xx, ww in ((y_low, x_low, hy * hx), (y_low, x_high, hy * lx),
                       (y_high, x_low, ly * hx), (y_high, x_high, ly * lx)):
        out.index_put_((nn, yy, xx, cc), g * ww, accumulate=True)
    return out


OP = BorderAlignBackward()


def border_align_backward(grad_output, boxes, argmax_idx, pool_size, *, height=None, width=None,
                          target="llvm", out=None):
    """Gradient of BorderAlign (BorderDet): grad_input [N, H, W, 4C] from grad_output [N, K, 4, C].

    boxes [N, K, 4] (x0, y0, x1, y1, the dtype of grad_output: float32 or float16),
    argmax_idx [N, K, 4, C] int32 (sample index in [0, pool_size]; other values contribute
    nothing), pool_size > 0, K == height * width. height and width are required unless
    `out` (a [N, H, W, 4C] buffer) gives them. float16 accumulates in float32 and is rounded
    once. numpy in -> numpy out; torch in -> torch out.
    """
    shape = getattr(grad_output, "shape", None)
    # grad_input's last dim (4C) for the spec's symbol Q; an out= buffer gives it instead
    q = 4 * int(shape[3]) if out is None and shape is not None and len(shape) == 4 else None
    return OP.call({"grad_output": grad_output, "boxes": boxes, "argmax_idx": argmax_idx},
                   {"pool_size": pool_size, "height": height, "width": width, "out_channels": q},
                   target, {"grad_input": out})
