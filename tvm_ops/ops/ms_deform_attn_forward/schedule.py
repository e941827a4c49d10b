"""Schedule recipes for ms_deform_attn_forward (knobs: schedules/ms_deform_attn_forward.yaml).

Kernels: forward and forward_private, and their *_fixed_c twins (C compiled in). The
compute (compute.py) is a sample block, a corner block and a gather reduction; both targets
schedule it here, with each sample's cell and its corners' rows and weights computed next
to the loads that use them.
"""

from __future__ import annotations

from ..ms_deform_attn_sampling import FMA_IR
from .compute import KERNELS


def llvm(sch, kernel, model, plan):
    """Owner computes: a parallel task owns a (batch, head) slice and walks its queries in
    order. Per (b, q, h) the output row accumulates in a register tile (constant C) or in
    place (symbolic C: a symbolic tile would be a heap workspace per query), over
    (level, point, corner), the channels vectorised. The private kernels first copy the
    slice's value rows (H rows apart in `value`) into a contiguous [K, C] buffer: the
    gathers then touch 128-byte rows packed together (fewer pages and lines)."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    lanes = plan["lanes"]
    fixed = kernel.endswith("_fixed_c")
    out = sch.get_sblock("output")
    b, q, h, c, l, p, k = sch.get_loops(out)
    sch.reorder(b, h, q, l, p, k, c)
    slice_ = sch.fuse(b, h)
    sch.parallel(slice_)
    sch.annotate(slice_, "pragma_import_llvm", FMA_IR)  # the sampling position's fma
    if fixed:
        tile = sch.cache_write(out, 0, "global")  # a small constant buffer: registers
        sch.reverse_compute_at(tile, q)
        sch.vectorize(sch.get_loops(tile)[-1])
    if "_private" in kernel:
        copy = sch.cache_read(out, "value", "global")
        sch.compute_at(copy, slice_)
        _vectorized(sch, sch.get_loops(copy)[-1], lanes, fixed)
    c_o, _ = _vectorized(sch, c, lanes, fixed)
    if fixed:
        sch.unroll(c_o)
    sch.decompose_reduction(out, l)
    _samples_at(sch, p, None)


def _samples_at(sch, p, scope):
    """Each sample's cell, then its four corners, computed at the point loop `p` of the
    output (in `scope` where not None: CUDA's registers), the corner loop unrolled."""
    corner = sch.get_sblock("corner")
    sch.compute_at(corner, p)
    sch.unroll(sch.get_loops(corner)[-1])
    sample = sch.get_sblock("sample")
    sch.compute_at(sample, p)
    if scope is not None:
        for block, buffers in ((corner, 2), (sample, 4)):
            for buffer in range(buffers):
                sch.set_scope(block, buffer, scope)


def _vectorized(sch, loop, lanes, fixed):
    """Split `loop` into target vectors and vectorise them (with a symbolic extent the
    split's predicate makes TVM emit scalar code: correct, slower)."""
    outer, inner = sch.split(loop, [None, lanes])
    sch.vectorize(inner)
    return outer, inner


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
    _samples_at(sch, p, "local")
