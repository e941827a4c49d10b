"""Schedule recipes for ms_deform_attn_forward (knobs: schedules/ms_deform_attn_forward.yaml).

Kernels: forward and forward_private, and their *_fixed_c twins (C compiled in). On the
CPU all are written in their scheduled form (compute.py, cpu_forward_compute). CUDA
schedules the compute (a sample block, a corner block and a gather reduction) here, with
each sample's cell and its corners' rows and weights computed next to the loads that use
them.
"""

from __future__ import annotations

from . import KERNELS


def llvm(sch, kernel, model, plan):
    """Owner computes: a parallel task owns a (batch, head) slice and walks its queries in
    blocks (see cpu_forward_compute). The CPU kernels are written in their scheduled form
    (the query blocks' clamped spare lanes have no compute form), so there is nothing to
    apply here; knobs reach them through the plan."""
    if kernel not in KERNELS:
        raise KeyError(kernel)


def _samples_at(sch, p):
    """Each sample's cell, then its four corners, then their four terms, computed at the
    point loop `p` of the output in registers (scope "local"), the corner loops unrolled:
    a thread loads a sample's four corners before it adds any."""
    term = sch.get_sblock("term")
    sch.compute_at(term, p)
    sch.unroll(sch.get_loops(term)[-1])
    corner = sch.get_sblock("corner")
    sch.compute_at(corner, p)
    sch.unroll(sch.get_loops(corner)[-1])
    sample = sch.get_sblock("sample")
    sch.compute_at(sample, p)
    for block, buffers in ((term, 1), (corner, 2), (sample, 4)):
        for buffer in range(buffers):
            sch.set_scope(block, buffer, "local")


def cuda(sch, kernel, model, plan):
    """mmcv's plan: a thread per output element (b, q, h, c), its (level, point, corner) sum
    in a register. Thread block = one (b, q) and threads_h heads x threads_c channels; the
    thread loops have constant extents and keep their split predicates as guards. Every
    thread computes its samples' corners itself (as mmcv), in registers."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    tc, th = int(plan["threads_c"]), int(plan["threads_h"])
    out = sch.get_sblock("output")
    b, q, h, c, l, p, k = sch.get_loops(out)
    h_o, h_i = sch.split(h, [None, th])
    c_o, c_i = sch.split(c, [None, tc])
    sch.reorder(q, b, h_o, h_i, c_i, c_o, l, p, k)
    # q, b and the head group on separate grid axes (as the backward): a fused (b, q) index
    # made every corner's load divide blockIdx.x by Q (a signed division, ~20 instructions,
    # inside the corner's branch where nvcc does not hoist it)
    sch.bind(q, "blockIdx.x")
    sch.bind(b, "blockIdx.y")
    sch.bind(h_o, "blockIdx.z")
    sch.bind(h_i, "threadIdx.y")
    sch.bind(c_i, "threadIdx.x")
    acc = sch.cache_write(out, 0, "local")
    sch.reverse_compute_at(acc, c_o)
    sch.decompose_reduction(out, l)
    _samples_at(sch, p)
