"""`bench --functions`: the differentiable torch functions (tvm_ops.functional) on the spec's
network cases, forward alone (under no_grad) and a training step (forward + backward),
against the PyTorch formulation the networks fall back to, timed in the same run on the
same tensors and device. Efficiency is the theory io / ops of the kernels a step runs (the
specs of the forward and, for a step, the backward) against this run's stream bandwidth and
the CPU's peak."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import runner
from .bench import median_seconds, peak_flops
from .ops import get
from .targets import TargetModel
from .testing import material


@dataclass
class FunctionLine:
    function: str
    case: str
    mode: str  # "forward" or "train"
    median_ms: float
    io_efficiency: float
    compute_efficiency: float | None
    peer: str
    peer_ms: float

    def text(self) -> str:
        compute = f"{self.compute_efficiency:6.1%}" if self.compute_efficiency is not None else "    - "
        return (f"{self.function:16s} {self.case:26s} {self.mode:8s} {self.median_ms:10.3f} ms  "
                f"io {self.io_efficiency:6.1%}  compute {compute}  peer {self.peer} {self.peer_ms:10.2f} ms  "
                f"x{self.peer_ms / self.median_ms:6.1f}")


def _timed(function, case, ours, peer, peer_name, leaves, grad, costs, repeat, device, bandwidth, peak):
    """FunctionLines of one case: `ours` and `peer` (callables over `leaves`) timed forward
    alone (no_grad) and as a training step (forward, then backward of `grad`); costs =
    {"forward": (io, ops), "train": (io, ops)} of the kernels each mode runs."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else None

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn(*leaves)
        return run

    def step(fn):
        def run():
            for leaf in leaves:
                leaf.grad = None
            fn(*leaves).backward(grad)
        return run

    for mode, wrap in (("forward", no_grad), ("train", step)):
        timed = {}
        for name, fn in (("tvm_ops", ours), (peer_name, peer)):
            run = wrap(fn)
            run()  # build or load kernels, warm the allocator
            timed[name] = median_seconds(run, repeat if name == "tvm_ops" else max(3, repeat // 2), sync)
        seconds = timed["tvm_ops"]
        io, ops = costs[mode]
        yield FunctionLine(function, case.name, mode, seconds * 1e3, io / seconds / bandwidth,
                           (ops / seconds / peak) if peak and ops else None, peer_name, timed[peer_name] * 1e3)


def _torch_inputs(op, case, device):
    """The spec case's inputs (numpy, params) and the same as torch tensors on `device`."""
    import torch

    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
    return inputs, params, {name: torch.from_numpy(np.ascontiguousarray(v)).to(device) for name, v in inputs.items()}


def _setup(forward_name: str, backward_name: str, model: TargetModel, case_name: str | None):
    """(forward op, backward op, device, peak FLOP/s, the network cases the call asks for) of
    a function whose kernels are `forward_name` and `backward_name`."""
    forward, backward = get(forward_name), get(backward_name)
    cases = [c for c in forward.spec.cases_in("network") if not case_name or c.name == case_name]
    return forward, backward, "cuda" if model.kind == "cuda" else "cpu", peak_flops(model), cases


def _costs(forward, backward, shape, forward_params=None, backward_params=None) -> dict:
    """{"forward": (io, ops), "train": (io, ops)} of the kernels each mode runs (float32)."""
    fwd = forward.spec.theory(shape, 4, forward_params)
    bwd = backward.spec.theory(shape, 4, backward_params)
    return {"forward": fwd, "train": (fwd[0] + bwd[0], fwd[1] + bwd[1])}


def ms_deform_attn_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.ms_deform_attn vs mmcv's grid_sample formulation."""
    import torch

    from . import functional
    from .testing.ms_deform_attn_backward import msda_pytorch

    forward, backward, device, peak, cases = _setup("ms_deform_attn_forward", "ms_deform_attn_backward", model, case_name)
    for case in cases:
        inputs, params, t = _torch_inputs(forward, case, device)
        shapes = t["spatial_shapes"].long()  # what mmcv's callers pass
        starts = t["level_start_index"].long()
        levels = [tuple(x) for x in inputs["spatial_shapes"].tolist()]
        leaves = [t[k].clone().requires_grad_(True) for k in ("value", "sampling_loc", "attn_weight")]
        grad = torch.randn(leaves[0].shape[0], leaves[1].shape[1], leaves[0].shape[2] * leaves[0].shape[3],
                           device=device)

        def ours(value, loc, attn):
            return functional.ms_deform_attn(value, shapes, starts, loc, attn, params["im2col_step"])

        def peer(value, loc, attn):
            return msda_pytorch(value, levels, loc, attn)

        costs = _costs(forward, backward, case.shape, params, params)
        yield from _timed("ms_deform_attn", case, ours, peer, "grid_sample", leaves, grad, costs, repeat, device,
                          bandwidth, peak)


def border_align_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.border_align (mmcv's NCHW layout, the permutes
    included) vs the fastest stock formulation of the forward's bench, run through autograd."""
    import torch

    from . import functional
    from .testing.border_align_forward import torch_forward_per_sample

    forward, backward, device, peak, cases = _setup("border_align_forward", "border_align_backward", model, case_name)
    for case in cases:
        _, params, t = _torch_inputs(forward, case, device)
        pool = params["pool_size"]
        boxes = t["boxes"]
        leaves = [t["input"].permute(0, 3, 1, 2).contiguous().requires_grad_(True)]  # NCHW, as mmcv's callers
        n, q, h, w = leaves[0].shape
        grad = torch.randn(n, q // 4, h * w, 4, device=device)

        def ours(feat):
            return functional.border_align(feat, boxes, pool)

        def peer(feat):
            return torch_forward_per_sample(feat.permute(0, 2, 3, 1), boxes, pool)[0].permute(0, 3, 1, 2)

        costs = _costs(forward, backward, case.shape, params, dict(params, height=h, width=w))
        yield from _timed("border_align", case, ours, peer, "per_sample", leaves, grad, costs, repeat, device,
                          bandwidth, peak)


def three_interpolate_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.three_interpolate vs the stock gather formulation
    (torch.gather of the three neighbours, weighted and summed), run through autograd."""
    import torch

    from . import functional
    from .testing.three_interpolate_forward import gather_formulation

    forward, backward, device, peak, cases = _setup("three_interpolate_forward", "three_interpolate_backward", model, case_name)
    for case in cases:
        _, _, t = _torch_inputs(forward, case, device)
        indices, weight = t["indices"], t["weights"]  # the case's indices are all in [0, M)
        index = indices.long()
        leaves = [t["features"].clone().requires_grad_(True)]
        grad = torch.randn(leaves[0].shape[0], leaves[0].shape[1], indices.shape[1], device=device)

        def ours(features):
            return functional.three_interpolate(features, indices, weight)

        def peer(features):
            return gather_formulation(features, index, weight)

        costs = _costs(forward, backward, case.shape)
        yield from _timed("three_interpolate", case, ours, peer, "gather", leaves, grad, costs, repeat, device,
                          bandwidth, peak)


FUNCTIONS = {"ms_deform_attn": ms_deform_attn_cases, "border_align": border_align_cases,
             "three_interpolate": three_interpolate_cases}
