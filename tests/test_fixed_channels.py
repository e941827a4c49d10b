"""Fixed-channel copies of the voxel pooling and dynamic_scatter kernels
(ops/fixed_channels.py): the generic kernel's bits on arrays that start anywhere (numpy's
keep no 64-byte alignment, which a constant row length would let LLVM assume), and launch
runs a copy only at its channel count."""

import numpy as np
import pytest

import tvm_ops
from tvm_ops import checks, dispatch, targets
from tvm_ops.ops import get
from tvm_ops.ops.fixed_channels import FIXED_CHANNELS, VOXEL_ENCODER_CHANNELS
from tvm_ops.tuning.tune import trace_launch

CPU = targets.resolve("llvm")
FORWARD, BACKWARD = get("voxel_pooling_forward"), get("voxel_pooling_backward")
SCATTER_FORWARD, SCATTER_BACKWARD = get("dynamic_scatter_forward"), get("dynamic_scatter_backward")
B, N, Y, X, Z = 2, 3000, 12, 10, 1


def misaligned(array: np.ndarray) -> np.ndarray:
    """A copy of `array` starting 4 bytes past a cache line."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + 4
    view = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    return view


def points(channels: int, seed: int):
    """geom [B, N, 3] with about a third of the points outside the grid, features [B, N, C]."""
    rng = np.random.default_rng(seed)
    geom = np.stack([rng.integers(-2, X + 2, (B, N)), rng.integers(-2, Y + 2, (B, N)),
                     rng.integers(-1, Z + 1, (B, N))], -1).astype(np.int32)
    return geom, rng.standard_normal((B, N, channels)).astype(np.float32)


@pytest.mark.parametrize("channels", FIXED_CHANNELS)
@pytest.mark.parametrize("pool", ["pool", "pool_first_touch"])
@pytest.mark.parametrize("bands", [1, 2])
def test_forward_copies_give_the_generic_bits_on_misaligned_arrays(pool, channels, bands):
    geom, feat = points(channels, channels + bands)
    kernels = dispatch.kernels(FORWARD, "float32", CPU)
    results = []
    for name in (pool, f"{pool}_c{channels}"):
        out = misaligned(np.full((B, Y, X, channels), np.nan, np.float32))
        kernels[name](misaligned(geom), misaligned(feat), out, Z, bands)
        results.append(out)
    assert np.isfinite(results[1]).all() and np.abs(results[1]).sum() > 0  # every row written, points summed
    assert np.array_equal(results[0], results[1])


@pytest.mark.parametrize("channels", FIXED_CHANNELS)
def test_backward_copies_give_the_generic_bits_on_misaligned_arrays(channels):
    geom, _ = points(channels, channels)
    kept = (geom[..., 0] >= 0) & (geom[..., 0] < X) & (geom[..., 1] >= 0) & (geom[..., 1] < Y)
    memo = np.where(kept[..., None], np.stack([np.broadcast_to(np.arange(B)[:, None], (B, N)), geom[..., 1],
                                               geom[..., 0]], -1), -1).astype(np.int32)
    grad = np.random.default_rng(channels).standard_normal((B, Y, X, channels)).astype(np.float32)
    kernels = dispatch.kernels(BACKWARD, "float32", CPU)
    results = []
    for name in ("gather", f"gather_c{channels}"):
        out = misaligned(np.full((B, N, channels), np.nan, np.float32))
        kernels[name](misaligned(grad), misaligned(memo), out)
        results.append(out)
    expected = np.where(kept[..., None], grad[np.arange(B)[:, None], np.maximum(geom[..., 1], 0) % Y,
                                              np.maximum(geom[..., 0], 0) % X], 0)
    assert np.array_equal(results[1], expected) and np.array_equal(results[0], results[1])


@pytest.mark.parametrize("channels", [*FIXED_CHANNELS, 48, 81])
def test_launch_runs_a_copy_only_at_its_channel_count(channels):
    geom, feat = points(channels, 0)
    forward = checks.check(FORWARD.spec, {"geom_xyz": geom, "input_features": feat},
                           {"num_voxel_x": X, "num_voxel_y": Y, "num_voxel_z": Z}, {}, FORWARD.rules)
    backward = checks.check(BACKWARD.spec, {"grad_output": np.zeros((B, Y, X, channels), np.float32),
                                            "pos_memo": geom}, {}, {}, BACKWARD.rules)
    launched = [name for op, problem in ((FORWARD, forward), (BACKWARD, backward))
                for name, _ in trace_launch(op, problem, dispatch.kernels(op, "float32", CPU).plan)]
    suffix = f"_c{channels}" if channels in FIXED_CHANNELS else ""
    assert launched[1:] == [f"pool{suffix}", f"gather{suffix}"]  # after pos_memo (N >= 4 points a row: no first touch)


def scattered(channels: int, seed: int):
    """dynamic_scatter_backward's sum / mean inputs: 3000 points in 700 voxels, 500 valid
    (voxel_num), a tenth of the map -1 and some entries past M."""
    rng = np.random.default_rng(seed)
    grad = rng.standard_normal((700, channels)).astype(np.float32)
    point_map = rng.integers(-1, 720, 3000).astype(np.int32)
    point_map[rng.random(3000) < 0.1] = -1
    return grad, point_map, rng.integers(1, 9, 700).astype(np.int32)


def problem_inputs(grad, point_map, count) -> dict:
    return {"grad_voxel_feats": grad, "feats": np.zeros((len(point_map), grad.shape[1]), np.float32),
            "voxel_feats": grad, "point2voxel_map": point_map, "voxel_points_count": count}


@pytest.mark.parametrize("channels", VOXEL_ENCODER_CHANNELS)
@pytest.mark.parametrize("reduce_type", ["sum", "mean"])
def test_scatter_backward_copies_give_the_generic_bits_on_misaligned_arrays(channels, reduce_type):
    grad, point_map, count = scattered(channels, channels)
    kernels = dispatch.kernels(SCATTER_BACKWARD, "float32", CPU)
    results = []
    for name in (f"{reduce_type}_rows", f"{reduce_type}_rows_c{channels}"):
        out = misaligned(np.full((len(point_map), channels), np.nan, np.float32))
        kernels[name](misaligned(grad), misaligned(count), misaligned(point_map), out, 500)
        results.append(out)
    valid = (point_map >= 0) & (point_map < 500)
    rows = grad[np.where(valid, point_map, 0)]
    expected = np.where(valid[:, None], rows / count[np.where(valid, point_map, 0)][:, None] if reduce_type == "mean"
                        else rows, 0).astype(np.float32)
    assert np.array_equal(results[1], expected) and np.array_equal(results[0], results[1])


@pytest.mark.parametrize("channels", VOXEL_ENCODER_CHANNELS)
def test_scatter_backward_max_copies_give_the_generic_bits_on_misaligned_arrays(channels):
    # max by voxel owners: whole rows (the copies) against channel vectors, with exact ties
    # (a feature equal to its voxel's max at several points: the first wins) and NaNs
    grad, point_map, _ = scattered(channels, channels + 1)
    rng = np.random.default_rng(channels)
    voxel_feats = rng.integers(0, 3, grad.shape).astype(np.float32)
    feats = rng.integers(0, 3, (len(point_map), channels)).astype(np.float32)
    feats[rng.random(feats.shape) < 0.05] = np.nan
    kernels = dispatch.kernels(SCATTER_BACKWARD, "float32", CPU)
    order, start = np.empty(len(point_map), np.int32), np.empty(len(grad) + 1, np.int32)
    kernels["max_buckets"](point_map, order, start, 500)
    results = []
    for name in ("max_voxels", f"max_voxels_rows_c{channels}"):
        out = misaligned(np.full((len(point_map), channels), np.nan, np.float32))
        kernels[name](misaligned(grad), misaligned(feats), misaligned(voxel_feats), order, start, out)
        results.append(out)
    valid = (point_map >= 0) & (point_map < 500)
    assert np.isfinite(results[1][valid]).all() and np.count_nonzero(results[1][valid]) > 0
    assert np.array_equal(results[0], results[1], equal_nan=True)


@pytest.mark.parametrize("channels", [*VOXEL_ENCODER_CHANNELS, 80, 129])
def test_scatter_backward_runs_a_copy_only_at_its_channel_count(channels):
    grad, point_map, count = scattered(channels, 0)
    problem = checks.check(SCATTER_BACKWARD.spec, problem_inputs(grad, point_map, count),
                           {"voxel_num": None, "reduce_type": "mean"}, {}, SCATTER_BACKWARD.rules)
    plan = dispatch.kernels(SCATTER_BACKWARD, "float32", CPU).plan
    launched = [name for name, _ in trace_launch(SCATTER_BACKWARD, problem, plan)]
    assert launched == [f"mean_rows_c{channels}" if channels in VOXEL_ENCODER_CHANNELS else "mean_rows"]
    problem = checks.check(SCATTER_BACKWARD.spec, problem_inputs(grad, point_map, count), {"voxel_num": None,
                           "reduce_type": "max"}, {}, SCATTER_BACKWARD.rules)
    launched = [name for name, _ in trace_launch(SCATTER_BACKWARD, problem, plan)]
    assert launched[1] == (f"max_voxels_rows_c{channels}" if channels in plan["whole_rows"] else "max_voxels")


def test_scatter_backward_max_takes_whole_rows_only_where_they_stay_in_registers():
    # first-match indices and the voxel's max: 2 x C / lanes registers, at most half the file
    plans = {cpu: SCATTER_BACKWARD.plan(targets.resolve(f"llvm:{cpu}"), SCATTER_BACKWARD.schedules["llvm"].defaults)
             for cpu in ("skylake-avx512", "haswell", "aarch64")}
    assert plans["skylake-avx512"]["whole_rows"] == [64, 128]  # 32 registers of 16 lanes
    assert plans["haswell"]["whole_rows"] == []  # 16 registers of 8 lanes: C = 64 fills them
    assert plans["aarch64"]["whole_rows"] == []  # 32 registers of 4 lanes


@pytest.mark.parametrize("channels", [*VOXEL_ENCODER_CHANNELS, 48])
@pytest.mark.parametrize("reduce_type", ["max", "sum", "mean"])
def test_scatter_forward_reduces_whole_rows_at_an_encoders_channels(channels, reduce_type):
    # the whole-row copies run only at their C and add each voxel's points in point order, as
    # the channel-vector reduce does: np.add.at on float32 adds in index order too
    from tvm_ops.invocation import CallPlan

    rng = np.random.default_rng(channels)
    coors = rng.integers(-1, 6, (3000, 3)).astype(np.int32)
    feats = (rng.standard_normal((3000, channels)) * 10.0 ** rng.integers(-6, 6, (3000, channels))).astype(np.float32)
    kept = (coors >= 0).all(1)
    _, inverse, counts = np.unique(coors[kept], axis=0, return_inverse=True, return_counts=True)
    expected = np.full((counts.size, channels), -np.inf if reduce_type == "max" else 0, np.float32)
    (np.maximum if reduce_type == "max" else np.add).at(expected, inverse.reshape(-1), feats[kept])
    if reduce_type == "mean":
        expected /= counts[:, None].astype(np.float32)
    inputs = {"feats": misaligned(feats), "coors": misaligned(coors)}
    library = dispatch.kernels(SCATTER_FORWARD, "float32", CPU)
    ran = []
    recording = library.like({name: (lambda name: lambda *args: ran.append(name) or library[name](*args))(name)
                              for name in library})
    problem = checks.check(SCATTER_FORWARD.spec, inputs, {"reduce_type": reduce_type}, {}, SCATTER_FORWARD.rules)
    voxel_feats, *_ = CallPlan(SCATTER_FORWARD, problem, recording).run(inputs, {})
    rows = f"reduce_{reduce_type}_rows_c{channels}"
    assert (rows in ran) == (channels in VOXEL_ENCODER_CHANNELS)
    assert np.array_equal(voxel_feats, expected)
    assert np.array_equal(voxel_feats, tvm_ops.dynamic_scatter_forward(feats, coors, reduce_type)[0])
