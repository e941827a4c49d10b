"""PyTorch's deterministic mode: calls whose kernels add in an order that changes from run to
run (the CUDA atomics) are refused under `torch.use_deterministic_algorithms(True)`, or warned
about under `warn_only=True`, before any kernel runs; the deterministic kernels never are."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import tvm_ops
from tvm_ops import runner, targets
from tvm_ops.ops import NAMES, get
from tvm_ops.testing import material

from .conftest import requires_torch

# the CUDA kernels that add with atomics (docs/semantics.md, Determinism)
ATOMIC_ON_CUDA = {"border_align_backward", "ms_deform_attn_backward", "three_interpolate_backward",
                  "voxel_pooling_forward"}


def problem_on(device):
    return SimpleNamespace(device=device, dtype="float32", sizes={"B": 2, "C": 4, "N": 8, "M": 8}, params={})


@pytest.mark.parametrize("name", NAMES)
def test_only_the_cuda_atomic_kernels_add_in_any_order(name):
    op = get(name)
    cuda_plan = op.plan(targets.resolve("cuda"), op.schedules["cuda"].defaults)
    assert op.adds_in_any_order(problem_on("cuda"), cuda_plan) == (name in ATOMIC_ON_CUDA)
    assert not op.adds_in_any_order(problem_on("cpu"), op.plan(targets.resolve("llvm"), op.schedules["llvm"].defaults))


def test_the_cuda_owners_of_three_interpolate_backward_add_in_a_fixed_order():
    op = get("three_interpolate_backward")
    knobs = {**op.schedules["cuda"].defaults, "kernel": "owner"}
    assert not op.adds_in_any_order(problem_on("cuda"), op.plan(targets.resolve("cuda"), knobs))


@pytest.fixture
def deterministic_mode():
    """torch.use_deterministic_algorithms, restored afterwards."""
    import torch

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture
def atomic_on_cpu(monkeypatch):
    """three_interpolate_backward's CPU calls declared as adding in any order (as its CUDA
    scatter does), so that the call path's refusal runs here; its torch inputs and a NaN out=."""
    import torch

    op = get("three_interpolate_backward")
    monkeypatch.setattr(type(op), "adds_in_any_order", lambda self, problem, plan: True)
    op.clear_call_cache()
    case = next(c for c in op.spec.cases if c.expect == "ok" and not c.heavy and all(c.shape.values()))
    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
    args = [torch.from_numpy(inputs[name]) for name in ("grad_output", "indices", "weights")]
    expected = tvm_ops.three_interpolate_backward(*(a.numpy() for a in args), params["m"])
    yield op, args, params["m"], expected
    op.clear_call_cache()


@requires_torch
def test_deterministic_mode_refuses_before_any_kernel_runs(deterministic_mode, atomic_on_cpu):
    import torch

    op, args, m, expected = atomic_on_cpu
    out = torch.full(expected.shape, float("nan"))
    tvm_ops.three_interpolate_backward(*args, m)  # the call's plan is made with the mode off
    deterministic_mode(True)
    for _ in range(2):  # the mode is read on every call, a repeated one's too
        with pytest.raises(tvm_ops.NotDeterministicError, match="three_interpolate_backward.*atomics"):
            tvm_ops.three_interpolate_backward(*args, m, out=out)
    assert torch.isnan(out).all()
    with pytest.raises(RuntimeError):  # what PyTorch raises for its own such operations
        tvm_ops.three_interpolate_backward(*args, m)


@requires_torch
def test_warn_only_warns_and_computes(deterministic_mode, atomic_on_cpu):
    op, args, m, expected = atomic_on_cpu
    deterministic_mode(True, warn_only=True)
    with pytest.warns(UserWarning, match="three_interpolate_backward.*warn_only"):
        result = tvm_ops.three_interpolate_backward(*args, m)
    np.testing.assert_array_equal(result.numpy(), expected)
    deterministic_mode(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(tvm_ops.three_interpolate_backward(*args, m).numpy(), expected)


@requires_torch
def test_deterministic_kernels_run_in_deterministic_mode(deterministic_mode):
    import torch

    op = get("three_interpolate_backward")
    op.clear_call_cache()
    grad_output = torch.rand(2, 3, 5)
    indices = torch.randint(0, 4, (2, 5, 3), dtype=torch.int32)
    weights = torch.rand(2, 5, 3)
    expected = tvm_ops.three_interpolate_backward(grad_output.numpy(), indices.numpy(), weights.numpy(), 4)
    deterministic_mode(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = tvm_ops.three_interpolate_backward(grad_output, indices, weights, 4)
    np.testing.assert_array_equal(result.numpy(), expected)


@requires_torch
def test_a_cuda_atomic_call_is_refused_in_deterministic_mode(deterministic_mode):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch (the CUDA atomic kernels need one)")
    from tvm_ops import functional

    features = torch.rand(1, 2, 4, device="cuda", requires_grad=True)
    indices = torch.zeros(1, 3, 3, dtype=torch.int32, device="cuda")
    weight = torch.full((1, 3, 3), 1 / 3, device="cuda")
    deterministic_mode(True)
    out = functional.three_interpolate(features, indices, weight)
    with pytest.raises(tvm_ops.NotDeterministicError):
        out.sum().backward()
