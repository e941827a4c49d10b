"""voxel_pooling_forward: inputs, float64 reference and PyTorch peer."""

from __future__ import annotations

import numpy as np

from . import peer_tensor


def make_inputs(case, dtype, rng):
    """Coordinates spill `spill` voxels beyond each x/y edge; a `z_out` fraction of the
    points get z = Z or z = -1 (out of range)."""
    s = case.shape
    B, N, C, X, Y, Z = (s[k] for k in ("B", "N", "C", "X", "Y", "Z"))
    geom = random_geom(rng, B, N, X, Y, Z, case.extra.get("spill", 0), case.extra.get("z_out", 0.0))
    feat = rng.uniform(-1, 1, (B, N, C)).astype(dtype)
    return ({"geom_xyz": geom, "input_features": feat},
            {"num_voxel_x": X, "num_voxel_y": Y, "num_voxel_z": Z})


def random_geom(rng, B: int, N: int, X: int, Y: int, Z: int, spill: int, z_out: float) -> np.ndarray:
    """geom_xyz [B, N, 3] int32: x and y uniform over the grid and `spill` voxels past each
    edge, z in range except for a `z_out` fraction at z = Z or z = -1. (voxel_pooling_backward
    makes its pos_memo from it.)"""
    geom = np.empty((B, N, 3), np.int32)
    geom[..., 0] = rng.integers(-spill, X + spill, (B, N))
    geom[..., 1] = rng.integers(-spill, Y + spill, (B, N))
    geom[..., 2] = rng.integers(0, max(Z, 1), (B, N))
    out = rng.random((B, N)) < z_out
    geom[..., 2][out] = np.where(rng.random(int(out.sum())) < 0.5, Z, -1)
    return geom


def reference(inputs, params):
    """float64, from the math in docs/semantics.md: kept mask, then a grouped sum per voxel."""
    geom = np.asarray(inputs["geom_xyz"]).astype(np.int64)
    feat = np.asarray(inputs["input_features"])
    X, Y, Z = params["num_voxel_x"], params["num_voxel_y"], params["num_voxel_z"]
    B, N, C = feat.shape
    kept = _kept(geom, X, Y, Z)
    b = np.broadcast_to(np.arange(B)[:, None], (B, N))
    memo = pos_memo_rule(geom, X, Y, Z)
    voxel = ((b * Y + geom[..., 1]) * X + geom[..., 0])[kept]
    rows = feat[kept].astype(np.float64)
    out = np.zeros((B * Y * X, C))
    if voxel.size:
        order = np.argsort(voxel, kind="stable")
        voxel, rows = voxel[order], rows[order]
        starts = np.flatnonzero(np.r_[True, voxel[1:] != voxel[:-1]])
        out[voxel[starts]] = np.add.reduceat(rows, starts, axis=0)
    return {"output_features": out.reshape(B, Y, X, C), "pos_memo": memo}


# BEVDepth's pooling written in PyTorch (the kept points' rows picked by a boolean mask), and
# the same sum in one pass over every point (the dropped ones added to a spare row past the
# grid, cut off after): no masked copy of the features, half the time on the network cases
FORMULATIONS = ("index_put_", "index_add_", "index_add_(spare_row)", "scatter_add_(spare_row)")


def peers(inputs, params):
    """The PyTorch formulations the bench times (its ratio is against the fastest)."""
    return {name: torch_peer(inputs, params, name) for name in FORMULATIONS}


def torch_peer(inputs, params, formulation: str = "index_put_"):
    """PyTorch eager from the same inputs: voxel_pool_pytorch."""
    g = peer_tensor(inputs["geom_xyz"])
    f = peer_tensor(inputs["input_features"])
    X, Y, Z = params["num_voxel_x"], params["num_voxel_y"], params["num_voxel_z"]
    return lambda: voxel_pool_pytorch(g, f, X, Y, Z, formulation)


def voxel_pool_pytorch(geom, feat, X: int, Y: int, Z: int, formulation: str = "index_put_"):
    """(output_features [B, Y, X, C], pos_memo) of geom [B, N, 3] int and feat [B, N, C] in
    PyTorch, differentiable in feat (the bench's peers of tvm_ops.functional.voxel_pooling):
    the kept mask and the linear voxel index, then one of FORMULATIONS: the kept points' rows
    summed by index_put_(accumulate=True) or index_add_; or every point's row summed by
    index_add_, or by scatter_add_ with the index expanded over the channels, into a spare
    row where the point is dropped."""
    import torch

    B, N, C = feat.shape
    x, y, z = geom[..., 0], geom[..., 1], geom[..., 2]
    kept = (x >= 0) & (x < X) & (y >= 0) & (y < Y) & (z >= 0) & (z < Z)
    b = torch.arange(B, dtype=torch.int32).view(B, 1).expand(B, N)
    voxel = (b.long() * Y + y.long()) * X + x.long()
    memo = torch.where(kept.unsqueeze(-1), torch.stack([b, y.int(), x.int()], -1),
                       torch.full((), -1, dtype=torch.int32))
    if formulation.endswith("(spare_row)"):
        spare = B * Y * X
        out = torch.zeros(spare + 1, C, dtype=feat.dtype)
        rows = torch.where(kept, voxel, spare).view(B * N)
        if formulation.startswith("scatter_add_"):
            out.scatter_add_(0, rows.unsqueeze(1).expand(B * N, C), feat.reshape(B * N, C))
        else:
            out.index_add_(0, rows, feat.reshape(B * N, C))
        return out[:spare].view(B, Y, X, C), memo
    out = torch.zeros(B * Y * X, C, dtype=feat.dtype)
    if formulation == "index_add_":
        out.index_add_(0, voxel[kept], feat[kept])
    else:
        out.index_put_((voxel[kept],), feat[kept], accumulate=True)
    return out.view(B, Y, X, C), memo


def pos_memo_rule(geom: np.ndarray, X: int, Y: int, Z: int) -> np.ndarray:
    """pos_memo [B, N, 3] int64 by the math: (b, y, x) for a kept point, (-1, -1, -1) else."""
    geom = np.asarray(geom).astype(np.int64)
    B, N, _ = geom.shape
    kept = _kept(geom, X, Y, Z)
    b = np.broadcast_to(np.arange(B)[:, None], (B, N))
    memo = np.full((B, N, 3), -1, np.int64)
    memo[kept] = np.stack([b[kept], geom[..., 1][kept], geom[..., 0][kept]], -1)
    return memo


def _kept(geom: np.ndarray, X: int, Y: int, Z: int) -> np.ndarray:
    x, y, z = geom[..., 0], geom[..., 1], geom[..., 2]
    return (x >= 0) & (x < X) & (y >= 0) & (y < Y) & (z >= 0) & (z < Z)
