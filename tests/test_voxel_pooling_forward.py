"""voxel_pooling_forward: spec cases, properties, edges, NaN, determinism, checks and interop."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import build, metrics, runner, targets
from tvm_ops.ops.voxel_pooling_forward import OP, first_touch, row_bands
from tvm_ops.testing import voxel_pooling_forward as TESTING

from . import conftest
from .conftest import requires_torch

I32_MIN, I32_MAX = -2**31, 2**31 - 1
ALGORITHMS = OP.schedules["llvm"].candidates["algorithm"]  # owner, sort
# the CPU paths: owner with R bands of output rows per batch, zero-filled first (kept points
# listed 4096 or 1024 at a time: several lists per batch in the larger cases) or at first
# touch (its untouched rows' zeros streamed past the caches from any size, where the output
# starts on a line, or cached), and sort. Fixed R and zero fill, not auto, so every split and
# both band kernels run whatever the machine's core count and the case's points per row.
KERNEL_SETS = {"owner-R1": {"algorithm": "owner", "row_bands": 1, "zero_fill": "upfront"},
               "owner-R2": {"algorithm": "owner", "row_bands": 2, "zero_fill": "upfront", "kept_list": 1024},
               "owner-R1-first-touch": {"algorithm": "owner", "row_bands": 1, "zero_fill": "first_touch",
                                        "stream_untouched": False},
               "owner-R4-first-touch": {"algorithm": "owner", "row_bands": 4, "zero_fill": "first_touch",
                                        "stream_untouched": True, "stream_min_mib": 0},
               "sort": {"algorithm": "sort", "row_bands": 1}}


def use_knobs(monkeypatch, knobs: dict) -> None:
    conftest.use_knobs(monkeypatch, OP, knobs)


@pytest.fixture(params=list(KERNEL_SETS))
def algorithm(request, monkeypatch):
    """Each test that takes it runs on every CPU kernel set."""
    use_knobs(monkeypatch, KERNEL_SETS[request.param])
    yield request.param
    OP.clear_call_cache()



def test_network_case_has_a_reduced_twin_in_the_suite():
    heavy = [c for c in OP.spec.cases if c.heavy]
    assert [c.shape for c in heavy] == [{"B": b, "N": 473088, "C": 80, "X": 128, "Y": 128, "Z": 1} for b in (2, 1)]
    twins = [c for c in OP.spec.cases if c.set == "network" and not c.heavy]
    assert [c.shape["B"] for c in twins] == [2, 1]
    assert all(c.shape["C"] == 80 and c.shape["X"] == 128 for c in twins)


SPEC_CASES = [c for c in OP.spec.cases if not c.heavy]


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c.name for c in SPEC_CASES])
def test_spec_cases_with_every_algorithm(algorithm, case):
    result = runner.run_case(OP, case, "float32", targets.resolve("llvm"))
    assert result.verdict == "pass", result.detail


def test_every_kernel_set_gives_the_same_bits(monkeypatch):
    """Every set adds each voxel's points from zero in point order (owner with any R, and
    sort): identical sums, so neither the algorithm nor the band split can change a result.
    The data is order-sensitive (features over six decades), so another order would show."""
    geom, feat = inputs(2, 5000, 37, 9, 7, 2, spill=3, z_spill=1, seed=5)
    feat *= 10.0 ** np.random.default_rng(5).uniform(-3, 3, (2, 5000, 1)).astype(np.float32)
    results = []
    for knobs in KERNEL_SETS.values():
        use_knobs(monkeypatch, knobs)
        out, memo = tvm_ops.voxel_pooling_forward(geom, feat, 9, 7, 2)
        check(geom, feat, 9, 7, 2, (out, memo))
        results.append(out.tobytes() + memo.tobytes())
    assert len(results) == len(KERNEL_SETS) and all(r == results[0] for r in results)
    assert np.array_equal(np.frombuffer(results[0][:out.nbytes], np.float32).reshape(out.shape),
                          in_point_order(geom, feat, 9, 7, 2))


def in_point_order(geom, feat, X, Y, Z):
    """float32 emulation of the owner sums: each voxel from zero, its points in order."""
    B, N, C = feat.shape
    out = np.zeros((B, Y, X, C), np.float32)
    for b in range(B):
        for n in range(N):
            x, y, z = geom[b, n]
            if 0 <= x < X and 0 <= y < Y and 0 <= z < Z:
                out[b, y, x] += feat[b, n]
    return out


@pytest.mark.parametrize("zero_fill", ["upfront", "first_touch"])
@pytest.mark.parametrize("R, Y", [(2, 7), (4, 7), (4, 3), (3, 2)])  # 4 bands of 7 rows: the last holds 1; of 3: empty
def test_row_bands_cover_every_row_once(monkeypatch, R, Y, zero_fill):
    """Bands of ceil(Y / R) rows, the last short or empty: every output row written (over
    garbage) by exactly its band, the sums those of point order; with first touches too,
    whether a row gets no point (zero-filled after the walk), one or many."""
    use_knobs(monkeypatch, {"algorithm": "owner", "row_bands": R, "zero_fill": zero_fill})
    geom, feat = inputs(2, 3001 if zero_fill == "upfront" else 6 * Y, 21, 3, Y, 1, spill=1, seed=R)
    if zero_fill == "first_touch":  # rows with no point (batch 0's last), one (batch 1's first) and several
        geom[0, (geom[0, :, 0] == 2) & (geom[0, :, 1] == Y - 1), 0] = -1
        geom[0, :2] = 0
        geom[1, (geom[1, :, 0] == 0) & (geom[1, :, 1] == 0), 0] = -1
        geom[1, 2] = 0
    out = np.full((2, Y, 3, 21), np.nan, np.float32)
    memo = np.full(geom.shape, 7, np.int32)
    tvm_ops.voxel_pooling_forward(geom, feat, 3, Y, 1, out=(out, memo))
    np.testing.assert_array_equal(out, in_point_order(geom, feat, 3, Y, 1))
    check(geom, feat, 3, Y, 1, (out, memo))


@pytest.mark.parametrize("kept_list", [0, -4096, True, 4096.0, "4096"])
def test_kept_list_must_be_a_positive_integer(kept_list):
    """The zero-filled walk's points per list (a tuning record or schedule file may hold any
    value): anything but a positive int is refused before a kernel is built."""
    with pytest.raises(ValueError, match=r"kept_list must be an integer from 1 to \d+, got "):
        OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults, kept_list=kept_list))
    assert OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults, kept_list=7))["kept_list"] == 7


@pytest.mark.parametrize("stream_untouched", ["false", 0, 1, None])
def test_stream_untouched_must_be_a_bool(stream_untouched):
    """A knob read from a tuning record or schedule file: "false" must not stream."""
    with pytest.raises(ValueError, match=r"stream_untouched must be true or false, got "):
        OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults, stream_untouched=stream_untouched))
    assert OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults, stream_untouched=False))[
        "stream_untouched"] is False


def test_first_touch_below_four_points_per_output_row():
    """zero_fill auto: the band owners mark first touches while a batch has fewer than 4
    points per output row, else zero-fill their band first; upfront / first_touch force it."""
    plan = OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults))
    assert plan["zero_fill"] == "auto"
    sizes = {"B": 1, "N": 20000, "Y": 128, "X": 128, "C": 80}
    assert first_touch(sizes, plan) and first_touch(dict(sizes, N=4 * 128 * 128 - 1), plan)
    assert not first_touch(dict(sizes, N=4 * 128 * 128), plan) and not first_touch(dict(sizes, N=473088), plan)
    assert not first_touch(sizes, dict(plan, zero_fill="upfront"))
    assert first_touch(dict(sizes, N=473088), dict(plan, zero_fill="first_touch"))
    with pytest.raises(ValueError, match="zero_fill must be one of"):
        OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults, zero_fill="never"))


@pytest.mark.parametrize("zero_fill", ["upfront", "first_touch"])
def test_a_lone_negative_zero_sums_to_positive_zero(monkeypatch, zero_fill):
    """A voxel is summed from +0: its one point's -0.0 gives +0.0 (0 + -0), also when the
    first touch stores the point's row (it stores feat + 0)."""
    use_knobs(monkeypatch, {"algorithm": "owner", "row_bands": 1, "zero_fill": zero_fill})
    geom = np.array([[[0, 0, 0], [1, 0, 0], [1, 0, 0]]], np.int32)
    feat = np.full((1, 3, 33), -0.0, np.float32)  # two channel vectors and a tail at any width
    feat[0, 2, ::2] = 2.0
    out, _ = tvm_ops.voxel_pooling_forward(geom, feat, 2, 1, 1)
    expected = np.zeros((1, 1, 2, 33), np.float32)  # -0 + 2 = 2; every other sum from +0
    expected[0, 0, 1, ::2] = 2.0
    assert out.view(np.uint32).tolist() == expected.view(np.uint32).tolist()


def test_row_bands_follow_the_model_not_the_thread_count():
    plan = OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults, row_bands="auto"))
    sizes = {"B": 1, "N": 473088, "Y": 128, "X": 128, "C": 80}
    assert row_bands(sizes, dict(plan, cores=2)) == 2
    assert row_bands(dict(sizes, B=2), dict(plan, cores=2)) == 1
    assert row_bands(dict(sizes, B=3), dict(plan, cores=16)) == 6  # ceil(16 / 3)
    assert row_bands(dict(sizes, Y=3), dict(plan, row_bands=4)) == 3  # at most Y bands
    assert OP.workspaces(dataclasses.make_dataclass("Problem", ["sizes", "dtype"])(sizes, "float32"), plan) == {}
    with pytest.raises(ValueError, match=r"row_bands must be an integer from 1 to \d+, got 0"):
        OP.plan(targets.resolve("llvm"), dict(OP.schedules["llvm"].defaults, row_bands=0))


@pytest.mark.parametrize("c", [16, 80, 19, 37])  # whole lines (streamed when aligned) and tails
@pytest.mark.parametrize("aligned", [True, False])
def test_every_first_touch_store_path_writes_every_row(monkeypatch, c, aligned):
    """out= over NaN, on a cache line or one word past it, rows with points and rows without:
    the streamed zeros (aligned, C % 16 == 0) and the cached ones give the sums of point
    order in every row, and nothing is written around the output."""
    use_knobs(monkeypatch, {"algorithm": "owner", "row_bands": 2, "zero_fill": "first_touch",
                            "stream_untouched": True, "stream_min_mib": 0})
    geom, feat = inputs(2, 40, c, 6, 5, 1, spill=2, seed=c)
    size = 2 * 5 * 6 * c
    storage = np.full(size + 16 + 64, np.nan, np.float32)
    start = (-storage.ctypes.data % 64) // 4 + (0 if aligned else 1)
    out = storage[start:start + size].reshape(2, 5, 6, c)
    assert (out.ctypes.data % 64 == 0) == aligned
    memo = np.empty(geom.shape, np.int32)
    tvm_ops.voxel_pooling_forward(geom, feat, 6, 5, 1, out=(out, memo))
    expected = in_point_order(geom, feat, 6, 5, 1)
    assert (expected == 0).all(axis=-1).any() and (expected != 0).any(axis=-1).any()  # both kinds of row
    np.testing.assert_array_equal(out, expected)
    assert np.isnan(storage[:start]).all() and np.isnan(storage[start + size:]).all()


def test_the_cpu_library_streams_untouched_rows_on_x86():
    """The first-touch walk's streamed zeros are in the host's library: non-temporal stores
    and the fence."""
    model = targets.resolve("llvm")
    if "sse2" not in model.features():
        pytest.skip("not an x86 host: the zeros are plain stores there")
    from tvm_ops import dispatch

    dispatch.kernels(OP, "float32", model)  # the parallel library (a tiny call runs the one-core one)
    asm = (build.find_entry(dispatch.default_variant(OP, "float32", model)) / "kernels.s").read_text()
    assert "movntps" in asm and "sfence" in asm  # (v)movntps: SSE or AVX encodings


def inputs(b, n, c, x, y, z, spill=0, z_spill=0, seed=0):
    rng = np.random.default_rng(seed)
    geom = np.stack([rng.integers(-spill, x + spill, (b, n)), rng.integers(-spill, y + spill, (b, n)),
                     rng.integers(-z_spill, z + z_spill, (b, n))], -1).astype(np.int32)
    return geom, rng.uniform(-1, 1, (b, n, c)).astype(np.float32)


def reference(geom, feat, x, y, z):
    ref = TESTING.reference({"geom_xyz": geom, "input_features": feat},
                       {"num_voxel_x": x, "num_voxel_y": y, "num_voxel_z": z})
    return ref["output_features"], ref["pos_memo"]


def check(geom, feat, x, y, z, result):
    out, memo = result
    ref_out, ref_memo = reference(geom, feat, x, y, z)
    assert out.shape == ref_out.shape and out.dtype == np.float32
    assert memo.dtype == np.int32
    np.testing.assert_array_equal(memo, ref_memo)  # exact: the metrics would hide one wrong entry
    assert metrics.accuracy(np.asarray(out), ref_out, "float32").failures(OP.spec.accuracy["float32"]) == []


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 3), n=st.integers(1, 400), c=st.integers(1, 45), x=st.integers(1, 12),
       y=st.integers(1, 12), z=st.integers(1, 4), spill=st.integers(0, 20), z_spill=st.integers(0, 3),
       seed=st.integers(0, 2**16))
def test_random_shapes_with_many_out_of_range_points(algorithm, b, n, c, x, y, z, spill, z_spill, seed):
    geom, feat = inputs(b, n, c, x, y, z, spill, z_spill, seed)
    check(geom, feat, x, y, z, tvm_ops.voxel_pooling_forward(geom, feat, x, y, z))


def test_zero_coordinates_are_valid_and_the_far_edges_are_not(algorithm):
    X, Y, Z = 5, 4, 3
    points = [  # (x, y, z), kept?
        (0, 0, 0, True), (X - 1, Y - 1, Z - 1, True), (0, 2, 1, True), (3, 0, 1, True), (3, 2, 0, True),
        (X, 0, 0, False), (0, Y, 0, False), (0, 0, Z, False),
        (-1, 0, 0, False), (0, -1, 0, False), (0, 0, -1, False),
    ]
    geom = np.array([[p[:3] for p in points]], np.int32)
    feat = np.arange(1, len(points) * 2 + 1, dtype=np.float32).reshape(1, len(points), 2)
    out, memo = tvm_ops.voxel_pooling_forward(geom, feat, X, Y, Z)
    for n, (px, py, pz, kept) in enumerate(points):
        assert memo[0, n].tolist() == ([0, py, px] if kept else [-1, -1, -1]), (px, py, pz)
    expected = np.zeros((1, Y, X, 2), np.float32)
    for n, (px, py, _pz, kept) in enumerate(points):
        if kept:
            expected[0, py, px] += feat[0, n]
    np.testing.assert_array_equal(out, expected)
    assert out[0, 0, 0].tolist() == feat[0, 0].tolist()  # x = y = z = 0 lands in voxel (0, 0)


def test_extreme_int32_coordinates_write_nothing(algorithm):
    X, Y, Z = 3, 3, 2
    values = np.array([I32_MIN, I32_MIN + 1, -1, 3, 2**30, I32_MAX], np.int32)
    grid = np.stack(np.meshgrid(values, values, values, indexing="ij"), -1).reshape(1, -1, 3)
    geom = np.concatenate([grid, np.array([[[1, 2, 1]]], np.int32)], axis=1)  # one kept point last
    feat = np.full((1, geom.shape[1], 19), 7.0, np.float32)
    storage = np.full(1 * Y * X * 19 + 64, -5.0, np.float32)  # sentinels after the output
    out = storage[:Y * X * 19].reshape(1, Y, X, 19)
    memo = np.empty((1, geom.shape[1], 3), np.int32)
    tvm_ops.voxel_pooling_forward(geom, feat, X, Y, Z, out=(out, memo))
    assert (storage[Y * X * 19:] == -5.0).all()
    expected = np.zeros((1, Y, X, 19), np.float32)
    expected[0, 2, 1] = 7.0
    np.testing.assert_array_equal(out, expected)
    assert (memo[0, :-1] == -1).all() and memo[0, -1].tolist() == [0, 2, 1]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_propagates_to_exactly_its_voxel(algorithm, bad):
    X, Y, Z, C = 6, 5, 2, 21  # C = 16 + a tail of 5
    geom, feat = inputs(2, 300, C, X, Y, Z, spill=2, z_spill=1, seed=3)
    geom[1, 7] = (0, 4, 1)      # a kept point
    geom[0, 9] = (2, 1, Z)      # a point dropped by z
    geom[1, 11] = (X, 0, 0)     # a point dropped by x
    for ch in (3, 18):          # a main-vector channel and a tail channel
        feat[1, 7, ch] = bad
        feat[0, 9, ch] = bad
        feat[1, 11, ch] = bad
    out, memo = tvm_ops.voxel_pooling_forward(geom, feat, X, Y, Z)
    nonfinite = np.argwhere(~np.isfinite(out))
    assert nonfinite.tolist() == [[1, 4, 0, 3], [1, 4, 0, 18]]
    if bad == np.inf:
        assert (out[1, 4, 0, [3, 18]] == np.inf).all()
    ref_out, ref_memo = reference(geom, feat, X, Y, Z)
    np.testing.assert_array_equal(memo, ref_memo)
    keep = np.isfinite(ref_out)
    np.testing.assert_allclose(out[keep], ref_out[keep], rtol=1e-5, atol=1e-5)


# --- determinism: both algorithms sum every voxel in point order ----------------------
DETERMINISM_CHILD = """
import dataclasses, hashlib, json, os, numpy as np, tvm, tvm_ops
from tvm_ops.ops.voxel_pooling_forward import OP
if os.environ.get("VOXEL_KNOBS"):  # a child process: the parent's choice of kernel set
    llvm = OP.schedules["llvm"]
    OP.schedules = dict(OP.schedules, llvm=dataclasses.replace(
        llvm, defaults=dict(llvm.defaults, **json.loads(os.environ["VOXEL_KNOBS"]))))
rng = np.random.default_rng(11)
geom = np.stack([rng.integers(-2, 6, (3, 40000)), rng.integers(-2, 5, (3, 40000)),
                 rng.integers(0, 2, (3, 40000))], -1).astype(np.int32)
feat = (rng.standard_normal((3, 40000, 35)) * 10 ** rng.uniform(-3, 3, (3, 40000, 1))).astype(np.float32)
out, memo = tvm_ops.voxel_pooling_forward(geom, feat, 4, 3, 1)
print(tvm.runtime.num_threads(), hashlib.sha256(out.tobytes() + memo.tobytes()).hexdigest())
"""


def _child_digest(threads: int, algorithm: str) -> tuple[int, str]:
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               VOXEL_KNOBS=json.dumps(KERNEL_SETS[algorithm]), TVM_OPS_RECORDS=os.devnull)
    done = subprocess.run([sys.executable, "-c", DETERMINISM_CHILD], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    used, digest = done.stdout.split()[-2:]
    return int(used), digest


def test_same_bits_on_every_run_and_thread_count(algorithm):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: TVM caps its pool at the cores, so no second thread count exists")
    one = _child_digest(1, algorithm)
    two = _child_digest(2, algorithm)
    assert one[0] == 1 and two[0] == 2  # the children really ran with different pools
    assert one[1] == two[1]
    namespace = {}
    exec(DETERMINISM_CHILD.replace("print(", "result = ("), namespace)  # this process, twice
    first = namespace["result"][1]
    exec(DETERMINISM_CHILD.replace("print(", "result = ("), namespace)
    assert first == namespace["result"][1] == one[1]
    # the data is order-sensitive: summing in reverse point order changes the bits, so a
    # schedule that reordered the sums per thread count would be caught
    geom, feat = namespace["geom"], namespace["feat"]
    kept = (geom[..., 0] >= 0) & (geom[..., 0] < 4) & (geom[..., 1] >= 0) & (geom[..., 1] < 3)
    kept &= geom[..., 2] == 0  # Z = 1
    voxel = ((np.arange(3)[:, None] * 3 + geom[..., 1]) * 4 + geom[..., 0])[kept]
    rows = feat[kept]
    forward, backward = np.zeros((36, 35), np.float32), np.zeros((36, 35), np.float32)
    np.add.at(forward, voxel, rows)
    np.add.at(backward, voxel[::-1], rows[::-1])
    assert not np.array_equal(forward, backward)


def test_one_kernel_serves_many_shapes():
    # a small call and a large one: the one-core build and the parallel one (the policy's choice)
    tvm_ops.voxel_pooling_forward(*inputs(1, 3, 2, 2, 2, 1), 2, 2, 1)
    tvm_ops.voxel_pooling_forward(*inputs(2, 500, 64, 12, 12, 1), 12, 12, 1)
    before = build.build_count
    for shape in [(2, 50, 16, 7, 3, 2), (1, 1000, 33, 1, 1, 1), (3, 17, 1, 40, 2, 5), (1, 64, 80, 16, 16, 1)]:
        geom, feat = inputs(*shape, spill=3, z_spill=1)
        check(geom, feat, *shape[3:], tvm_ops.voxel_pooling_forward(geom, feat, *shape[3:]))
    assert build.build_count == before


# --- out= ----------------------------------------------------------------------
def test_out_pair_is_written_in_place_over_garbage(algorithm):
    geom, feat = inputs(2, 200, 19, 6, 5, 2, spill=2, z_spill=1)
    out = np.full((2, 5, 6, 19), np.nan, np.float32)  # the kernels must overwrite every element
    memo = np.full((2, 200, 3), 99, np.int32)
    result = tvm_ops.voxel_pooling_forward(geom, feat, 6, 5, 2, out=(out, memo))
    assert result[0] is out and result[1] is memo
    check(geom, feat, 6, 5, 2, (out, memo))


@pytest.mark.parametrize("which", [0, 1])
def test_out_pair_may_hold_none(which):
    geom, feat = inputs(1, 100, 5, 4, 4, 1, spill=1)
    buffers = [np.empty((1, 4, 4, 5), np.float32), np.empty((1, 100, 3), np.int32)]
    given = tuple(b if i == which else None for i, b in enumerate(buffers))
    result = tvm_ops.voxel_pooling_forward(geom, feat, 4, 4, 1, out=given)
    assert result[which] is buffers[which]
    check(geom, feat, 4, 4, 1, result)


def test_non_contiguous_inputs_are_made_contiguous():
    geom, feat = inputs(2, 80, 10, 5, 5, 1, spill=1)
    wide = np.zeros((2, 80, 20), np.float32)
    wide[:, :, ::2] = feat
    check(geom, feat, 5, 5, 1, tvm_ops.voxel_pooling_forward(geom, wide[:, :, ::2], 5, 5, 1))


# --- checks: type, status and a message naming the tensor --------------------------
GEOM, FEAT = inputs(2, 6, 4, 3, 3, 1)


def call(geom=GEOM, feat=FEAT, x=3, y=3, z=1, out=None):
    return tvm_ops.voxel_pooling_forward(geom, feat, x, y, z, out=out)


@pytest.mark.parametrize("changes, error, pattern", [
    ({"geom": None}, tvm_ops.BadParamError, r"geom_xyz is missing"),
    ({"feat": [[1.0]]}, tvm_ops.BadParamError, r"input_features must be a numpy array"),
    ({"geom": np.zeros((2, 6), np.int32)}, tvm_ops.BadParamError,
     r"geom_xyz must have rank 3 \[B, N, 3\], got rank 2"),
    ({"feat": np.zeros((2, 6, 4, 1), np.float32)}, tvm_ops.BadParamError,
     r"input_features must have rank 3 \[B, N, C\], got rank 4"),
    ({"geom": np.zeros((2, 6, 3), np.int64)}, tvm_ops.BadParamError, r"geom_xyz must have dtype int32, got int64"),
    ({"feat": np.zeros((2, 6, 4), np.float16)}, tvm_ops.BadParamError,
     r"input_features must have dtype float32, got float16"),
    ({"feat": np.zeros((2, 6, 4), np.float64)}, tvm_ops.BadParamError,
     r"input_features must have dtype float32, got float64"),
    ({"geom": np.zeros((3, 6, 3), np.int32)}, tvm_ops.BadParamError,
     r"geom_xyz.shape\[0\] \(B\) must equal input_features.shape\[0\] = 2, got 3"),
    ({"geom": np.zeros((2, 5, 3), np.int32)}, tvm_ops.BadParamError,
     r"geom_xyz.shape\[1\] \(N\) must equal input_features.shape\[1\] = 6, got 5"),
    ({"geom": np.zeros((2, 6, 2), np.int32)}, tvm_ops.BadParamError, r"geom_xyz.shape\[2\] must be 3, got 2"),
    ({"x": 0}, tvm_ops.BadParamError, r"num_voxel_x must be >= 1, got 0"),
    ({"y": -4}, tvm_ops.BadParamError, r"num_voxel_y must be >= 1, got -4"),
    ({"z": 0}, tvm_ops.BadParamError, r"num_voxel_z must be >= 1, got 0"),
    ({"x": 2.0}, tvm_ops.BadParamError, r"num_voxel_x must be an integer"),
    ({"z": True}, tvm_ops.BadParamError, r"num_voxel_z must be an integer"),
    ({"y": None}, tvm_ops.BadParamError, r"num_voxel_y is required"),
    ({"z": None}, tvm_ops.BadParamError, r"num_voxel_z is required"),
    ({"geom": np.zeros((0, 6, 3), np.int32), "feat": np.zeros((0, 6, 4), np.float32)}, tvm_ops.BadParamError,
     r"B, N, C must be non-zero, got B=0"),
    ({"geom": np.zeros((2, 0, 3), np.int32), "feat": np.zeros((2, 0, 4), np.float32)}, tvm_ops.BadParamError,
     r"got B=2, N=0, C=4"),
    ({"feat": np.zeros((2, 6, 0), np.float32)}, tvm_ops.BadParamError, r"got B=2, N=6, C=0"),
])
def test_bad_inputs(changes, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        call(**changes)
    assert info.value.status == error.status


def test_out_checks():
    good_memo = np.zeros((2, 6, 3), np.int32)
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['output_features'\].shape\[2\] \(X\) must equal "
                                                     r"num_voxel_x = 3, got 4"):
        call(out=(np.zeros((2, 3, 4, 4), np.float32), good_memo))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['output_features'\].shape\[1\] \(Y\) must equal"):
        call(out=(np.zeros((2, 5, 3, 4), np.float32), None))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['output_features'\].shape\[3\] \(C\) must equal"):
        call(out=(np.zeros((2, 3, 3, 5), np.float32), None))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['pos_memo'\].shape\[1\] \(N\) must equal"):
        call(out=(None, np.zeros((2, 7, 3), np.int32)))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['pos_memo'\] must have dtype int32, got int64"):
        call(out=(None, np.zeros((2, 6, 3), np.int64)))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['output_features'\] must have the dtype of"):
        call(out=(np.zeros((2, 3, 3, 4), np.float64), None))
    with pytest.raises(tvm_ops.BadParamError, match=r"out must be a pair"):
        call(out=np.zeros((2, 3, 3, 4), np.float32))
    strided = np.zeros((2, 3, 3, 8), np.float32)[..., ::2]
    with pytest.raises(tvm_ops.NotSupportedError, match=r"must be C-contiguous") as info:
        call(out=(strided, None))
    assert info.value.status == "NOT_SUPPORTED"


def test_checks_run_in_the_mlu_ops_order():
    with pytest.raises(tvm_ops.BadParamError, match="rank"):
        call(geom=np.zeros((2, 6), np.int64))
    with pytest.raises(tvm_ops.BadParamError, match="dtype"):
        call(geom=np.zeros((5, 6, 3), np.int64))


def test_large_tensors_are_not_supported_without_touching_data():
    huge = np.broadcast_to(np.zeros(1, np.float32), (1, 2**16, 2**15))  # 2^31 elements, no memory
    geom = np.broadcast_to(np.zeros(1, np.int32), (1, 2**16, 3))
    with pytest.raises(tvm_ops.NotSupportedError, match=r"input_features has 2147483648 elements") as info:
        tvm_ops.voxel_pooling_forward(geom, huge, 4, 4, 1)
    assert info.value.status == "NOT_SUPPORTED"
    # a small input whose output grid would reach 2^31 elements
    with pytest.raises(tvm_ops.NotSupportedError, match=r"output_features has 2147483648 elements"):
        tvm_ops.voxel_pooling_forward(np.zeros((1, 1, 3), np.int32), np.zeros((1, 1, 2**11), np.float32),
                                      2**10, 2**10, 1)


def test_unknown_target():
    with pytest.raises(tvm_ops.BadParamError, match="unknown target 'tpu'"):
        tvm_ops.voxel_pooling_forward(GEOM, FEAT, 3, 3, 1, target="tpu")


# --- torch interop ------------------------------------------------------------
@requires_torch
def test_torch_in_torch_out():
    import torch

    geom, feat = inputs(2, 300, 23, 8, 6, 2, spill=3, z_spill=1)
    out, memo = tvm_ops.voxel_pooling_forward(torch.from_numpy(geom), torch.from_numpy(feat), 8, 6, 2)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert isinstance(memo, torch.Tensor) and memo.dtype == torch.int32
    check(geom, feat, 8, 6, 2, (out.numpy(), memo.numpy()))


@requires_torch
def test_torch_out_pair_is_written_in_place():
    import torch

    geom, feat = inputs(2, 300, 23, 8, 6, 2, spill=3, z_spill=1)
    out, memo = torch.full((2, 6, 8, 23), 5.0), torch.full((2, 300, 3), 7, dtype=torch.int32)
    result = tvm_ops.voxel_pooling_forward(torch.from_numpy(geom), torch.from_numpy(feat), 8, 6, 2,
                                           out=(out, memo))
    assert result[0] is out and result[1] is memo
    check(geom, feat, 8, 6, 2, (out.numpy(), memo.numpy()))


@requires_torch
def test_mixed_kinds_are_rejected():
    import torch

    with pytest.raises(tvm_ops.BadParamError, match="is a numpy tensor on cpu but input_features is a torch"):
        tvm_ops.voxel_pooling_forward(GEOM, torch.from_numpy(FEAT), 3, 3, 1)


@requires_torch
def test_torch_peer_matches_the_reference():
    case = OP.spec.case("bnd_3x999x19_7x5x3")
    data, params = TESTING.make_inputs(case, "float32", np.random.default_rng(1))
    out, memo = TESTING.torch_peer(data, params)()
    ref = TESTING.reference(data, params)
    np.testing.assert_array_equal(memo.numpy(), ref["pos_memo"])
    assert metrics.accuracy(out.numpy(), ref["output_features"], "float32").failures(
        OP.spec.accuracy["float32"]) == []
