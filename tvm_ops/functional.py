"""Differentiable PyTorch functions over the tvm_ops kernels, with the signatures and layouts
the networks already call (mmcv), so switching is one import.

Each function is a `torch.library.custom_op` (namespace `tvm_ops`) with a fake
implementation (shapes only, for torch.compile and meta tensors) and its backward registered
with `register_autograd`, so `torch.compile(fullgraph=True)` traces through it without a
graph break and `torch.library.opcheck` passes. Tensors run where they live: CPU tensors on
the LLVM kernels, CUDA tensors on the CUDA kernels. Under `torch.no_grad()` only the forward
runs. Importing this module needs torch and nothing else; TVM loads on the first call.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from . import interop
from .errors import BadParamError

__all__ = ["BorderAlign", "MultiScaleDeformableAttnFunction", "border_align", "ms_deform_attn"]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _target(tensor: Tensor) -> str:
    return "cuda" if tensor.device.type == "cuda" else "llvm"


def _kernel_input(tensor: Tensor) -> Tensor:
    # the kernels read tensors through DLPack, which exports no tensor that requires grad;
    # autograd is this module's job, so the kernels get plain views
    return tensor.detach()


def _int32(tensor: Tensor, name: str) -> Tensor:
    """An index tensor as the kernels take it: int32 as given; int64 (what mmcv's callers pass)
    converted once its values are known to fit. The values are read on the host on every call
    for CPU tensors and once per tensor and version for CUDA ones (the converted tensor is kept
    with them, so the kernels' own value checks find it again: no per-call synchronisation)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.int32 or tensor.dtype != torch.int64:
        return tensor  # other dtypes: the operator's checks name them
    if tensor.device.type == "cpu":
        _require_int32(tensor.numpy(), name)
        return tensor.to(torch.int32)
    return interop.per_version(tensor, name, _int32_twin)


def _int32_twin(tensor: Tensor, name: str) -> Tensor:
    _require_int32(tensor.cpu().numpy(), name)
    return tensor.to(torch.int32)


def _require_int32(values: np.ndarray, name: str) -> None:
    if values.size and (values.min() < INT32_MIN or values.max() > INT32_MAX):
        raise BadParamError(f"ms_deform_attn: {name} holds values outside int32 "
                            f"[{values.min()}, {values.max()}]; the kernels index with int32")


# --- multi-scale deformable attention -------------------------------------------------------


@torch.library.custom_op("tvm_ops::ms_deform_attn_forward", mutates_args=())
def _msda_forward(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor, sampling_locations: Tensor,
                  attention_weights: Tensor, im2col_step: int) -> Tensor:
    from .ops.ms_deform_attn_forward import ms_deform_attn_forward

    return ms_deform_attn_forward(_kernel_input(value), _int32(spatial_shapes, "spatial_shapes"),
                                  _int32(level_start_index, "level_start_index"),
                                  _kernel_input(sampling_locations), _kernel_input(attention_weights), im2col_step,
                                  target=_target(value))


@_msda_forward.register_fake
def _msda_forward_shape(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step):
    batch, _, heads, channels = value.shape
    return value.new_empty((batch, sampling_locations.shape[1], heads, channels))


@torch.library.custom_op("tvm_ops::ms_deform_attn_backward", mutates_args=())
def _msda_backward(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor, sampling_locations: Tensor,
                   attention_weights: Tensor, grad_output: Tensor, im2col_step: int) -> tuple[Tensor, Tensor, Tensor]:
    from .ops.ms_deform_attn_backward import ms_deform_attn_backward

    return ms_deform_attn_backward(_kernel_input(value), _int32(spatial_shapes, "spatial_shapes"),
                                   _int32(level_start_index, "level_start_index"),
                                   _kernel_input(sampling_locations), _kernel_input(attention_weights),
                                   _kernel_input(grad_output), im2col_step, target=_target(value))


@_msda_backward.register_fake
def _msda_backward_shape(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                         grad_output, im2col_step):
    return torch.empty_like(value), torch.empty_like(sampling_locations), torch.empty_like(attention_weights)


def _msda_setup_context(ctx, inputs, output):
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step = inputs
    ctx.save_for_backward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    ctx.im2col_step = im2col_step


def _msda_grad(ctx, grad_output):
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights = ctx.saved_tensors
    grad_value, grad_locations, grad_weights = _msda_backward(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights, grad_output.contiguous(),
        ctx.im2col_step)
    return grad_value, None, None, grad_locations, grad_weights, None


_msda_forward.register_autograd(_msda_grad, setup_context=_msda_setup_context)


def ms_deform_attn(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor, sampling_locations: Tensor,
                   attention_weights: Tensor, im2col_step: int = 64) -> Tensor:
    """Multi-scale deformable attention, mmcv's `MultiScaleDeformableAttnFunction` contract:
    value [B, K, H, C], spatial_shapes [L, 2] (h, w) and level_start_index [L] (int64 or
    int32), sampling_locations [B, Q, H, L, P, 2] (x, y in [0, 1]), attention_weights
    [B, Q, H, L, P] -> [B, Q, H*C]; float32. Differentiable in value, sampling_locations
    and attention_weights (the backward is tvm_ops.ms_deform_attn_backward). Sampling rule
    and checks: tvm_ops.ms_deform_attn_forward."""
    out = _msda_forward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                        int(im2col_step))
    return out.flatten(2)


class MultiScaleDeformableAttnFunction:
    """mmcv's name and argument order: `MultiScaleDeformableAttnFunction.apply(value,
    value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
    im2col_step)` is `ms_deform_attn`."""

    apply = staticmethod(ms_deform_attn)


# --- border align (BorderDet) ----------------------------------------------------------------
# The custom ops take the kernels' NHWC layout; border_align permutes mmcv's NCHW around them
# (torch differentiates the permutes), so torch.compile sees the layout changes too.


@torch.library.custom_op("tvm_ops::border_align_forward", mutates_args=())
def _border_forward(input: Tensor, boxes: Tensor, pool_size: int) -> tuple[Tensor, Tensor]:
    from .ops.border_align_forward import border_align_forward

    return border_align_forward(_kernel_input(input), _kernel_input(boxes), pool_size, target=_target(input))


@_border_forward.register_fake
def _border_forward_shape(input, boxes, pool_size):
    n, _, _, q = input.shape
    shape = (n, boxes.shape[1], 4, q // 4)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)


@torch.library.custom_op("tvm_ops::border_align_backward", mutates_args=())
def _border_backward(grad_output: Tensor, boxes: Tensor, argmax_idx: Tensor, pool_size: int, height: int,
                     width: int) -> Tensor:
    from .ops.border_align_backward import border_align_backward

    return border_align_backward(_kernel_input(grad_output), _kernel_input(boxes), argmax_idx, pool_size,
                                 height=height, width=width, target=_target(grad_output))


@_border_backward.register_fake
def _border_backward_shape(grad_output, boxes, argmax_idx, pool_size, height, width):
    n, _, _, c = grad_output.shape
    return grad_output.new_empty((n, height, width, 4 * c))


def _border_setup_context(ctx, inputs, output):
    input, boxes, pool_size = inputs
    ctx.save_for_backward(boxes, output[1])
    ctx.pool_size, ctx.height, ctx.width = pool_size, input.shape[1], input.shape[2]
    ctx.mark_non_differentiable(output[1])


def _border_grad(ctx, grad_output, _grad_argmax):
    boxes, argmax_idx = ctx.saved_tensors
    grad_input = _border_backward(grad_output.contiguous(), boxes, argmax_idx, ctx.pool_size, ctx.height,
                                  ctx.width)
    return grad_input, None, None


_border_forward.register_autograd(_border_grad, setup_context=_border_setup_context)


def border_align(input: Tensor, boxes: Tensor, pool_size: int) -> Tensor:
    """BorderAlign with mmcv's contract: input [N, 4C, H, W] (borders top, left, bottom, right
    as channel blocks), boxes [N, H*W, 4] (x0, y0, x1, y1) -> [N, C, H*W, 4], the max over the
    pool_size + 1 samples of each border; float32 or float16. Differentiable in input (the
    backward is tvm_ops.border_align_backward of the forward's argmax). The kernels work in
    NHWC: the input is copied into it and the result is a permuted view of the kernels'
    [N, H*W, 4, C] output. Rules: tvm_ops.border_align_forward."""
    output, _ = _border_forward(input.permute(0, 2, 3, 1), boxes, int(pool_size))
    return output.permute(0, 3, 1, 2)


class BorderAlign(torch.nn.Module):
    """mmcv's `BorderAlign(pool_size)` layer: forward(input, boxes) = border_align(input, boxes,
    pool_size)."""

    def __init__(self, pool_size: int):
        super().__init__()
        self.pool_size = int(pool_size)

    def forward(self, input: Tensor, boxes: Tensor) -> Tensor:
        return border_align(input, boxes, self.pool_size)

    def extra_repr(self) -> str:
        return f"pool_size={self.pool_size}"
