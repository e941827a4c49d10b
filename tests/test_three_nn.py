"""three_nn: properties against the float64 reference, mmcv's tie rule, dtypes, out=,
torch, bad input and NaN safety."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import build
from tvm_ops.ops import get
from tvm_ops.testing import material

from .conftest import requires_torch

OP = get("three_nn")
TESTING = material(OP)


def grid_points(rng, shape, half=128, dtype="float32"):
    """Multiples of 1/64 with |k| <= half: squared distances exact in float32 (ties stay ties)."""
    return (rng.integers(-half, half + 1, shape) / 64).astype(dtype)


def reference(unknown, known):
    ref = TESTING.reference({"unknown": unknown, "known": known}, {})
    return ref["dist2"], ref["idx"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), n=st.integers(1, 150), m=st.integers(3, 140), half=st.sampled_from([0, 1, 3, 128]),
       dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 2**16))
def test_grid_points_match_the_reference_exactly(b, n, m, half, dtype, seed):
    # on the grid every distance is exact, so every index must be the reference's, ties included
    rng = np.random.default_rng(seed)
    unknown, known = grid_points(rng, (b, n, 3), half, dtype), grid_points(rng, (b, m, 3), half, dtype)
    dist2, idx = tvm_ops.three_nn(unknown, known)
    assert dist2.dtype == np.float32 and idx.dtype == np.int32 and dist2.shape == idx.shape == (b, n, 3)
    ref_d, ref_i = reference(unknown, known)
    np.testing.assert_array_equal(dist2, ref_d)
    np.testing.assert_array_equal(idx, ref_i)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), n=st.integers(1, 100), m=st.integers(3, 300), scale=st.sampled_from([1e-3, 1.0, 1e3]),
       seed=st.integers(0, 2**16))
def test_arbitrary_points_pick_a_true_top3(b, n, m, scale, seed):
    # off the grid float32 rounding may swap near-equal neighbours: each pick must still be a
    # point at the reference's k-th distance (to float32 accuracy), and the picks distinct
    rng = np.random.default_rng(seed)
    unknown = (rng.normal(size=(b, n, 3)) * scale).astype(np.float32)
    known = (rng.normal(size=(b, m, 3)) * scale).astype(np.float32)
    dist2, idx = tvm_ops.three_nn(unknown, known)
    ref_d, _ = reference(unknown, known)
    np.testing.assert_allclose(dist2, ref_d, rtol=1e-5, atol=1e-6 * scale**2)
    picked = np.square(unknown.astype(np.float64)[:, :, None] - np.take_along_axis(
        known.astype(np.float64)[:, None], idx[..., None].astype(np.int64), 2)).sum(-1)
    np.testing.assert_allclose(picked, ref_d, rtol=1e-5, atol=1e-6 * scale**2)
    assert (np.sort(idx, -1)[..., 1:] != np.sort(idx, -1)[..., :-1]).all()
    assert (np.diff(dist2, axis=-1) >= 0).all()


def test_ties_rank_the_lower_index_first():
    # known points 0..7: indices 6, 2, 4, 1 at distance 1 (in that scan order they are 1, 2, 4,
    # 6), the others farther; unknown point at the origin
    known = np.full((1, 8, 3), 5.0, np.float32)
    for i, axis in ((6, 0), (2, 1), (4, 2), (1, 0)):
        known[0, i] = 0
        known[0, i, axis] = 1.0 if i != 1 else -1.0
    dist2, idx = tvm_ops.three_nn(np.zeros((1, 1, 3), np.float32), known)
    assert idx.tolist() == [[[1, 2, 4]]] and dist2.tolist() == [[[1.0, 1.0, 1.0]]]
    # all known points equal: 0, 1, 2 whichever vector lane or tail the unknown point is in
    unknown = np.random.default_rng(1).normal(size=(2, 37, 3)).astype(np.float32)
    _, idx = tvm_ops.three_nn(unknown, np.ones((2, 9, 3), np.float32))
    assert (idx == [0, 1, 2]).all()


def test_m_exactly_three_orders_all_known_points():
    rng = np.random.default_rng(3)
    unknown, known = grid_points(rng, (2, 40, 3)), grid_points(rng, (2, 3, 3))
    dist2, idx = tvm_ops.three_nn(unknown, known)
    assert (np.sort(idx, -1) == [0, 1, 2]).all()
    np.testing.assert_array_equal(dist2, reference(unknown, known)[0])


def test_float16_inputs_give_the_float32_results_of_the_same_values():
    rng = np.random.default_rng(4)
    unknown, known = grid_points(rng, (2, 50, 3), dtype="float16"), grid_points(rng, (2, 20, 3), dtype="float16")
    d16, i16 = tvm_ops.three_nn(unknown, known)
    d32, i32 = tvm_ops.three_nn(unknown.astype(np.float32), known.astype(np.float32))
    assert d16.dtype == np.float32
    np.testing.assert_array_equal(d16, d32)
    np.testing.assert_array_equal(i16, i32)


def test_nan_and_inf_coordinates_never_rank_and_stay_in_bounds():
    rng = np.random.default_rng(5)
    unknown, known = grid_points(rng, (1, 40, 3)), grid_points(rng, (1, 10, 3))
    unknown[0, 3, 1] = np.nan
    unknown[0, 35, 0] = np.inf
    known[0, [0, 4], 2] = np.nan
    known[0, 7, 0] = -np.inf
    dist2, idx = tvm_ops.three_nn(unknown, known)
    ref_d, ref_i = reference(unknown, known)
    np.testing.assert_array_equal(dist2, ref_d)
    np.testing.assert_array_equal(idx, ref_i)
    assert idx[0, 3].tolist() == [-1, -1, -1] and np.isposinf(dist2[0, 3]).all()
    assert not np.isin(idx, [0, 4, 7]).any()
    # only two finite known points: the third slot stays (inf, -1)
    known[0, 2:] = np.nan
    dist2, idx = tvm_ops.three_nn(unknown, known)
    assert (idx[0, :, 2] == -1).all() and np.isposinf(dist2[0, :, 2]).all()
    assert set(np.unique(idx[0, :, :2])) <= {-1, 0, 1}


def test_outputs_never_written_outside_the_callers_buffers():
    rng = np.random.default_rng(6)
    unknown, known = grid_points(rng, (2, 45, 3)), grid_points(rng, (2, 12, 3))
    unknown[0, 0] = np.nan
    size = unknown.size
    d_big, i_big = np.full(size + 64, -7.0, np.float32), np.full(size + 64, -7, np.int32)
    dist2, idx = d_big[32:32 + size].reshape(unknown.shape), i_big[32:32 + size].reshape(unknown.shape)
    result = tvm_ops.three_nn(unknown, known, out=(dist2, idx))
    assert result[0] is dist2 and result[1] is idx
    assert (d_big[:32] == -7).all() and (d_big[-32:] == -7).all() and (i_big[:32] == -7).all()
    assert (i_big[-32:] == -7).all()
    ref_d, ref_i = reference(unknown, known)
    np.testing.assert_array_equal(dist2, ref_d)
    np.testing.assert_array_equal(idx, ref_i)


def test_out_takes_either_buffer_alone():
    rng = np.random.default_rng(7)
    unknown, known = grid_points(rng, (1, 20, 3)), grid_points(rng, (1, 5, 3))
    idx = np.zeros((1, 20, 3), np.int32)
    dist2, same = tvm_ops.three_nn(unknown, known, out=(None, idx))
    assert same is idx
    np.testing.assert_array_equal(idx, reference(unknown, known)[1])


def test_one_kernel_serves_many_shapes():
    rng = np.random.default_rng(8)
    tvm_ops.three_nn(grid_points(rng, (1, 40, 3)), grid_points(rng, (1, 4, 3)))
    tvm_ops.three_nn(grid_points(rng, (1, 2, 3)), grid_points(rng, (1, 4, 3)))  # the small kernel
    tvm_ops.three_nn(grid_points(rng, (2, 200, 3)), grid_points(rng, (2, 500, 3)))  # the parallel build
    before = build.build_count
    for b, n, m in [(2, 33, 9), (3, 100, 250), (1, 1, 3), (4, 7, 3000), (1, 64, 64)]:
        unknown, known = grid_points(rng, (b, n, 3)), grid_points(rng, (b, m, 3))
        dist2, idx = tvm_ops.three_nn(unknown, known)
        np.testing.assert_array_equal(idx, reference(unknown, known)[1])
    assert build.build_count == before


@pytest.mark.parametrize("known_shape, unknown_dtype, match", [
    ((1, 2, 3), "float32", r"M\) must be at least 3"),
    ((1, 0, 3), "float32", r"M\) must be at least 3"),
    ((1, 5, 2), "float32", r"known.shape\[2\] must be 3"),
    ((1, 5, 3), "float64", "unknown must have dtype float32 or float16"),
    ((2, 5, 3), "float32", r"known.shape\[0\] \(B\) must equal unknown.shape\[0\] = 1"),
])
def test_bad_input_is_a_bad_param_error(known_shape, unknown_dtype, match):
    unknown = np.zeros((1, 4, 3), unknown_dtype)
    with pytest.raises(tvm_ops.BadParamError, match=match):
        tvm_ops.three_nn(unknown, np.zeros(known_shape, np.float32))


def test_known_must_have_the_dtype_of_unknown_and_out_must_be_a_pair():
    with pytest.raises(tvm_ops.BadParamError, match="the dtype of unknown"):
        tvm_ops.three_nn(np.zeros((1, 4, 3), np.float32), np.zeros((1, 5, 3), np.float16))
    with pytest.raises(tvm_ops.BadParamError, match="out must be a pair"):
        tvm_ops.three_nn(np.zeros((1, 4, 3), np.float32), np.zeros((1, 5, 3), np.float32),
                         out=np.zeros((1, 4, 3), np.float32))


@requires_torch
def test_torch_in_torch_out():
    import torch

    rng = np.random.default_rng(9)
    unknown, known = grid_points(rng, (2, 30, 3)), grid_points(rng, (2, 8, 3))
    dist2, idx = tvm_ops.three_nn(torch.from_numpy(unknown), torch.from_numpy(known))
    assert isinstance(dist2, torch.Tensor) and dist2.dtype == torch.float32 and idx.dtype == torch.int32
    ref_d, ref_i = reference(unknown, known)
    np.testing.assert_array_equal(dist2.numpy(), ref_d)
    np.testing.assert_array_equal(idx.numpy(), ref_i)
