"""`bench --functions`: the differentiable torch functions (tvm_ops.functional) on the spec's
network cases, forward alone (under no_grad) and a training step (forward + backward),
against the PyTorch formulation the networks fall back to, timed in the same run on the
same tensors and device. Efficiency is the theory io / ops of the kernels a step runs (the
specs of the forward and, for a step, the backward) against this run's stream bandwidth and
the CPU's peak."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import runner
from .bench import Timed, call_timing, interleaved_medians, on_device, peak_flops, peer_rounds
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
    peer: str  # the fastest formulation of this run
    peer_ms: float
    other_peers: dict  # {name: ms} of the others

    def text(self) -> str:
        compute = f"{self.compute_efficiency:6.1%}" if self.compute_efficiency is not None else "    - "
        others = "".join(f"  [{name} {ms:.2f} ms x{ms / self.median_ms:.1f}]" for name, ms in self.other_peers.items())
        return (f"{self.function:16s} {self.case:26s} {self.mode:8s} {self.median_ms:10.3f} ms  "
                f"io {self.io_efficiency:6.1%}  compute {compute}  peer {self.peer} {self.peer_ms:10.2f} ms  "
                f"x{self.peer_ms / self.median_ms:6.1f}{others}")


def _timed(function, case, ours, peers: dict, leaves, grad, costs, repeat, device, bandwidth, peak):
    """FunctionLines of one case: `ours` and each of `peers` ({name: callable}, over `leaves`)
    timed forward alone (no_grad) and as a training step (forward, then backward of `grad`),
    the ratio against the fastest peer of each mode; costs = {"forward": (io, ops), "train":
    (io, ops)} of the kernels each mode runs."""
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
        timings = {}
        sides = [("tvm_ops", ours, "tvm", repeat)] + [(name, peer, "torch", peer_rounds(repeat))
                                                      for name, peer in peers.items()]
        for name, fn, library, rounds in sides:
            run = wrap(fn)
            # the tensors a peer makes land on the case's device (ours place their own)
            placed = functools.partial(on_device, torch.device(device if library == "torch" else "cpu"))
            placed(run)()  # build or load kernels, warm the allocator
            timings[name] = Timed(placed(call_timing(run, sync)), library, rounds)
        timed = interleaved_medians(timings, repeat)
        seconds = timed["tvm_ops"]
        peer_ms = {name: timed[name] * 1e3 for name in peers}
        fastest = min(peer_ms, key=peer_ms.get)
        io, ops = costs[mode]
        yield FunctionLine(function, case.name, mode, seconds * 1e3, io / seconds / bandwidth,
                           (ops / seconds / peak) if peak and ops else None, fastest, peer_ms.pop(fastest), peer_ms)


def _torch_inputs(op, case, device):
    """The spec case's inputs (numpy, params) and the same as torch tensors on `device`."""
    import torch

    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
    return inputs, params, {name: torch.from_numpy(np.ascontiguousarray(v)).to(device) for name, v in inputs.items()}


# the forward and backward operator each function's training step runs
FUNCTION_OPS = {"ms_deform_attn": ("ms_deform_attn_forward", "ms_deform_attn_backward"),
                "border_align": ("border_align_forward", "border_align_backward"),
                "voxel_pooling": ("voxel_pooling_forward", "voxel_pooling_backward"),
                "three_interpolate": ("three_interpolate_forward", "three_interpolate_backward"),
                "dynamic_scatter": ("dynamic_scatter_forward", "dynamic_scatter_backward")}


def _ops_device_peak(function: str, model: TargetModel):
    """(forward op, backward op of `function`, the torch device of `model`, its peak FLOP/s)."""
    forward_name, backward_name = FUNCTION_OPS[function]
    return get(forward_name), get(backward_name), "cuda" if model.kind == "cuda" else "cpu", peak_flops(model)


def _network_cases(op, device: str, case_name: str | None):
    """(case, numpy inputs, params, torch inputs on `device`) of each network case of op's
    spec, only case_name's when given."""
    for case in op.spec.cases_in("network"):
        if case_name and case.name != case_name:
            continue
        yield (case, *_torch_inputs(op, case, device))


def _costs(forward, backward, shape, forward_params=None, backward_params=None) -> dict:
    """{"forward": (io, ops), "train": (io, ops)} of the kernels each mode runs (float32); a
    step's ops are unknown (None) when either spec has no ops formula."""
    fwd = forward.spec.theory(shape, 4, forward_params)
    bwd = backward.spec.theory(shape, 4, backward_params)
    ops = None if None in (fwd[1], bwd[1]) else fwd[1] + bwd[1]
    return {"forward": fwd, "train": (fwd[0] + bwd[0], ops)}


def ms_deform_attn_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.ms_deform_attn vs mmcv's grid_sample formulation
    and the corners' rows by index_select where they fit (testing.ms_deform_attn_backward)."""
    import torch

    from . import functional
    from .testing.ms_deform_attn_backward import msda_pytorch, msda_pytorch_rows, rows_fit

    forward, backward, device, peak = _ops_device_peak("ms_deform_attn", model)
    for case, inputs, params, t in _network_cases(forward, device, case_name):
        shapes = t["spatial_shapes"].long()  # what mmcv's callers pass
        starts = t["level_start_index"].long()
        levels = [tuple(x) for x in inputs["spatial_shapes"].tolist()]
        leaves = [t[k].clone().requires_grad_(True) for k in ("value", "sampling_loc", "attn_weight")]
        grad = torch.randn(leaves[0].shape[0], leaves[1].shape[1], leaves[0].shape[2] * leaves[0].shape[3],
                           device=device)

        def ours(value, loc, attn):
            return functional.ms_deform_attn(value, shapes, starts, loc, attn, params["im2col_step"])

        peers = {"grid_sample": functools.partial(_msda_peer, msda_pytorch, levels)}
        if rows_fit(leaves[0], leaves[1]):
            peers["index_select"] = functools.partial(_msda_peer, msda_pytorch_rows, levels)

        costs = _costs(forward, backward, case.shape, params, params)
        yield from _timed("ms_deform_attn", case, ours, peers, leaves, grad, costs, repeat, device,
                          bandwidth, peak)


def _msda_peer(formulation, levels, value, loc, attn):
    return formulation(value, levels, loc, attn)


def border_align_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.border_align (mmcv's NCHW layout, the permutes
    included) vs the fastest stock formulation of the forward's bench, run through autograd."""
    import torch

    from . import functional
    from .testing.border_align_forward import torch_forward_per_sample

    forward, backward, device, peak = _ops_device_peak("border_align", model)
    for case, _, params, t in _network_cases(forward, device, case_name):
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
        yield from _timed("border_align", case, ours, {"per_sample": peer}, leaves, grad, costs, repeat, device,
                          bandwidth, peak)


def voxel_pooling_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.voxel_pooling vs BEVDepth's pooling in stock
    PyTorch (index_add_ of the kept points' features, autograd's gather back) and the same
    sum over every point with a spare row (testing.voxel_pooling_forward; index_put_, the
    slowest in every run, is left to the forward's bench)."""
    import torch

    from . import functional

    forward, backward, device, peak = _ops_device_peak("voxel_pooling", model)
    for case, _, params, t in _network_cases(forward, device, case_name):
        voxel_num = [params[k] for k in ("num_voxel_x", "num_voxel_y", "num_voxel_z")]
        geom = t["geom_xyz"]
        leaves = [t["input_features"].clone().requires_grad_(True)]
        grad = torch.randn(geom.shape[0], leaves[0].shape[2], voxel_num[1], voxel_num[0], device=device)

        def ours(feat):
            return functional.voxel_pooling(geom, feat, voxel_num)

        peers = {name: functools.partial(_voxel_pool_peer, geom, voxel_num, name)
                 for name in ("index_add_", "index_add_(spare_row)", "scatter_add_(spare_row)")}

        # the backward's sizes: B, N, C of the points and the forward's grid (Y, X)
        costs = _costs(forward, backward, case.shape, params)
        yield from _timed("voxel_pooling", case, ours, peers, leaves, grad, costs, repeat, device,
                          bandwidth, peak)


def _voxel_pool_peer(geom, voxel_num, formulation, feat):
    from .testing.voxel_pooling_forward import voxel_pool_pytorch

    return voxel_pool_pytorch(geom, feat, *voxel_num, formulation)[0].permute(0, 3, 1, 2)


def three_interpolate_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.three_interpolate vs the stock gather formulation
    (torch.gather of the three neighbours, weighted and summed) and the product by the
    interpolation matrix (one torch.bmm), run through autograd."""
    import torch

    from . import functional
    from .testing.three_interpolate_forward import dense_formulation, gather_formulation

    forward, backward, device, peak = _ops_device_peak("three_interpolate", model)
    for case, _, _, t in _network_cases(forward, device, case_name):
        indices, weight = t["indices"], t["weights"]  # the case's indices are all in [0, M)
        index = indices.long()
        leaves = [t["features"].clone().requires_grad_(True)]
        grad = torch.randn(leaves[0].shape[0], leaves[0].shape[1], indices.shape[1], device=device)

        def ours(features):
            return functional.three_interpolate(features, indices, weight)

        peers = {name: functools.partial(formulation, index=index, weights=weight)
                 for name, formulation in (("gather", gather_formulation), ("dense_bmm", dense_formulation))}

        costs = _costs(forward, backward, case.shape)
        yield from _timed("three_interpolate", case, ours, peers, leaves, grad, costs, repeat, device,
                          bandwidth, peak)


def dynamic_scatter_cases(model: TargetModel, bandwidth: float, repeat: int, case_name: str | None):
    """FunctionLines of tvm_ops.functional.dynamic_scatter vs the fastest stock formulation of
    the forward's bench (torch.unique of an int64 key per row, scatter_reduce / index_add),
    run through autograd."""
    import torch

    from . import functional
    from .testing.dynamic_scatter_forward import dynamic_scatter_pytorch

    forward, backward, device, peak = _ops_device_peak("dynamic_scatter", model)
    for case, _, params, t in _network_cases(forward, device, case_name):
        reduce_type, coors = params["reduce_type"], t["coors"]
        leaves = [t["feats"].clone().requires_grad_(True)]
        grad = torch.randn(case.shape["M"], case.shape["C"], device=device)

        def ours(feats):
            return functional.dynamic_scatter(feats, coors, reduce_type)[0]

        def peer(feats):
            return dynamic_scatter_pytorch(feats, coors, reduce_type)[0]

        costs = _costs(forward, backward, case.shape, params, params)
        yield from _timed("dynamic_scatter", case, ours, {"key+unique": peer}, leaves, grad, costs, repeat, device,
                          bandwidth, peak)


FUNCTIONS = {"ms_deform_attn": ms_deform_attn_cases, "border_align": border_align_cases,
             "voxel_pooling": voxel_pooling_cases, "three_interpolate": three_interpolate_cases,
             "dynamic_scatter": dynamic_scatter_cases}
