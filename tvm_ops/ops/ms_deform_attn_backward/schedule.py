"""Schedule recipes for ms_deform_attn_backward (knobs: schedules/ms_deform_attn_backward.yaml).

Kernels: backward and backward_private, and their *_fixed_c twins (C compiled in; none
with fixed_c 0). All are written in their scheduled form in the op module
(cpu_backward_compute, cuda_backward_compute; knobs reach them through the plan), so
neither recipe has anything to apply. CUDA builds `backward` alone.
"""

from __future__ import annotations

from . import KERNELS


def llvm(sch, kernel, model, plan):
    """Owner computes, one pass (see cpu_backward_compute): a (batch, head) slice per
    parallel task, the four corners of each sample unrolled, channels vectorised.
    TensorIR's block rules cannot fuse the scatter (a reduction block with an init)
    with the per-sample channel dots, so the loop nest is written directly."""
    if kernel not in KERNELS:
        raise KeyError(kernel)


def cuda(sch, kernel, model, plan):
    """Written in its scheduled form too (cuda_backward_compute): the warp's three sums over
    channels go over the lanes together, which no schedule of a reduction block emits."""
    if kernel not in KERNELS:
        raise KeyError(kernel)
