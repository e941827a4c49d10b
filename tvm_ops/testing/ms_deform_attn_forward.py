"""ms_deform_attn_forward: inputs, float64 reference and PyTorch peer."""

from __future__ import annotations

import numpy as np

from . import ms_deform_attn_backward as backward
from . import peer_tensor

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
    B, _, H, C = value.shape
    out = np.zeros((B, np.shape(sampling_loc)[1], H, C))
    for b, q, levels, start in backward.query_blocks(value, spatial_shapes, level_start_index, sampling_loc):
        samples = backward.bilinear_samples(value[b], levels, start, np.asarray(sampling_loc[b, q]))
        attn = np.asarray(attn_weight[b, q], np.float64)
        out[b, q] = (samples * attn[..., None]).sum(axis=(2, 3))
    return out


def access_pattern(inputs, params):
    """The corners alone: each (b, q, h) sums the used bilinear corner rows of its samples."""
    return backward.access_pattern(inputs, params, scatter=False)
