"""border_align_forward: inputs, float64 reference and PyTorch peers."""

from __future__ import annotations

import numpy as np

from . import peer_tensor
from .border_align_backward import along, border_sample, box_layout


def make_inputs(case, dtype, rng):
    s = case.shape
    n, k, h, w, q = s["N"], s["K"], s["H"], s["W"], s["Q"]
    pool = int(case.extra.get("pool_size", 10))
    feat = rng.uniform(-1, 1, (n, h, w, q)).astype(dtype)
    boxes = box_layout(case.extra.get("boxes", "inside"), n, k, h, w, rng).astype(dtype)
    # channels as the public function derives it (input.shape[3] // 4)
    return {"input": feat, "boxes": boxes}, {"pool_size": pool, "channels": q // 4}


def reference(inputs, params):
    output, argmax = forward_reference(inputs["input"], inputs["boxes"], params["pool_size"])
    return {"output": output, "argmax_idx": argmax}


def forward_reference(feat, boxes, pool_size):
    """float64 numpy, from docs/semantics.md: per sample the bilinear value (0 outside
    [-1, H] x [-1, W]), then the running max over i = 0..pool_size where a strictly greater
    value replaces. Sample positions: the shared float32 expression (border_sample)."""
    return _running_max(sample_values(feat, boxes, pool_size))


def _running_max(values):
    """(max, first index reaching it) over the samples' values in turn: sample 0 starts, a
    strictly greater value replaces (so a NaN sample 0 stays)."""
    values = iter(values)
    best = next(values)
    argmax = np.zeros(best.shape, np.int32)
    for i, value in enumerate(values, 1):
        take = value > best
        best = np.where(take, value, best)
        argmax = np.where(take, i, argmax).astype(np.int32)
    return best, argmax


def sample_values(feat, boxes, pool_size):
    """Per sample i = 0..pool_size, its float64 bilinear values [N, K, 4, C]."""
    f = np.asarray(feat, np.float64)
    n, h, w, q = f.shape
    c = q // 4
    bx = np.asarray(boxes).astype(np.float32)  # positions in float32, as the contract states
    k = bx.shape[1]
    x0, y0, x1, y1 = (bx[..., j, None, None] for j in range(4))  # [N, K, 1, 1]
    col = np.arange(4)[:, None] * c + np.arange(c)[None, :]  # [4, C]
    nn = np.arange(n)[:, None, None, None]
    for i in range(pool_size + 1):
        with np.errstate(invalid="ignore", over="ignore"):
            x, y = border_sample(x0, y0, x1, y1, np.full((n, k, 4, 1), i), pool_size, np.where)
            x, y = x.astype(np.float64), y.astype(np.float64)
            ok = (y >= -1) & (y <= h) & (x >= -1) & (x <= w)  # NaN -> False
        y = np.where(ok, np.maximum(y, 0), 0)
        x = np.where(ok, np.maximum(x, 0), 0)
        yi, xi = y.astype(np.int64), x.astype(np.int64)
        ytop, xtop = yi >= h - 1, xi >= w - 1
        y_low, x_low = np.where(ytop, h - 1, yi), np.where(xtop, w - 1, xi)
        y_high, x_high = np.where(ytop, h - 1, yi + 1), np.where(xtop, w - 1, xi + 1)
        ly, lx = np.where(ytop, 0.0, y - yi), np.where(xtop, 0.0, x - xi)
        value = ((1 - ly) * (1 - lx) * f[nn, y_low, x_low, col] + (1 - ly) * lx * f[nn, y_low, x_high, col]
                 + ly * (1 - lx) * f[nn, y_high, x_low, col] + ly * lx * f[nn, y_high, x_high, col])
        yield np.where(ok, value, 0.0)


def argmax_misses(feat, boxes, pool_size, argmax, tolerance):
    """Elements [N, K, 4, C] whose argmax is not the float64 reference's first maximal sample,
    unless its sample's value is within `tolerance` of that maximum: the kernels sample and
    compare in float32, where a near-tie may round either way."""
    samples = list(sample_values(feat, boxes, pool_size))
    best, first = _running_max(samples)
    values = np.stack(samples, axis=-1)  # [N, K, 4, C, S]
    argmax = np.asarray(argmax)
    inside = (argmax >= 0) & (argmax <= pool_size)
    picked = np.take_along_axis(values, np.clip(argmax, 0, pool_size)[..., None], -1)[..., 0]
    near_tie = inside & (np.abs(picked - best) <= tolerance)
    return (argmax != first) & ~near_tie


def peers(inputs, params):
    """Stock PyTorch: every sample's four corners gathered at once, then max over the samples
    (torch.max gives the first maximal index), by advanced indexing or by a flat torch.take;
    or one sample at a time with a running max (pool_size + 1 smaller passes)."""
    feat, boxes = peer_tensor(inputs["input"]), peer_tensor(inputs["boxes"])
    pool = params["pool_size"]
    return {"indexing": lambda: torch_forward(feat, boxes, pool, "indexing"),
            "take": lambda: torch_forward(feat, boxes, pool, "take"),
            "per_sample": lambda: torch_forward_per_sample(feat, boxes, pool)}


def torch_forward(feat, boxes, pool_size, gather="indexing"):
    """(output, argmax) in PyTorch eager, float32 arithmetic, all samples at once."""
    import torch

    value = _torch_samples(feat, boxes, pool_size, torch.arange(pool_size + 1).view(1, 1, 1, -1, 1), gather)
    best, argmax = value.max(dim=3)
    return best.to(feat.dtype), argmax.int()


def torch_forward_per_sample(feat, boxes, pool_size):
    """(output, argmax) in PyTorch eager, one sample at a time: a strictly greater value
    replaces the running max."""
    import torch

    best = _torch_samples(feat, boxes, pool_size, torch.zeros(1, 1, 1, 1, 1, dtype=torch.long))[:, :, :, 0]
    argmax = torch.zeros(best.shape, dtype=torch.int32)
    for i in range(1, pool_size + 1):
        value = _torch_samples(feat, boxes, pool_size, torch.full((1, 1, 1, 1, 1), i))[:, :, :, 0]
        take = value > best
        best = torch.where(take, value, best)
        argmax.masked_fill_(take, i)
    return best.to(feat.dtype), argmax


def _torch_samples(feat, boxes, pool_size, i, gather="indexing"):
    """The bilinear values [N, K, 4, S, C] of samples i ([1, 1, 1, S, 1] long) of every border."""
    import torch

    n, h, w, q = feat.shape
    c = q // 4
    bx = boxes.float()
    x0, y0, x1, y1 = (bx[..., j, None, None, None] for j in range(4))  # [N, K, 1, 1, 1]
    starts = [torch.cat(parts, 2) for parts in ((x0, x0, x1, x1), (y0, y0, y1, y1))]
    ends = [torch.cat(parts, 2) for parts in ((x1, x0, x0, x1), (y0, y1, y1, y0))]
    moves_x = (torch.arange(4) % 2 == 0).view(1, 1, 4, 1, 1)
    moved = [torch.where(i == pool_size, e, along(s, e, i, pool_size)) for s, e in zip(starts, ends)]
    x = torch.where(moves_x, moved[0], starts[0])
    y = torch.where(~moves_x, moved[1], starts[1])  # [N, K, 4, P+1, 1]
    ok = (y >= -1) & (y <= h) & (x >= -1) & (x <= w)
    y = torch.where(ok, y.clamp(min=0), 0)
    x = torch.where(ok, x.clamp(min=0), 0)
    yi, xi = y.long(), x.long()
    ytop, xtop = yi >= h - 1, xi >= w - 1
    y_low, x_low = torch.where(ytop, h - 1, yi), torch.where(xtop, w - 1, xi)
    y_high, x_high = torch.where(ytop, h - 1, yi + 1), torch.where(xtop, w - 1, xi + 1)
    ly, lx = torch.where(ytop, 0, y - yi), torch.where(xtop, 0, x - xi)
    nn = torch.arange(n).view(n, 1, 1, 1, 1)
    col = (torch.arange(4).view(1, 1, 4, 1, 1) * c + torch.arange(c).view(1, 1, 1, 1, c))
    f = feat.float()
    flat = f.reshape(-1)

    def corner(yy, xx):
        if gather == "indexing":
            return f[nn, yy, xx, col]
        return torch.take(flat, ((nn * h + yy) * w + xx) * q + col)

    value = ((1 - ly) * (1 - lx) * corner(y_low, x_low) + (1 - ly) * lx * corner(y_low, x_high)
             + ly * (1 - lx) * corner(y_high, x_low) + ly * lx * corner(y_high, x_high))
    return torch.where(ok, value, 0)
