"""TensorIR compute of ms_deform_attn_forward: sample and corner blocks and a gather reduction.

    sample[b, q, h, l, p]     the sample's cell (y0, x0) and offsets (lh, lw), or SKIPPED
    corner[b, q, h, l, p, k]  row and weight (bilinear weight * attention) of corner k of
                              the sample, from its cell: together the sampling rule both
                              directions share (ops/ms_deform_attn_sampling.py)
    output[b, q, h, c]        sum over (l, p, k) of weight * value[b, row, h, c], rows of
                              unused corners (-1) skipped

Each output element is written by one iteration of its spatial loops, so every schedule is
a gather without atomics, and the sum runs in (l, p, k) order on every target: the same
bits wherever the tasks run. `channels` compiles C in (None: symbolic).

The position, its floor and the validity test run once per sample (the sample block), the
rest per corner: TensorIR's compute_at cannot place a block that writes a constant [0:4]
region (all four corners at once) at the consumer's point loop, so corners stay a block
each, and the sample block writes one buffer per value for the same reason.
"""

from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from ..ms_deform_attn_sampling import cell_macro, corner_of_cell_macro


# *_private: gather from a contiguous copy of the (batch, head) slice (CPU; on CUDA the same
# kernel); *_fixed_c: C compiled in (plan "fixed_c")
KERNELS = ("forward", "forward_private", "forward_fixed_c", "forward_private_fixed_c")


def forward_compute(dtype: str, position, channels: int | None = None):
    """The forward with sampling positions by `position` (fma_position on the CPU,
    exact_position on CUDA)."""
    zero = tirx.const(0, dtype)
    cell = cell_macro(dtype, position)
    corner = corner_of_cell_macro(dtype)
    channel_count = tirx.Var("C", "int32") if channels is None else tirx.IntImm("int32", channels)
    # element alignment only: the kernels take any contiguous numpy / torch view
    EL = np.dtype(dtype).itemsize

    @T.prim_func(s_tir=True)
    def forward(value_h: T.handle, shapes_h: T.handle, lsi_h: T.handle, loc_h: T.handle,
                attn_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        B, K, H, L, Q, P = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        C = T.meta_var(channel_count)
        value = T.match_buffer(value_h, (B, K, H, C), dtype, align=EL)
        shapes = T.match_buffer(shapes_h, (L, 2), "int32", align=4)
        lsi = T.match_buffer(lsi_h, (L,), "int32", align=4)
        loc = T.match_buffer(loc_h, (B, Q, H, L, P, 2), dtype, align=EL)
        attn = T.match_buffer(attn_h, (B, Q, H, L, P), dtype, align=EL)
        out = T.match_buffer(out_h, (B, Q, H, C), dtype, align=EL)
        y0s = T.sblock_alloc_buffer((B, Q, H, L, P), "int32")
        x0s = T.sblock_alloc_buffer((B, Q, H, L, P), "int32")
        lhs = T.sblock_alloc_buffer((B, Q, H, L, P), dtype)
        lws = T.sblock_alloc_buffer((B, Q, H, L, P), dtype)
        rows = T.sblock_alloc_buffer((B, Q, H, L, P, 4), "int32")
        weight = T.sblock_alloc_buffer((B, Q, H, L, P, 4), dtype)
        for b, q, h, l, p in T.grid(B, Q, H, L, P):
            with T.sblock("sample"):
                vb, vq, vh, vl, vp = T.axis.remap("SSSSS", [b, q, h, l, p])
                T.reads(shapes[vl, 0:2], loc[vb, vq, vh, vl, vp, 0:2])
                T.writes(y0s[vb, vq, vh, vl, vp], x0s[vb, vq, vh, vl, vp], lhs[vb, vq, vh, vl, vp],
                         lws[vb, vq, vh, vl, vp])
                cell(shapes, loc, y0s, x0s, lhs, lws, vb, vq, vh, vl, vp)
        for b, q, h, l, p, k in T.grid(B, Q, H, L, P, 4):
            with T.sblock("corner"):
                vb, vq, vh, vl, vp, vk = T.axis.remap("SSSSSS", [b, q, h, l, p, k])
                T.reads(shapes[vl, 0:2], lsi[vl], y0s[vb, vq, vh, vl, vp], x0s[vb, vq, vh, vl, vp],
                        lhs[vb, vq, vh, vl, vp], lws[vb, vq, vh, vl, vp], attn[vb, vq, vh, vl, vp])
                T.writes(rows[vb, vq, vh, vl, vp, vk], weight[vb, vq, vh, vl, vp, vk])
                corner(shapes, lsi, y0s, x0s, lhs, lws, rows, weight, vb, vq, vh, vl, vp, vk, K)
                weight[vb, vq, vh, vl, vp, vk] = weight[vb, vq, vh, vl, vp, vk] * attn[vb, vq, vh, vl, vp]
        for b, q, h, c, l, p, k in T.grid(B, Q, H, C, L, P, 4):
            with T.sblock("output"):
                vb, vq, vh, vc, vl, vp, vk = T.axis.remap("SSSSRRR", [b, q, h, c, l, p, k])
                T.reads(rows[vb, vq, vh, vl, vp, vk], weight[vb, vq, vh, vl, vp, vk], value[vb, 0:K, vh, vc])
                T.writes(out[vb, vq, vh, vc])
                with T.init():
                    out[vb, vq, vh, vc] = zero
                r: T.let = rows[vb, vq, vh, vl, vp, vk]
                # the load only for a used corner: r is -1 otherwise
                out[vb, vq, vh, vc] = out[vb, vq, vh, vc] + T.if_then_else(
                    r >= 0, weight[vb, vq, vh, vl, vp, vk] * value[vb, T.max(r, 0), vh, vc], zero)

    return forward
