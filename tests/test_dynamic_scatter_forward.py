"""dynamic_scatter_forward: both grouping plans against the float64 reference, sums in point
order to the bit, the counted output size with out=, torch, bad input and guard regions."""

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import runner, targets
from tvm_ops.ops import get
from tvm_ops.ops.dynamic_scatter_forward.compute import MAX_COLUMNS
from tvm_ops.testing import material

from .conftest import computed_kernels, requires_torch, use_knobs

OP = get("dynamic_scatter_forward")
TESTING = material(OP)
NAMES = ("voxel_feats", "voxel_coors", "point2voxel_map", "voxel_points_count")


# radix: the default (the serial kernel below split_min_points points, the two-part one from
# there; 10-bit digits below small_sort_keys keys); radix_split: the two-part kernel however
# few the points; radix_split_wide: the same in 14-bit digits however few the keys
PLANS = {"radix": {"sort": "radix"}, "radix_split": {"sort": "radix", "split_min_points": 0},
         "radix_split_wide": {"sort": "radix", "split_min_points": 0, "small_sort_keys": 0},
         "bitonic": {"sort": "bitonic", "tile": 64}}


@pytest.fixture(params=list(PLANS.values()), ids=list(PLANS))
def grouping(request, monkeypatch):
    """Each grouping plan on the CPU: radix (the CPU's; the serial kernel on these few
    points), radix_split (its two-part kernel, from the first point on), radix_split_wide
    (the same sorting in 14-bit digits, as it does from small_sort_keys keys on), bitonic (the CUDA
    plan's kernels, in tiles of 64 entries: from 33 points on, the tile sort, the global
    steps and the tile merges all run)."""
    use_knobs(monkeypatch, OP, request.param)
    yield request.param["sort"]
    OP.clear_call_cache()


def points(rng, n, d, extent, dropped=0.0, channels=5):
    coors = rng.integers(0, extent, (n, d)).astype(np.int32)
    coors[rng.random(n) < dropped, rng.integers(0, d)] = -1
    return rng.uniform(-1, 1, (n, channels)).astype(np.float32), coors


def assert_matches_reference(result, feats, coors, reduce_type):
    ref = TESTING.reference({"feats": feats, "coors": coors}, {"reduce_type": reduce_type})
    # a float32 sum of k terms is off by at most about k * 2^-24 * the sum of their magnitudes
    magnitude = TESTING.reference({"feats": np.abs(feats), "coors": coors}, {"reduce_type": "sum"})["voxel_feats"]
    bound = ref["voxel_points_count"][:, None] * 2.0**-23 * magnitude
    if reduce_type != "sum":
        bound = bound / ref["voxel_points_count"][:, None] if reduce_type == "mean" else 0 * bound
    for name, value in zip(NAMES, result):
        assert value.shape == ref[name].shape, name
        if name == "voxel_feats":
            assert (np.abs(value - ref[name]) <= bound).all()
        else:
            np.testing.assert_array_equal(value, ref[name], err_msg=name)


@pytest.mark.parametrize("plan", ["bitonic", "radix_split", "radix_split_wide"])
@pytest.mark.parametrize("case", [c.name for c in OP.spec.cases if not c.heavy and c.expect == "ok"])
def test_each_grouping_plan_passes_every_spec_case(case, plan, monkeypatch):
    # the CUDA plan's grouping (network, head flags, chunked scan) run here on the CPU, and
    # the two-part radix kernel on every case however small (bnd_huge_coords: its rows do
    # not fit one key, so the serial kernel takes over)
    use_knobs(monkeypatch, OP, PLANS[plan])
    result = runner.run_case(OP, OP.spec.case(case), "float32", targets.resolve("llvm"))
    OP.clear_call_cache()
    assert result.verdict == "pass", result.detail


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 700), d=st.integers(1, 5), extent=st.sampled_from([1, 2, 5, 40, 2**31 - 1]),
       dropped=st.sampled_from([0.0, 0.1, 1.0]), channels=st.sampled_from([1, 7, 16, 33]),
       reduce_type=st.sampled_from(["max", "sum", "mean"]), seed=st.integers(0, 2**16))
def test_random_points_match_the_reference(grouping, n, d, extent, dropped, channels, reduce_type, seed):
    feats, coors = points(np.random.default_rng(seed), n, d, extent, dropped, channels)
    assert_matches_reference(tvm_ops.dynamic_scatter_forward(feats, coors, reduce_type), feats, coors, reduce_type)


def test_sum_and_mean_add_each_voxels_points_in_point_order(grouping):
    # np.add.at on float32 adds in index order: the kernels' order, so the same bits
    rng = np.random.default_rng(1)
    feats, coors = points(rng, 3000, 3, 3, dropped=0.05, channels=40)
    feats *= 10.0 ** rng.integers(-6, 6, feats.shape)  # magnitudes where the order shows
    kept = (coors >= 0).all(1)
    _, inverse, counts = np.unique(coors[kept], axis=0, return_inverse=True, return_counts=True)
    ordered = np.zeros((counts.size, 40), np.float32)
    np.add.at(ordered, inverse.reshape(-1), feats[kept])
    total, *_ = tvm_ops.dynamic_scatter_forward(feats, coors, "sum")
    mean, *_ = tvm_ops.dynamic_scatter_forward(feats, coors, "mean")
    np.testing.assert_array_equal(total, ordered)
    np.testing.assert_array_equal(mean, ordered / counts[:, None].astype(np.float32))


@pytest.mark.parametrize("d, extent", [(MAX_COLUMNS + 2, 3), (3, 2**31 - 1)], ids=["many_columns", "wide_rows"])
def test_the_two_part_grouping_leaves_what_it_cannot_key_to_the_serial_kernel(d, extent, monkeypatch):
    # more columns than group_split keeps in registers, or rows wider than one int64 key:
    # it counts -1 and group_rows groups the points
    use_knobs(monkeypatch, OP, PLANS["radix_split"])
    feats, coors = points(np.random.default_rng(d), 300, d, extent, dropped=0.1, channels=4)
    assert_matches_reference(tvm_ops.dynamic_scatter_forward(feats, coors, "sum"), feats, coors, "sum")
    OP.clear_call_cache()


def test_every_plan_gives_the_same_bits(monkeypatch):
    # just below the default split_min_points: the radix plan runs the serial kernel
    n = int(OP.schedules["llvm"].defaults["split_min_points"]) - 1
    feats, coors = points(np.random.default_rng(2), n, 4, 6, dropped=0.02, channels=24)
    results = {}
    for plan, knobs in PLANS.items():
        use_knobs(monkeypatch, OP, knobs)
        results[plan] = [tvm_ops.dynamic_scatter_forward(feats, coors, r) for r in ("max", "sum", "mean")]
        OP.clear_call_cache()
    for plan in ("radix_split", "radix_split_wide", "bitonic"):
        for a, b in zip(results["radix"], results[plan]):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)


def test_max_ignores_nan_and_keeps_minus_inf_for_an_all_nan_channel():
    feats = np.array([[np.nan, 1.0], [np.nan, np.nan], [2.0, np.nan]], np.float32)
    coors = np.array([[0, 0], [0, 0], [1, 0]], np.int32)
    voxel_feats, *_ = tvm_ops.dynamic_scatter_forward(feats, coors, "max")
    np.testing.assert_array_equal(voxel_feats, [[-np.inf, 1.0], [2.0, -np.inf]])
    total, *_ = tvm_ops.dynamic_scatter_forward(feats, coors, "sum")
    assert np.isnan(total).tolist() == [[True, True], [False, True]]


def test_lexicographic_order_signed_columns_and_extreme_values():
    big = np.iinfo(np.int32).max
    coors = np.array([[big, 0], [0, big], [0, 0], [0, big], [5, -1], [-2**31, 3], [big, 0], [1, 2**20]], np.int32)
    feats = np.arange(16, dtype=np.float32).reshape(8, 2)
    _, voxel_coors, point2voxel, counts = tvm_ops.dynamic_scatter_forward(feats, coors, "sum")
    assert voxel_coors.tolist() == [[0, 0], [0, big], [1, 2**20], [big, 0]]
    assert point2voxel.tolist() == [3, 1, 0, 1, -1, -1, 3, 2] and counts.tolist() == [1, 2, 1, 2]


def test_out_buffers_need_the_counted_size_and_stay_untouched_otherwise():
    feats, coors = points(np.random.default_rng(3), 200, 3, 4, dropped=0.1)
    expected = tvm_ops.dynamic_scatter_forward(feats, coors, "mean")
    m = expected[0].shape[0]
    out = tuple(np.full_like(e, -7) for e in expected)
    result = tvm_ops.dynamic_scatter_forward(feats, coors, "mean", out=out)
    assert all(r is o for r, o in zip(result, out))
    for e, o in zip(expected, out):
        np.testing.assert_array_equal(e, o)
    wrong = np.full((m + 1, feats.shape[1]), 5.0, np.float32)
    mapped = np.full(200, 9, np.int32)
    with pytest.raises(tvm_ops.BadParamError, match=rf"out\['voxel_feats'\].shape\[0\] \(M\) must be {m}"):
        tvm_ops.dynamic_scatter_forward(feats, coors, "mean", out=(wrong, None, mapped, None))
    assert (wrong == 5.0).all() and (mapped == 9).all()  # refused before any output was written
    with pytest.raises(tvm_ops.BadParamError, match="M is 0 when N is 0"):
        tvm_ops.dynamic_scatter_forward(feats[:0], coors[:0], out=(np.zeros((2, 5), np.float32), None, None, None))
    with pytest.raises(tvm_ops.BadParamError, match="out must be a 4-tuple"):
        tvm_ops.dynamic_scatter_forward(feats, coors, out=wrong)


def test_outputs_inside_guarded_buffers_write_nothing_outside(grouping):
    feats, coors = points(np.random.default_rng(4), 333, 3, 5, dropped=0.2, channels=19)
    expected = tvm_ops.dynamic_scatter_forward(feats, coors, "max")
    guarded, views = [], []
    for e in expected:
        flat = np.full(e.size + 64, -99, e.dtype)
        guarded.append(flat)
        views.append(flat[32:32 + e.size].reshape(e.shape))
    tvm_ops.dynamic_scatter_forward(feats, coors, "max", out=tuple(views))
    for e, flat, view in zip(expected, guarded, views):
        np.testing.assert_array_equal(view, e)
        assert (flat[:32] == -99).all() and (flat[32 + e.size:] == -99).all()


@pytest.mark.parametrize("feats, coors, reduce_type, error, message", [
    (np.zeros((4, 2), np.float64), np.zeros((4, 3), np.int32), "max", tvm_ops.BadParamError, "feats must have dtype float32"),
    (np.zeros((4, 2), np.float32), np.zeros((4, 3), np.int64), "max", tvm_ops.BadParamError, "coors must have dtype int32"),
    (np.zeros((4, 2), np.float32), np.zeros((5, 3), np.int32), "max", tvm_ops.BadParamError, r"coors.shape\[0\] \(N\) must equal"),
    (np.zeros((4, 2), np.float32), np.zeros((4, 0), np.int32), "max", tvm_ops.BadParamError, "D must be non-zero"),
    (np.zeros((4, 2), np.float32), np.zeros((4, 3), np.int32), "amax", tvm_ops.BadParamError, "reduce_type must be one of"),
    (np.zeros((4,), np.float32), np.zeros((4, 3), np.int32), "max", tvm_ops.BadParamError, "feats must have rank 2"),
])
def test_bad_input_is_refused_before_any_kernel(feats, coors, reduce_type, error, message):
    with pytest.raises(error, match=message):
        tvm_ops.dynamic_scatter_forward(feats, coors, reduce_type)


@requires_torch
def test_torch_tensors_in_torch_tensors_out():
    import torch

    feats, coors = points(np.random.default_rng(5), 100, 3, 3, dropped=0.1)
    expected = tvm_ops.dynamic_scatter_forward(feats, coors, "sum")
    result = tvm_ops.dynamic_scatter_forward(torch.from_numpy(feats), torch.from_numpy(coors), "sum")
    assert all(isinstance(r, torch.Tensor) for r in result)
    for e, r in zip(expected, result):
        np.testing.assert_array_equal(e, r.numpy())


@functools.lru_cache(maxsize=None)
def _library_kernels(kind: str, knobs: tuple) -> frozenset:
    """The names OP.computes builds for a target and knobs (parsed once per process: ~3 s)."""
    model = targets.resolve("llvm") if kind == "llvm" else targets.cuda("sm_90")
    return computed_kernels(OP, "float32", OP.plan(model, dict(OP.schedules[kind].defaults, **dict(knobs))), model)


@pytest.mark.parametrize("kind, knobs", [("llvm", {}), ("llvm", {"sort": "bitonic"}), ("cuda", {})], ids=str)
@pytest.mark.parametrize("points, channels, columns", [(100, 128, 3), (4000, 5, 4), (4000, 16, 6), (10, 1, 1)])
@pytest.mark.parametrize("reduce_type", ["max", "sum", "mean"])
def test_count_and_launch_ask_only_for_kernels_the_library_holds(kind, knobs, points, channels, columns, reduce_type):
    """Each target's library builds only the kernels its plan runs (a GPU-less check of the
    CUDA call): count and launch run with kernels that record their names, over every branch
    (serial or two-core radix grouping, fixed columns, reduce widths)."""
    import dataclasses

    from tvm_ops import build, checks

    model = targets.resolve("llvm") if kind == "llvm" else targets.cuda("sm_90")
    plan = OP.plan(model, dict(OP.schedules[kind].defaults, **knobs))
    held = _library_kernels(kind, tuple(knobs.items()))
    calls = []
    kernels = build.Kernels({name: (lambda name: lambda *args: calls.append(name))(name) for name in held})
    kernels.plan = plan
    feats, coors = np.zeros((points, channels), np.float32), np.zeros((points, columns), np.int32)
    problem = checks.check(OP.spec, {"feats": feats, "coors": coors}, {"reduce_type": reduce_type}, {}, OP.rules)
    if kind == "cuda":
        problem = dataclasses.replace(problem, kind="torch", device="cuda")
    tensors = {"feats": feats, "coors": coors, "point2voxel_map": np.zeros(points, np.int32)}
    tensors |= {name: np.zeros(shape, dtype) for name, (shape, dtype) in OP.workspaces(problem, plan).items()}
    voxels = 3
    tensors["count"][0] = voxels  # what the (recording) grouping kernels would have counted
    assert OP.count(kernels, problem, tensors) == {"M": voxels}
    tensors |= {"voxel_feats": np.zeros((voxels, channels), np.float32), "voxel_coors": np.zeros((voxels, columns), np.int32),
                "voxel_points_count": np.zeros(voxels, np.int32)}
    OP.launch(kernels, problem, tensors)  # a kernel the library lacks: KeyError
    assert calls[-1].startswith(f"reduce_{reduce_type}") and set(calls) <= held


@pytest.mark.parametrize("n", [100, 4000])
def test_parallel_loops_counts_the_loops_a_cpu_call_runs(n):
    """The one-core threshold scales with OP.parallel_loops: it must be the number of parallel
    loops in the kernels a call runs (serial grouping below split_min_points, group_split
    from there)."""
    import tvm_ffi
    from tvm import tirx

    from tvm_ops import checks, dispatch
    from tvm_ops.invocation import CallPlan

    model = targets.resolve("llvm")
    variant = dispatch.default_variant(OP, "float32", model)
    loops_of = {}
    for symbol, func in variant.scheduled_module().functions.items():
        found = []
        tvm_ffi.structural_map(func, (tirx.For, lambda loop: found.append(loop.kind == tirx.ForKind.PARALLEL) or loop))
        loops_of[symbol.name_hint] = sum(found)
    library = dispatch.kernels(OP, "float32", model)
    ran = []
    recording = library.like({name: (lambda name: lambda *args: ran.append(name) or library[name](*args))(name)
                              for name in loops_of})
    feats, coors = points(np.random.default_rng(n), n, 3, 40, dropped=0.1, channels=128)
    problem = checks.check(OP.spec, {"feats": feats, "coors": coors}, {"reduce_type": "max"}, {}, OP.rules)
    CallPlan(OP, problem, recording).run({"feats": feats, "coors": coors}, {})
    assert sum(loops_of[name] for name in ran) == OP.parallel_loops(problem, OP.schedules["llvm"].defaults)


def test_a_one_core_library_groups_serially():
    # group_split's two parts made serial do more work than group_rows (one-core libraries run
    # where the policy keeps a call off the second core)
    from tvm_ops import build, checks

    model = targets.resolve("llvm")
    plan = OP.plan(model, OP.schedules["llvm"].defaults)
    n = int(plan["split_min_points"]) + 1000
    feats, coors = np.zeros((n, 8), np.float32), np.zeros((n, 3), np.int32)
    problem = checks.check(OP.spec, {"feats": feats, "coors": coors}, {"reduce_type": "sum"}, {}, OP.rules)
    tensors = {"feats": feats, "coors": coors, "point2voxel_map": np.zeros(n, np.int32)}
    tensors |= {name: np.zeros(shape, dtype) for name, (shape, dtype) in OP.workspaces(problem, plan).items()}
    for one_core, grouping in ((False, "group_split_d3"), (True, "group_rows_d3")):
        calls = []
        kernels = build.Kernels({name: (lambda name: lambda *args: calls.append(name))(name)
                                 for name in _library_kernels("llvm", ())})
        kernels.plan, kernels.one_core = plan, one_core
        OP.count(kernels, problem, tensors)
        assert calls == [grouping]
