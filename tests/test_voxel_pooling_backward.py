"""voxel_pooling_backward: spec cases on every CPU path, properties, garbage pos_memo, NaN,
agreement with voxel_pooling_forward, checks and interop."""


import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import build, checks, dispatch, records, runner, targets
from tvm_ops.ops.voxel_pooling_backward import OP
from tvm_ops.testing import voxel_pooling_backward as TESTING
from tvm_ops.testing.voxel_pooling_forward import pos_memo_rule

from .conftest import requires_torch, tuning_record, use_knobs

I32_MIN, I32_MAX = -2**31, 2**31 - 1
# the CPU paths: whole-line rows streamed past the caches from any output size (taken when
# the output starts on a cache line and C % 16 == 0, else the cached stores) with the row
# prefetch, and cached stores only without it, in short tasks so that several tasks end
# inside one batch
KERNEL_SETS = {"stream": {"stream": True, "stream_min_mib": 0, "prefetch_points": 16, "task_points": 1024},
               "cached": {"stream": False, "prefetch_points": 0, "task_points": 256}}


@pytest.fixture(params=list(KERNEL_SETS))
def path(request, monkeypatch):
    """Each test that takes it runs on every CPU kernel variant."""
    use_knobs(monkeypatch, OP, KERNEL_SETS[request.param])
    yield request.param
    OP.clear_call_cache()


def test_network_case_has_a_reduced_twin_in_the_suite():
    (heavy,) = [c for c in OP.spec.cases if c.heavy]
    assert heavy.shape == {"B": 2, "N": 473088, "C": 80, "Y": 128, "X": 128}
    (twin,) = [c for c in OP.spec.cases if c.set == "network" and not c.heavy]
    assert {k: twin.shape[k] for k in "BCYX"} == {"B": 2, "C": 80, "Y": 128, "X": 128}
    assert twin.extra == heavy.extra


SPEC_CASES = [c for c in OP.spec.cases if not c.heavy and c.expect == "ok"]


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c.name for c in SPEC_CASES])
def test_spec_cases_on_every_path(path, case):
    result = runner.run_case(OP, case, "float32", targets.resolve("llvm"))
    assert result.verdict == "pass", result.detail


def test_generated_pos_memo_looks_like_the_forwards():
    """make_inputs' pos_memo is the forward's rule on random geometry: kept rows (b, y, x) in
    the grid, the rest (-1, -1, -1), both present; garbage cases add rows of neither kind."""
    data, _ = TESTING.make_inputs(OP.spec.case("net_2x20000x80_128x128"), "float32", np.random.default_rng(0))
    memo = data["pos_memo"]
    dropped = (memo == -1).all(-1)
    assert memo.dtype == np.int32 and 0.1 < dropped.mean() < 0.5
    assert (memo[~dropped][:, 0] == np.repeat([0, 1], (~dropped).sum(1))).all()
    assert ((memo[~dropped][:, 1:] >= 0) & (memo[~dropped][:, 1:] < 128)).all()
    data, _ = TESTING.make_inputs(OP.spec.case("bnd_garbage_3x2000x21_5x6"), "float32", np.random.default_rng(0))
    memo = data["pos_memo"]
    b = np.arange(3)[:, None]
    forward_like = (memo == -1).all(-1) | ((memo[..., 0] == b) & (memo[..., 1] >= 0) & (memo[..., 1] < 5)
                                           & (memo[..., 2] >= 0) & (memo[..., 2] < 6))
    assert 0.2 < (~forward_like).mean() < 0.6
    assert (memo == I32_MIN).any() and (memo == I32_MAX).any()


# --- properties ------------------------------------------------------------------------
def inputs(b, n, c, y, x, garbage=0.0, seed=0):
    """grad_output [b, y, x, c] and a forward-made pos_memo [b, n, 3] (z range 2, coordinates
    2 past the edges), a `garbage` fraction of its rows arbitrary int32."""
    rng = np.random.default_rng(seed)
    geom = np.stack([rng.integers(-2, x + 2, (b, n)), rng.integers(-2, y + 2, (b, n)),
                     rng.integers(-1, 3, (b, n))], -1).astype(np.int32)
    memo = pos_memo_rule(geom, x, y, 2).astype(np.int32)
    rows = rng.random((b, n)) < garbage
    memo[rows] = TESTING.garbage_rows(rng, int(rows.sum()), b, y, x)
    return rng.uniform(-1, 1, (b, y, x, c)).astype(np.float32), memo


def reference(grad, memo):
    return TESTING.reference({"grad_output": grad, "pos_memo": memo}, {})["grad_input_features"]


def check(grad, memo, result):
    ref = reference(grad, memo)
    assert result.shape == ref.shape and result.dtype == np.float32
    np.testing.assert_array_equal(result, ref.astype(np.float32))  # a copy: bit-exact


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 3), n=st.integers(1, 400), c=st.integers(1, 70), y=st.integers(1, 9),
       x=st.integers(1, 9), garbage=st.sampled_from([0.0, 0.1, 1.0]), seed=st.integers(0, 2**16))
def test_random_shapes_and_pos_memo(path, b, n, c, y, x, garbage, seed):
    grad, memo = inputs(b, n, c, y, x, garbage, seed)
    check(grad, memo, tvm_ops.voxel_pooling_backward(grad, memo))


@pytest.mark.parametrize("c", [16, 80, 19, 37])  # whole lines (streamed when aligned) and tails
@pytest.mark.parametrize("aligned", [True, False])
def test_every_store_path_writes_every_element(path, c, aligned):
    """out= over NaN, on a cache line or one word past it: the streamed path (aligned, C % 16
    == 0) and the cached one write every element, and nothing after the output."""
    grad, memo = inputs(2, 333, c, 5, 6, garbage=0.2, seed=c)
    size = memo.shape[0] * memo.shape[1] * c
    storage = np.full(size + 16 + 64, np.nan, np.float32)
    start = (-storage.ctypes.data % 64) // 4 + (0 if aligned else 1)
    out = storage[start:start + size].reshape(2, 333, c)
    assert (out.ctypes.data % 64 == 0) == aligned
    assert tvm_ops.voxel_pooling_backward(grad, memo, out=out) is out
    check(grad, memo, out)
    assert np.isnan(storage[:start]).all() and np.isnan(storage[start + size:]).all()


def test_the_cpu_library_streams_on_x86():
    """The streamed path is in the host's library: non-temporal stores and the fence."""
    model = targets.resolve("llvm")
    if "sse2" not in model.features():
        pytest.skip("not an x86 host: streamed rows are plain stores there")
    dispatch.kernels(OP, "float32", model)  # the parallel library (a tiny call runs the one-core one)
    entry = build.find_entry(dispatch.default_variant(OP, "float32", model))
    asm = (entry / "kernels.s").read_text()
    assert "movntps" in asm and "sfence" in asm  # (v)movntps: SSE or AVX encodings


@pytest.mark.parametrize("knob, value", [("task_points", 0), ("task_points", -1), ("task_points", 2.5),
                                         ("task_points", True), ("prefetch_points", -1), ("stream", "false"),
                                         ("stream_min_mib", -1)])
def test_the_plan_refuses_knobs_its_loops_are_not_made_for(knob, value):
    """A task of -1 points once left points out of the sum (through a tuning record that held it)."""
    with pytest.raises(ValueError, match=f"{knob} must be"):
        OP.plan(targets.host_cpu(), dict(OP.schedules["llvm"].defaults, **{knob: value}))


def test_a_record_with_a_task_of_minus_one_points_leaves_the_call_on_the_default(tmp_path, monkeypatch):
    grad, memo = inputs(2, 3000, 80, 16, 16)
    problem = checks.check(OP.spec, {"grad_output": grad, "pos_memo": memo}, {}, {}, OP.rules)
    model = targets.host_cpu()
    record = tuning_record(OP, model, records.problem_class(OP.spec, problem), "by hand",
                           dict(OP.schedules["llvm"].defaults, task_points=-1))
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(record) + "\n")
    monkeypatch.setenv("TVM_OPS_RECORDS", str(path))
    OP.clear_call_cache()
    try:
        check(grad, memo, tvm_ops.voxel_pooling_backward(grad, memo))
    finally:
        OP.clear_call_cache()


# --- pos_memo of any int32 value ----------------------------------------------------------
def test_any_int32_pos_memo_reads_and_writes_only_its_buffers(path):
    """Every triple of int32 extremes, edges and in-range values: the points that name
    their own batch and a voxel of the grid get its row, the others zeros. grad_output sits
    between sentinel rows that any read outside it would copy into the result (a read far
    outside would fault), and the output is followed by sentinels."""
    B, Y, X, C = 2, 3, 4, 21
    values = np.array([I32_MIN, I32_MIN + 1, -2, -1, 0, 1, 2, 3, 4, 5, 2**30, I32_MAX], np.int32)
    grid = np.stack(np.meshgrid(values, values, values, indexing="ij"), -1).reshape(1, -1, 3)
    memo = np.ascontiguousarray(np.broadcast_to(grid, (B,) + grid.shape[1:]))
    N = memo.shape[1]
    size = B * Y * X * C
    padded = np.full(size + 2 * 4096, 1e30, np.float32)  # sentinels before and after grad_output
    grad = padded[4096:4096 + size].reshape(B, Y, X, C)
    grad[...] = np.random.default_rng(1).uniform(-1, 1, grad.shape)
    storage = np.full(B * N * C + 64, -5.0, np.float32)
    out = storage[:B * N * C].reshape(B, N, C)
    tvm_ops.voxel_pooling_backward(grad, memo, out=out)
    assert (storage[B * N * C:] == -5.0).all()
    check(grad, memo, out)
    kept = (memo[..., 0] == np.arange(B)[:, None]) & (memo[..., 1] >= 0) & (memo[..., 1] < Y) & \
        (memo[..., 2] >= 0) & (memo[..., 2] < X)
    assert kept.sum() == B * Y * X  # each batch's own (y, x) pairs, once each
    assert (out[~kept] == 0).all() and (np.abs(out[kept]) <= 1).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_reaches_exactly_the_points_of_its_voxel(path, bad):
    """A dropped point stores zeros, never grad_output[b, 0, 0] times 0 (which would be NaN)."""
    grad, memo = inputs(2, 300, 21, 4, 5, garbage=0.1, seed=4)
    grad[1, 0, 0, [3, 18]] = bad  # voxel (0, 0): a main-vector channel and a tail channel
    grad[0, 2, 3, 5] = bad
    memo[1, 7] = (1, 0, 0)
    memo[0, 8] = (0, 2, 3)
    memo[0, 9] = (1, 0, 0)   # another batch's index: not kept
    out = tvm_ops.voxel_pooling_backward(grad, memo)
    check(grad, memo, out)
    hit = {(1, int(n)) for n in np.flatnonzero((memo[1] == (1, 0, 0)).all(-1))}
    hit |= {(0, int(n)) for n in np.flatnonzero((memo[0] == (0, 2, 3)).all(-1))}
    rows = {tuple(map(int, bn)) for bn in np.argwhere(~np.isfinite(out))[:, :2]}
    assert rows == hit and (1, 7) in rows and (0, 8) in rows and (0, 9) not in rows
    assert (out[0, 9] == 0).all()


# --- agreement with the forward ------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3000, 80, 16, 16, 1), (3, 777, 19, 5, 7, 3), (1, 50, 3, 1, 1, 1)])
def test_is_the_adjoint_of_the_forwards_sum(shape):
    """<forward(f), g> == <f, backward(g, pos_memo)> for random f, g: the forward sums each
    kept point's features into its voxel, and the backward hands that voxel's gradient back
    to exactly those points (computed in float64 from the float32 results)."""
    B, N, C, X, Y, Z = shape
    rng = np.random.default_rng(sum(shape))
    geom = np.stack([rng.integers(-3, X + 3, (B, N)), rng.integers(-3, Y + 3, (B, N)),
                     rng.integers(-1, Z + 1, (B, N))], -1).astype(np.int32)
    feat = rng.uniform(-1, 1, (B, N, C)).astype(np.float32)
    g = rng.uniform(-1, 1, (B, Y, X, C)).astype(np.float32)
    pooled, memo = tvm_ops.voxel_pooling_forward(geom, feat, X, Y, Z)
    grad_feat = tvm_ops.voxel_pooling_backward(g, memo)
    lhs = np.sum(pooled.astype(np.float64) * g)
    rhs = np.sum(feat.astype(np.float64) * grad_feat)
    assert lhs == pytest.approx(rhs, rel=1e-5, abs=1e-4)
    assert 0 < (grad_feat != 0).any(-1).mean() < 1  # some points kept, some dropped


# --- shapes, out= and checks -------------------------------------------------------------
def test_one_kernel_serves_many_shapes():
    # a small call and a large one: the one-core build and the parallel one (the policy's choice)
    tvm_ops.voxel_pooling_backward(*inputs(1, 3, 2, 2, 2))
    tvm_ops.voxel_pooling_backward(*inputs(1, 900, 64, 16, 16))
    before = build.build_count
    for shape in [(2, 50, 16, 7, 3), (1, 1000, 33, 1, 1), (3, 17, 1, 40, 2), (1, 64, 80, 16, 16)]:
        grad, memo = inputs(*shape, garbage=0.1)
        check(grad, memo, tvm_ops.voxel_pooling_backward(grad, memo))
    assert build.build_count == before


def test_non_contiguous_inputs_are_made_contiguous():
    grad, memo = inputs(2, 80, 10, 5, 5)
    wide = np.zeros((2, 5, 5, 20), np.float32)
    wide[..., ::2] = grad
    memo_t = np.ascontiguousarray(memo.transpose(1, 0, 2)).transpose(1, 0, 2)
    assert not memo_t.flags.c_contiguous
    check(grad, memo, tvm_ops.voxel_pooling_backward(wide[..., ::2], memo_t))


@pytest.mark.parametrize("b, n, c, y, x", [(1, 50, 7, 3, 5), (2, 300, 80, 17, 33), (2, 500, 19, 40, 40),
                                           (1, 900, 33, 64, 70), (3, 10, 1, 1, 1), (1, 700, 16, 32, 32)])
def test_a_channels_first_gradient_is_rewritten_channels_last_with_the_same_bits(path, b, n, c, y, x):
    # the gradient of functional.voxel_pooling's [B, C, Y, X] view: a [B, Y, X, C] view of
    # channels-first memory, taken as it is and transposed in registers (ops/channels_last.py):
    # whole squares, C % 16 channels, positions past the last square and past a task's 1024
    grad, memo = inputs(b, n, c, y, x, garbage=0.1)
    channels_first = np.ascontiguousarray(grad.transpose(0, 3, 1, 2))
    view = channels_first.transpose(0, 2, 3, 1)
    check(grad, memo, tvm_ops.voxel_pooling_backward(view, memo))
    plan = OP._calls.get(OP._signature({"grad_output": view, "pos_memo": memo}, {}, "llvm",
                                       {"grad_input_features": None}))
    # with one channel or one position the view is contiguous already: the plain gather
    assert plan.problem.notes["channels_first"] == (not view.flags.c_contiguous) == (c > 1 and y * x > 1)


@requires_torch
def test_a_torch_channels_first_gradient_takes_the_same_path():
    import torch

    grad, memo = inputs(2, 300, 80, 17, 33, garbage=0.1)
    view = torch.from_numpy(np.ascontiguousarray(grad.transpose(0, 3, 1, 2))).permute(0, 2, 3, 1)
    result = tvm_ops.voxel_pooling_backward(view, torch.from_numpy(memo))
    check(grad, memo, result.numpy())


GRAD, MEMO = inputs(2, 6, 4, 3, 5)


def call(grad=GRAD, memo=MEMO, out=None):
    return tvm_ops.voxel_pooling_backward(grad, memo, out=out)


@pytest.mark.parametrize("changes, pattern", [
    ({"grad": None}, r"grad_output is missing"),
    ({"memo": [[0, 0, 0]]}, r"pos_memo must be a numpy array"),
    ({"grad": np.zeros((2, 3, 5), np.float32)}, r"grad_output must have rank 4 \[B, Y, X, C\], got rank 3"),
    ({"memo": np.zeros((2, 6), np.int32)}, r"pos_memo must have rank 3 \[B, N, 3\], got rank 2"),
    ({"memo": np.zeros((2, 6, 3), np.int64)}, r"pos_memo must have dtype int32, got int64"),
    ({"grad": np.zeros((2, 3, 5, 4), np.float16)}, r"grad_output must have dtype float32, got float16"),
    ({"grad": np.zeros((2, 3, 5, 4), np.float64)}, r"grad_output must have dtype float32, got float64"),
    ({"memo": np.zeros((3, 6, 3), np.int32)}, r"pos_memo.shape\[0\] \(B\) must equal grad_output.shape\[0\] = 2, got 3"),
    ({"memo": np.zeros((2, 6, 2), np.int32)}, r"pos_memo.shape\[2\] must be 3, got 2"),
    ({"grad": np.zeros((0, 3, 5, 4), np.float32), "memo": np.zeros((0, 6, 3), np.int32)},
     r"B, N, C, Y, X must be non-zero, got B=0"),
    ({"memo": np.zeros((2, 0, 3), np.int32)}, r"got B=2, N=0, C=4, Y=3, X=5"),
    ({"grad": np.zeros((2, 3, 5, 0), np.float32)}, r"got B=2, N=6, C=0"),
    ({"grad": np.zeros((2, 0, 5, 4), np.float32)}, r"C=4, Y=0, X=5"),
    ({"grad": np.zeros((2, 3, 0, 4), np.float32)}, r"Y=3, X=0"),
])
def test_bad_inputs(changes, pattern):
    with pytest.raises(tvm_ops.BadParamError, match=pattern) as info:
        call(**changes)
    assert info.value.status == "BAD_PARAM"


def test_out_checks():
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input_features'\].shape\[1\] \(N\) must equal"):
        call(out=np.zeros((2, 7, 4), np.float32))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input_features'\].shape\[2\] \(C\) must equal"):
        call(out=np.zeros((2, 6, 5), np.float32))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input_features'\] must have the dtype of"):
        call(out=np.zeros((2, 6, 4), np.float64))
    with pytest.raises(tvm_ops.BadParamError, match=r"shares memory with grad_output"):
        call(out=GRAD.reshape(-1)[:48].reshape(2, 6, 4))
    with pytest.raises(tvm_ops.NotSupportedError, match=r"must be C-contiguous"):
        call(out=np.zeros((2, 6, 8), np.float32)[..., ::2])


def test_large_tensors_are_not_supported_without_touching_data():
    huge = np.broadcast_to(np.zeros(1, np.float32), (1, 2**16, 2**15, 1))  # 2^31 elements, no memory
    with pytest.raises(tvm_ops.NotSupportedError, match=r"grad_output has 2147483648 elements"):
        tvm_ops.voxel_pooling_backward(huge, np.zeros((1, 1, 3), np.int32))
    # a small input whose output would reach 2^31 elements
    points = np.broadcast_to(np.zeros(1, np.int32), (1, 2**20, 3))
    with pytest.raises(tvm_ops.NotSupportedError, match=r"grad_input_features has 2147483648 elements"):
        tvm_ops.voxel_pooling_backward(np.zeros((1, 1, 1, 2**11), np.float32), points)


# --- torch interop --------------------------------------------------------------------
@requires_torch
def test_torch_in_torch_out_and_out():
    import torch

    grad, memo = inputs(2, 300, 23, 6, 8, garbage=0.1)
    result = tvm_ops.voxel_pooling_backward(torch.from_numpy(grad), torch.from_numpy(memo))
    assert isinstance(result, torch.Tensor) and result.dtype == torch.float32
    check(grad, memo, result.numpy())
    out = torch.full((2, 300, 23), float("nan"))
    assert tvm_ops.voxel_pooling_backward(torch.from_numpy(grad), torch.from_numpy(memo), out=out) is out
    check(grad, memo, out.numpy())


@requires_torch
def test_mixed_kinds_are_rejected():
    import torch

    with pytest.raises(tvm_ops.BadParamError, match="is a torch tensor on cpu but grad_output is a numpy"):
        tvm_ops.voxel_pooling_backward(GRAD, torch.from_numpy(MEMO))
