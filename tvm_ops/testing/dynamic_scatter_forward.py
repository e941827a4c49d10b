"""dynamic_scatter_forward: inputs, float64 reference and PyTorch peers."""

from __future__ import annotations

import numpy as np

from . import peer_tensor

MVXNET_GRID = (41, 1600, 1408)  # (z, y, x) voxels of MVXNet's KITTI grid


def make_inputs(case, dtype, rng):
    """The case's M distinct rows of a grid (extra grid: its extent per column, default
    MVXNet's for D = 3), every one given at least one of the N - dropped kept points, the
    rest spread at random; `dropped` points get a negative entry in a random column (down to
    INT32_MIN). extra: reduce_type, ties (features rounded to few integers), nan (the share
    of features set to NaN)."""
    s, extra = case.shape, case.extra
    N, C, D, M = s["N"], s["C"], s["D"], s["M"]
    dropped = int(extra.get("dropped", 0))
    grid = tuple(extra.get("grid", MVXNET_GRID if D == 3 else (64,) * D))
    rows = _distinct_rows(grid[:D], M, rng)
    kept = N - dropped
    which = np.concatenate([np.arange(M), rng.integers(0, max(M, 1), kept - M)]) if M else np.zeros(0, np.int64)
    coors = np.zeros((N, D), np.int64)
    if D:  # (D = 0 is a bad parameter: no row to give)
        points = rng.permutation(N)
        coors[points[:kept]] = rows[which]
        bad = points[kept:]
        coors[bad] = rng.integers(0, 8, (dropped, D))
        coors[bad, rng.integers(0, D, dropped)] = rng.choice([-1, -5, np.iinfo(np.int32).min], dropped)
    if extra.get("ties"):
        feats = rng.integers(-2, 3, (N, C)).astype(dtype)
    else:
        feats = rng.uniform(-1, 1, (N, C)).astype(dtype)
    nan = float(extra.get("nan", 0))
    if nan:
        feats[rng.random((N, C)) < nan] = np.nan
    inputs = {"feats": feats, "coors": coors.astype(np.int32)}
    return inputs, {"reduce_type": extra.get("reduce_type", "max")}


def _distinct_rows(grid: tuple, count: int, rng) -> np.ndarray:
    """`count` distinct rows with column d in [0, grid[d]), in random order."""
    if not grid or not count:
        return np.zeros((count, len(grid)), np.int64)
    if np.prod([float(g) for g in grid]) < 2**62:
        linear = rng.choice(int(np.prod(grid, dtype=np.int64)), count, replace=False)
        return np.stack(np.unravel_index(linear, grid), 1).astype(np.int64).reshape(count, len(grid))
    rows = np.zeros((0, len(grid)), np.int64)
    while len(rows) < count:  # a huge grid: random rows almost never repeat
        extra = np.stack([rng.integers(0, g, count) for g in grid], 1)
        rows = np.unique(np.concatenate([rows, extra]), axis=0)
    return rng.permutation(rows)[:count]


def reference(inputs, params):
    """From the definition, in float64: np.unique over the kept rows (lexicographic), then
    each voxel's max (NaN ignored: fmax), sum or mean."""
    feats = np.asarray(inputs["feats"], np.float64)
    coors = np.asarray(inputs["coors"])
    kept = (coors >= 0).all(1)
    rows, inverse, counts = np.unique(coors[kept], axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    voxels = len(rows)
    reduce_type = params.get("reduce_type", "max")
    if reduce_type == "max":
        out = np.full((voxels, feats.shape[1]), -np.inf)
        np.fmax.at(out, inverse, feats[kept])
    else:
        out = np.zeros((voxels, feats.shape[1]))
        np.add.at(out, inverse, feats[kept])
        if reduce_type == "mean":
            out /= counts[:, None]
    point2voxel = np.full(len(coors), -1, np.int64)
    point2voxel[kept] = inverse
    return {"voxel_feats": out, "voxel_coors": rows.reshape(voxels, coors.shape[1]),
            "point2voxel_map": point2voxel, "voxel_points_count": counts}


def peers(inputs, params):
    """Stock PyTorch: the voxels by torch.unique, the reduction by scatter_reduce (max) or
    index_add_ (sum, mean). 'key+unique' numbers each row by its position in the kept rows'
    bounding box (an int64 key) and takes the 1-D unique; 'rows+unique' is mmcv's own
    formulation, torch.unique over rows (dim=0)."""
    return {"key+unique": _peer(inputs, params, _voxels_by_key), "rows+unique": _peer(inputs, params, _voxels_by_rows)}


def _voxels_by_key(coors, kept):
    import torch

    rows = coors[kept].long()
    extent = rows.amax(0) + 1 if rows.numel() else torch.ones(coors.shape[1], dtype=torch.long)
    key = torch.zeros(rows.shape[0], dtype=torch.long)
    for d in range(coors.shape[1]):
        key = key * extent[d] + rows[:, d]
    unique, inverse, counts = torch.unique(key, sorted=True, return_inverse=True, return_counts=True)
    voxel_coors = torch.empty((unique.shape[0], coors.shape[1]), dtype=torch.long)
    for d in reversed(range(coors.shape[1])):
        voxel_coors[:, d] = unique % extent[d]
        unique = unique // extent[d]
    return voxel_coors.int(), inverse, counts


def _voxels_by_rows(coors, kept):
    import torch

    rows, inverse, counts = torch.unique(coors[kept], dim=0, sorted=True, return_inverse=True, return_counts=True)
    return rows, inverse, counts


def dynamic_scatter_pytorch(feats, coors, reduce_type, voxels_of=_voxels_by_key):
    """The op in stock PyTorch, differentiable in feats (out-of-place scatter_reduce with
    include_self=False for max: each voxel's max of its own points, where a NaN propagates,
    unlike the op, so the cases with NaN features are not the peers'; index_add for sum and
    mean): (voxel_feats, voxel_coors, point2voxel_map, voxel_points_count)."""
    import torch

    kept = (coors >= 0).all(1)
    voxel_coors, inverse, counts = voxels_of(coors, kept)
    points = feats[kept]
    empty = feats.new_zeros((voxel_coors.shape[0], feats.shape[1]))
    if reduce_type == "max":
        out = empty.scatter_reduce(0, inverse[:, None].expand_as(points), points, "amax", include_self=False)
    else:
        out = empty.index_add(0, inverse, points)
        if reduce_type == "mean":
            out = out / counts[:, None].to(feats.dtype)
    point2voxel = torch.full((coors.shape[0],), -1, dtype=torch.int32)
    point2voxel[kept] = inverse.int()
    return out, voxel_coors, point2voxel, counts.int()


def _peer(inputs, params, voxels_of):
    feats, coors = peer_tensor(inputs["feats"]), peer_tensor(inputs["coors"])
    reduce_type = params.get("reduce_type", "max")
    return lambda: dynamic_scatter_pytorch(feats, coors, reduce_type, voxels_of)


def access_pattern(inputs, params):
    """The gathers alone: each voxel sums its points' feature rows, in point order (the
    voxels lexicographic). The grouping's sort is left out: the pattern is its accesses."""
    from ..access_pattern import AccessPattern, csr

    feats, coors = inputs["feats"], np.asarray(inputs["coors"])
    kept = np.flatnonzero((coors >= 0).all(1))
    _, voxel = np.unique(coors[kept], axis=0, return_inverse=True)
    voxel = voxel.reshape(-1)
    offsets, index = csr(voxel, kept, int(voxel.max()) + 1 if voxel.size else 0)
    return AccessPattern(feats.shape[0], feats.shape[1], offsets, index, gather=True, scatter=False,
                         dtype=str(feats.dtype))
