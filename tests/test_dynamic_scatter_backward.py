"""dynamic_scatter_backward: spec cases, properties, checks, interop and determinism."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import metrics, spec, targets
from tvm_ops.ops import get
from tvm_ops.testing import material

from .conftest import requires_torch, use_knobs

OP = get("dynamic_scatter_backward")
TESTING = material(OP)
CPU = targets.resolve("llvm")
NAMES = ("grad_voxel_feats", "feats", "voxel_feats", "point2voxel_map", "voxel_points_count")



def make(n, m, c, reduce_type="max", voxel_num=None, seed=0, **extra):
    case = spec.Case("t", "random", {"N": n, "M": m, "C": c}, ("float32",),
                     extra=dict(extra, reduce_type=reduce_type, voxel_num=voxel_num))
    return TESTING.make_inputs(case, "float32", np.random.default_rng(seed))


def run(inputs, params, **kw):
    return tvm_ops.dynamic_scatter_backward(*(inputs[k] for k in NAMES), params["voxel_num"],
                                            params["reduce_type"], **kw)


def assert_exact(inputs, params, result):
    ref = TESTING.reference(inputs, params)["grad_feats"]
    assert result.shape == ref.shape and result.dtype == np.float32
    # bit-exact: every element equal to the float64 reference (diff3 == 0 in the spec)
    assert np.array_equal(result.astype(np.float64), ref)
    assert metrics.accuracy(result, ref, "float32").failures(OP.spec.accuracy["float32"]) == []


def test_spec_asks_bit_exact_float32():
    assert OP.spec.accuracy["float32"]["diff3"] == 0


def test_hand_computed_max_sum_mean():
    # 5 points, 3 voxels, 2 channels; point 3 is dropped, voxel 2 is beyond voxel_num=2
    feats = np.array([[1, 5], [3, 5], [3, 2], [9, 9], [7, 1]], np.float32)
    p2v = np.array([0, 0, 0, -1, 2], np.int32)
    voxel_feats = np.array([[3, 5], [0, 0], [7, 1]], np.float32)
    grad = np.array([[10, 20], [30, 40], [50, 60]], np.float32)
    count = np.array([3, 0, 1], np.int32)
    args = (grad, feats, voxel_feats, p2v, count)
    out = tvm_ops.dynamic_scatter_backward(*args, 2, "max")
    # channel 0: max 3 at points 1 and 2 -> point 1; channel 1: max 5 at points 0 and 1 -> point 0
    expected = np.zeros((5, 2), np.float32)
    expected[1, 0], expected[0, 1] = 10, 20
    assert np.array_equal(out, expected)
    out = tvm_ops.dynamic_scatter_backward(*args, 3, "max")  # voxel 2 now takes part
    expected[4] = [50, 60]
    assert np.array_equal(out, expected)
    out = tvm_ops.dynamic_scatter_backward(*args, 2, "sum")
    assert np.array_equal(out, np.array([[10, 20]] * 3 + [[0, 0], [0, 0]], np.float32))
    out = tvm_ops.dynamic_scatter_backward(*args, None, "mean")  # voxel_num defaults to M
    assert np.array_equal(out, np.array([[10 / 3, 20 / 3]] * 3 + [[0, 0], [50, 60]], np.float32))


def test_mean_divides_by_the_count_as_a_float32():
    # mmcv's rule: the count converted to float32 (exact up to 2^24; 2^24 + 1 rounds to 2^24),
    # then one float32 division; above 2^24 that is not the exact quotient rounded (last line)
    grad = np.array([[1.0, 3.0, 0.1, 7.0]], np.float32)
    zeros = np.zeros((1, 4), np.float32)
    for count in (2**24 - 1, 2**24 + 1, 2**31 - 1):
        out = tvm_ops.dynamic_scatter_backward(grad, zeros, zeros, np.zeros(1, np.int32),
                                               np.array([count], np.int32), None, "mean")
        expected = grad / np.float32(count)  # numpy's float32 division: correctly rounded
        assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(out.astype(np.float64), TESTING.reference(
            {"grad_voxel_feats": grad, "feats": zeros, "voxel_feats": zeros, "point2voxel_map": np.zeros(1, np.int32),
             "voxel_points_count": np.array([count], np.int32)}, {"reduce_type": "mean"})["grad_feats"])
    exact = (grad.astype(np.float64) / (2**24 + 1)).astype(np.float32)
    assert not np.array_equal(grad / np.float32(2**24 + 1), exact)  # the rule is not the exact quotient


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 60), extra_points=st.integers(0, 120), c=st.integers(1, 70),
       reduce_type=st.sampled_from(["max", "sum", "mean"]), ties=st.booleans(),
       nan=st.sampled_from([0, 0.05]), dropped=st.integers(0, 5), vn_cut=st.integers(0, 10),
       seed=st.integers(0, 2**16))
def test_random_shapes(m, extra_points, c, reduce_type, ties, nan, dropped, vn_cut, seed):
    n = m + extra_points
    inputs, params = make(n, m, c, reduce_type, voxel_num=max(m - vn_cut, 0), seed=seed, ties=ties, nan=nan,
                          dropped=min(dropped, n), map_high=m + 7)
    assert_exact(inputs, params, run(inputs, params))


def test_many_exact_ties_smallest_index_wins():
    inputs, params = make(2000, 8, 48, ties=True)  # ~250 points per voxel, 5 distinct values
    out = run(inputs, params)
    assert_exact(inputs, params, out)
    # each (voxel, channel) sends its gradient to exactly one point: the first that matches
    p2v, feats, vf = inputs["point2voxel_map"], inputs["feats"], inputs["voxel_feats"]
    for v in range(3):
        for ch in range(3):
            pts = np.flatnonzero(p2v == v)
            winners = pts[feats[pts, ch] == vf[v, ch]]
            assert winners.size > 1  # really a tie
            assert out[winners[0], ch] == inputs["grad_voxel_feats"][v, ch]
            assert not out[winners[1:], ch].any()


def test_nan_features_never_match_and_write_nothing():
    inputs, params = make(300, 50, 24, nan=0.2, voxel_num=40)
    inputs["feats"][:, 0] = np.nan  # a whole channel without any match
    inputs["voxel_feats"][:, 1] = np.nan
    out = run(inputs, params)
    assert np.isfinite(out).all() and not out[:, :2].any()
    assert_exact(inputs, params, out)


@pytest.mark.parametrize("reduce_type", ["max", "sum", "mean"])
@pytest.mark.parametrize("voxel_num", [0, 1, 17, 33, 34])
def test_voxel_num_zero_and_below_m(reduce_type, voxel_num):
    inputs, params = make(34, 34, 5, reduce_type, voxel_num=voxel_num, dropped=4)
    out = run(inputs, params)
    assert_exact(inputs, params, out)
    p2v = inputs["point2voxel_map"]
    assert not out[(p2v < 0) | (p2v >= voxel_num)].any()
    if voxel_num == 0:
        assert not out.any()


@pytest.mark.parametrize("form", ["int", "numpy_int", "array", "array2d", "big_endian", "default"])
def test_voxel_num_forms(form):
    inputs, params = make(100, 60, 9, voxel_num=45)
    value = {"int": 45, "numpy_int": np.int64(45), "array": np.array([45], np.int32),
             "array2d": np.array([[45]], np.int32), "big_endian": np.array([45], ">i4"), "default": None}[form]
    out = tvm_ops.dynamic_scatter_backward(*(inputs[k] for k in NAMES), value)
    assert_exact(inputs, dict(params, voxel_num=60 if value is None else 45), out)


def test_map_entries_outside_the_voxels_are_ignored():
    inputs, params = make(500, 100, 33, map_high=100 + 500)
    inputs["point2voxel_map"][::7] = np.iinfo(np.int32).max
    inputs["point2voxel_map"][1::7] = np.iinfo(np.int32).min
    for reduce_type in ("max", "sum", "mean"):
        params["reduce_type"] = reduce_type
        assert_exact(inputs, params, run(inputs, params))


def test_workspace_is_the_min_index_per_voxel_and_channel(monkeypatch):
    # the traceback (CUDA's max plan; on the CPU the channel owners' library)
    use_knobs(monkeypatch, OP, {"max_owners": "channels"})
    inputs, params = make(400, 70, 21, ties=True, dropped=10, voxel_num=60)
    kernels = __import__("tvm_ops.dispatch", fromlist=["kernels"]).kernels(OP, "float32", CPU)
    rf = np.empty((70, 21), np.int32)
    kernels["max_init"](rf, 400)
    kernels["max_traceback"](inputs["feats"], inputs["voxel_feats"], inputs["point2voxel_map"], rf, 60)
    p2v = inputs["point2voxel_map"]
    expected = np.full((70, 21), 400)
    for n in range(400):
        v = p2v[n]
        if 0 <= v < 60:
            hit = inputs["feats"][n] == inputs["voxel_feats"][v]
            expected[v, hit] = np.minimum(expected[v, hit], n)
    assert np.array_equal(rf, expected)


@pytest.mark.parametrize("case", [c.name for c in OP.spec.cases if not c.heavy and c.expect == "ok"
                                  and c.extra.get("reduce_type") == "max"])
def test_every_max_plan_gives_the_reference_bits(case, monkeypatch):
    # voxels (the default: counting sort, a task per voxel), the same without its prefetch of
    # the rows ahead, and channels (the traceback's channel-block owners, kept as the other
    # candidate) on every max case
    from tvm_ops import runner

    for knobs in ({"max_owners": "voxels"}, {"max_owners": "voxels", "max_prefetch_points": 0},
                  {"max_owners": "channels"}):
        use_knobs(monkeypatch, OP, knobs)
        result = runner.run_case(OP, OP.spec.case(case), "float32", CPU)
        assert result.verdict == "pass", (knobs, result.detail)
    OP.clear_call_cache()


@pytest.mark.parametrize("case", [c.name for c in OP.spec.cases if not c.heavy and c.expect == "ok"
                                  and c.extra.get("reduce_type") in ("sum", "mean")])
def test_row_gathers_without_prefetch_give_the_reference_bits(case, monkeypatch):
    # the CPU's sum / mean prefetch the row of the point `prefetch_points` on; 0 is the plain walk
    from tvm_ops import runner

    use_knobs(monkeypatch, OP, {"prefetch_points": 0})
    result = runner.run_case(OP, OP.spec.case(case), "float32", CPU)
    assert result.verdict == "pass", result.detail
    OP.clear_call_cache()


def test_voxel_buckets_list_each_voxels_points_in_index_order():
    inputs, params = make(500, 80, 3, dropped=20, voxel_num=70, map_high=90)
    kernels = __import__("tvm_ops.dispatch", fromlist=["kernels"]).kernels(OP, "float32", CPU)
    order, start = np.full(500, -1, np.int32), np.full(81, -1, np.int32)
    kernels["max_buckets"](inputs["point2voxel_map"], order, start, 70)
    p2v = inputs["point2voxel_map"]
    for v in range(80):
        expected = np.flatnonzero(p2v == v) if v < 70 else []
        assert order[start[v]:start[v + 1]].tolist() == list(expected), v
    assert start[80] == np.count_nonzero((p2v >= 0) & (p2v < 70))


# Same bits on every thread count: a fresh process per TVM_NUM_THREADS.
CHILD = """
import hashlib, sys, numpy as np, tvm_ops
from tvm_ops import spec
from tvm_ops.ops.dynamic_scatter_backward import OP as op
from tvm_ops.testing import dynamic_scatter_backward as testing
for rt in ("max", "sum", "mean"):
    case = spec.Case("d", "random", {"N": 6000, "M": 900, "C": 67}, ("float32",),
                     extra={"reduce_type": rt, "ties": True, "dropped": 30, "voxel_num": 850})
    data, params = testing.make_inputs(case, "float32", np.random.default_rng(7))
    out = op.call(data, params, "llvm", {})
    print(rt, hashlib.sha256(out.tobytes()).hexdigest())
"""


def test_deterministic_across_thread_counts():
    # this process runs on TVM_NUM_THREADS = all cores; the children on 1 and 3 threads
    digests = {"".join(f"{rt} {hashlib.sha256(run_case_d(rt).tobytes()).hexdigest()}\n"
                       for rt in ("max", "sum", "mean"))}
    for threads in ("1", "3"):
        env = dict(os.environ, TVM_NUM_THREADS=threads)
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        digests.add(done.stdout)
    assert len(digests) == 1, digests


def run_case_d(reduce_type):
    case = spec.Case("d", "random", {"N": 6000, "M": 900, "C": 67}, ("float32",),
                     extra={"reduce_type": reduce_type, "ties": True, "dropped": 30, "voxel_num": 850})
    data, params = TESTING.make_inputs(case, "float32", np.random.default_rng(7))
    out = OP.call(data, params, "llvm", {})
    assert_exact(data, params, out)
    return out


def test_out_writes_into_the_callers_buffer():
    inputs, params = make(80, 30, 12, dropped=5)
    for reduce_type in ("max", "sum", "mean"):
        out = np.full((80, 12), 123.0, np.float32)
        result = run(inputs, dict(params, reduce_type=reduce_type), out=out)
        assert result is out
        assert_exact(inputs, dict(params, reduce_type=reduce_type), out)
    out = np.full((80, 12), 123.0, np.float32)
    run(inputs, dict(params, voxel_num=0), out=out)
    assert not out.any()


def test_zero_elements_succeed():
    inputs, params = make(20, 10, 4)
    empty_c = {k: (v[:, :0] if v.ndim == 2 else v) for k, v in inputs.items()}
    assert run(empty_c, params).shape == (20, 0)
    no_voxels = {"grad_voxel_feats": np.zeros((0, 4), np.float32), "feats": inputs["feats"],
                 "voxel_feats": np.zeros((0, 4), np.float32), "point2voxel_map": inputs["point2voxel_map"],
                 "voxel_points_count": np.zeros(0, np.int32)}
    out = np.full((20, 4), 5.0, np.float32)
    assert run(no_voxels, params, out=out) is out and not out.any()


def test_non_contiguous_inputs_are_made_contiguous():
    inputs, params = make(90, 40, 10, ties=True)
    wide = np.zeros((90, 20), np.float32)
    wide[:, ::2] = inputs["feats"]
    out = run(dict(inputs, feats=wide[:, ::2]), params)
    assert_exact(inputs, params, out)


# --- checks: type, status and a message naming the tensor ------------------------
GOOD, GOOD_PARAMS = make(12, 6, 4)


def call(voxel_num=None, reduce_type="max", out=None, **changes):
    args = dict(GOOD, **changes)
    return tvm_ops.dynamic_scatter_backward(*(args[k] for k in NAMES), voxel_num, reduce_type, out=out)


@pytest.mark.parametrize("changes, error, pattern", [
    ({"feats": None}, tvm_ops.BadParamError, r"feats is missing"),
    ({"voxel_points_count": [1, 2]}, tvm_ops.BadParamError, r"voxel_points_count must be a numpy array"),
    ({"grad_voxel_feats": np.zeros((6, 4, 1), np.float32)}, tvm_ops.BadParamError,
     r"grad_voxel_feats must have rank 2 \[M, C\], got rank 3"),
    ({"feats": np.zeros(12, np.float32)}, tvm_ops.BadParamError, r"feats must have rank 2 \[N, C\], got rank 1"),
    ({"voxel_feats": np.zeros((6,), np.float32)}, tvm_ops.BadParamError, r"voxel_feats must have rank 2"),
    ({"point2voxel_map": np.zeros((12, 1), np.int32)}, tvm_ops.BadParamError,
     r"point2voxel_map must have rank 1 \[N\]"),
    ({"voxel_points_count": np.zeros((6, 1), np.int32)}, tvm_ops.BadParamError,
     r"voxel_points_count must have rank 1 \[M\]"),
    ({"grad_voxel_feats": np.zeros((6, 4), np.float64)}, tvm_ops.BadParamError,
     r"grad_voxel_feats must have dtype float32, got float64"),
    ({"feats": np.zeros((12, 4), np.float16)}, tvm_ops.BadParamError,
     r"feats must have the dtype of grad_voxel_feats \(float32\), got float16"),
    ({"voxel_feats": np.zeros((6, 4), np.float64)}, tvm_ops.BadParamError, r"voxel_feats must have the dtype"),
    ({"point2voxel_map": np.zeros(12, np.int64)}, tvm_ops.BadParamError,
     r"point2voxel_map must have dtype int32, got int64"),
    ({"voxel_points_count": np.zeros(6, np.float32)}, tvm_ops.BadParamError,
     r"voxel_points_count must have dtype int32, got float32"),
    ({"feats": np.zeros((12, 5), np.float32)}, tvm_ops.BadParamError,
     r"feats.shape\[1\] \(C\) must equal grad_voxel_feats.shape\[1\] = 4, got 5"),
    ({"voxel_feats": np.zeros((6, 3), np.float32)}, tvm_ops.BadParamError,
     r"voxel_feats.shape\[1\] \(C\) must equal grad_voxel_feats.shape\[1\] = 4, got 3"),
    ({"voxel_feats": np.zeros((7, 4), np.float32)}, tvm_ops.BadParamError,
     r"voxel_feats.shape\[0\] \(M\) must equal grad_voxel_feats.shape\[0\] = 6, got 7"),
    ({"voxel_points_count": np.zeros(5, np.int32)}, tvm_ops.BadParamError,
     r"voxel_points_count.shape\[0\] \(M\) must equal grad_voxel_feats.shape\[0\] = 6, got 5"),
    ({"point2voxel_map": np.zeros(11, np.int32)}, tvm_ops.BadParamError,
     r"point2voxel_map.shape\[0\] \(N\) must equal feats.shape\[0\] = 12, got 11"),
    ({"feats": np.zeros((5, 4), np.float32), "point2voxel_map": np.zeros(5, np.int32)}, tvm_ops.BadParamError,
     r"feats.shape\[0\] \(N\) must be >= grad_voxel_feats.shape\[0\] \(M\) = 6, got 5"),
])
def test_bad_inputs(changes, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        call(**changes)
    assert info.value.status == error.status == "BAD_PARAM"


@pytest.mark.parametrize("voxel_num, pattern", [
    (-1, r"voxel_num must be >= 0, got -1"), (7, r"voxel_num must be <= M \(voxel_feats.shape\[0\]\) = 6, got 7"),
    (2.5, r"voxel_num must be an integer"), (True, r"voxel_num must be an integer"),
    (np.array([3], np.int64), r"voxel_num must be an int or a one-element int32 array, got dtype int64"),
    (np.array([3, 4], np.int32), r"voxel_num must be an int or a one-element int32 array, got shape \[2\]"),
    (np.array([7], np.int32), r"voxel_num must be <= M"),
])
def test_bad_voxel_num(voxel_num, pattern):
    with pytest.raises(tvm_ops.BadParamError, match=pattern):
        call(voxel_num=voxel_num)


@pytest.mark.parametrize("reduce_type", ["min", "MAX", "", None, 0])
def test_unknown_reduce_type_names_the_accepted_values(reduce_type):
    with pytest.raises(tvm_ops.BadParamError, match=r"reduce_type") as info:
        call(reduce_type=reduce_type)
    if reduce_type is not None:
        assert "'max', 'sum', 'mean'" in str(info.value)
    assert info.value.status == "BAD_PARAM"


def test_out_checks():
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_feats'\].shape\[0\] \(N\) must equal"):
        call(out=np.zeros((13, 4), np.float32))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_feats'\] must have the dtype of"):
        call(out=np.zeros((12, 4), np.float64))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_feats'\] must have rank 2"):
        call(out=np.zeros(48, np.float32))
    with pytest.raises(tvm_ops.NotSupportedError, match=r"must be C-contiguous"):
        call(out=np.zeros((12, 8), np.float32)[:, ::2])


def test_checks_run_in_the_mlu_ops_order():
    with pytest.raises(tvm_ops.BadParamError, match="rank"):
        call(feats=np.zeros(12, np.float64))
    with pytest.raises(tvm_ops.BadParamError, match="dtype"):
        call(feats=np.zeros((3, 9), np.float64))


def test_large_tensors_are_not_supported_without_touching_data():
    huge = np.broadcast_to(np.zeros(1, np.float32), (2**24, 2**7))  # 2^31 elements, no memory
    with pytest.raises(tvm_ops.NotSupportedError, match=r"feats has 2147483648 elements") as info:
        tvm_ops.dynamic_scatter_backward(GOOD["grad_voxel_feats"][:, :1].repeat(128, 1), huge,
                                         np.zeros((6, 128), np.float32), np.broadcast_to(np.int32(0), (2**24,)),
                                         GOOD["voxel_points_count"])
    assert info.value.status == "NOT_SUPPORTED"


def test_unknown_target():
    with pytest.raises(tvm_ops.BadParamError, match="unknown target 'tpu'"):
        tvm_ops.dynamic_scatter_backward(*(GOOD[k] for k in NAMES), target="tpu")


# --- torch interop ------------------------------------------------------------
@requires_torch
@pytest.mark.parametrize("reduce_type", ["max", "sum", "mean"])
def test_torch_in_torch_out(reduce_type):
    import torch

    inputs, params = make(300, 100, 19, reduce_type, voxel_num=90, ties=True, dropped=8)
    voxel_num = torch.tensor([90], dtype=torch.int32)
    out = tvm_ops.dynamic_scatter_backward(*(torch.from_numpy(inputs[k]) for k in NAMES), voxel_num, reduce_type)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert_exact(inputs, params, out.numpy())


@requires_torch
def test_torch_out_buffer_is_written_in_place():
    import torch

    inputs, params = make(300, 100, 19, ties=True)
    out = torch.full((300, 19), 5.0)
    result = tvm_ops.dynamic_scatter_backward(*(torch.from_numpy(inputs[k]) for k in NAMES), out=out)
    assert result is out
    assert_exact(inputs, params, out.numpy())


@requires_torch
def test_mixed_kinds_are_rejected():
    import torch

    with pytest.raises(tvm_ops.BadParamError, match="feats is a numpy tensor on cpu but grad_voxel_feats is a torch"):
        tvm_ops.dynamic_scatter_backward(torch.from_numpy(GOOD["grad_voxel_feats"]),
                                         *(GOOD[k] for k in NAMES[1:]))


@requires_torch
@pytest.mark.parametrize("reduce_type", ["max", "sum", "mean"])
def test_torch_peers_match_the_reference(reduce_type):
    inputs, params = make(700, 300, 33, reduce_type, voxel_num=280, ties=True, nan=0.02, dropped=20)
    ref = TESTING.reference(inputs, params)["grad_feats"]
    peers = TESTING.peers(inputs, params)
    assert len(peers) == (1 if reduce_type == "max" else 2)
    for run in peers.values():
        assert np.array_equal(run().numpy().astype(np.float64), ref)
