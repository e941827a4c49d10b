"""Schedule recipes for border_align_forward (knobs: schedules/border_align_forward.yaml).

Kernels: `border` (channels in whole vectors on the CPU, all channels on CUDA),
`border_tail` (the last vector of channels when C % vector != 0) and `border_small`
(C < vector, scalar) on the CPU (CUDA builds `border` alone), and a channels-first input
to the layout the others read: `to_channels_last` on the CPU (written in its scheduled
form, ops/channels_last.py), `to_nhwc` on CUDA."""

from __future__ import annotations

from . import KERNELS


def llvm(sch, kernel, model, plan):
    """Owner computes: a parallel task per box (n, k). Its (pool_size + 1) x 4 samples'
    cells and weights are computed once per box (compute_at the box loop: a workspace of
    that size; each sample's position once, in registers: staged per box it was one more
    workspace, and the 950-box case's calls took 11.5 ms against 8.1-9.3), then per (border,
    channel vector) the max and argmax over the samples stay in registers while the samples
    are walked, and are stored once."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    if kernel == "to_channels_last":
        return
    block = sch.get_sblock("border")
    n, k, s, i, co, ci = sch.get_loops(block)
    sch.reorder(n, k, s, co, i, ci)
    box = sch.fuse(n, k)
    sch.parallel(box)
    argmax = sch.cache_write(block, 1, "global")  # [vector] int32 per (border, vector): registers
    sch.reverse_compute_at(argmax, co)
    sch.reverse_compute_at(sch.get_sblock("output"), co)
    if kernel != "border_small":  # whole vectors; border_small keeps a predicate: scalar
        sch.vectorize(ci)
        sch.vectorize(sch.get_loops(argmax)[-1])
        sch.vectorize(sch.get_loops(sch.get_sblock("output"))[-1])
    sch.decompose_reduction(block, i)
    sample = sch.get_sblock("sample")
    sch.compute_at(sample, box)
    _, sample_i, _ = sch.get_loops(sample)[1:]
    sch.compute_at(sch.get_sblock("position"), sample_i)  # (x, y) per sample: registers


def cuda(sch, kernel, model, plan):
    """mmcv's plan: a thread per (n, k, border, channel), the max and argmax over the samples
    in registers, each thread computing its samples' cells and weights. Block: one box,
    threads_c channels x the 4 borders; blockIdx.y walks channel groups (the split's
    predicate guards the last)."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
    if kernel == "to_nhwc":  # a thread per element, consecutive threads on consecutive channels
        blocks, threads = sch.split(sch.fuse(*sch.get_loops(sch.get_sblock("to_nhwc"))), [None, 256])
        sch.bind(blocks, "blockIdx.x")
        sch.bind(threads, "threadIdx.x")
        return
    threads = int(plan["threads_c"])
    block = sch.get_sblock("border")
    n, k, s, i, co, ci = sch.get_loops(block)
    c_o, c_i = sch.split(ci, [None, threads])
    sch.reorder(n, k, c_o, s, c_i, co, i)
    sch.bind(sch.fuse(n, k), "blockIdx.x")
    sch.bind(c_o, "blockIdx.y")
    sch.bind(s, "threadIdx.y")
    sch.bind(c_i, "threadIdx.x")
    argmax = sch.cache_write(block, 1, "local")
    sch.set_scope(block, 0, "local")  # the float32 max: an intermediate, a register per thread
    sch.reverse_compute_at(argmax, co)
    sch.reverse_compute_at(sch.get_sblock("output"), co)
    sch.decompose_reduction(block, i)
    sample = sch.get_sblock("sample")
    sch.compute_at(sample, i)
    for buffer in range(2):
        sch.set_scope(sample, buffer, "local")
    # inline: the CUDA C is the one last timed and tested on a GPU (staged like the CPU's,
    # registers per sample, is a candidate to time there)
    sch.compute_inline(sch.get_sblock("position"))
