"""dynamic_scatter_backward: inputs, float64 reference and PyTorch peer."""

from __future__ import annotations

import numpy as np

from . import peer_tensor


def make_inputs(case, dtype, rng):
    """Points spread over voxels (every voxel gets a point first, unless dropped), then the
    forward's max per voxel as voxel_feats, so exact matches exist. extra: reduce_type,
    voxel_num, dropped (points mapped to -1), ties (features rounded to few integers),
    nan (fraction of feats and of voxel_feats set to NaN), map_high (map entries up to it)."""
    s, extra = case.shape, case.extra
    N, M, C = s["N"], s["M"], s["C"]
    if extra.get("ties"):
        feats = rng.integers(-2, 3, (N, C)).astype(dtype)
    else:
        feats = rng.uniform(-1, 1, (N, C)).astype(dtype)
    p2v = np.concatenate([rng.permutation(M), rng.integers(0, max(M, 1), max(N - M, 0))])[:N]
    p2v = rng.permutation(p2v).astype(np.int32) if M else np.full(N, -1, np.int32)
    dropped = int(extra.get("dropped", 0))
    if dropped:
        p2v[rng.choice(N, dropped, replace=False)] = -1
    if extra.get("map_high"):
        wild = rng.random(N) < 0.1
        p2v[wild] = rng.integers(-5, int(extra["map_high"]), int(wild.sum()))
    nan = float(extra.get("nan", 0))
    if nan:
        feats[rng.random((N, C)) < nan] = np.nan
    kept = (p2v >= 0) & (p2v < M)
    voxel_feats = _grouped_max(feats[kept], p2v[kept].astype(np.int64), M, -1e30).astype(dtype)
    empty = np.bincount(p2v[kept], minlength=M)[:M] == 0
    voxel_feats[empty] = rng.uniform(-1, 1, (int(empty.sum()), C)).astype(dtype)
    if nan:
        voxel_feats[rng.random((M, C)) < nan] = np.nan
    count = np.bincount(p2v[kept], minlength=M)[:M].astype(np.int32)
    grad = rng.uniform(-1, 1, (M, C)).astype(dtype)
    inputs = {"grad_voxel_feats": grad, "feats": feats, "voxel_feats": voxel_feats,
              "point2voxel_map": p2v, "voxel_points_count": count}
    return inputs, {"voxel_num": extra.get("voxel_num"), "reduce_type": extra.get("reduce_type", "max")}


def valid_voxels(params, M: int) -> int:
    """The call's voxel_num (an int or a one-element array), M when not given."""
    voxel_num = params.get("voxel_num")
    return M if voxel_num is None else int(np.asarray(voxel_num).reshape(-1)[0])


def reference(inputs, params):
    """float64, from docs/semantics.md. mean: the quotient of the gradient and the count as a
    float32 (exact up to 2^24, rounded above), rounded once to the output dtype: float32's
    own division (the float64 quotient of two float32 values rounds to the same float32),
    so the spec can ask diff3 == 0 of every mode."""
    g = np.asarray(inputs["grad_voxel_feats"], np.float64)
    feats, voxel_feats = np.asarray(inputs["feats"]), np.asarray(inputs["voxel_feats"])
    p2v = np.asarray(inputs["point2voxel_map"]).astype(np.int64)
    N, C = feats.shape
    M = voxel_feats.shape[0]
    voxel_num = valid_voxels(params, M)
    out = np.zeros((N, C), np.float64)
    pts = np.flatnonzero((p2v >= 0) & (p2v < min(voxel_num, M)))
    vox = p2v[pts]
    reduce_type = params.get("reduce_type", "max")
    if reduce_type == "sum":
        out[pts] = g[vox]
    elif reduce_type == "mean":
        count = np.asarray(inputs["voxel_points_count"]).astype(np.float32).astype(np.float64)[vox][:, None]
        out[pts] = (g[vox] / count).astype(feats.dtype)
    else:
        # winner of (v, c): the smallest n among exact matches -> sort matches by (v, c, n)
        point, channel = np.nonzero(feats[pts] == voxel_feats[vox])  # NaN never matches
        n_idx, v_idx = pts[point], vox[point]
        key = v_idx * C + channel
        order = np.lexsort((n_idx, key))
        key, n_idx, v_idx, channel = key[order], n_idx[order], v_idx[order], channel[order]
        first = np.r_[True, key[1:] != key[:-1]] if key.size else np.zeros(0, bool)
        out[n_idx[first], channel[first]] = g[v_idx[first], channel[first]]
    return {"grad_feats": out}


def access_pattern(inputs, params):
    """sum / mean: the gathers alone, each point's output row taken from its voxel's gradient
    row in point order (a dropped point's row is written, nothing read). max: None (its
    bytes are its bound: the feature rows and the voxels' rows are read whole)."""
    from ..access_pattern import AccessPattern, offsets_of

    if params.get("reduce_type", "max") == "max":
        return None
    g, p2v = inputs["grad_voxel_feats"], np.asarray(inputs["point2voxel_map"]).astype(np.int64)
    M = g.shape[0]
    voxel_num = valid_voxels(params, M)
    taken = (p2v >= 0) & (p2v < min(voxel_num, M))
    return AccessPattern(M, g.shape[1], offsets_of(taken), p2v[taken], gather=True, scatter=False,
                         dtype=str(g.dtype))


def peers(inputs, params):
    """max: the traceback in PyTorch; sum / mean: that formula's gather and mask, and one
    index_select from the voxel rows with a zero row appended for the dropped points."""
    if params.get("reduce_type", "max") == "max":
        return {"torch": torch_peer(inputs, params)}
    return {"torch": torch_peer(inputs, params), "index_select": index_select_peer(inputs, params)}


def index_select_peer(inputs, params):
    """sum / mean as one gather: each point's row from the voxels' (mean: divided per voxel
    first, M rows rather than N) rows, a point outside the valid voxels taking an appended
    zero row."""
    import torch

    g, p2v, count = (peer_tensor(inputs[k]) for k in ("grad_voxel_feats", "point2voxel_map", "voxel_points_count"))
    M, C = g.shape
    voxel_num = valid_voxels(params, M)
    mean = params.get("reduce_type") == "mean"

    def run():
        p = p2v.long()
        rows = g[:voxel_num] / count[:voxel_num].to(g.dtype)[:, None] if mean else g[:voxel_num]
        table = torch.cat([rows, rows.new_zeros(1, C)])
        return table.index_select(0, torch.where((p >= 0) & (p < voxel_num), p, voxel_num))

    return run


def torch_peer(inputs, params):
    """PyTorch eager computing the same rule (max: scatter_reduce amin + scatter)."""
    import torch

    g, f, vf, p2v, count = (peer_tensor(inputs[k]) for k in (
        "grad_voxel_feats", "feats", "voxel_feats", "point2voxel_map", "voxel_points_count"))
    N, C = f.shape
    M = vf.shape[0]
    voxel_num = valid_voxels(params, M)
    reduce_type = params.get("reduce_type", "max")

    def run():
        p = p2v.long()
        valid = (p >= 0) & (p < voxel_num)
        idx = torch.where(valid, p, 0)
        if reduce_type != "max":
            gg = g[idx] if reduce_type == "sum" else g[idx] / count[idx].to(g.dtype)[:, None]
            return gg * valid[:, None]
        match = (f == vf[idx]) & valid[:, None]
        cand = torch.where(match, torch.arange(N).unsqueeze(1), N)
        rf = torch.full((M, C), N, dtype=torch.long).scatter_reduce_(
            0, idx.unsqueeze(1).expand(N, C), cand, "amin")[:voxel_num]
        out = torch.zeros((N + 1, C), dtype=g.dtype)  # row N collects "no match"
        out.scatter_(0, rf, g[:voxel_num])
        return out[:N]

    return run


def _grouped_max(values: np.ndarray, groups: np.ndarray, count: int, fill: float) -> np.ndarray:
    """out[g] = max(values[groups == g]) along axis 0 (NaN propagates), `fill` for empty groups."""
    out = np.full((count,) + values.shape[1:], fill, values.dtype)
    if groups.size == 0:
        return out
    order = np.argsort(groups, kind="stable")
    g, vals = groups[order], values[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    out[g[starts]] = np.maximum.reduceat(vals, starts, axis=0)
    return out
