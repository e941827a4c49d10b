"""Differentiable PyTorch functions over the tvm_ops kernels, with the signatures and layouts
the networks already call (mmcv, BEVDepth), so switching is one import.

Each function is a `torch.library.custom_op` (namespace `tvm_ops`) with a fake
implementation (shapes only, for torch.compile and meta tensors) and its backward registered
with `register_autograd`, so `torch.compile(fullgraph=True)` traces through it without a
graph break and `torch.library.opcheck` passes; a plain eager call skips the dispatcher and
runs the same implementation and formula directly (custom_ops.py). Tensors run where they
live: CPU tensors on the LLVM kernels, CUDA tensors on the CUDA kernels. Under
`torch.autocast` every function runs in float32 on float32 casts of its floating inputs
(custom_ops.py). Under `torch.no_grad()` only the forward runs. Under
`torch.use_deterministic_algorithms(True)` a CUDA kernel that adds with atomics raises
NotDeterministicError (docs/semantics.md, Determinism). Reverse mode only: a tangent reaching a
differentiable input (torch.func.jvp, jacfwd, forward_ad) raises NotSupportedError instead
of the zero a custom op would give, and so do torch.func.grad, vjp and jacrev (which torch
refuses for a custom op's autograd formula in its own terms); torch.func.vmap works.
torch.fx.symbolic_trace records each function as one call node (its checks branch on
shapes, which fx's proxies cannot take). Meta tensors run the fake implementations: all of a
call's tensors on meta, or a BadParamError. Importing this module needs torch and nothing
else; TVM loads on the first call.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor
from torch._C._functorch import TransformType, get_interpreter_stack, get_unwrapped, is_functorch_wrapped_tensor
from torch.autograd import forward_ad

from . import checks, interop
from .custom_ops import FUNCTORCH_ON, custom_op
from .errors import BadParamError, NotSupportedError

__all__ = ["BorderAlign", "DynamicScatter", "MultiScaleDeformableAttnFunction", "border_align", "dynamic_scatter",
           "ms_deform_attn", "three_interpolate", "three_nn", "voxel_pooling", "voxel_pooling_train"]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_STRIDED = torch.strided


def _target(tensor: Tensor) -> str:
    return "cuda" if tensor.device.type == "cuda" else "llvm"


def _kernel_input(tensor: Tensor) -> Tensor:
    # the kernels read tensors through DLPack, which exports no tensor that requires grad;
    # autograd is this module's job, so the kernels get plain views
    return tensor.detach() if tensor.requires_grad else tensor


def _int32(tensor: Tensor, name: str, function: str = "ms_deform_attn", negative_dropped: bool = False) -> Tensor:
    """An index tensor as the kernels take it: int32 as given; int64 (what mmcv's callers pass)
    converted once its values are known to fit (with negative_dropped, where any negative value
    means the same, values below int32 become -1). The values are read on the host on every
    call for CPU tensors and once per tensor and version for CUDA ones (the converted tensor is
    kept with them, so the kernels' own value checks find it again: no per-call
    synchronisation)."""
    tensor = _kernel_input(tensor)
    if tensor.dtype != torch.int64:
        return tensor  # int32 as it is; other dtypes: the operator's checks name them
    if tensor.device.type == "cpu":
        return _int32_twin(tensor, name, function, negative_dropped)
    return interop.per_version(tensor, (name, negative_dropped),
                               lambda t, _: _int32_twin(t, name, function, negative_dropped))


def _int32_twin(tensor: Tensor, name: str, function: str, negative_dropped: bool) -> Tensor:
    values = interop.host_array(tensor)
    if values.size:
        low, high = values.min(), values.max()
        if high > INT32_MAX or (low < INT32_MIN and not negative_dropped):
            raise BadParamError(f"{function}: {name} holds values outside int32 [{low}, {high}]; the kernels "
                                f"index with int32")
        if low < INT32_MIN:  # still negative: dropped as before
            tensor = tensor.clamp(min=-1)
    return tensor.to(torch.int32)


def _dense_tensors(function: str, **tensors) -> None:
    """BadParamError unless every argument is a dense (strided) torch tensor: these functions
    reshape and permute them before the operators' checks would see them, and a numpy array,
    a sparse or a nested tensor must get the library's error rather than torch's."""
    for name, tensor in tensors.items():
        if not isinstance(tensor, Tensor):
            raise BadParamError(f"{function}: {name} must be a torch.Tensor, got {type(tensor).__name__} "
                                f"(numpy arrays go to the tvm_ops.<operator> functions)")
        if tensor.layout is not _STRIDED or tensor.is_nested:  # (the message built only then)
            interop.require_dense(f"{function}: {name}", tensor)


def _one_device(function: str, **tensors) -> None:
    """BadParamError unless every tensor is on one device. A fake implementation runs for a
    call with any meta tensor: among real tensors it would return uninitialised outputs."""
    (first, tensor), *others = tensors.items()
    for name, other in others:
        if other.device != tensor.device:
            raise BadParamError(f"{function}: {name} is on {other.device} but {first} is on {tensor.device}; "
                                f"give every tensor on one device")


def _without_gradient(ctx, *outputs) -> None:
    """Mark `outputs` (indices, counts, argmax; three_nn's distances) non-differentiable and
    have the backward get None for their gradients: autograd would otherwise build and fill a
    zero tensor of each one's size on every backward (voxel_pooling's pos_memo on BEVDepth's
    case: 11 MB, a fifth of a CPU training step). The backward then gets None wherever a
    gradient is undefined, the differentiable output's too (torch.autograd.grad given an
    undefined gradient, as gradcheck tries), and gives None for the inputs there."""
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)


def _reverse_mode_only(function: str, *differentiable) -> None:
    """NotSupportedError for a tangent on a differentiable input: a custom op without a
    forward-mode formula would give a zero tangent (torch.func.jvp, jacfwd) or none
    (torch.autograd.forward_ad), silently. And for torch.func's reverse-mode transforms (grad,
    vjp, jacrev), which torch refuses for a custom op's autograd formula in its own words
    ("autograd.Function ... must override the setup_context staticmethod"). Costs a module
    attribute read and a probe outside those."""
    if getattr(forward_ad, "_current_level", -1) >= 0:  # a dual level or a functorch jvp
        jvp = FUNCTORCH_ON() and any(level.key() == TransformType.Jvp for level in get_interpreter_stack())
        if jvp or any(_has_tangent(tensor) for tensor in differentiable):
            raise NotSupportedError(f"{function}: forward-mode AD (torch.func.jvp, jacfwd, forward_ad) has no "
                                    f"formula here; differentiate in reverse mode with autograd (backward, "
                                    f"torch.autograd.grad)")
    if FUNCTORCH_ON() and any(level.key() == TransformType.Grad for level in get_interpreter_stack()):
        raise NotSupportedError(f"{function}: torch.func.grad, vjp and jacrev cannot differentiate a custom op's "
                                f"autograd formula (torch's limitation); use torch.autograd.grad or backward "
                                f"(torch.func.vmap is supported)")


def _has_tangent(tensor) -> bool:
    """Whether `tensor`, or the tensor a functorch transform (vmap) wraps, is dual with a
    tangent (forward_ad.make_dual): unpack_dual has no batching rule, so it reads the
    innermost tensor."""
    while is_functorch_wrapped_tensor(tensor):
        tensor = get_unwrapped(tensor)
    return forward_ad.unpack_dual(tensor).tangent is not None


def _traced_as_one_call(function):
    """`function` recorded by torch.fx.symbolic_trace (torchvision's feature extraction, FX
    quantisation) as one call node rather than traced into: its checks branch on shapes and
    values, which fx's proxies cannot take. (torch.fx.wrap does this for a name in this
    module's globals, which a caller's `from tvm_ops.functional import ...` bypasses.)"""
    @functools.wraps(function)
    def call(*args, **kwargs):
        for value in args:  # (this runs on every call: the arguments once, no tuple built)
            if isinstance(value, _PROXY):
                return value.tracer.create_proxy("call_function", call, args, kwargs)
        for value in kwargs.values():
            if isinstance(value, _PROXY):
                return value.tracer.create_proxy("call_function", call, args, kwargs)
        return function(*args, **kwargs)

    return call


_PROXY = torch.fx.Proxy


# --- multi-scale deformable attention -------------------------------------------------------


@custom_op("tvm_ops::ms_deform_attn_forward")
def _msda_forward(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor, sampling_locations: Tensor,
                  attention_weights: Tensor, im2col_step: int) -> Tensor:
    from .ops.ms_deform_attn_forward import ms_deform_attn_forward

    return ms_deform_attn_forward(_kernel_input(value), _int32(spatial_shapes, "spatial_shapes"),
                                  _int32(level_start_index, "level_start_index"),
                                  _kernel_input(sampling_locations), _kernel_input(attention_weights), im2col_step,
                                  target=_target(value))


@_msda_forward.register_fake
def _msda_forward_shape(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step):
    _one_device("ms_deform_attn", value=value, spatial_shapes=spatial_shapes, level_start_index=level_start_index,
                sampling_locations=sampling_locations, attention_weights=attention_weights)
    batch, _, heads, channels = value.shape
    return value.new_empty((batch, sampling_locations.shape[1], heads, channels))


@custom_op("tvm_ops::ms_deform_attn_backward")
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
    _one_device("ms_deform_attn_backward", value=value, spatial_shapes=spatial_shapes,
                level_start_index=level_start_index, sampling_locations=sampling_locations,
                attention_weights=attention_weights, grad_output=grad_output)
    return torch.empty_like(value), torch.empty_like(sampling_locations), torch.empty_like(attention_weights)


def _msda_setup_context(ctx, inputs, output):
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step = inputs
    ctx.save_for_backward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    ctx.im2col_step = im2col_step


def _msda_grad(ctx, grad_output):
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights = ctx.saved_tensors
    grad_value, grad_locations, grad_weights = _msda_backward(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights, grad_output,
        ctx.im2col_step)
    return grad_value, None, None, grad_locations, grad_weights, None


_msda_forward.register_autograd(_msda_grad, setup_context=_msda_setup_context)


@_traced_as_one_call
def ms_deform_attn(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor, sampling_locations: Tensor,
                   attention_weights: Tensor, im2col_step: int = 64) -> Tensor:
    """Multi-scale deformable attention, mmcv's `MultiScaleDeformableAttnFunction` contract:
    value [B, K, H, C], spatial_shapes [L, 2] (h, w) and level_start_index [L] (int64 or
    int32), sampling_locations [B, Q, H, L, P, 2] (x, y in [0, 1]), attention_weights
    [B, Q, H, L, P] -> [B, Q, H*C]; float32. Differentiable in value, sampling_locations
    and attention_weights (the backward is tvm_ops.ms_deform_attn_backward). Sampling rule
    and checks: tvm_ops.ms_deform_attn_forward."""
    _dense_tensors("ms_deform_attn", value=value, spatial_shapes=spatial_shapes, level_start_index=level_start_index,
                   sampling_locations=sampling_locations, attention_weights=attention_weights)
    _reverse_mode_only("ms_deform_attn", value, sampling_locations, attention_weights)
    out = _msda_forward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                        checks.int_param("ms_deform_attn", "im2col_step", im2col_step, 1))
    return out.flatten(2)


class MultiScaleDeformableAttnFunction:
    """mmcv's name and argument order: `MultiScaleDeformableAttnFunction.apply(value,
    value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
    im2col_step)` is `ms_deform_attn`."""

    apply = staticmethod(ms_deform_attn)


# --- border align (BorderDet) ----------------------------------------------------------------
# The custom ops take the kernels' NHWC layout; border_align permutes mmcv's NCHW around them
# (torch differentiates the permutes), so torch.compile sees the layout changes too.


@custom_op("tvm_ops::border_align_forward")
def _border_forward(input: Tensor, boxes: Tensor, pool_size: int) -> tuple[Tensor, Tensor]:
    from .ops.border_align_forward import border_align_forward

    return border_align_forward(_kernel_input(input), _kernel_input(boxes), pool_size, target=_target(input))


@_border_forward.register_fake
def _border_forward_shape(input, boxes, pool_size):
    _one_device("border_align", input=input, boxes=boxes)
    n, _, _, q = input.shape
    shape = (n, boxes.shape[1], 4, q // 4)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)


@custom_op("tvm_ops::border_align_backward")
def _border_backward(grad_output: Tensor, boxes: Tensor, argmax_idx: Tensor, pool_size: int, height: int,
                     width: int, channels_first: bool = False) -> Tensor:
    from .ops.border_align_backward import border_align_backward

    out = None
    if channels_first:  # [N, H, W, 4C] as a view of [N, 4C, H, W] memory (CPU)
        n, _, _, c = grad_output.shape
        memory = interop.empty_like_kind("torch", "cpu", (n, 4 * c, height, width),
                                         interop.torch_dtype_name(grad_output.dtype), zero=False)
        out = memory.permute(0, 2, 3, 1)
    return border_align_backward(_kernel_input(grad_output), _kernel_input(boxes), argmax_idx, pool_size,
                                 height=height, width=width, target=_target(grad_output), out=out)


@_border_backward.register_fake
def _border_backward_shape(grad_output, boxes, argmax_idx, pool_size, height, width, channels_first=False):
    _one_device("border_align_backward", grad_output=grad_output, boxes=boxes, argmax_idx=argmax_idx)
    n, _, _, c = grad_output.shape
    if channels_first:
        return grad_output.new_empty((n, 4 * c, height, width)).permute(0, 2, 3, 1)
    return grad_output.new_empty((n, height, width, 4 * c))


def _border_setup_context(ctx, inputs, output):
    input, boxes, pool_size = inputs
    ctx.save_for_backward(boxes, output[1])
    ctx.pool_size, ctx.height, ctx.width = pool_size, input.shape[1], input.shape[2]
    # the NHWC view of an NCHW map (the usual case) gets its gradient in the map's layout: the
    # backward writes it so on the CPU (border_align_backward's channels-first out=), where
    # autograd would otherwise copy it there (torch's strided copy: 3.6 ms of a 13 ms step on
    # the largest network case); CUDA keeps NHWC (its copy is a small part of a step there)
    ctx.channels_first = input.device.type == "cpu" and not input.is_contiguous()
    _without_gradient(ctx, output[1])


def _border_grad(ctx, grad_output, _grad_argmax):
    if grad_output is None:  # undefined (_without_gradient): none for the input either
        return None, None, None
    boxes, argmax_idx = ctx.saved_tensors
    grad_input = _border_backward(grad_output, boxes, argmax_idx, ctx.pool_size, ctx.height,
                                  ctx.width, ctx.channels_first)
    return grad_input, None, None


_border_forward.register_autograd(_border_grad, setup_context=_border_setup_context)


@_traced_as_one_call
def border_align(input: Tensor, boxes: Tensor, pool_size: int) -> Tensor:
    """BorderAlign with mmcv's contract: input [N, 4C, H, W] (borders top, left, bottom, right
    as channel blocks), boxes [N, H*W, 4] (x0, y0, x1, y1) -> [N, C, H*W, 4], the max over the
    pool_size + 1 samples of each border; float32 or float16. Differentiable in input (the
    backward is tvm_ops.border_align_backward of the forward's argmax). The kernels work in
    NHWC: the input is copied into it and the result is a permuted view of the kernels'
    [N, H*W, 4, C] output. Rules: tvm_ops.border_align_forward."""
    _dense_tensors("border_align", input=input, boxes=boxes)
    if input.dim() != 4:  # before the permute, whose own error would name no argument
        raise BadParamError(f"border_align: input must have rank 4 [N, 4C, H, W], got shape {list(input.shape)}")
    _reverse_mode_only("border_align", input)
    output, _ = _border_forward(input.permute(0, 2, 3, 1), boxes, _pool_size(pool_size))
    return output.permute(0, 3, 1, 2)


def _pool_size(pool_size) -> int:
    # an integer as the kernels' checks take it (a float is refused, never truncated)
    return checks.int_param("border_align", "pool_size", pool_size, 1)


class BorderAlign(torch.nn.Module):
    """mmcv's `BorderAlign(pool_size)` layer: forward(input, boxes) = border_align(input, boxes,
    pool_size)."""

    def __init__(self, pool_size: int):
        super().__init__()
        self.pool_size = _pool_size(pool_size)

    def forward(self, input: Tensor, boxes: Tensor) -> Tensor:
        return border_align(input, boxes, self.pool_size)

    def extra_repr(self) -> str:
        return f"pool_size={self.pool_size}"


# --- BEV voxel pooling (BEVDepth) -----------------------------------------------------------


@custom_op("tvm_ops::voxel_pooling_forward")
def _voxel_forward(geom_xyz: Tensor, input_features: Tensor, num_voxel_x: int, num_voxel_y: int,
                   num_voxel_z: int) -> tuple[Tensor, Tensor]:
    from .ops.voxel_pooling_forward import voxel_pooling_forward

    return voxel_pooling_forward(_kernel_input(geom_xyz), _kernel_input(input_features), num_voxel_x, num_voxel_y,
                                 num_voxel_z, target=_target(input_features))


@_voxel_forward.register_fake
def _voxel_forward_shape(geom_xyz, input_features, num_voxel_x, num_voxel_y, num_voxel_z):
    _one_device("voxel_pooling", geom_xyz=geom_xyz, input_features=input_features)
    batch, points, channels = input_features.shape
    return (input_features.new_empty((batch, num_voxel_y, num_voxel_x, channels)),
            geom_xyz.new_empty((batch, points, 3)))


@custom_op("tvm_ops::voxel_pooling_backward")
def _voxel_backward(grad_output: Tensor, pos_memo: Tensor) -> Tensor:
    from .ops.voxel_pooling_backward import voxel_pooling_backward

    return voxel_pooling_backward(_kernel_input(grad_output), _kernel_input(pos_memo), target=_target(grad_output))


@_voxel_backward.register_fake
def _voxel_backward_shape(grad_output, pos_memo):
    _one_device("voxel_pooling_backward", grad_output=grad_output, pos_memo=pos_memo)
    batch, points, _ = pos_memo.shape
    return grad_output.new_empty((batch, points, grad_output.shape[3]))


def _voxel_setup_context(ctx, inputs, output):
    _without_gradient(ctx, output[1])
    ctx.save_for_backward(output[1])  # pos_memo: all the backward reads besides the gradient


def _voxel_grad(ctx, grad_output, _grad_pos_memo):
    if grad_output is None:  # undefined (_without_gradient): none for the input either
        return None, None, None, None, None
    (pos_memo,) = ctx.saved_tensors
    # the gradient of the [B, C, Y, X] permuted view comes back as a [B, Y, X, C] view of
    # channels-first memory: the backward rewrites it channels-last itself (on the CPU in
    # registers, several times faster than torch's permute-copy), then gathers whole rows
    return None, _voxel_backward(grad_output, pos_memo), None, None, None


_voxel_forward.register_autograd(_voxel_grad, setup_context=_voxel_setup_context)


@_traced_as_one_call
def voxel_pooling(geom_xyz: Tensor, input_features: Tensor, voxel_num) -> Tensor:
    """BEV voxel pooling, BEVDepth's `voxel_pooling_train` contract: geom_xyz [B, ..., 3]
    integer voxel coordinates (x, y, z) and input_features [B, ..., C] float32 with the same
    middle dims (cameras, depth bins, rows, columns: flattened to N points); voxel_num =
    (X, Y, Z), a sequence of ints or an integer tensor -> [B, C, Y, X], the sum of the
    features of the points in each voxel (a point outside the grid is dropped).

    Returns, as BEVDepth does, a permuted view of a contiguous [B, Y, X, C] tensor.
    Differentiable in input_features (the backward is tvm_ops.voxel_pooling_backward over
    the pos_memo the forward saved); no gradient for geom_xyz. geom_xyz may be int32 (what
    BEVDepth passes, after .int()) or int64 (values outside int32 are outside the grid, so
    they are clamped to -1 or INT32_MAX on the device before the conversion: the same points
    are dropped). A voxel_num tensor is read on the host: once per tensor and version for a
    CUDA tensor (interop.host_values), the one host synchronisation of these functions.
    torch.compile(fullgraph=True) and torch.export cannot trace that read: they need Python
    ints (a BadParamError says so; without fullgraph the call runs eagerly, a graph break).
    Rules and checks: tvm_ops.voxel_pooling_forward."""
    _dense_tensors("voxel_pooling", geom_xyz=geom_xyz, input_features=input_features)
    _reverse_mode_only("voxel_pooling", input_features)
    num_x, num_y, num_z = _voxel_num(voxel_num)
    if geom_xyz.dim() < 2 or geom_xyz.shape[-1] != 3 or input_features.dim() != geom_xyz.dim() or \
            geom_xyz.shape[:-1] != input_features.shape[:-1]:
        raise BadParamError(f"voxel_pooling: geom_xyz [B, ..., 3] and input_features [B, ..., C] must share their "
                            f"leading dims, got {list(geom_xyz.shape)} and {list(input_features.shape)}")
    if geom_xyz.dtype == torch.int64:
        geom_xyz = geom_xyz.clamp(-1, INT32_MAX).to(torch.int32)
    batch, channels = input_features.shape[0], input_features.shape[-1]
    points = math.prod(input_features.shape[1:-1])  # not -1: reshape cannot infer it with B or C = 0
    out, _ = _voxel_forward(geom_xyz.reshape(batch, points, 3), input_features.reshape(batch, points, channels),
                            num_x, num_y, num_z)
    return out.permute(0, 3, 1, 2)


voxel_pooling_train = voxel_pooling  # BEVDepth's name (bevdepth.ops.voxel_pooling_train)


def _voxel_num(voxel_num) -> tuple[int, int, int]:
    if isinstance(voxel_num, Tensor):
        if voxel_num.dtype.is_floating_point or voxel_num.dtype == torch.bool or voxel_num.numel() != 3:
            raise BadParamError(f"voxel_pooling: voxel_num must be 3 integers (X, Y, Z), got a {voxel_num.dtype} "
                                f"tensor of shape {list(voxel_num.shape)}")
        if torch.compiler.is_compiling():  # a traced tensor has no values to read
            raise BadParamError("voxel_pooling: voxel_num is read on the host, which torch.compile(fullgraph=True) "
                                "and torch.export cannot trace from a tensor; pass (X, Y, Z) as Python ints, "
                                "e.g. tuple(voxel_num.tolist()) read once outside the traced code")
        return interop.host_values(voxel_num, _three_ints)
    values = list(voxel_num)
    if len(values) != 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                    for v in values):
        raise BadParamError(f"voxel_pooling: voxel_num must be 3 integers (X, Y, Z), got {voxel_num!r}")
    return tuple(int(v) for v in values)


def _three_ints(values: np.ndarray) -> tuple[int, int, int]:
    """The three values of a host copy of voxel_num (module level: host_values keys its cache
    by the converter)."""
    return tuple(int(v) for v in values.reshape(-1))


# --- three_nn / three_interpolate (PointNet++ feature propagation) ---------------------------


@custom_op("tvm_ops::three_nn")
def _three_nn(unknown: Tensor, known: Tensor) -> tuple[Tensor, Tensor]:
    from .ops.three_nn import three_nn

    return three_nn(_kernel_input(unknown), _kernel_input(known), target=_target(unknown))


@_three_nn.register_fake
def _three_nn_shape(unknown, known):
    _one_device("three_nn", unknown=unknown, known=known)
    return unknown.new_empty(unknown.shape, dtype=torch.float32), unknown.new_empty(unknown.shape, dtype=torch.int32)


def _three_nn_setup_context(ctx, inputs, output):
    _without_gradient(ctx, *output)


def _three_nn_grad(ctx, _grad_dist2, _grad_idx):
    return None, None  # a selection: no gradient (mmcv's ThreeNN returns none either)


# registered so that inputs which require grad give outputs that do not (instead of torch's
# "autograd kernel not registered" error at backward time)
_three_nn.register_autograd(_three_nn_grad, setup_context=_three_nn_setup_context)


@_traced_as_one_call
def three_nn(unknown: Tensor, known: Tensor) -> tuple[Tensor, Tensor]:
    """mmcv's `three_nn`: unknown [B, N, 3], known [B, M, 3] (float32 or float16, M >= 3) ->
    (dist [B, N, 3] float32, the Euclidean distances ascending, idx [B, N, 3] int32); of equal
    distances the lower index first. Not differentiable (the outputs never require grad).
    NaN / inf distances never rank; a slot no finite distance reaches is (inf, -1). Rules:
    tvm_ops.three_nn (which returns the squared distances)."""
    _dense_tensors("three_nn", unknown=unknown, known=known)
    dist2, idx = _three_nn(unknown, known)
    return dist2.sqrt(), idx


@custom_op("tvm_ops::three_interpolate_forward")
def _three_interpolate_forward(features: Tensor, indices: Tensor, weight: Tensor) -> Tensor:
    from .ops.three_interpolate_forward import three_interpolate_forward

    return three_interpolate_forward(_kernel_input(features), _int32(indices, "indices", "three_interpolate"),
                                     _kernel_input(weight), target=_target(features))


@_three_interpolate_forward.register_fake
def _three_interpolate_forward_shape(features, indices, weight):
    _one_device("three_interpolate", features=features, indices=indices, weight=weight)
    return features.new_empty((features.shape[0], features.shape[1], indices.shape[1]))


@custom_op("tvm_ops::three_interpolate_backward")
def _three_interpolate_backward(grad_output: Tensor, indices: Tensor, weight: Tensor, m: int) -> Tensor:
    from .ops.three_interpolate_backward import three_interpolate_backward

    return three_interpolate_backward(_kernel_input(grad_output), _int32(indices, "indices", "three_interpolate"),
                                      _kernel_input(weight), m, target=_target(grad_output))


@_three_interpolate_backward.register_fake
def _three_interpolate_backward_shape(grad_output, indices, weight, m):
    _one_device("three_interpolate_backward", grad_output=grad_output, indices=indices, weight=weight)
    return grad_output.new_empty((grad_output.shape[0], grad_output.shape[1], m))


def _three_interpolate_setup_context(ctx, inputs, output):
    features, indices, weight = inputs
    ctx.save_for_backward(indices, weight)
    ctx.m = features.shape[2]


def _three_interpolate_grad(ctx, grad_output):
    indices, weight = ctx.saved_tensors
    grad_features = _three_interpolate_backward(grad_output, indices, weight, ctx.m)
    return grad_features, None, None  # as mmcv: no gradient for the indices or the weights


_three_interpolate_forward.register_autograd(_three_interpolate_grad, setup_context=_three_interpolate_setup_context)


@_traced_as_one_call
def three_interpolate(features: Tensor, indices: Tensor, weight: Tensor) -> Tensor:
    """mmcv's `three_interpolate`: features [B, C, M], indices [B, N, 3] (int32, or int64 that
    fits), weight [B, N, 3] (the dtype of features: float32 or float16) -> [B, C, N], the
    weighted sum of the three indexed features; indices outside [0, M) contribute nothing.
    Differentiable in features (the backward is tvm_ops.three_interpolate_backward with
    m = M); as mmcv's, no gradient flows to weight. Rules: tvm_ops.three_interpolate_forward."""
    _dense_tensors("three_interpolate", features=features, indices=indices, weight=weight)
    _reverse_mode_only("three_interpolate", features)
    return _three_interpolate_forward(features, indices, weight)


# --- dynamic scatter (MVXNet's dynamic voxel feature encoder) --------------------------------


@custom_op("tvm_ops::dynamic_scatter_forward")
def _scatter_forward(feats: Tensor, coors: Tensor, reduce_type: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from .ops.dynamic_scatter_forward import dynamic_scatter_forward

    # a point with any negative coordinate is dropped, however negative: int64 ones below
    # int32 are taken as -1
    return dynamic_scatter_forward(_kernel_input(feats), _int32(coors, "coors", "dynamic_scatter", True),
                                   reduce_type, target=_target(feats))


@_scatter_forward.register_fake
def _scatter_forward_shape(feats, coors, reduce_type):
    _one_device("dynamic_scatter", feats=feats, coors=coors)
    # the number of voxels depends on the coordinates' values: an unbacked symbolic size
    voxels = torch.library.get_ctx().new_dynamic_size()
    int32 = torch.int32
    return (feats.new_empty((voxels, feats.shape[1])), coors.new_empty((voxels, coors.shape[1]), dtype=int32),
            coors.new_empty((coors.shape[0],), dtype=int32), coors.new_empty((voxels,), dtype=int32))


@custom_op("tvm_ops::dynamic_scatter_backward")
def _scatter_backward(grad_voxel_feats: Tensor, feats: Tensor, voxel_feats: Tensor, point2voxel_map: Tensor,
                      voxel_points_count: Tensor, reduce_type: str) -> Tensor:
    from .ops.dynamic_scatter_backward import dynamic_scatter_backward

    return dynamic_scatter_backward(_kernel_input(grad_voxel_feats), _kernel_input(feats), _kernel_input(voxel_feats),
                                    _kernel_input(point2voxel_map), _kernel_input(voxel_points_count), None,
                                    reduce_type, target=_target(feats))


@_scatter_backward.register_fake
def _scatter_backward_shape(grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count, reduce_type):
    _one_device("dynamic_scatter_backward", grad_voxel_feats=grad_voxel_feats, feats=feats, voxel_feats=voxel_feats,
                point2voxel_map=point2voxel_map, voxel_points_count=voxel_points_count)
    return torch.empty_like(feats)


def _scatter_setup_context(ctx, inputs, output):
    feats, _coors, reduce_type = inputs
    voxel_feats, _voxel_coors, point2voxel_map, voxel_points_count = output
    _without_gradient(ctx, *output[1:])
    ctx.save_for_backward(feats, voxel_feats, point2voxel_map, voxel_points_count)
    ctx.reduce_type = reduce_type


def _scatter_grad(ctx, grad_voxel_feats, _grad_coors, _grad_map, _grad_count):
    if grad_voxel_feats is None:  # undefined (_without_gradient): none for feats either
        return None, None, None
    feats, voxel_feats, point2voxel_map, voxel_points_count = ctx.saved_tensors
    grad_feats = _scatter_backward(grad_voxel_feats, feats, voxel_feats, point2voxel_map,
                                   voxel_points_count, ctx.reduce_type)
    return grad_feats, None, None


_scatter_forward.register_autograd(_scatter_grad, setup_context=_scatter_setup_context)


@_traced_as_one_call
def dynamic_scatter(feats: Tensor, coors: Tensor, reduce_type: str = "max") -> tuple[Tensor, Tensor]:
    """mmcv's `dynamic_scatter` (DynamicScatterFunction.apply): feats [N, C] float32, coors
    [N, D] (int32, or int64 up to INT32_MAX) -> (voxel_feats [M, C], voxel_coors [M, D] int32): the
    distinct coordinate rows of the points without a negative coordinate, in lexicographic
    order, and the max, sum or mean of each one's points' features (in point order: the same
    bits every run, on CPU and CUDA). Differentiable in feats (the backward is
    tvm_ops.dynamic_scatter_backward over the point2voxel_map and voxel_points_count the
    forward saved). M depends on the values: on CUDA reading it is the call's one host
    synchronisation; under torch.compile it is an unbacked symbolic size. Rules:
    tvm_ops.dynamic_scatter_forward."""
    _dense_tensors("dynamic_scatter", feats=feats, coors=coors)
    _reverse_mode_only("dynamic_scatter", feats)
    voxel_feats, voxel_coors, _, _ = _scatter_forward(feats, coors, reduce_type)
    return voxel_feats, voxel_coors


class DynamicScatter(torch.nn.Module):
    """mmcv's `DynamicScatter(voxel_size, point_cloud_range, average_points)` layer:
    forward(points, coors) = dynamic_scatter(points, coors, "mean" if average_points else
    "max"). voxel_size and point_cloud_range are kept for the interface (the coordinates
    arrive already voxelised). Batched coordinates [N, 4] (batch, z, y, x) are scattered in
    one call: the voxels of every sample, batch index first; mmcv loops over the batch indices
    0 .. coors[-1, 0], which gives the same result when the last point holds the largest
    batch index (mmdet3d's order)."""

    def __init__(self, voxel_size, point_cloud_range, average_points: bool):
        super().__init__()
        self.voxel_size, self.point_cloud_range = voxel_size, point_cloud_range
        self.average_points = bool(average_points)

    def forward(self, points: Tensor, coors: Tensor) -> tuple[Tensor, Tensor]:
        return dynamic_scatter(points, coors, "mean" if self.average_points else "max")

    def extra_repr(self) -> str:
        return (f"voxel_size={self.voxel_size}, point_cloud_range={self.point_cloud_range}, "
                f"average_points={self.average_points}")
