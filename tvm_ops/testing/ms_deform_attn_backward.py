"""ms_deform_attn_backward: inputs, float64 reference and PyTorch peer."""

from __future__ import annotations

import numpy as np

from . import peer_tensor


def make_inputs(case, dtype, rng):
    s = case.shape
    levels = np.asarray(case.extra.get("levels", [[1, s["K"]]] if s["L"] else []),
                        np.int64).reshape(-1, 2)
    hw = levels[:, 0] * levels[:, 1]
    lsi = np.r_[0, np.cumsum(hw)][:len(levels)]
    B, K, H, C, L, Q, P = (s[k] for k in "BKHCLQP")
    loc_shape = (B, Q, H, L, P, 2)
    if "loc_values" in case.extra:
        loc = rng.choice(np.asarray(case.extra["loc_values"], np.float64), loc_shape)
    else:
        loc = rng.uniform(float(case.extra.get("loc_low", 0.0)), float(case.extra.get("loc_high", 1.0)), loc_shape)
    inputs = {
        "value": rng.standard_normal((B, K, H, C)).astype(dtype),
        "spatial_shapes": levels.astype(np.int32),
        "level_start_index": lsi.astype(np.int32),
        "sampling_loc": loc.astype(dtype),
        "attn_weight": rng.uniform(0, 1, (B, Q, H, L, P)).astype(dtype),
        "grad_output": rng.standard_normal((B, Q, H, C)).astype(dtype),
    }
    return inputs, {"im2col_step": case.extra.get("im2col_step", 64)}


def reference(inputs, params):
    return gradients(*(inputs[k] for k in ("value", "spatial_shapes", "level_start_index",
                                            "sampling_loc", "attn_weight", "grad_output")))


# the corners' rows formulation keeps every picked row for its backward: up to this many bytes
ROWS_PEER_MAX_BYTES = 2 << 30


def peers(inputs, params):
    """The PyTorch formulations the bench times (its ratio is against the fastest): autograd
    through mmcv's grid_sample formulation, and through the corners' rows picked by
    index_select (2-3x faster on the DETR decoder's few queries, slower with BEVFormer's
    128 corners a query), where its rows fit in ROWS_PEER_MAX_BYTES (net_bevformer's would
    take 7.6 GB)."""
    formulations = {"autograd(grid_sample)": torch_peer(inputs, params)}
    if rows_fit(inputs["value"], inputs["sampling_loc"]):
        formulations["autograd(index_select)"] = torch_peer(inputs, params, msda_pytorch_rows)
    return formulations


def rows_fit(value, loc) -> bool:
    """Whether msda_pytorch_rows's picked rows of these inputs (numpy or torch) fit in
    ROWS_PEER_MAX_BYTES."""
    corners = int(np.prod(loc.shape[:-1])) * 4  # B Q H L P samples, four corners each
    return corners * value.shape[3] * value.dtype.itemsize <= ROWS_PEER_MAX_BYTES


def torch_peer(inputs, params, formulation=None):
    """`formulation` (default msda_pytorch) forward, built once; the callable runs its
    autograd backward."""
    import torch

    v = peer_tensor(inputs["value"]).requires_grad_(True)
    lo = peer_tensor(inputs["sampling_loc"]).requires_grad_(True)
    a = peer_tensor(inputs["attn_weight"]).requires_grad_(True)
    shapes = [tuple(x) for x in np.asarray(inputs["spatial_shapes"]).tolist()]
    out = (formulation or msda_pytorch)(v, shapes, lo, a)
    go = peer_tensor(inputs["grad_output"]).reshape(out.shape)

    def run():
        return torch.autograd.grad(out, (v, lo, a), go, retain_graph=True)

    return run


def msda_pytorch(value, shapes, loc, attn):
    """mmcv's multi_scale_deformable_attn_pytorch: a grid_sample per level."""
    import torch
    import torch.nn.functional as F

    bs, _, nh, C = value.shape
    _, Q, _, L, P, _ = loc.shape
    vl = value.split([int(h) * int(w) for h, w in shapes], dim=1)
    grids = 2 * loc - 1
    outs = []
    for l, (h, w) in enumerate(shapes):
        v = vl[l].flatten(2).transpose(1, 2).reshape(bs * nh, C, int(h), int(w))
        gr = grids[:, :, :, l].transpose(1, 2).flatten(0, 1)
        outs.append(F.grid_sample(v, gr, mode="bilinear", padding_mode="zeros", align_corners=False))
    a = attn.transpose(1, 2).reshape(bs * nh, 1, Q, L * P)
    o = (torch.stack(outs, dim=-2).flatten(-2) * a).sum(-1).view(bs, nh * C, Q)
    return o.transpose(1, 2).contiguous()


def msda_pytorch_rows(value, shapes, loc, attn):
    """The same output from value's rows: each sample's four bilinear corners (a corner
    outside its level weighs 0, its index clamped into the level), every corner's row of
    value [B, K, H, C] picked by one index_select, weighted and summed by a batched matmul."""
    import torch

    bs, K, nh, C = value.shape
    Q = loc.shape[1]
    corners, weights, start = [], [], 0
    for level, (h, w) in enumerate(shapes):
        h, w = int(h), int(w)
        x = loc[:, :, :, level, :, 0] * w - 0.5  # [B, Q, H, P], pixel centres at integers
        y = loc[:, :, :, level, :, 1] * h - 0.5
        x0, y0 = x.floor(), y.floor()
        fx, fy = x - x0, y - y0
        for dy in (0, 1):
            for dx in (0, 1):
                xi, yi = x0 + dx, y0 + dy
                inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
                weights.append((fx if dx else 1 - fx) * (fy if dy else 1 - fy) * attn[:, :, :, level, :] * inside)
                corners.append(start + yi.clamp(0, h - 1).long() * w + xi.clamp(0, w - 1).long())
        start += h * w
    index = torch.cat(corners, -1)  # [B, Q, H, 4 L P]
    weight = torch.cat(weights, -1)
    # row of (b, k, h) in value viewed as [B K H, C]
    rows = (index + torch.arange(bs).view(bs, 1, 1, 1) * K) * nh + torch.arange(nh).view(1, 1, nh, 1)
    picked = value.reshape(bs * K * nh, C).index_select(0, rows.view(-1)).view(*rows.shape, C)
    return torch.matmul(weight.unsqueeze(-2), picked).view(bs, Q, nh * C)


# --------------------------------------------------------------------------
# reference (float64 numpy, from the math in docs/semantics.md; independent of the kernels)
# --------------------------------------------------------------------------
REFERENCE_CHUNK = 1 << 22  # samples x channels per step: bounds the reference's memory


def query_blocks(value, spatial_shapes, level_start_index, sampling_loc):
    """(b, a slice of queries, level shapes [L, 2], level starts [L]) covering every sample in
    blocks of at most REFERENCE_CHUNK samples x channels; nothing when any dimension is 0."""
    B, K, H, C = np.shape(value)
    _, Q, _, L, P, _ = np.shape(sampling_loc)
    if min(B, Q, H, L, P, C, K) == 0:
        return
    levels = np.asarray(spatial_shapes, np.int64).reshape(L, 2)
    start = np.asarray(level_start_index, np.int64).reshape(L)
    step = max(1, REFERENCE_CHUNK // max(1, H * L * P * C))
    for b in range(B):
        for q0 in range(0, Q, step):
            yield b, slice(q0, min(Q, q0 + step)), levels, start


def gradients(value, spatial_shapes, level_start_index, sampling_loc, attn_weight, grad_output):
    value = np.asarray(value, np.float64)
    B, K, H, C = value.shape
    _, Q, _, L, P, _ = np.shape(sampling_loc)
    gv = np.zeros((B * K * H, C))
    gloc = np.zeros((B, Q, H, L, P, 2))
    gattn = np.zeros((B, Q, H, L, P))
    out = {"grad_value": gv.reshape(value.shape), "grad_sampling_loc": gloc, "grad_attn_weight": gattn}
    for b, q, levels, start in query_blocks(value, spatial_shapes, level_start_index, sampling_loc):
        _reference_chunk(value[b], levels, start, np.asarray(sampling_loc[b, q]),
                         np.asarray(attn_weight[b, q], np.float64),
                         np.asarray(grad_output[b, q], np.float64),
                         gv.reshape(B, K * H, C)[b], gloc[b, q], gattn[b, q])
    return out


def corners(value, levels, start, loc):
    """The bilinear corners of a block of samples (loc [q, H, L, P, 2], value [K, H, C]):
    (inside, lh, lw, [(weight, used, value row index into value.reshape(K*H, C), corner
    values [q, H, L, P, C]) for corners (0,0), (0,1), (1,0), (1,1)]), in float64 after the
    position."""
    K, H, C = value.shape
    inside, lh, lw, rows = corner_rows(levels, start, loc, K, H)
    vflat = value.reshape(K * H, C)
    found = [(weight, ok, target, np.where(ok[..., None], vflat[target], 0.0)) for weight, ok, target in rows]
    return inside, lh, lw, found


def corner_rows(levels, start, loc, K, H):
    """(inside, lh, lw, [(weight, used, row of value.reshape(K*H, C)) for corners (0,0),
    (0,1), (1,0), (1,1)]) of a block of samples loc [q, H, L, P, 2] (row 0 where unused)."""
    L = len(levels)
    hl = levels[:, 0].reshape(1, 1, L, 1)
    wl = levels[:, 1].reshape(1, 1, L, 1)
    st = start.reshape(1, 1, L, 1)
    # The sampling position is computed in float32, as the kernels and mmcv do: it is
    # the spec's input precision. It is the exact loc * h_l - 0.5 (exact in float64)
    # rounded once to float32, as a fused multiply-add gives it (mmcv's CUDA build;
    # the kernels do the same). A float64 position can pick a different cell near an
    # integer boundary, where grad_sampling_loc is discontinuous. Everything after it
    # is float64.
    dt = loc.dtype
    with np.errstate(invalid="ignore", over="ignore"):
        h_im = (loc[..., 1].astype(np.float64) * hl - 0.5).astype(dt).astype(np.float64)
        w_im = (loc[..., 0].astype(np.float64) * wl - 0.5).astype(dt).astype(np.float64)
        inside = (h_im > -1) & (w_im > -1) & (h_im < hl) & (w_im < wl)
    h_im = np.where(inside, h_im, 0.0)
    w_im = np.where(inside, w_im, 0.0)
    h_low, w_low = np.floor(h_im).astype(np.int64), np.floor(w_im).astype(np.int64)
    lh, lw = h_im - h_low, w_im - w_low
    hh, hw = 1 - lh, 1 - lw
    head = np.broadcast_to(np.arange(H).reshape(1, H, 1, 1), inside.shape)
    rows = []
    for dy, dx, weight in ((0, 0, hh * hw), (0, 1, hh * lw), (1, 0, lh * hw), (1, 1, lh * lw)):
        y, x = h_low + dy, w_low + dx
        row = st + y * wl + x
        ok = inside & (y >= 0) & (y < hl) & (x >= 0) & (x < wl) & (row >= 0) & (row < K)
        rows.append((weight, ok, np.where(ok, row, 0) * H + head))
    return inside, lh, lw, rows


def access_pattern(inputs, params, gather=True, scatter=True):
    """The corners alone, in the CPU kernels' order: a (b, h) slice's value rows contiguous
    (the private copy's layout); the backward walks each slice level by level, each
    (level, query) reading its samples' used corner rows (gather) and adding to the same
    rows of grad_value (scatter), in (point, corner) order; the forward (gather only)
    walks a slice's queries, each over (level, point, corner)."""
    from ..access_pattern import AccessPattern, fixed_groups, offsets_of

    value, loc = inputs["value"], inputs["sampling_loc"]
    B, K, H, C = value.shape
    levels = np.asarray(inputs["spatial_shapes"], np.int64).reshape(-1, 2)
    start = np.asarray(inputs["level_start_index"], np.int64).reshape(-1)
    counts, index = [], []
    for b in range(B):
        *_, rows = corner_rows(levels, start, np.asarray(loc[b]), K, H)
        head = np.arange(H).reshape(1, H, 1, 1, 1)
        # [Q, H, L, P, 4]: row r of slice (b, h) is table row (b * H + h) * K + r
        targets = (b * H + head) * K + np.stack([target for _, _, target in rows], -1) // H
        used = np.stack([ok for _, ok, _ in rows], -1)
        order = (1, 2, 0, 3, 4) if scatter else (1, 0, 2, 3, 4)  # (h, l, q | p, k) or (h, q | l, p, k)
        fan = targets.shape[3] * 4 if scatter else targets[0, 0].size
        group_offsets, group_index = fixed_groups(targets.transpose(order).reshape(-1, fan),
                                                  used.transpose(order).reshape(-1, fan))
        counts.append(np.diff(group_offsets))
        index.append(group_index)
    return AccessPattern(B * H * K, C, offsets_of(counts), np.concatenate(index) if index else np.zeros(0),
                         gather, scatter, str(value.dtype))


def bilinear_samples(value, levels, start, loc):
    """The bilinear samples [q, H, L, P, C] of a block of samples (0 where skipped)."""
    *_, found = corners(value, levels, start, loc)
    return sum(weight[..., None] * v for weight, _, _, v in found)


def _reference_chunk(value, levels, start, loc, attn, g, gv, gloc, gattn):
    """One batch item, a block of queries: loc [q, H, L, P, 2], value [K, H, C], gv [K*H, C]."""
    L = len(levels)
    hl = levels[:, 0].reshape(1, 1, L, 1)
    wl = levels[:, 1].reshape(1, 1, L, 1)
    inside, lh, lw, found = corners(value, levels, start, loc)
    hh, hw = 1 - lh, 1 - lw
    C = value.shape[2]
    gq = np.broadcast_to(g[:, :, None, None, :], inside.shape + (C,))  # grad_output per sample
    ga = gq * attn[..., None]
    vs = []
    for weight, ok, target, v in found:
        vs.append(v)
        t, contrib = target[ok], (weight[ok])[:, None] * ga[ok]
        if t.size:
            order = np.argsort(t, kind="stable")
            ts = t[order]
            starts = np.flatnonzero(np.r_[True, ts[1:] != ts[:-1]])
            gv[ts[starts]] += np.add.reduceat(contrib[order], starts, axis=0)
    v1, v2, v3, v4 = vs
    e = lambda a: a[..., None]  # noqa: E731
    val = e(hh * hw) * v1 + e(hh * lw) * v2 + e(lh * hw) * v3 + e(lh * lw) * v4
    grad_h = -e(hw) * v1 - e(lw) * v2 + e(hw) * v3 + e(lw) * v4
    grad_w = -e(hh) * v1 + e(hh) * v2 - e(lh) * v3 + e(lh) * v4
    gattn[...] = np.where(inside, (gq * val).sum(-1), 0.0)
    gloc[..., 0] = np.where(inside, wl * (grad_w * ga).sum(-1), 0.0)
    gloc[..., 1] = np.where(inside, hl * (grad_h * ga).sum(-1), 0.0)
