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


def ms_deform_attn_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.ms_deform_attn vs mmcv's grid_sample formulation."""
    import torch

    from . import functional
    from .testing.ms_deform_attn_backward import msda_pytorch

    forward, backward = get("ms_deform_attn_forward"), get("ms_deform_attn_backward")
    device = "cuda" if model.kind == "cuda" else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else None
    peak = peak_flops(model)
    for case in forward.spec.cases_in("network"):
        if case_name and case.name != case_name:
            continue
        inputs, params = material(forward).make_inputs(case, "float32", runner.case_rng(forward.name, case.name,
                                                                                       "float32"))
        t = {name: torch.from_numpy(np.ascontiguousarray(v)).to(device) for name, v in inputs.items()}
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

        itemsize = 4
        fwd_io, fwd_ops = forward.spec.theory(case.shape, itemsize, params)
        bwd_io, bwd_ops = backward.spec.theory(case.shape, itemsize, params)
        for mode, wrap, io, ops in (("forward", no_grad, fwd_io, fwd_ops),
                                    ("train", step, fwd_io + bwd_io, fwd_ops + bwd_ops)):
            timed = {}
            for name, fn in (("tvm_ops", ours), ("grid_sample", peer)):
                run = wrap(fn)
                run()  # build or load kernels, warm the allocator
                timed[name] = median_seconds(run, repeat if name == "tvm_ops" else max(3, repeat // 2), sync)
            seconds = timed["tvm_ops"]
            yield FunctionLine("ms_deform_attn", case.name, mode, seconds * 1e3, io / seconds / bandwidth,
                               (ops / seconds / peak) if peak else None, "grid_sample", timed["grid_sample"] * 1e3)


FUNCTIONS = {"ms_deform_attn": ms_deform_attn_cases}
