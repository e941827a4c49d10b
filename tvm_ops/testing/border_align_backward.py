"""border_align_backward: inputs, float64 reference and PyTorch peers."""

from __future__ import annotations

import numpy as np

from . import peer_tensor


def make_inputs(case, dtype, rng):
    s = case.shape
    n, k, c, h, w = s["N"], s["K"], s["C"], s["H"], s["W"]
    x = case.extra
    pool = int(x.get("pool_size", 10))
    grad_output = rng.uniform(-1, 1, (n, k, 4, c)).astype(dtype)
    boxes = box_layout(x.get("boxes", "inside"), n, k, h, w, rng).astype(dtype)
    spill = int(x.get("argmax_spill", 0))
    argmax = rng.integers(-spill, pool + 1 + spill, (n, k, 4, c)).astype(np.int32)
    ends = float(x.get("argmax_ends", 0))
    if ends:  # this fraction of the argmax values names the first or the last sample
        pick = rng.random(argmax.shape) < ends
        argmax[pick] = rng.choice(np.array([0, pool], np.int32), pick.sum())
    params = {"pool_size": pool, "height": h, "width": w, "out_channels": s["Q"]}
    return {"grad_output": grad_output, "boxes": boxes, "argmax_idx": argmax}, params


def reference(inputs, params):
    return {"grad_input": grad_input_reference(inputs["grad_output"], inputs["boxes"], inputs["argmax_idx"],
                                    params["pool_size"], params["height"], params["width"])}


def torch_peer(inputs, params):
    args = _peer_args(inputs, params)
    return lambda: torch_gradient(*args)


def peers(inputs, params):
    """The PyTorch formulations the bench times (its ratio is against the fastest)."""
    args = _peer_args(inputs, params)
    return {"index_put_": torch_peer(inputs, params), "autograd": lambda: torch_autograd_gradient(*args),
            "index_add_": lambda: torch_index_add_gradient(*args)}



def _peer_args(inputs, params):
    """(grad_output, boxes, argmax_idx, pool_size, height, width) for the PyTorch peers."""
    return (*(peer_tensor(inputs[t]) for t in ("grad_output", "boxes", "argmax_idx")),
            params["pool_size"], params["height"], params["width"])


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
    elif kind == "corners":        # every corner exactly on -1, 0, W-1 or W (x) and -1, 0, H-1 or H (y)
        xs = rng.choice(np.array([-1.0, 0.0, w - 1.0, float(w)]), (n, k, 2))
        ys = rng.choice(np.array([-1.0, 0.0, h - 1.0, float(h)]), (n, k, 2))
    else:
        raise ValueError(f"unknown box layout {kind!r}")
    return np.stack([xs[..., 0], ys[..., 0], xs[..., 1], ys[..., 1]], -1)


def border_sample(x0, y0, x1, y1, i, pool_size, where):
    """(x, y) of sample i (0..pool_size) on borders s = 0..3 (top, left, bottom, right) of
    boxes (x0, y0, x1, y1), for numpy (where=np.where) or torch (torch.where): the sample
    rule that the kernels' `sample_xy` (ops/border_align_sampling.py) computes in
    float32. x0.. are [..., 1, 1] or broadcast so; the border axis is dim -2, i [..., 4, C].

    A border moves along one axis from its start corner to its end corner: top (x0, y0) ->
    (x1, y0), left (x0, y0) -> (x0, y1), bottom (x1, y1) -> (x0, y1), right (x1, y1) ->
    (x1, y0). Along that axis a = start + i * ((end - start) / pool_size) (SPEC_NOTES'
    start + i * step, rounded once: `along`), except a = end at i == pool_size: the product can round past the end
    corner, and an end corner exactly on -1, H or W would then drop out of the map. The
    other axis is the start corner's, untouched (no 0 * width: inf * 0 is NaN)."""
    cat = (lambda parts: np.concatenate(parts, -2)) if where is np.where else _torch_cat
    sx, sy = cat([x0, x0, x1, x1]), cat([y0, y0, y1, y1])
    ex, ey = cat([x1, x0, x0, x1]), cat([y0, y1, y1, y0])
    moves_x = (np.arange(4) % 2 == 0)[:, None]
    if where is not np.where:
        import torch

        moves_x = torch.from_numpy(moves_x).to(x0.device)  # the peers run on the GPU too
    x = where(moves_x, where(i == pool_size, ex, along(sx, ex, i, pool_size)), sx)
    y = where(~moves_x, where(i == pool_size, ey, along(sy, ey, i, pool_size)), sy)
    return x, y


def along(start, end, i, pool_size):
    """start + i * ((end - start) / pool_size) in start's dtype, the step rounded to it and the
    sum rounded once (through float64, where the product is exact): the kernels' sample_xy,
    whether or not their compiler fuses the multiply-add. numpy arrays or torch tensors."""
    step = (end - start) / pool_size
    if isinstance(start, np.ndarray):
        return (start.astype(np.float64) + i.astype(np.float64) * step.astype(np.float64)).astype(start.dtype)
    return (start.double() + i.double() * step.double()).to(start.dtype)


def _torch_cat(parts):
    import torch

    return torch.cat(parts, -2)


def grad_input_reference(grad_output, boxes, argmax_idx, pool_size, height, width):
    """float64 numpy reference written from docs/semantics.md (np.bincount scatter)."""
    go = np.asarray(grad_output, dtype=np.float64)
    bx = np.asarray(boxes).astype(np.float32)  # positions in float32, as the contract states
    am = np.asarray(argmax_idx).astype(np.int64)
    n, _k, _, c = go.shape
    h, w, p = int(height), int(width), int(pool_size)
    x0, y0, x1, y1 = (bx[..., j, None, None] for j in range(4))  # [N, K, 1, 1]
    with np.errstate(invalid="ignore", over="ignore"):
        ok = (am >= 0) & (am <= p)
        x, y = border_sample(x0, y0, x1, y1, np.where(ok, am, 0), p, np.where)
        x, y = x.astype(np.float64), y.astype(np.float64)
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


def _torch_corners(go, bx, am, pool_size, height, width):
    """PyTorch eager: (ok, nn, cc, corners) of every (n, k, s, c): whether its sample counts,
    its batch and grad_input column, and its 4 bilinear corners [(y, x, weight)]."""
    import torch

    am = am.long()
    n, _k, _, c = go.shape
    h, w, p = int(height), int(width), int(pool_size)
    x0, y0, x1, y1 = (bx[..., j, None, None] for j in range(4))
    ok = (am >= 0) & (am <= p)
    x, y = border_sample(x0, y0, x1, y1, torch.where(ok, am, 0), p, torch.where)
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
    nn = torch.arange(n)[:, None, None, None].expand_as(am)
    cc = (torch.arange(4)[:, None] * c + torch.arange(c)[None, :]).expand_as(am)
    corners = ((y_low, x_low, hy * hx), (y_low, x_high, hy * lx), (y_high, x_low, ly * hx), (y_high, x_high, ly * lx))
    return ok, nn, cc, corners


def torch_gradient(go, bx, am, pool_size, height, width):
    """PyTorch eager: the same gradient with index_put_(accumulate=True), in the input dtype."""
    import torch

    ok, nn, cc, corners = _torch_corners(go, bx, am, pool_size, height, width)
    n, _k, _, c = go.shape
    g = torch.where(ok, go, 0)
    out = torch.zeros(n, int(height), int(width), 4 * c, dtype=go.dtype)
    for yy, xx, ww in corners:
        out.index_put_((nn, yy, xx, cc), g * ww, accumulate=True)
    return out


def torch_index_add_gradient(go, bx, am, pool_size, height, width):
    """PyTorch eager: the same gradient with index_add_ over a linear grad_input index."""
    import torch

    ok, nn, cc, corners = _torch_corners(go, bx, am, pool_size, height, width)
    n, _k, _, c = go.shape
    h, w = int(height), int(width)
    g = torch.where(ok, go, 0)
    index = torch.cat([(((nn * h + yy) * w + xx) * (4 * c) + cc).reshape(-1) for yy, xx, _ in corners])
    values = torch.cat([(g * ww).reshape(-1) for _, _, ww in corners])
    return torch.zeros(n * h * w * 4 * c, dtype=go.dtype).index_add_(0, index, values).view(n, h, w, 4 * c)


def torch_autograd_gradient(go, bx, am, pool_size, height, width):
    """PyTorch eager autograd: a forward that samples each (n, k, s, c) bilinearly at its
    argmax position (BorderAlign's output at its max) from a feature map that requires grad,
    then the gradient of that map for grad_output."""
    import torch

    ok, nn, cc, corners = _torch_corners(go, bx, am, pool_size, height, width)
    n, _k, _, c = go.shape
    feature = torch.zeros(n, int(height), int(width), 4 * c, dtype=go.dtype, requires_grad=True)
    sampled = sum(feature[nn, yy, xx, cc] * ww for yy, xx, ww in corners)
    (grad,) = torch.autograd.grad(torch.where(ok, sampled, 0), feature, grad_outputs=go)
    return grad
