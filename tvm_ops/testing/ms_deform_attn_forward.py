"""ms_deform_attn_forward: inputs, float64 reference and PyTorch peer."""

from __future__ import annotations

import numpy as np

from . import ms_deform_attn_backward as backward
from . import peer_tensor

REFERENCE_CHUNK = backward.REFERENCE_CHUNK  # samples x channels per step


def make_inputs(case, dtype, rng):
    inputs, params = backward.make_inputs(case, dtype, rng)
    del inputs["grad_output"]
    return inputs, params


def reference(inputs, params):
    return {"output": output(*(inputs[k] for k in ("value", "spatial_shapes", "level_start_index",
                                                   "sampling_loc", "attn_weight")))}


def peers(inputs, params):
    return {"grid_sample": torch_peer(inputs, params)}


def torch_peer(inputs, params):
    """mmcv's multi_scale_deformable_attn_pytorch (grid_sample), without autograd."""
    import torch

    v, lo, a = (peer_tensor(inputs[k]) for k in ("value", "sampling_loc", "attn_weight"))
    shapes = [tuple(x) for x in np.asarray(inputs["spatial_shapes"]).tolist()]

    def run():
        with torch.no_grad():
            return backward.msda_pytorch(v, shapes, lo, a)

    return run


# --------------------------------------------------------------------------
# reference (float64 numpy, from the math in docs/semantics.md; independent of the kernels)
# --------------------------------------------------------------------------


def output(value, spatial_shapes, level_start_index, sampling_loc, attn_weight):
    """output[b, q, h, :] = sum over (l, p) of attn * the bilinear sample, in float64."""
    value = np.asarray(value, np.float64)
    B, K, H, C = value.shape
    _, Q, _, L, P, _ = np.shape(sampling_loc)
    out = np.zeros((B, Q, H, C))
    if min(B, Q, H, L, P, C, K) == 0:
        return out
    levels = np.asarray(spatial_shapes, np.int64).reshape(L, 2)
    start = np.asarray(level_start_index, np.int64).reshape(L)
    step = max(1, REFERENCE_CHUNK // max(1, H * L * P * C))
    for b in range(B):
        for q0 in range(0, Q, step):
            q = slice(q0, min(Q, q0 + step))
            samples = backward.bilinear_samples(value[b], levels, start, np.asarray(sampling_loc[b, q]))
            attn = np.asarray(attn_weight[b, q], np.float64)
            out[b, q] = (samples * attn[..., None]).sum(axis=(2, 3))
    return out
