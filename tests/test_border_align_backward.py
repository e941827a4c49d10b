"""border_align_backward: spec cases, properties, checks, guard regions, out= and interop."""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import build, metrics
from tvm_ops.ops.border_align_backward import OP
from tvm_ops.testing import border_align_backward as TESTING
from tvm_ops.testing.border_align_backward import box_layout, torch_autograd_gradient, torch_gradient

from .conftest import requires_torch




def inputs(n, h, w, c, pool=10, dtype="float32", boxes="inside", spill=0, seed=0):
    rng = np.random.default_rng(seed)
    k = h * w
    go = rng.uniform(-1, 1, (n, k, 4, c)).astype(dtype)
    bx = box_layout(boxes, n, k, h, w, rng).astype(dtype)
    am = rng.integers(-spill, pool + 1 + spill, (n, k, 4, c)).astype(np.int32)
    return go, bx, am


def reference(go, bx, am, pool, h, w):
    return TESTING.reference({"grad_output": go, "boxes": bx, "argmax_idx": am},
                        {"pool_size": pool, "height": h, "width": w})["grad_input"]


def check(result, go, bx, am, pool, h, w, dtype="float32"):
    ref = reference(go, bx, am, pool, h, w)
    assert np.abs(ref).max() > 0, "a reference of zeros tests nothing"
    acc = metrics.accuracy(np.asarray(result), ref, dtype)
    assert acc.failures(OP.spec.accuracy[dtype]) == []


def test_reference_matches_a_loop_over_the_semantics_rule():
    # an independent scalar transcription of docs/semantics.md, on a small input with every kind of box
    n, h, w, c, pool = 2, 3, 4, 3, 4
    go, bx, am = inputs(n, h, w, c, pool, boxes="partly_outside", spill=2, seed=3)
    out = np.zeros((n, h, w, 4 * c))
    for b in range(n):
        for k in range(h * w):
            x0, y0, x1, y1 = bx[b, k].astype(np.float32)
            start = [(x0, y0), (x0, y0), (x1, y1), (x1, y1)]
            end = [(x1, y0), (x0, y1), (x0, y1), (x1, y0)]
            for s in range(4):
                for ch in range(c):
                    i = am[b, k, s, ch]
                    if not 0 <= i <= pool:
                        continue
                    # along the border's axis start + i * step, the step in float32 and the sum
                    # rounded once to float32; the other axis keeps the start; the last sample
                    # is the end corner itself (start + pool * step can round past it)
                    moving = 0 if s % 2 == 0 else 1
                    point = list(end[s] if i == pool else start[s])
                    if i != pool:
                        a, e = start[s][moving], end[s][moving]
                        point[moving] = np.float32(float(a) + int(i) * float(np.float32((e - a) / np.float32(pool))))
                    x, y = float(point[0]), float(point[1])
                    if y < -1 or y > h or x < -1 or x > w:
                        continue
                    y, x = max(y, 0.0), max(x, 0.0)
                    yl, xl = int(y), int(x)
                    if yl >= h - 1:
                        yl = yh = h - 1
                        y = float(yl)
                    else:
                        yh = yl + 1
                    if xl >= w - 1:
                        xl = xh = w - 1
                        x = float(xl)
                    else:
                        xh = xl + 1
                    ly, lx = y - yl, x - xl
                    g = float(go[b, k, s, ch])
                    for yy, xx, wt in ((yl, xl, (1 - ly) * (1 - lx)), (yl, xh, (1 - ly) * lx),
                                       (yh, xl, ly * (1 - lx)), (yh, xh, ly * lx)):
                        out[b, yy, xx, s * c + ch] += g * wt
    assert np.abs(out).max() > 0
    np.testing.assert_allclose(reference(go, bx, am, pool, h, w), out, rtol=1e-12, atol=1e-12)
    result = tvm_ops.border_align_backward(go, bx, am, pool, height=h, width=w)
    np.testing.assert_allclose(result, out, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9), c=st.integers(1, 40),
       pool=st.integers(1, 24),
       boxes=st.sampled_from(["inside", "partly_outside", "degenerate", "edges", "corners"]),
       spill=st.integers(0, 3), dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 2**16))
def test_random_shapes_and_boxes(n, h, w, c, pool, boxes, spill, dtype, seed):
    go, bx, am = inputs(n, h, w, c, pool, dtype, boxes, spill, seed)
    out = tvm_ops.border_align_backward(go, bx, am, pool, height=h, width=w)
    assert out.shape == (n, h, w, 4 * c) and out.dtype == np.dtype(dtype)
    ref = reference(go, bx, am, pool, h, w)
    assert metrics.accuracy(out, ref, dtype).failures(OP.spec.accuracy[dtype]) == []


def test_one_library_serves_many_shapes():
    # a small call and a large one: the one-core build and the parallel one (the policy's choice)
    tvm_ops.border_align_backward(*inputs(1, 2, 3, 5), 10, height=2, width=3)
    tvm_ops.border_align_backward(*inputs(1, 25, 38, 17), 10, height=25, width=38)
    before = build.build_count
    for n, h, w, c in [(2, 7, 10, 33), (1, 1, 1, 16), (3, 4, 5, 1), (1, 25, 38, 17)]:
        go, bx, am = inputs(n, h, w, c)
        check(tvm_ops.border_align_backward(go, bx, am, 10, height=h, width=w), go, bx, am, 10, h, w)
    assert build.build_count == before


# --- no write outside grad_input (mmcv#2139) --------------------------------------
GUARD = 4096  # sentinel elements before and after grad_input in one allocation


def hostile(n, h, w, c, pool, dtype, seed):
    """Boxes NaN, +-inf, 1e30, -1e30, far outside; argmax INT32_MIN/MAX and just outside."""
    go, bx, am = inputs(n, h, w, c, pool, dtype, "partly_outside", spill=3, seed=seed)
    rng = np.random.default_rng(seed + 1)
    big = np.finfo(dtype).max  # 1e30 in float32; float16's max is 65504
    specials = np.array([np.nan, np.inf, -np.inf, big, -big, 1e4, -1e4], dtype)
    pick = rng.random(bx.shape) < 0.35
    bx[pick] = rng.choice(specials, pick.sum())
    huge = rng.random(am.shape) < 0.2
    am[huge] = rng.choice(np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max, -1, pool + 1,
                                    2**30, -(2**30)], np.int32), huge.sum())
    return go, bx, am


def line_aligned_storage(size, dtype, fill):
    """A 1-D array of `size` elements that starts on a cache line (64 bytes)."""
    raw = np.empty(size * np.dtype(dtype).itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    storage = raw[start:start + size * np.dtype(dtype).itemsize].view(dtype)
    storage[:] = fill
    return storage


@pytest.mark.parametrize("dtype", ["float32", "float16"])
# C = 256: the 128-lane main kernel, its stores streamed when grad_input starts on a line;
# C = 132: main kernel + tail, rows of whole lines (4C words) but border blocks that are not
@pytest.mark.parametrize("n, h, w, c", [(2, 5, 7, 37), (1, 1, 1, 16), (2, 3, 2, 5), (1, 4, 5, 132),
                                        (1, 3, 4, 256)])
@pytest.mark.parametrize("shift", [0, 3], ids=["on_a_line", "off_a_line"])
def test_no_write_outside_grad_input(n, h, w, c, dtype, shift):
    pool = 6
    go, bx, am = hostile(n, h, w, c, pool, dtype, seed=n * 100 + c)
    size = n * h * w * 4 * c
    sentinel = np.array(-12345.0, dtype)
    storage = line_aligned_storage(GUARD + shift + size + GUARD, dtype, sentinel)
    out = storage[GUARD + shift:GUARD + shift + size].reshape(n, h, w, 4 * c)
    result = tvm_ops.border_align_backward(go, bx, am, pool, out=out)
    assert result is out
    assert (storage[:GUARD + shift] == sentinel).all() and (storage[GUARD + shift + size:] == sentinel).all()
    # every element of grad_input was written (no sentinel left), and the values are right
    ref = reference(go, bx, am, pool, h, w)
    assert not (out == sentinel).any() and np.isfinite(out).all()
    # boxes of 1e4 put the float32 sample coordinates (the kernel's, as mmcv) ~1e-3 off float64's
    assert metrics.accuracy(out, ref, dtype).failures({"diff1": 1e-3, "diff2": 1e-3}) == []


def test_nan_boxes_contribute_nothing_and_inf_boxes_stay_finite():
    go, bx, am = inputs(2, 4, 5, 8, seed=9)
    bad = bx.copy()
    bad[:, ::2] = np.nan          # every sample NaN: contributes nothing
    bad[:, 1::4, 0] = np.inf      # x0 = inf: top/bottom samples NaN or outside, left border outside
    zeroed = go.copy()
    zeroed[:, ::2] = 0
    result = tvm_ops.border_align_backward(go, bad, am, 10, height=4, width=5)
    assert np.isfinite(result).all()
    same = tvm_ops.border_align_backward(zeroed, bad, am, 10, height=4, width=5)
    np.testing.assert_array_equal(result, same)
    check(result, go, bad, am, 10, 4, 5)


def test_nonfinite_gradients_reach_only_their_own_corners():
    # corner_adds=per_position adds g * 0 where a lane's sample has no corner, which an inf or
    # NaN gradient would turn into NaN there: such boxes take the per-sample adds
    go, bx, am = inputs(1, 4, 5, 130, seed=12)
    go[0, 3, 0, 7] = np.inf
    go[0, 8, 2, 129] = -np.inf
    go[0, 11, 1, 64] = np.nan
    result = tvm_ops.border_align_backward(go, bx, am, 10, height=4, width=5)
    with np.errstate(invalid="ignore"):
        ref = reference(go, bx, am, 10, 4, 5)
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(result), special(ref))
    assert np.isnan(result).any() and np.isinf(result).any()
    finite = np.isfinite(ref)
    np.testing.assert_allclose(result[finite], ref[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("c", [5, 130])  # per-lane adds (C < 16); 128-lane owner + 2-channel tail
# the end corners (W, -1) and (-1, H): in float32, start + pool * ((end - start) / pool) lands
# 1-4 ulp outside [-1, H] x [-1, W] at these sizes, and the last sample would be skipped
@pytest.mark.parametrize("h, w, pool", [(6, 6, 13), (11, 11, 21)], ids=["per_position", "per_sample"])
def test_last_sample_is_the_end_corner(h, w, pool, c, dtype):
    go, _bx, _am = inputs(2, h, w, c, pool, dtype, seed=pool)
    bx = np.tile(np.array([-1, -1, w, h], dtype), (2, h * w, 1))
    am = np.full(go.shape, pool, np.int32)
    out = tvm_ops.border_align_backward(go, bx, am, pool, height=h, width=w)
    check(out, go, bx, am, pool, h, w, dtype)
    # each border's last sample is a corner of the map, so its whole gradient lands on one pixel:
    # top and right end at (W, -1), pixel (0, W-1); left and bottom at (-1, H), pixel (H-1, 0)
    sums = go.astype(np.float64).sum(1)  # [N, 4, C]
    expected = np.zeros((2, h, w, 4, c))
    for s, (py, px) in enumerate([(0, w - 1), (h - 1, 0), (h - 1, 0), (0, w - 1)]):
        expected[:, py, px, s] = sums[:, s]
    tol = 1e-4 if dtype == "float32" else 0.1
    np.testing.assert_allclose(out.astype(np.float64), expected.reshape(out.shape), rtol=1e-3, atol=tol)


@pytest.mark.parametrize("pool", [14, 15, 40])
def test_pool_sizes_past_the_position_table(pool):
    # per_position's table holds samples 0..14 (entry 15 is "no sample"); larger pool sizes
    # take the per-sample adds, in the same kernel
    go, bx, am = inputs(2, 4, 6, 130, pool, "float32", "partly_outside", spill=2, seed=pool)
    check(tvm_ops.border_align_backward(go, bx, am, pool, height=4, width=6), go, bx, am, pool, 4, 6)


def test_argmax_outside_the_samples_contributes_nothing():
    go, bx, am = inputs(2, 4, 5, 20, pool=5, seed=4)
    outside = am.copy()
    outside[:, :, :, ::3] = np.array([-1, 6, np.iinfo(np.int32).max, np.iinfo(np.int32).min])[
        np.arange(outside[:, :, :, ::3].size) % 4].reshape(outside[:, :, :, ::3].shape)
    zeroed = go.copy()
    zeroed[:, :, :, ::3] = 0
    a = tvm_ops.border_align_backward(go, bx, outside, 5, height=4, width=5)
    b = tvm_ops.border_align_backward(zeroed, bx, outside, 5, height=4, width=5)
    np.testing.assert_array_equal(a, b)
    check(a, go, bx, outside, 5, 4, 5)


def test_float16_accumulates_in_float32_and_rounds_once():
    # many equal small contributions to one pixel: half-precision accumulation would stall
    n, h, w, c, pool = 1, 16, 16, 16, 1
    k = h * w
    go = np.full((n, k, 4, c), 0.01, np.float16)
    bx = np.tile(np.array([3.0, 3.0, 3.0, 3.0], np.float16), (n, k, 1))
    am = np.zeros((n, k, 4, c), np.int32)
    out = tvm_ops.border_align_backward(go, bx, am, pool, height=h, width=w)
    exact = k * float(np.float16(0.01))  # 256 * 0.01 into pixel (3, 3) for every channel
    assert out[0, 3, 3, 0] == np.float16(exact)


def cpu_knob_variants():
    """The hand-tuned llvm knobs, then variants that between them take every other candidate
    of every knob: the i-th takes each knob's i-th other candidate (its default when it has
    fewer): as many builds as the longest candidate list, not one per candidate."""
    sched = OP.schedules["llvm"]
    others = {knob: [value for value in candidates if value != sched.defaults[knob]]
              for knob, candidates in sched.candidates.items()}
    yield dict(sched.defaults)
    for i in range(max(map(len, others.values()))):
        yield {knob: values[i] if i < len(values) else sched.defaults[knob] for knob, values in others.items()}


# the float32 tests below run every float32 CPU knob variant (~10 s of build each): on one
# worker, whose process keeps the loaded libraries (cpu_variant_kernels)
KNOB_VARIANTS = pytest.mark.xdist_group("border_align_backward_float32_knob_variants")


@functools.lru_cache(maxsize=None)
def cpu_variant_kernels(dtype):
    """(knobs, kernels) of each llvm knob variant, built or loaded once per process."""
    from tvm_ops import targets

    model = targets.resolve("llvm")
    loaded = []
    for knobs in cpu_knob_variants():
        variant = build.Variant(OP, dtype, model, knobs, "test")
        loaded.append((knobs, build.load(build.find_or_build(variant), OP)))
    return tuple(loaded)


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=KNOB_VARIANTS), "float16"])
def test_cpu_result_bits_do_not_depend_on_the_knobs(dtype):
    # owners walk k in order and every lane receives its own sample's 4 adds in the same order
    # (per_sample's other lanes add +0, which changes no bit): the same bits whichever task
    # split, corner-add form, owner width or prefetch distance the schedule picks, on every run
    # C = 85: one 64-lane owner + a 21-channel tail, five 16-lane owners + 5, or all tail at 128
    n, h, w, c, pool = 2, 6, 7, 85, 5
    go, bx, am = inputs(n, h, w, c, pool, dtype, "partly_outside", spill=1, seed=11)
    same_bits_in_every_cpu_variant(go, bx, am, pool, h, w, dtype)


def same_bits_in_every_cpu_variant(go, bx, am, pool, h, w, dtype):
    """Each llvm knob variant's kernels, twice: all the same bits, and the reference's values."""
    from tvm_ops.ops.border_align_backward import SCATTER, TAIL

    n, c = go.shape[0], go.shape[3]
    results = []
    for knobs, kernels in cpu_variant_kernels(dtype):
        lanes = kernels.plan["owner_lanes"]
        for _ in range(2):
            out = np.full((n, h, w, 4 * c), np.nan, dtype)
            if c >= lanes:  # as launch does
                kernels[SCATTER](go, bx, am, out, pool)
            kernels[TAIL](go, bx, am, out, pool)
            results.append(out)
    assert len(results) >= 2 * 3
    check(results[0], go, bx, am, pool, h, w, dtype)
    for other in results[1:]:
        np.testing.assert_array_equal(other.view(np.uint8), results[0].view(np.uint8))


@KNOB_VARIANTS
def test_cpu_variants_at_the_largest_pool_size():
    # pool_size 2**31 - 1: the per-sample adds visit only the blocks of 16 samples that hold
    # some lane's argmax (here the first, some in between and the last, whose end is INT32_MAX)
    n, h, w, c, pool = 2, 4, 6, 85, 2**31 - 1
    go, bx, am = inputs(n, h, w, c, 10, "float32", "partly_outside", seed=13)
    rng = np.random.default_rng(14)
    far = np.array([16, 31, 1000, 2**20 + 3, pool - 16, pool - 15, pool - 1, pool, -1, np.iinfo(np.int32).min],
                   np.int64)
    pick = rng.random(am.shape) < 0.3
    am[pick] = rng.choice(far, pick.sum()).astype(np.int32)
    same_bits_in_every_cpu_variant(go, bx, am, pool, h, w, "float32")


# the child: a network-like case with every argmax in [0, 10], at pool sizes that leave
# almost every sample unnamed; its time must follow the data, not pool_size
LARGE_POOL_CHILD = """
import numpy as np, tvm_ops
from tvm_ops import metrics
from tvm_ops.ops.border_align_backward import OP
from tvm_ops.testing.border_align_backward import box_layout, grad_input_reference
n, h, w, c = 1, 25, 38, 144
rng = np.random.default_rng(21)
go = rng.uniform(-1, 1, (n, h * w, 4, c)).astype(np.float32)
bx = box_layout("inside", n, h * w, h, w, rng).astype(np.float32)
am = rng.integers(0, 11, (n, h * w, 4, c)).astype(np.int32)
for pool in (10, 10**6, 2**31 - 1):
    out = tvm_ops.border_align_backward(go, bx, am, pool, height=h, width=w)
    ref = grad_input_reference(go, bx, am, pool, h, w)
    assert metrics.accuracy(out, ref, "float32").failures(OP.spec.accuracy["float32"]) == [], pool
print("ok")
"""


def test_time_follows_the_argmax_values_not_pool_size():
    # computing every sample of every box would take minutes at pool_size 10**6 and hours at
    # 2**31 - 1: a regression fails by the timeout instead of hanging the suite. The library
    # (pool_size is a runtime argument) is built here first, out of the child's time
    go, bx, am = inputs(1, 2, 3, 144)
    check(tvm_ops.border_align_backward(go, bx, am, 10, height=2, width=3), go, bx, am, 10, 2, 3)
    done = subprocess.run([sys.executable, "-c", LARGE_POOL_CHILD], env=dict(os.environ), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# --- out= ------------------------------------------------------------------------
def test_out_gives_height_and_width():
    go, bx, am = inputs(2, 3, 4, 6)
    out = np.full((2, 3, 4, 24), 7.0, np.float32)
    result = tvm_ops.border_align_backward(go, bx, am, 10, out=out)
    assert result is out
    check(out, go, bx, am, 10, 3, 4)


def test_out_with_matching_height_and_width():
    go, bx, am = inputs(2, 3, 4, 6)
    out = np.empty((2, 3, 4, 24), np.float32)
    tvm_ops.border_align_backward(go, bx, am, 10, height=3, width=4, out=out)
    check(out, go, bx, am, 10, 3, 4)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n, h, w, c", [(2, 3, 4, 6), (1, 5, 7, 19), (2, 9, 11, 40)])
def test_out_as_a_channels_first_view_gets_the_same_bits(n, h, w, c, dtype):
    """[N, H, W, 4C] of contiguous [N, 4C, H, W] memory (an NCHW map's layout): the contiguous
    call's values in it, nothing written around it."""
    go, bx, am = inputs(n, h, w, c, 10, dtype, "partly_outside", spill=2, seed=c)
    expected = tvm_ops.border_align_backward(go, bx, am, 10, height=h, width=w)
    memory = np.full((n, 4 * c, h, w), np.nan, dtype)
    result = tvm_ops.border_align_backward(go, bx, am, 10, out=memory.transpose(0, 2, 3, 1))
    assert result.shape == expected.shape and np.shares_memory(result, memory)
    np.testing.assert_array_equal(memory.transpose(0, 2, 3, 1), expected)


@requires_torch
def test_a_channels_first_torch_view_gets_the_same_bits():
    import torch

    go, bx, am = inputs(2, 5, 6, 18, 10, "float32", "partly_outside", spill=2, seed=4)
    expected = tvm_ops.border_align_backward(go, bx, am, 10, height=5, width=6)
    memory = torch.full((2, 72, 5, 6), float("nan"))
    tvm_ops.border_align_backward(*map(torch.from_numpy, (go, bx, am)), 10, out=memory.permute(0, 2, 3, 1))
    np.testing.assert_array_equal(memory.permute(0, 2, 3, 1).numpy(), expected)


# --- checks: type, status and a message naming the tensor ------------------------
GOOD = dict(zip(("grad_output", "boxes", "argmax_idx"), inputs(2, 3, 4, 5)))


def call(pool=10, height=3, width=4, out=None, **changes):
    args = dict(GOOD, **changes)
    return tvm_ops.border_align_backward(args["grad_output"], args["boxes"], args["argmax_idx"], pool,
                                         height=height, width=width, out=out)


@pytest.mark.parametrize("changes, pattern", [
    ({"boxes": None}, r"boxes is missing"),
    ({"argmax_idx": [[1]]}, r"argmax_idx must be a numpy array"),
    ({"grad_output": np.zeros((2, 12, 4), np.float32)}, r"grad_output must have rank 4 \[N, K, 4, C\], got rank 3"),
    ({"boxes": np.zeros((2, 12), np.float32)}, r"boxes must have rank 3"),
    ({"argmax_idx": np.zeros((2, 12, 4), np.int32)}, r"argmax_idx must have rank 4"),
    ({"grad_output": np.zeros((2, 12, 4, 5), np.float64)}, r"grad_output must have dtype float32 or float16, got float64"),
    ({"boxes": np.zeros((2, 12, 4), np.float16)}, r"boxes must have the dtype of grad_output \(float32\), got float16"),
    ({"argmax_idx": np.zeros((2, 12, 4, 5), np.int64)}, r"argmax_idx must have dtype int32, got int64"),
    ({"grad_output": np.zeros((2, 12, 3, 5), np.float32)}, r"grad_output.shape\[2\] must be 4, got 3"),
    ({"boxes": np.zeros((2, 12, 5), np.float32)}, r"boxes.shape\[2\] must be 4, got 5"),
    ({"argmax_idx": np.zeros((2, 12, 4, 6), np.int32)}, r"argmax_idx.shape\[3\] \(C\) must equal grad_output.shape\[3\] = 5, got 6"),
    ({"boxes": np.zeros((2, 11, 4), np.float32)}, r"boxes.shape\[1\] \(K\) must equal grad_output.shape\[1\] = 12, got 11"),
    ({"boxes": np.zeros((3, 12, 4), np.float32)}, r"boxes.shape\[0\] \(N\) must equal grad_output.shape\[0\] = 2, got 3"),
])
def test_bad_inputs(changes, pattern):
    with pytest.raises(tvm_ops.BadParamError, match=pattern) as info:
        call(**changes)
    assert info.value.status == "BAD_PARAM"


@pytest.mark.parametrize("kwargs, pattern", [
    ({"pool": 0}, r"pool_size must be >= 1, got 0"),
    ({"pool": -3}, r"pool_size must be >= 1, got -3"),
    ({"pool": 2.0}, r"pool_size must be an integer"),
    ({"pool": None}, r"pool_size is required"),
    ({"height": None}, r"height is required"),
    ({"width": None}, r"width is required"),
    ({"height": 4}, r"height \* width must equal grad_output.shape\[1\] \(K\) = 12, got 4 \* 4 = 16"),
    ({"width": -4}, r"width must be >= 0, got -4"),
])
def test_bad_params(kwargs, pattern):
    with pytest.raises(tvm_ops.BadParamError, match=pattern):
        call(**kwargs)


def test_zero_elements_are_bad_params():
    z = np.zeros
    with pytest.raises(tvm_ops.BadParamError, match=r"N, C, H, W, K must be non-zero, got N=0"):
        tvm_ops.border_align_backward(z((0, 12, 4, 5), np.float32), z((0, 12, 4), np.float32),
                                      z((0, 12, 4, 5), np.int32), 10, height=3, width=4)
    with pytest.raises(tvm_ops.BadParamError, match=r"must be non-zero, got N=2, C=0"):
        tvm_ops.border_align_backward(z((2, 12, 4, 0), np.float32), GOOD["boxes"],
                                      z((2, 12, 4, 0), np.int32), 10, height=3, width=4)
    with pytest.raises(tvm_ops.BadParamError, match=r"H=0, W=4, K=0"):
        tvm_ops.border_align_backward(z((2, 0, 4, 5), np.float32), z((2, 0, 4), np.float32),
                                      z((2, 0, 4, 5), np.int32), 10, height=0, width=4)


def test_out_checks():
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input'\].shape\[3\] must be a multiple of 4"):
        call(out=np.zeros((2, 3, 4, 21), np.float32), height=None, width=None)
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input'\].shape\[3\] / 4 must equal grad_output"):
        call(out=np.zeros((2, 3, 4, 24), np.float32), height=None, width=None)
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input'\].shape\[1\] \(H\) must equal height"):
        call(out=np.zeros((2, 4, 3, 20), np.float32))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input'\] must have the dtype of"):
        call(out=np.zeros((2, 3, 4, 20), np.float16))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_input'\] must have rank 4"):
        call(out=np.zeros((2, 3, 80), np.float32))
    with pytest.raises(tvm_ops.NotSupportedError, match=r"must be C-contiguous or a channels-first view on the "
                       r"CPU .* got strides \[480, 160, 40, 2\] for shape \[2, 3, 4, 20\]; other strided"):
        call(out=np.zeros((2, 3, 4, 40), np.float32)[..., ::2])


def test_checks_run_before_any_kernel():
    before = build.build_count
    with pytest.raises(tvm_ops.BadParamError):
        call(height=5)
    assert build.build_count == before


def test_non_contiguous_and_misaligned_inputs():
    go, bx, am = GOOD.values()
    wide = np.zeros(go.shape[:-1] + (10,), np.float32)
    wide[..., ::2] = go
    storage = np.zeros(bx.size + 1, np.float32)
    shifted = storage[1:].reshape(bx.shape)
    shifted[...] = bx
    check(tvm_ops.border_align_backward(wide[..., ::2], shifted, am, 10, height=3, width=4), go, bx, am, 10, 3, 4)


def test_unknown_target():
    with pytest.raises(tvm_ops.BadParamError, match="unknown target 'tpu'"):
        tvm_ops.border_align_backward(*GOOD.values(), 10, height=3, width=4, target="tpu")


# --- torch interop ------------------------------------------------------------
@requires_torch
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_torch_in_torch_out(dtype):
    import torch

    go, bx, am = inputs(2, 5, 6, 21, dtype=dtype)
    out = tvm_ops.border_align_backward(torch.from_numpy(go), torch.from_numpy(bx), torch.from_numpy(am), 10,
                                        height=5, width=6)
    assert isinstance(out, torch.Tensor) and out.dtype == getattr(torch, dtype) and out.shape == (2, 5, 6, 84)
    check(out.numpy(), go, bx, am, 10, 5, 6, dtype)


@pytest.mark.parametrize("c", [17, 31, 40])
def test_channels_after_the_last_16_lane_group(c):
    # the C % 16 rest (C >= 16) is a 16-lane owner over C's last 16 channels that stores
    # only its last C % 16 lanes: every column must still be the reference's, including
    # the ones its unstored lanes share with the previous owner
    go, bx, am = inputs(1, 5, 6, c, 6, boxes="partly_outside", spill=1, seed=c)
    out = np.full((1, 5, 6, 4 * c), np.nan, np.float32)
    tvm_ops.border_align_backward(go, bx, am, 6, out=out)
    check(out, go, bx, am, 6, 5, 6)


@requires_torch
def test_torch_small_channels_and_out_buffer():
    import torch

    go, bx, am = inputs(2, 3, 4, 3)  # C < 16: only the tail kernel runs
    out = torch.full((2, 3, 4, 12), 5.0)
    result = tvm_ops.border_align_backward(torch.from_numpy(go), torch.from_numpy(bx), torch.from_numpy(am), 10,
                                           out=out)
    assert result is out
    check(out.numpy(), go, bx, am, 10, 3, 4)


@requires_torch
def test_torch_peer_matches_the_reference():
    import torch

    go, bx, am = inputs(2, 5, 7, 19, pool=4, boxes="partly_outside", spill=2, seed=5)
    peer = torch_gradient(torch.from_numpy(go), torch.from_numpy(bx), torch.from_numpy(am), 4, 5, 7).numpy()
    check(peer, go, bx, am, 4, 5, 7)


@requires_torch
def test_torch_autograd_peer_matches_the_reference():
    import torch

    go, bx, am = inputs(2, 5, 7, 19, pool=4, boxes="partly_outside", spill=2, seed=6)
    peer = torch_autograd_gradient(torch.from_numpy(go), torch.from_numpy(bx), torch.from_numpy(am), 4, 5, 7)
    check(peer.numpy(), go, bx, am, 4, 5, 7)


def test_the_reference_places_samples_in_float32_as_the_kernels_do():
    # box (-3, -2, 3, 2), pool_size 21: the bottom border's sample 14 lies at float32 -1.0000002,
    # just outside the map (no gradient), at -1 exactly in float64: a float64 reference gave
    # it gradient (~0.6% of random fuzzed calls reached such a sample)
    from tvm_ops.testing.border_align_backward import grad_input_reference

    h, w, pool = 4, 4, 21
    boxes = np.array([[[-3, -2, 3, 2]] * (h * w)], np.float32)
    grad_output = np.zeros((1, h * w, 4, 1), np.float32)
    grad_output[0, 0, 2, 0] = 1.0  # the bottom border of box 0
    argmax = np.full((1, h * w, 4, 1), 14, np.int32)
    reference = grad_input_reference(grad_output, boxes, argmax, pool, h, w)
    kernels = tvm_ops.border_align_backward(grad_output, boxes, argmax, pool, height=h, width=w)
    assert not reference.any() and not kernels.any()
