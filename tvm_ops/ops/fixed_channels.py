"""CPU kernels also built with their channel count fixed.

A kernel that moves a feature row per point in channel vectors (voxel pooling's adds and
copies) runs that row as a loop of C / V vector steps when C is symbolic: a loop whose trip
count LLVM learns per point, with its remainder handling. With C a constant
(PrimFunc.specialize) the steps become straight-line code whose loads issue together: 20-30%
faster on those kernels at BEVDepth's C = 80, the same arithmetic in the same order
(docs/kernels/voxel_pooling_forward.md, voxel_pooling_backward.md; ms_deform_attn does the
same for one C through its `fixed_c` knob). So their libraries also
hold copies for the channel counts of the networks they serve, and launch runs the copy
whose C matches (`pick`), the generic kernel for any other C. The copies declare their
buffers aligned to their element only (one_core.element_aligned). Each operator names the
counts of its networks (FIXED_CHANNELS, the BEV ops', by default).
"""

from __future__ import annotations

from ..one_core import element_aligned

# BEV feature channels: BEVDepth's and BEVFusion's camera branch 80, BEVDet's 64
FIXED_CHANNELS = (64, 80)
# point features of a dynamic voxel encoder (MVXNet's DynamicVFE layers: 64, 128)
VOXEL_ENCODER_CHANNELS = (64, 128)


def _name(kernel: str, channels: int) -> str:
    return f"{kernel}_c{channels}"


def names(kernel: str, fixed: tuple = FIXED_CHANNELS) -> tuple:
    """The kernel's fixed-channel copies' names."""
    return tuple(_name(kernel, channels) for channels in fixed)


def pick(kernel: str, channels: int, fixed: tuple = FIXED_CHANNELS) -> str:
    """The kernel that runs a call with `channels` channels: its fixed copy, or itself."""
    return _name(kernel, channels) if channels in fixed else kernel


def copies(kernel: str, func, buffers: dict, fixed: tuple = FIXED_CHANNELS) -> dict:
    """{copy name: `func` with its channel dimension fixed}. `buffers`: {parameter index:
    (dimension names, dtype)} of the buffer parameters from the first one up to one holding
    the channels "C", named as in the compute (a name shared by two buffers is one variable):
    PrimFunc.specialize rebinds each dimension to the variable that first names it, so the
    buffers before the channels' must be restated too."""
    from tvm import tirx  # here: launch reads `pick` without TVM

    def specialized(channels: int):
        variables: dict = {}

        def shape(dims) -> list:
            return [channels if d == "C" else d if isinstance(d, int) else variables.setdefault(d, tirx.Var(d, "int32"))
                    for d in dims]

        copy = func.specialize({func.params[index]: tirx.decl_buffer(shape(dims), dtype, func.params[index].name)
                                for index, (dims, dtype) in buffers.items()})
        # rows of a constant length let LLVM prove vector accesses 64-byte aligned from
        # TVM's declaration of every buffer's alignment, which numpy arrays do not keep
        return element_aligned(copy)

    return {_name(kernel, channels): specialized(channels) for channels in fixed}
