"""The custom ops of tvm_ops.functional, and their plain eager calls without the dispatcher.

Each torch function is a `torch.library.custom_op`, so that torch.compile, fake and meta
tensors, torch.func.vmap, dispatch and function modes, jit tracing and the profiler see one
op, with its fake implementation and its autograd formula (torch.func's grad, vjp, jacrev,
jvp and jacfwd are refused: functional.py). A plain eager call pays for
that machinery: the dispatcher's round trips and the custom op's autograd wrapper cost ~5-8
us of a forward and ~25 us of a training step on the CPU, more than a small case's kernels
(docs/performance.md). So `custom_op` registers the custom op and returns a `CustomOp`
that runs a plain call -- every tensor a plain strided tensor with storage (an nn.Parameter
too) on the CPU or a GPU, made outside all of the above -- straight to the op's implementation: through
a torch.autograd.Function built from the op's own setup_context and backward formula when a
tensor requires grad (what the custom op's autograd runs), else as a function call. Any
other call goes through the custom op.

Under torch.autocast (mixed-precision training, on the CPU or a GPU, float16 or bfloat16)
every op runs in float32: its autocast rule casts the floating inputs to float32 and its
outputs are float32, torch's rule for the ops it keeps in float32 and what BEVFormer's
MultiScaleDeformableAttnFunction_fp32 does. These ops sum many products (scatters,
interpolations), most have float32 kernels only, and a model's float32 inputs (weights from
three_nn, boxes, sampling locations) meet its lower-precision activations there, a call
the dtype checks would otherwise refuse.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)  # Parameter disables __torch_function__


def _torch_probe(name: str):
    """torch._C's probe `name` (e.g. whether a function mode is on); where this torch has no
    such probe, one that always answers yes (every call then takes the custom op)."""
    probe = torch._C
    for part in name.split("."):
        probe = getattr(probe, part, None)
    return probe if callable(probe) else (lambda: True)


_FUNCTION_MODE_ON = _torch_probe("_is_torch_function_mode_enabled")  # torch.device contexts too
FUNCTORCH_ON = _torch_probe("_are_functorch_transforms_active")  # vmap, torch.func.grad, jvp
_PROFILER_ON = _torch_probe("_autograd._profiler_enabled")  # the profiler names the op
_AUTOCAST_ON = _torch_probe("_is_any_autocast_enabled")  # the autocast rule casts the inputs
# a tensor without storage (autograd's is_grads_batched hands a backward batched gradients of
# torch's older vmap, which functorch's probe does not see) takes the custom op and its
# batching rule; where torch has no such probe, every tensor is taken as storage-less
_HAS_STORAGE = getattr(torch._C, "_has_storage", None) or (lambda tensor: False)
# the device types whose autocast gets the float32 rule (a CPU-only torch has CUDA's too)
AUTOCAST_DEVICES = tuple(device for device in ("cpu", "cuda") if torch.amp.is_autocast_available(device))


def plain_context() -> bool:
    """Whether calls made now need nothing of a custom op but its implementation and autograd
    formula: no tracing or compiling, no dispatch mode (fake tensors, flop counters) or
    function mode, no functorch transform, no profiler, no autocast."""
    return not (torch.compiler.is_compiling() or torch.jit.is_tracing() or is_in_torch_dispatch_mode()
                or _FUNCTION_MODE_ON() or FUNCTORCH_ON() or _PROFILER_ON() or _AUTOCAST_ON())


class CustomOp:
    """A custom op (`op`: what torch.ops.tvm_ops holds) and the direct way to run it."""

    def __init__(self, name: str, implementation):
        self.name = name
        self.op = torch.library.custom_op(name, mutates_args=())(implementation)
        for device in AUTOCAST_DEVICES:
            self.op.register_autocast(device, torch.float32)
        self.implementation = implementation
        self.function = None  # the torch.autograd.Function of a plain call, once registered
        self.register_fake = self.op.register_fake

    def register_autograd(self, backward, setup_context) -> None:
        self.op.register_autograd(backward, setup_context=setup_context)
        self.function = _autograd_function(self.name, self.implementation, backward, setup_context)

    def __call__(self, *args):
        if not plain_context():
            return self.op(*args)
        needs_grad = False
        for arg in args:  # plain strided tensors off the meta device (one loop: this runs per call)
            if isinstance(arg, torch.Tensor):
                if type(arg) not in _PLAIN_TYPES or arg.is_meta or arg.layout is not torch.strided or \
                        not _HAS_STORAGE(arg):
                    return self.op(*args)
                needs_grad = needs_grad or arg.requires_grad
        if needs_grad and torch.is_grad_enabled():
            # an op without a formula keeps the custom op's answer (torch's error at backward)
            return self.op(*args) if self.function is None else self.function.apply(*args)
        return self.implementation(*args)


def custom_op(name: str):
    """Decorator: the implementation registered as the custom op `name` (no mutated
    arguments), returned as a CustomOp."""
    return lambda implementation: CustomOp(name, implementation)


def _autograd_function(name: str, implementation, backward, setup_context):
    def forward(ctx, *args):
        output = implementation(*args)
        setup_context(ctx, args, output)
        return output

    return type(name.replace("::", "_"), (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})
