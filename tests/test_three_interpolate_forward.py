"""three_interpolate_forward: properties against the float64 reference, the adjoint of
three_interpolate_backward, dtypes, out=, torch, bad input and index safety."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import build, metrics, targets
from tvm_ops.ops import get
from tvm_ops.testing import material

from .conftest import requires_torch, use_knobs

OP = get("three_interpolate_forward")
TESTING = material(OP)


def inputs(b, c, m, n, dtype="float32", low=None, high=None, seed=0):
    rng = np.random.default_rng(seed)
    low = 0 if low is None else low
    high = max(m, 1) if high is None else high
    return (rng.uniform(-1, 1, (b, c, m)).astype(dtype),
            rng.integers(low, high, (b, n, 3)).astype(np.int32),
            rng.uniform(0, 1, (b, n, 3)).astype(dtype))


def check_against_reference(f, idx, w, result, dtype):
    ref = TESTING.reference({"features": f, "indices": idx, "weights": w}, {})["output"]
    assert metrics.accuracy(result, ref, dtype).failures(OP.spec.accuracy[dtype]) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), c=st.integers(1, 40), m=st.integers(1, 140), n=st.integers(1, 150),
       spill=st.integers(0, 40), dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 2**16))
def test_random_shapes_with_out_of_range_indices(b, c, m, n, spill, dtype, seed):
    f, idx, w = inputs(b, c, m, n, dtype, low=-spill, high=m + spill, seed=seed)
    out = tvm_ops.three_interpolate_forward(f, idx, w)
    assert out.shape == (b, c, n) and out.dtype == np.dtype(dtype)
    check_against_reference(f, idx, w, out, dtype)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), c=st.integers(1, 40), m=st.integers(1, 100), n=st.integers(1, 120),
       spill=st.integers(0, 20), seed=st.integers(0, 2**16))
def test_forward_is_the_adjoint_of_the_backward(b, c, m, n, spill, seed):
    # <forward(f), g> == <f, backward(g)>: the two ops agree on every index rule
    f, idx, w = inputs(b, c, m, n, low=-spill, high=m + spill, seed=seed)
    g = np.random.default_rng(seed + 1).uniform(-1, 1, (b, c, n)).astype(np.float32)
    forward = tvm_ops.three_interpolate_forward(f, idx, w).astype(np.float64)
    backward = tvm_ops.three_interpolate_backward(g, idx, w, m).astype(np.float64)
    lhs, rhs = (forward * g).sum(), (f * backward).sum()
    scale = (np.abs(forward) * np.abs(g)).sum() + 1e-30
    assert abs(lhs - rhs) <= 1e-5 * scale


CPU_PLANS = {"tiles": {"plan": "tiles", "channel_vectors": 1}, "tiles_x4": {"plan": "tiles", "channel_vectors": 4},
             "gather": {"plan": "gather"}}


@pytest.fixture(params=list(CPU_PLANS.values()), ids=list(CPU_PLANS))
def cpu_plan(request, monkeypatch):
    """Each CPU plan as the default: tiles (transposed feature tiles; with four channel
    vectors per task, the last task's whole vectors go one at a time) and gather (vector
    gathers, also the tiles plan's fallback for small sizes and its last C % lanes channels)."""
    use_knobs(monkeypatch, OP, request.param)
    yield request.param
    OP.clear_call_cache()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 2), c=st.integers(1, 70), m=st.integers(1, 70), n=st.integers(1, 70),
       spill=st.integers(0, 10), dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 2**16))
def test_each_cpu_plan_matches_the_reference_and_the_portable_kernel(cpu_plan, b, c, m, n, spill, dtype, seed):
    """Shapes around the tiles plan's edges (C, M and N below, at and past a vector, with
    tails), out-of-range indices with NaN weights there: the reference's values and the
    portable kernel's bits (a call of fewer points than a vector runs it)."""
    f, idx, w = inputs(b, c, m, n, dtype, low=-spill, high=m + spill, seed=seed)
    w[(idx < 0) | (idx >= m)] = np.nan
    out = tvm_ops.three_interpolate_forward(f, idx, w)
    check_against_reference(f, idx, w, out, dtype)
    portable = np.concatenate([tvm_ops.three_interpolate_forward(f, idx[:, i:i + 1], w[:, i:i + 1])
                               for i in range(n)], axis=2)
    assert np.array_equal(out, portable)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("m", [1, 2, 15, 16])
def test_rows_of_up_to_16_features_are_looked_up_in_a_register(m, dtype):
    """AVX-512: each channel's row of M <= 16 features held in one register, the neighbours
    picked by lane permutes: the reference's values and the portable kernel's bits, with
    indices past both ends (NaN weights there) and infinite and NaN features in the columns
    no index reads (the register holds them: they must not leak into a sum)."""
    from tvm_ops import dispatch
    from tvm_ops.ops.cpu_ir import has_lane_lookup
    from tvm_ops.ops.three_interpolate_forward import KERNELS, cpu_kernel

    model = targets.resolve("llvm")
    if not has_lane_lookup(model.features()):
        pytest.skip("this host has no 16-entry lane lookup (AVX-512)")
    assert cpu_kernel(dispatch.kernels(OP, dtype, model), dtype, {"B": 2, "C": 37, "M": m, "N": 45}) == KERNELS[3]
    f, idx, w = inputs(2, 37, m, 45, dtype, low=-3, high=m + 3, seed=m)
    read = (m + 1) // 2
    idx[(idx >= read) & (idx < m)] = m + 1  # the columns from `read` on: never an index's
    f[:, :, read:] = np.where(np.arange(m - read) % 2, np.inf, np.nan).astype(dtype)
    w[(idx < 0) | (idx >= m)] = np.nan
    out = tvm_ops.three_interpolate_forward(f, idx, w)
    assert np.isfinite(out).all()
    check_against_reference(f, idx, w, out, dtype)
    portable = np.concatenate([tvm_ops.three_interpolate_forward(f, idx[:, i:i + 1], w[:, i:i + 1])
                               for i in range(45)], axis=2)
    assert np.array_equal(out, portable)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_tiles_plan_on_avx2_gives_the_host_bits(dtype):
    """8-lane squares (three rounds of shuffles) on an AVX2 target: the same bits as this
    host's plan, whole channel vectors, their tail and the gather plan's last channels."""
    if targets.missing_features(targets.resolve("llvm:haswell")):
        pytest.skip("this host cannot run AVX2 code")
    f, idx, w = inputs(2, 37, 30, 45, dtype, low=-3, high=33, seed=5)
    avx2 = tvm_ops.three_interpolate_forward(f, idx, w, target="llvm:haswell")
    assert np.array_equal(avx2, tvm_ops.three_interpolate_forward(f, idx, w))
    check_against_reference(f, idx, w, avx2, dtype)


def test_out_of_range_indices_contribute_nothing_even_with_nan_weights():
    f, idx, w = inputs(2, 5, 4, 30)
    idx[:, ::2, 1] = 7  # >= M
    idx[:, 1::2, 2] = -3
    idx[0, 5] = [2**31 - 1, -(2**31), 4]
    w[:, ::2, 1] = np.nan
    w[:, 1::2, 2] = np.inf
    w[0, 5] = np.nan
    out = tvm_ops.three_interpolate_forward(f, idx, w)
    assert np.isfinite(out).all() and (out[0, :, 5] == 0).all()
    check_against_reference(f, idx, w, out, "float32")


def test_float16_sums_in_float32_and_rounds_once():
    # 2048 + 1 + 1 in float16 steps would round to 2048 twice; summed in float32 it is 2050
    f = np.array([[[2048.0, 1.0, 1.0]]], np.float16)
    idx = np.array([[[0, 1, 2]]], np.int32)
    w = np.ones((1, 1, 3), np.float16)
    assert tvm_ops.three_interpolate_forward(f, idx, w).tolist() == [[[2050.0]]]


@pytest.mark.parametrize("m", [1, 2, 3, 40])
def test_float16_vector_gathers_pick_each_column(m):
    """The CPU's float16 gathers read a pair of halves and keep one (gather_ir): every
    column, the first and the last included, gives the portable kernel's bits (a call with
    fewer points than a vector runs it). M = 1 has no pair: it runs the portable kernel."""
    f, idx, w = inputs(2, 5, m, 64, "float16", seed=m)
    idx[:, :, 0] = 0
    idx[:, :, 1] = m - 1
    vector = tvm_ops.three_interpolate_forward(f, idx, w)
    portable = np.concatenate([tvm_ops.three_interpolate_forward(f, idx[:, i:i + 8], w[:, i:i + 8])
                               for i in range(0, 64, 8)], axis=2)
    assert np.array_equal(vector, portable)
    check_against_reference(f, idx, w, vector, "float16")


def test_output_never_written_outside_the_callers_buffer():
    f, idx, w = inputs(2, 7, 20, 37, low=-5, high=25)
    size = 2 * 7 * 37
    big = np.full(size + 64, -7.0, np.float32)
    out = big[32:32 + size].reshape(2, 7, 37)
    assert tvm_ops.three_interpolate_forward(f, idx, w, out=out) is out
    assert (big[:32] == -7).all() and (big[-32:] == -7).all()
    check_against_reference(f, idx, w, out, "float32")


def test_m_zero_gives_zeros():
    f, idx, w = inputs(2, 3, 0, 5, high=4)
    assert (tvm_ops.three_interpolate_forward(f, idx, w) == 0).all()


def test_one_kernel_serves_many_shapes():
    tvm_ops.three_interpolate_forward(*inputs(1, 3, 5, 40))
    tvm_ops.three_interpolate_forward(*inputs(1, 3, 5, 2))  # the small kernel
    tvm_ops.three_interpolate_forward(*inputs(2, 64, 300, 200))  # the parallel build
    before = build.build_count
    for shape in [(2, 17, 9, 33), (3, 64, 250, 100), (1, 1, 1, 1), (4, 5, 3000, 16), (1, 9, 8, 17)]:
        f, idx, w = inputs(*shape)
        check_against_reference(f, idx, w, tvm_ops.three_interpolate_forward(f, idx, w), "float32")
    assert build.build_count == before


@pytest.mark.parametrize("edit, match", [
    (lambda f, i, w: (f, i.astype(np.int64), w), "indices must have dtype int32"),
    (lambda f, i, w: (f, i, w.astype(np.float16)), "the dtype of features"),
    (lambda f, i, w: (f, i[:, :, :2], w[:, :, :2]), r"indices.shape\[2\] must be 3"),
    (lambda f, i, w: (f, i, w[:, :-1]), r"weights.shape\[1\] \(N\)"),
    (lambda f, i, w: (f[:1], i, w), r"indices.shape\[0\] \(B\) must equal features.shape\[0\] = 1"),
    (lambda f, i, w: (f[:, :0], i, w), "must be non-zero"),
])
def test_bad_input_is_a_bad_param_error(edit, match):
    with pytest.raises(tvm_ops.BadParamError, match=match):
        tvm_ops.three_interpolate_forward(*edit(*inputs(2, 3, 6, 5)))


def test_a_wrong_out_shape_is_refused():
    f, idx, w = inputs(2, 3, 6, 5)
    with pytest.raises(tvm_ops.BadParamError, match="out"):
        tvm_ops.three_interpolate_forward(f, idx, w, out=np.zeros((2, 3, 6), np.float32))


@requires_torch
def test_torch_in_torch_out():
    import torch

    f, idx, w = inputs(2, 6, 11, 40, dtype="float16")
    out = tvm_ops.three_interpolate_forward(torch.from_numpy(f), torch.from_numpy(idx), torch.from_numpy(w))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    check_against_reference(f, idx, w, out.numpy(), "float16")
