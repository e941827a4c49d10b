"""three_interpolate_backward: inputs, float64 reference and PyTorch peers."""

from __future__ import annotations

import numpy as np

from . import peer_tensor


def make_inputs(case, dtype, rng):
    s = case.shape
    low = case.extra.get("index_low", 0)
    high = case.extra.get("index_high", max(s["M"], 1))
    grad_output = rng.uniform(-1, 1, (s["B"], s["C"], s["N"])).astype(dtype)
    indices = rng.integers(low, high, (s["B"], s["N"], 3), dtype=np.int64).astype(np.int32)
    weights = rng.uniform(0, 1, (s["B"], s["N"], 3)).astype(dtype)
    return {"grad_output": grad_output, "indices": indices, "weights": weights}, {"m": s["M"]}


def reference(inputs, params):
    go = np.asarray(inputs["grad_output"])
    idx = np.asarray(inputs["indices"]).astype(np.int64)
    w = np.asarray(inputs["weights"], dtype=np.float64)
    m = params["m"]
    batch, channels, points = go.shape
    out = np.zeros((batch, channels, m))
    for b in range(batch):
        target = idx[b].ravel()  # target column of each (n, k)
        keep = (target >= 0) & (target < m)
        point = np.repeat(np.arange(points), 3)[keep]
        order = np.argsort(target[keep], kind="stable")
        target, point, weight = target[keep][order], point[order], w[b].ravel()[keep][order]
        if target.size == 0:
            continue
        contributions = go[b][:, point].astype(np.float64) * weight  # (C, K), grouped by target column
        starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])
        out[b][:, target[starts]] = np.add.reduceat(contributions, starts, axis=1)
    return {"grad_features": out}


def torch_peer(inputs, params):
    """What a PyTorch PointNet++ without custom ops runs: autograd through a gather forward."""
    import torch

    go, idx, w = _torch_inputs(inputs)
    m = params["m"]
    batch, channels, points = go.shape
    index = idx.long().clamp(0, max(m - 1, 0)).reshape(batch, 1, points * 3).expand(batch, channels, -1)
    weights = w * ((idx >= 0) & (idx < m)).to(w.dtype)

    def run():
        features = torch.zeros(batch, channels, m, dtype=go.dtype, requires_grad=True)
        gathered = torch.gather(features, 2, index).reshape(batch, channels, points, 3)
        (gathered * weights[:, None]).sum(-1).backward(go)
        return features.grad

    return run


def peers(inputs, params):
    """The PyTorch formulations the bench times (its ratio is against the fastest)."""
    return {"autograd(gather)": torch_peer(inputs, params),
            "scatter_add_": _scatter_add_peer(inputs, params),
            "index_add_": _index_add_peer(inputs, params),
            "dense_bmm": _dense_peer(inputs, params)}


def _dense_peer(inputs, params):
    """grad_output times the interpolation matrix (three_interpolate_forward's
    interpolation_matrix: the forward's adjoint), one torch.bmm in float32."""
    from .three_interpolate_forward import interpolation_matrix, masked_neighbours

    go, idx, w = _torch_inputs(inputs)
    m = params["m"]
    index, weights = masked_neighbours(idx, w, m)

    def run():
        return go.float().bmm(interpolation_matrix(index, weights, m)).to(go.dtype)

    return run


def _index_add_peer(inputs, params):
    """The weighted gradients added into the flat output at a linear (b, c, m) index."""
    import torch

    go, idx, w = _torch_inputs(inputs)
    m = params["m"]
    batch, channels, points = go.shape
    valid = (idx >= 0) & (idx < m)
    rows = (torch.arange(batch).view(batch, 1, 1) * channels + torch.arange(channels).view(1, channels, 1)) * m
    linear = (rows + idx.long().clamp(0, max(m - 1, 0)).reshape(batch, 1, points * 3)).reshape(-1)
    weights = (w * valid.to(w.dtype)).reshape(batch, 1, points * 3)

    def run():
        contrib = (go.repeat_interleave(3, dim=2) * weights).reshape(-1)
        return torch.zeros(batch * channels * m, dtype=go.dtype).index_add_(0, linear, contrib).view(
            batch, channels, m)

    return run


def _scatter_add_peer(inputs, params):
    """A hand-written backward: the weighted gradients scattered with scatter_add_."""
    import torch

    go, idx, w = _torch_inputs(inputs)
    m = params["m"]
    batch, channels, points = go.shape
    index = idx.long().clamp(0, max(m - 1, 0)).reshape(batch, 1, points * 3).expand(batch, channels, -1)
    valid = ((idx >= 0) & (idx < m)).to(w.dtype)

    def run():
        contrib = (go[:, :, :, None] * (w * valid)[:, None]).reshape(batch, channels, points * 3)
        return torch.zeros(batch, channels, m, dtype=go.dtype).scatter_add_(2, index, contrib)

    return run


def _torch_inputs(inputs):
    return (peer_tensor(inputs[k]) for k in ("grad_output", "indices", "weights"))
