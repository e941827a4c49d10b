"""three_nn: inputs, float64 reference and PyTorch peers."""

from __future__ import annotations

import numpy as np

from . import peer_tensor

GRID = 64  # coordinates are multiples of 1/GRID: squared distances are exact in float32
REFERENCE_CHUNK = 1 << 22  # (n, m) pairs per step of the reference


def make_inputs(case, dtype, rng):
    """Coordinates k / 64 with |k| <= grid_half (default 128: |x| <= 2), exact in float16;
    extra nan_fraction puts a NaN coordinate into that share of the points."""
    s = case.shape
    half = case.extra.get("grid_half", 128)
    unknown = rng.integers(-half, half + 1, (s["B"], s["N"], 3)) / GRID
    known = rng.integers(-half, half + 1, (s["B"], s["M"], 3)) / GRID
    fraction = case.extra.get("nan_fraction", 0.0)
    for points in (unknown, known):
        hit = rng.random(points.shape[:2]) < fraction
        points[hit, rng.integers(0, 3, int(hit.sum()))] = np.nan
    return {"unknown": unknown.astype(dtype), "known": known.astype(dtype)}, {}


def reference(inputs, params):
    """From the definition, in float64: per unknown point sort the known points by (squared
    distance, index) and take the first three with a finite distance; slots left: inf, -1."""
    unknown = np.asarray(inputs["unknown"], np.float64)
    known = np.asarray(inputs["known"], np.float64)
    batch, points, _ = unknown.shape
    dist2 = np.full((batch, points, 3), np.inf)
    idx = np.full((batch, points, 3), -1, np.int64)
    step = max(1, REFERENCE_CHUNK // max(1, known.shape[1]))
    for b in range(batch):
        for n0 in range(0, points, step):
            d = np.square(unknown[b, n0:n0 + step, None, :] - known[b, None, :, :]).sum(-1)  # [n, M]
            d = np.where(np.isfinite(d), d, np.inf)
            order = np.argsort(d, axis=1, kind="stable")[:, :3]  # stable: equal distances by index
            nearest = np.take_along_axis(d, order, 1)
            found = np.isfinite(nearest)
            dist2[b, n0:n0 + step] = nearest
            idx[b, n0:n0 + step] = np.where(found, order, -1)
    return {"dist2": dist2, "idx": idx}


def peers(inputs, params):
    """Stock PyTorch formulations of the same result. topk's order among equal distances is
    unspecified (the grid cases have ties), so the topk peers rank an int64 key: the distance's
    float32 bits (monotonic for non-negative floats) above the point's index, whose smallest
    three are mmcv's lower-index-first order; the sort peer, as a PyTorch user would write it,
    sorts stably. Distances exact on the grid, as the kernel's."""
    return {"chunked+topk": _chunked_peer(inputs, _nearest_topk), "full+topk": _full_peer(inputs, _nearest_topk),
            "chunked+sort": _chunked_peer(inputs, _nearest)}


def _distances(unknown, known):
    import torch

    d2 = (unknown[:, :, None] - known[:, None]).square().sum(-1)  # [B, n, M]
    return torch.where(torch.isfinite(d2), d2, torch.full_like(d2, float("inf")))


def _nearest(unknown, known):
    """The three smallest squared distances of each unknown point and their indices (stable sort)."""
    import torch

    d2 = _distances(unknown, known)
    dist2, idx = torch.sort(d2, dim=2, stable=True)
    dist2, idx = dist2[..., :3], idx[..., :3].int()
    return dist2, torch.where(torch.isfinite(dist2), idx, torch.full_like(idx, -1))


def _nearest_topk(unknown, known):
    """The same by torch.cdist (its difference-based mode: no matmul rounding) and topk over
    unique int64 keys (distance bits << 32 | index); the three squared distances recomputed
    from the chosen points."""
    import torch

    dist = torch.cdist(unknown, known, compute_mode="donot_use_mm_for_euclid_dist")  # [B, n, M]
    dist = torch.where(torch.isfinite(dist), dist, torch.full_like(dist, float("inf")))
    key = (dist.view(torch.int32).to(torch.int64) << 32) | torch.arange(dist.shape[2], dtype=torch.int64)
    idx = (torch.topk(key, 3, dim=2, largest=False, sorted=True).values & 0xFFFFFFFF).long()  # [B, n, 3]
    chosen = torch.gather(known, 1, idx.reshape(idx.shape[0], -1, 1).expand(-1, -1, 3)).view(*idx.shape, 3)
    dist2 = (unknown[:, :, None] - chosen).square().sum(-1)
    dist2 = torch.where(torch.isfinite(torch.gather(dist, 2, idx)), dist2, torch.full_like(dist2, float("inf")))
    return dist2, torch.where(torch.isfinite(dist2), idx.int(), torch.full_like(idx, -1).int())


def _full_peer(inputs, nearest):
    """Every [B, N, M] distance at once."""
    unknown, known = (peer_tensor(inputs[k]).float() for k in ("unknown", "known"))
    return lambda: nearest(unknown, known)


def _chunked_peer(inputs, nearest, chunk=256):
    """In chunks of unknown points (what a PointNet++ without custom ops writes to bound the
    [N, M] temporaries)."""
    import torch

    unknown, known = (peer_tensor(inputs[k]).float() for k in ("unknown", "known"))

    def run():
        parts = [nearest(unknown[:, n0:n0 + chunk], known) for n0 in range(0, unknown.shape[1], chunk)]
        return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)

    return run
