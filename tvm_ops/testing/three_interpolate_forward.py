"""three_interpolate_forward: inputs, float64 reference and PyTorch peers."""

from __future__ import annotations

import numpy as np

from . import peer_tensor


def make_inputs(case, dtype, rng):
    """extra: index_low / index_high (indices drawn from [low, high); default [0, M)),
    nan_weight_out_of_range (NaN weights wherever the index is outside [0, M))."""
    s = case.shape
    low = case.extra.get("index_low", 0)
    high = case.extra.get("index_high", max(s["M"], 1))
    features = rng.uniform(-1, 1, (s["B"], s["C"], s["M"])).astype(dtype)
    indices = rng.integers(low, high, (s["B"], s["N"], 3), dtype=np.int64).astype(np.int32)
    weights = rng.uniform(0, 1, (s["B"], s["N"], 3))
    if case.extra.get("nan_weight_out_of_range"):
        weights[(indices < 0) | (indices >= s["M"])] = np.nan
    return {"features": features, "indices": indices, "weights": weights.astype(dtype)}, {}


def reference(inputs, params):
    """out[b, :, n] = sum over k of weights[b, n, k] * features[b, :, indices[b, n, k]] in
    float64, terms with an index outside [0, M) left out."""
    features = np.asarray(inputs["features"], np.float64)
    idx = np.asarray(inputs["indices"]).astype(np.int64)
    w = np.asarray(inputs["weights"], np.float64)
    batch, channels, m = features.shape
    out = np.zeros((batch, channels, idx.shape[1]))
    for b in range(batch):
        for k in range(3):
            keep = (idx[b, :, k] >= 0) & (idx[b, :, k] < m)
            points = np.flatnonzero(keep)
            out[b][:, points] += features[b][:, idx[b, points, k]] * w[b, points, k]
    return {"output": out}


def peers(inputs, params):
    """What a PointNet++ without custom ops runs, and the interpolation as a matrix product
    (the bench's ratio is against the fastest)."""
    return {"gather": _gather_peer(inputs), "index_select": _index_select_peer(inputs),
            "dense_bmm": _dense_peer(inputs)}


def _masked(inputs):
    """features, and their neighbours' indices and weights as masked_neighbours gives them."""
    f, idx, w = (peer_tensor(inputs[k]) for k in ("features", "indices", "weights"))
    return (f, *masked_neighbours(idx, w, f.shape[2]))


def masked_neighbours(idx, w, m: int):
    """(indices clamped into [0, m) as int64, weights zeroed where the index is outside: a
    NaN weight there too): what a formulation that indexes every neighbour needs."""
    import torch

    valid = (idx >= 0) & (idx < m)
    return idx.long().clamp(0, max(m - 1, 0)), torch.where(valid, w, torch.zeros_like(w))


def gather_formulation(features, index, weights):
    """torch.gather of the three neighbours' features, weighted and summed (index clamped,
    weights already zero where it was out of range)."""
    batch, channels, _ = features.shape
    points = index.shape[1]
    gathered = features.gather(2, index.reshape(batch, 1, points * 3).expand(batch, channels, -1))
    return (gathered.reshape(batch, channels, points, 3) * weights[:, None]).sum(-1)


def _gather_peer(inputs):
    f, index, w = _masked(inputs)
    return lambda: gather_formulation(f, index, w)


def _index_select_peer(inputs):
    """Per batch, index_select of the features' columns, weighted and summed."""
    import torch

    f, index, w = _masked(inputs)

    def run():
        return torch.stack([(f[b].index_select(1, index[b].reshape(-1)).reshape(f.shape[1], -1, 3) * w[b]).sum(-1)
                            for b in range(f.shape[0])])

    return run


def interpolation_matrix(index, weights, m: int):
    """W [B, N, M] float32, each point's three weights at its neighbours' columns (index
    clamped, weights zero where it was out of range: _masked), repeated neighbours summed:
    out[b] = features[b] @ W[b].T, and grad_features[b] = grad_output[b] @ W[b]."""
    import torch

    batch, points, _ = index.shape
    return torch.zeros(batch, points, m).scatter_add_(2, index, weights.float())


def dense_formulation(features, index, weights):
    """The interpolation as one torch.bmm by the interpolation matrix, built per call, in
    float32 (PyTorch's CPU bmm in float16 ran ~100x slower): fast where M is small, and
    B * N * M floats of memory."""
    matrix = interpolation_matrix(index, weights, features.shape[2])
    return features.float().bmm(matrix.transpose(1, 2)).to(features.dtype)


def _dense_peer(inputs):
    f, index, w = _masked(inputs)
    return lambda: dense_formulation(f, index, w)
