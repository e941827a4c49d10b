"""three_interpolate_backward: properties, checks, interop and dispatch."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import build, metrics
from tvm_ops.ops import get
from tvm_ops.ops.three_interpolate_backward import CAST, OWNER_KERNELS, SCATTER
from tvm_ops.testing import material

from .conftest import requires_torch

OP = get("three_interpolate_backward")
TESTING = material(OP)



def inputs(b, c, n, m, dtype="float32", low=None, high=None, seed=0):
    rng = np.random.default_rng(seed)
    low = 0 if low is None else low
    high = max(m, 1) if high is None else high
    return (rng.uniform(-1, 1, (b, c, n)).astype(dtype),
            rng.integers(low, high, (b, n, 3)).astype(np.int32),
            rng.uniform(0, 1, (b, n, 3)).astype(dtype))


def check_against_reference(go, idx, w, m, result, dtype):
    ref = TESTING.reference({"grad_output": go, "indices": idx, "weights": w}, {"m": m})["grad_features"]
    acc = metrics.accuracy(result, ref, dtype)
    assert acc.failures(OP.spec.accuracy[dtype]) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), c=st.integers(1, 70), n=st.integers(1, 150), m=st.integers(1, 140),
       spill=st.integers(0, 40), dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 2**16))
def test_random_shapes_with_out_of_range_indices(b, c, n, m, spill, dtype, seed):
    go, idx, w = inputs(b, c, n, m, dtype, low=-spill, high=m + spill, seed=seed)
    out = tvm_ops.three_interpolate_backward(go, idx, w, m)
    assert out.shape == (b, c, m) and out.dtype == np.dtype(dtype)
    check_against_reference(go, idx, w, m, out, dtype)


def test_out_of_range_indices_contribute_nothing_even_with_nan_weights():
    go, idx, w = inputs(2, 5, 30, 4)
    idx[:, ::2, 1] = 7  # >= M
    idx[:, 1::2, 2] = -3
    w[:, ::2, 1] = np.nan
    w[:, 1::2, 2] = np.inf
    out = tvm_ops.three_interpolate_backward(go, idx, w, 4)
    assert np.isfinite(out).all()
    check_against_reference(go, idx, w, 4, out, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("c", [1, 3, 4, 5, 17, 40])
def test_narrow_and_wide_kernels_agree_with_the_reference(c, dtype):
    # every CPU kernel (launch picks one by C, N and M), with tails of N, M and of a channel
    # vector; and the scatter and cast computes, CUDA's kernels, built here as written: serial
    # (atomics apart)
    import tvm

    from tvm_ops import dispatch, targets
    from tvm_ops.ops.three_interpolate_backward.compute import cast_compute, scatter_compute

    model = targets.resolve("llvm")
    kernels = dict(dispatch.kernels(OP, dtype, model))
    as_written = tvm.IRModule({name: compute(dtype, name).with_attr("global_symbol", name)
                               for name, compute in ((SCATTER, scatter_compute), (CAST, cast_compute))})
    cuda_computes = tvm.tirx.build(as_written, target=model.tvm_target())
    kernels |= {name: cuda_computes[name] for name in (SCATTER, CAST)}
    go, idx, w = inputs(2, c, 300, 77, dtype, low=-5, high=90, seed=c)
    for name in OWNER_KERNELS:
        out = np.full((2, c, 77), np.nan, dtype)
        kernels[name](go, idx, w, out)
        check_against_reference(go, idx, w, 77, out, dtype)
    acc, out = np.zeros((2, c, 77), np.float32), np.full((2, c, 77), np.nan, dtype)
    kernels[SCATTER](go, idx, w, acc)  # the scatter adds into a zero-filled float32 accumulator
    kernels[CAST](acc, out)
    check_against_reference(go, idx, w, 77, out, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_narrow_kernel_takes_many_rows_in_one_pass(dtype):
    # an owner per (b, c) row, whatever M: far more rows than a tile held, M and N not whole
    # vectors, indices past both ends
    from tvm_ops import dispatch, targets
    from tvm_ops.ops.three_interpolate_backward import cpu_kernel

    model = targets.resolve("llvm")
    kernels = dispatch.kernels(OP, dtype, model)
    assert cpu_kernel({"C": 2, "N": 37, "M": 5003}, kernels.plan) == OWNER_KERNELS[2]
    go, idx, w = inputs(3, 2, 37, 5003, dtype, low=-40, high=5043, seed=5)
    out = np.full((3, 2, 5003), np.nan, dtype)
    kernels[OWNER_KERNELS[2]](go, idx, w, out)
    check_against_reference(go, idx, w, 5003, out, dtype)
    assert np.array_equal(out, tvm_ops.three_interpolate_backward(go, idx, w, 5003))


def test_one_kernel_serves_many_shapes():
    # a small call and a large one: the one-core build and the parallel one (the policy's choice)
    tvm_ops.three_interpolate_backward(*inputs(1, 3, 5, 2), 2)
    tvm_ops.three_interpolate_backward(*inputs(2, 64, 300, 500), 500)
    before = build.build_count
    for shape in [(2, 17, 33, 9), (3, 64, 100, 250), (1, 1, 1, 1), (4, 40, 7, 3000)]:
        go, idx, w = inputs(*shape)
        out = tvm_ops.three_interpolate_backward(go, idx, w, shape[3])
        check_against_reference(go, idx, w, shape[3], out, "float32")
    assert build.build_count == before


def test_out_writes_into_the_callers_buffer_and_gives_m():
    go, idx, w = inputs(2, 6, 20, 5)
    out = np.full((2, 6, 5), 123.0, np.float32)
    result = tvm_ops.three_interpolate_backward(go, idx, w, out=out)
    assert result is out
    check_against_reference(go, idx, w, 5, out, "float32")


def test_m_zero_gives_an_empty_output():
    go, idx, w = inputs(2, 3, 4, 1)
    out = tvm_ops.three_interpolate_backward(go, idx, w, 0)
    assert out.shape == (2, 3, 0)


def test_non_contiguous_inputs_are_made_contiguous():
    go, idx, w = inputs(2, 8, 30, 6)
    wide = np.zeros((2, 8, 60), np.float32)
    wide[:, :, ::2] = go
    out = tvm_ops.three_interpolate_backward(wide[:, :, ::2], idx, w, 6)
    check_against_reference(go, idx, w, 6, out, "float32")


def test_misaligned_input_data():
    go, idx, w = inputs(2, 8, 30, 6)
    storage = np.zeros(go.size + 1, np.float32)
    shifted = storage[1:].reshape(go.shape)  # 4 bytes off any 64-byte boundary
    shifted[...] = go
    out = tvm_ops.three_interpolate_backward(shifted, idx, w, 6)
    check_against_reference(go, idx, w, 6, out, "float32")


# --- checks: type, status and a message naming the tensor ------------------------
GOOD = dict(zip(("grad_output", "indices", "weights"), inputs(2, 4, 6, 3)))


def call(m=3, out=None, **changes):
    args = dict(GOOD, **changes)
    return tvm_ops.three_interpolate_backward(args["grad_output"], args["indices"], args["weights"], m, out=out)


@pytest.mark.parametrize("changes, error, pattern", [
    ({"indices": None}, tvm_ops.BadParamError, r"indices is missing"),
    ({"weights": [[1.0]]}, tvm_ops.BadParamError, r"weights must be a numpy array"),
    ({"grad_output": np.zeros((2, 4), np.float32)}, tvm_ops.BadParamError,
     r"grad_output must have rank 3 \[B, C, N\], got rank 2"),
    ({"indices": np.zeros((2, 6, 3, 1), np.int32)}, tvm_ops.BadParamError, r"indices must have rank 3"),
    ({"grad_output": np.zeros((2, 4, 6), np.float64)}, tvm_ops.BadParamError,
     r"grad_output must have dtype float32 or float16, got float64"),
    ({"indices": np.zeros((2, 6, 3), np.int64)}, tvm_ops.BadParamError, r"indices must have dtype int32, got int64"),
    ({"weights": np.zeros((2, 6, 3), np.float16)}, tvm_ops.BadParamError,
     r"weights must have the dtype of grad_output \(float32\), got float16"),
    ({"indices": np.zeros((3, 6, 3), np.int32)}, tvm_ops.BadParamError,
     r"indices.shape\[0\] \(B\) must equal grad_output.shape\[0\] = 2, got 3"),
    ({"indices": np.zeros((2, 5, 3), np.int32)}, tvm_ops.BadParamError,
     r"indices.shape\[1\] \(N\) must equal grad_output.shape\[2\] = 6, got 5"),
    ({"weights": np.zeros((2, 6, 2), np.float32)}, tvm_ops.BadParamError, r"weights.shape\[2\] must be 3, got 2"),
    ({"indices": np.zeros((2, 6, 4), np.int32)}, tvm_ops.BadParamError, r"indices.shape\[2\] must be 3, got 4"),
    ({"grad_output": np.zeros((0, 4, 6), np.float32), "indices": np.zeros((0, 6, 3), np.int32),
      "weights": np.zeros((0, 6, 3), np.float32)}, tvm_ops.BadParamError, r"B, C, N must be non-zero, got B=0"),
    ({"grad_output": np.zeros((2, 0, 6), np.float32)}, tvm_ops.BadParamError, r"must be non-zero, got B=2, C=0"),
])
def test_bad_inputs(changes, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        call(**changes)
    assert info.value.status == error.status


@pytest.mark.parametrize("m, pattern", [(-1, r"m must be >= 0, got -1"), (2.5, r"m must be an integer"),
                                        (True, r"m must be an integer"), (None, r"m is required")])
def test_bad_m(m, pattern):
    with pytest.raises(tvm_ops.BadParamError, match=pattern):
        call(m=m)


def test_out_checks():
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_features'\].shape\[2\] \(M\) must equal m = 3, got 4"):
        call(out=np.zeros((2, 4, 4), np.float32))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_features'\] must have the dtype of"):
        call(out=np.zeros((2, 4, 3), np.float16))
    strided = np.zeros((2, 4, 6), np.float32)[:, :, ::2]
    with pytest.raises(tvm_ops.NotSupportedError, match=r"must be C-contiguous, got strides \[24, 6, 2\] for shape "
                       r"\[2, 4, 3\]; strided outputs are not supported") as info:
        call(out=strided)
    assert info.value.status == "NOT_SUPPORTED"


def test_checks_run_in_the_mlu_ops_order():
    # rank is reported before dtype, dtype before shapes
    with pytest.raises(tvm_ops.BadParamError, match="rank"):
        call(grad_output=np.zeros((2, 4), np.float64))
    with pytest.raises(tvm_ops.BadParamError, match="dtype"):
        call(grad_output=np.zeros((5, 4, 6), np.float64))


def test_large_tensors_are_not_supported_without_touching_data():
    huge = np.broadcast_to(np.zeros(1, np.float32), (1, 2**16, 2**15))  # 2^31 elements, no memory
    idx = np.zeros((1, 2**15, 3), np.int32)
    w = np.zeros((1, 2**15, 3), np.float32)
    with pytest.raises(tvm_ops.NotSupportedError, match=r"grad_output has 2147483648 elements") as info:
        tvm_ops.three_interpolate_backward(huge, idx, w, 4)
    assert info.value.status == "NOT_SUPPORTED"
    # an M just below 2^31: the owners' tile count ceil(M / m_tile) wrapped in int32, so no
    # tile ran and the output came back unwritten; refused before any allocation
    with pytest.raises(tvm_ops.NotSupportedError, match=r"grad_features has 2147483646 elements"):
        tvm_ops.three_interpolate_backward(*inputs(1, 1, 4, 4), 2**31 - 2)


def test_errors_form_one_family():
    assert issubclass(tvm_ops.BadParamError, ValueError)
    for cls in (tvm_ops.BadParamError, tvm_ops.NotSupportedError, tvm_ops.ArchMismatchError):
        assert issubclass(cls, tvm_ops.OpError)
    assert tvm_ops.ArchMismatchError.status == "ARCH_MISMATCH"


def test_unknown_target():
    with pytest.raises(tvm_ops.BadParamError, match="unknown target 'tpu'"):
        tvm_ops.three_interpolate_backward(*GOOD.values(), 3, target="tpu")


# --- torch interop ------------------------------------------------------------
@requires_torch
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_torch_in_torch_out(dtype):
    import torch

    go, idx, w = inputs(2, 9, 40, 7, dtype)
    out = tvm_ops.three_interpolate_backward(torch.from_numpy(go), torch.from_numpy(idx), torch.from_numpy(w), 7)
    assert isinstance(out, torch.Tensor) and out.dtype == getattr(torch, dtype)
    check_against_reference(go, idx, w, 7, out.numpy(), dtype)


@requires_torch
def test_torch_out_buffer_is_written_in_place():
    import torch

    go, idx, w = inputs(2, 9, 40, 7)
    out = torch.full((2, 9, 7), 5.0)
    result = tvm_ops.three_interpolate_backward(torch.from_numpy(go), torch.from_numpy(idx),
                                                torch.from_numpy(w), out=out)
    assert result is out
    check_against_reference(go, idx, w, 7, out.numpy(), "float32")


@requires_torch
def test_mixed_kinds_and_torch_dtypes_are_rejected():
    import torch

    go, idx, w = inputs(2, 9, 40, 7)
    with pytest.raises(tvm_ops.BadParamError, match="indices is a numpy tensor on cpu but grad_output is a torch"):
        tvm_ops.three_interpolate_backward(torch.from_numpy(go), idx, torch.from_numpy(w), 7)
    with pytest.raises(tvm_ops.BadParamError, match="got bfloat16"):
        tvm_ops.three_interpolate_backward(torch.from_numpy(go).bfloat16(), torch.from_numpy(idx),
                                           torch.from_numpy(w).bfloat16(), 7)


@requires_torch
def test_torch_peer_matches_the_reference():
    case = OP.spec.case("bnd_out_of_range_idx")
    data, params = TESTING.make_inputs(case, "float32", np.random.default_rng(1))
    ref = TESTING.reference(data, params)["grad_features"]
    for name, peer in TESTING.peers(data, params).items():
        result = peer().numpy()
        assert metrics.accuracy(result, ref, "float32").failures(OP.spec.accuracy["float32"]) == [], name
