"""voxel_pooling_backward: inputs, float64 reference and PyTorch peers."""

from __future__ import annotations

import numpy as np

from . import peer_tensor
from .voxel_pooling_forward import pos_memo_rule, random_geom

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def make_inputs(case, dtype, rng):
    """pos_memo as voxel_pooling_forward writes it, from random geometry (the forward's
    generator: `spill` voxels past the x/y edges, a `z_out` fraction out of z range, Z =
    extra.z), then a `garbage` fraction of its rows replaced by arbitrary int32 triples;
    grad_output uniform in [-1, 1)."""
    s = case.shape
    B, N, C, Y, X = (s[k] for k in ("B", "N", "C", "Y", "X"))
    Z = case.extra.get("z", 1)
    # (an empty grid, a BAD_PARAM case, draws coordinates as for one voxel: all are dropped)
    geom = random_geom(rng, B, N, max(X, 1), max(Y, 1), Z, case.extra.get("spill", 0), case.extra.get("z_out", 0.0))
    memo = pos_memo_rule(geom, X, Y, Z).astype(np.int32)
    garbage = rng.random((B, N)) < case.extra.get("garbage", 0.0)
    memo[garbage] = garbage_rows(rng, int(garbage.sum()), B, Y, X)
    grad = rng.uniform(-1, 1, (B, Y, X, C)).astype(dtype)
    return {"grad_output": grad, "pos_memo": memo}, {}


def garbage_rows(rng, count: int, B: int, Y: int, X: int) -> np.ndarray:
    """count rows of int32 triples no forward writes but a caller might pass: each entry
    drawn from the int32 extremes, -1, the first value past each edge (B, Y, X), values in
    range (so that some rows name another batch with a valid (y, x), or a valid batch with
    one coordinate just outside) and uniform int32."""
    rows = np.empty((count, 3), np.int64)
    for k, size in enumerate((B, Y, X)):
        picks = np.array([INT32_MIN, INT32_MIN + 1, -2, -1, size, size + 1, 2**30, INT32_MAX], np.int64)
        kind = rng.integers(0, 3, count)  # 0: a special value, 1: in range, 2: any int32
        rows[:, k] = np.where(kind == 0, rng.choice(picks, count),
                              np.where(kind == 1, rng.integers(0, size, count),
                                       rng.integers(INT32_MIN, INT32_MAX, count, endpoint=True)))
    return rows.astype(np.int32)


def reference(inputs, params):
    """float64, from the math in docs/semantics.md: a point whose pos_memo names its own
    batch and a voxel of the grid takes that voxel's grad_output row, every other point 0."""
    grad = np.asarray(inputs["grad_output"]).astype(np.float64)
    memo = np.asarray(inputs["pos_memo"]).astype(np.int64)
    B, Y, X, C = grad.shape
    kept = kept_points(memo, B, Y, X)
    out = np.zeros((B, memo.shape[1], C))
    out[kept] = grad.reshape(-1, C)[voxel_rows(memo, Y, X)[kept]]
    return {"grad_input_features": out}


def kept_points(memo: np.ndarray, B: int, Y: int, X: int) -> np.ndarray:
    """[B, N] bool: the points whose pos_memo names their own batch and a voxel of the grid."""
    b, y, x = memo[..., 0], memo[..., 1], memo[..., 2]
    return (b == np.arange(B)[:, None]) & (y >= 0) & (y < Y) & (x >= 0) & (x < X)


def voxel_rows(memo: np.ndarray, Y: int, X: int) -> np.ndarray:
    """[B, N] int64: the row (b, y, x) of grad_output seen as [B * Y * X, C] (meaningful
    where the point is kept)."""
    return (memo[..., 0] * Y + memo[..., 1]) * X + memo[..., 2]


def access_pattern(inputs, params):
    """The gathers alone: each kept point's output row from its voxel's grad_output row, in
    point order; a dropped point's row is written (zeros), nothing read. The random rows,
    not the bytes, bound the op: with every point dropped (only the output written) the
    kernel ran in a third of the time (docs/kernels/voxel_pooling_backward.md)."""
    from ..access_pattern import AccessPattern, offsets_of

    grad, memo = inputs["grad_output"], np.asarray(inputs["pos_memo"]).astype(np.int64)
    B, Y, X, C = grad.shape
    kept = kept_points(memo, B, Y, X)
    return AccessPattern(B * Y * X, C, offsets_of(kept), voxel_rows(memo, Y, X)[kept], gather=True, scatter=False,
                         dtype=str(grad.dtype))


def peers(inputs, params):
    """The PyTorch formulations the bench times (its ratio is against the fastest):
    - masked_index: BEVDepth's own backward (a boolean mask, advanced indexing of the kept
      points' rows into a zeroed tensor);
    - index_select / gather: every point gathers one row of grad_output with a zero row
      appended, the points not kept pointing at that row (one pass, no masking pass);
    - index_select_out: index_select into an output allocated once, outside the timing (as
      tvm_ops' own numpy outputs come from reused memory: a fresh 300 MB tensor costs
      PyTorch more in page faults than the gather itself)."""
    return {name: torch_peer(inputs, name) for name in ("masked_index", "index_select", "gather", "index_select_out")}


def torch_peer(inputs, formulation: str):
    import torch

    grad = peer_tensor(inputs["grad_output"])
    memo = peer_tensor(inputs["pos_memo"])
    B, Y, X, C = grad.shape
    N = memo.shape[1]
    out = grad.new_empty(B, N, C) if formulation == "index_select_out" else None

    def run():
        mb, y, x = memo.unbind(-1)
        b = torch.arange(B, dtype=memo.dtype).view(B, 1)
        kept = (mb == b) & (y >= 0) & (y < Y) & (x >= 0) & (x < X)
        if formulation == "masked_index":
            result = grad.new_zeros(B, N, C)
            result[kept] = grad[b.expand(B, N)[kept].long(), y[kept].long(), x[kept].long()]
            return result
        if formulation == "gather":
            table = torch.cat([grad.view(B, Y * X, C), grad.new_zeros(B, 1, C)], 1)  # row Y*X: zeros
            voxel = torch.where(kept, y.long() * X + x.long(), Y * X)
            return torch.gather(table, 1, voxel.unsqueeze(-1).expand(B, N, C))
        table = torch.cat([grad.view(B * Y * X, C), grad.new_zeros(1, C)])  # row B*Y*X: zeros
        rows = torch.where(kept, (b.long() * Y + y.long()) * X + x.long(), B * Y * X).view(-1)
        if out is None:
            return table.index_select(0, rows).view(B, N, C)
        return torch.index_select(table, 0, rows, out=out.view(B * N, C)).view(B, N, C)

    return run
