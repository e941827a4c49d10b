"""border_align_forward: properties, agreement with the backward, out=, torch, bad input."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import metrics
from tvm_ops.ops import get
from tvm_ops.testing import material
from tvm_ops.testing.border_align_backward import box_layout, grad_input_reference

OP = get("border_align_forward")
TESTING = material(OP)
LAYOUTS = ["inside", "partly_outside", "outside", "degenerate", "edges", "corners"]


def make(n, h, w, c, layout="inside", dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    feat = rng.uniform(-1, 1, (n, h, w, 4 * c)).astype(dtype)
    boxes = box_layout(layout, n, h * w, h, w, rng).astype(dtype)
    return feat, boxes


def check(feat, boxes, pool, output, argmax, dtype="float32"):
    ref_out, _ = TESTING.forward_reference(feat, boxes, pool)
    acc = metrics.accuracy(np.asarray(output), ref_out, dtype)
    assert acc.failures(OP.spec.accuracy[dtype]) == [], str(acc)
    # samples are compared in float32: a few float32 roundings of the inputs' magnitude
    tolerance = 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(np.asarray(feat, np.float64)).max()))
    misses = TESTING.argmax_misses(feat, boxes, pool, argmax, tolerance)
    assert not misses.any(), f"{misses.sum()} argmax elements differ from the reference beyond a float32 tie"


def test_argmax_check_accepts_float32_near_ties_only():
    # a float32 random shape (seed 61884) where one element's two best samples differ by
    # less than float32 resolves: the kernel's first maximal sample is not the float64 one's
    feat, boxes = make(2, 6, 3, 40, "inside", seed=61884)
    output, argmax = tvm_ops.border_align_forward(feat, boxes, 14)
    _, first = TESTING.forward_reference(feat, boxes, 14)
    assert np.count_nonzero(argmax != first) == 1
    check(feat, boxes, 14, output, argmax)
    wrong = argmax.copy()
    flat = np.flatnonzero(argmax == first)[0]
    wrong.flat[flat] = (wrong.flat[flat] + 1) % 15  # another sample: not a tie on random input
    with pytest.raises(AssertionError, match="1 argmax elements differ"):
        check(feat, boxes, 14, output, wrong)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 2), h=st.integers(1, 6), w=st.integers(1, 6), c=st.sampled_from([1, 3, 16, 17, 40]),
       pool=st.integers(1, 14), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_random_shapes_and_box_layouts(n, h, w, c, pool, layout, seed):
    feat, boxes = make(n, h, w, c, layout, seed=seed)
    output, argmax = tvm_ops.border_align_forward(feat, boxes, pool)
    assert output.shape == argmax.shape == (n, h * w, 4, c) and argmax.dtype == np.int32
    assert ((argmax >= 0) & (argmax <= pool)).all()
    check(feat, boxes, pool, output, argmax)


def test_float16_samples_and_compares_in_float32():
    feat, boxes = make(2, 5, 7, 20, "partly_outside", np.float16, seed=3)
    output, argmax = tvm_ops.border_align_forward(feat, boxes, 9)
    assert output.dtype == np.float16
    check(feat, boxes, 9, output, argmax, "float16")


def test_backward_of_the_argmax_is_the_gradient_of_the_output():
    # output is piecewise linear in the input: d sum(g * output) / d input, by central
    # differences on random input elements, equals border_align_backward of the argmax
    feat, boxes = make(1, 4, 5, 3, "corners", seed=5)
    feat = feat.astype(np.float32)
    pool = 6
    output, argmax = tvm_ops.border_align_forward(feat, boxes, pool)
    g = np.random.default_rng(6).standard_normal(output.shape).astype(np.float32)
    grad = tvm_ops.border_align_backward(g, boxes, argmax, pool, height=4, width=5)
    assert np.allclose(grad, grad_input_reference(g, boxes, argmax, pool, 4, 5), atol=1e-5)
    rng = np.random.default_rng(7)
    eps = 1e-3
    checked = 0
    for flat in rng.choice(feat.size, 40, replace=False):
        idx = np.unravel_index(flat, feat.shape)
        plus, minus = feat.copy(), feat.copy()
        plus[idx] += eps
        minus[idx] -= eps
        out_plus, arg_plus = TESTING.forward_reference(plus, boxes, pool)
        out_minus, arg_minus = TESTING.forward_reference(minus, boxes, pool)
        if not (np.array_equal(arg_plus, argmax) and np.array_equal(arg_minus, argmax)):
            continue  # a max switches sample inside the step: no derivative there
        numeric = ((g * out_plus).sum() - (g * out_minus).sum()) / (2 * eps)
        assert np.isclose(numeric, grad[idx], atol=1e-4), idx
        checked += 1
    assert checked >= 30 and np.abs(grad).sum() > 0


def test_nan_and_infinite_boxes_read_nothing_outside():
    feat, boxes = make(1, 3, 4, 8, seed=2)
    boxes[0, 0] = np.nan
    boxes[0, 1] = [np.inf, -np.inf, np.inf, 1.0]
    boxes[0, 2] = [1e30, -1e30, 3e38, 2.0]
    output, argmax = tvm_ops.border_align_forward(feat, boxes, 5)
    assert np.isfinite(output).all() and ((argmax >= 0) & (argmax <= 5)).all()
    assert not output[0, 0].any() and not argmax[0, 0].any()  # every sample of a NaN box is 0
    check(feat, boxes, 5, output, argmax)


def test_samples_outside_are_zero_whatever_the_map_holds():
    feat, boxes = make(1, 2, 2, 4, "outside", seed=1)
    feat[...] = np.inf
    output, argmax = tvm_ops.border_align_forward(feat, boxes, 3)
    assert not output.any() and not argmax.any()


def test_out_pair_with_none_and_torch_in_torch_out():
    feat, boxes = make(2, 3, 5, 9, "partly_outside", seed=4)
    argmax = np.full((2, 15, 4, 9), -5, np.int32)
    output, got = tvm_ops.border_align_forward(feat, boxes, 4, out=(None, argmax))
    assert got is argmax
    check(feat, boxes, 4, output, argmax)
    torch = pytest.importorskip("torch")
    t_out, t_arg = tvm_ops.border_align_forward(torch.from_numpy(feat), torch.from_numpy(boxes), 4)
    assert isinstance(t_out, torch.Tensor) and np.array_equal(t_out.numpy(), output)
    assert np.array_equal(t_arg.numpy(), argmax)


@pytest.mark.parametrize("change, message", [
    (lambda f, b: (f[..., :30], b), "input.shape\\[3\\] must be 4 \\* C"),
    (lambda f, b: (f, b[:, :10]), "must equal boxes.shape\\[1\\] \\(K\\)"),
])
def test_shape_rules(change, message):
    feat, boxes = make(1, 3, 4, 8)
    with pytest.raises(tvm_ops.BadParamError, match=message):
        tvm_ops.border_align_forward(*change(feat, boxes), 4)


@pytest.mark.parametrize("pool", [0, -1, 1025])
def test_pool_size_bounds(pool):
    feat, boxes = make(1, 3, 4, 8)
    with pytest.raises(tvm_ops.BadParamError, match="pool_size"):
        tvm_ops.border_align_forward(feat, boxes, pool)


@pytest.mark.parametrize("n, h, w, c, dtype", [(2, 3, 5, 6, np.float32), (2, 8, 9, 20, np.float32),
                                               (1, 40, 30, 17, np.float16)])
def test_channels_first_input_views_give_the_same_bits(n, h, w, c, dtype):
    # mmcv's NCHW memory seen as NHWC (functional.border_align passes that): to_channels_last
    # converts it (squares in registers where 16 positions and channels fit, element by
    # element elsewhere, tasks of 1024 positions); a view with a size-1 dim and a generic
    # strided view take the copy path
    feat, boxes = make(n, h, w, c, "partly_outside", dtype, seed=11)
    expected = tvm_ops.border_align_forward(feat, boxes, 4)
    nchw = np.ascontiguousarray(feat.transpose(0, 3, 1, 2))
    wide = np.zeros(feat.shape[:3] + (2 * feat.shape[3],), feat.dtype)
    wide[..., ::2] = feat
    views = [nchw.transpose(0, 2, 3, 1), wide[..., ::2]]
    torch = pytest.importorskip("torch")
    views.append(torch.from_numpy(nchw).permute(0, 2, 3, 1))
    for view in views:
        output, argmax = tvm_ops.border_align_forward(view, boxes if isinstance(view, np.ndarray)
                                                      else torch.from_numpy(boxes), 4)
        assert np.array_equal(np.asarray(output), expected[0]) and np.array_equal(np.asarray(argmax), expected[1])
    one_row, one_boxes = make(1, 1, 4, 3, seed=12)
    nchw = np.ascontiguousarray(one_row.transpose(0, 3, 1, 2))
    got = tvm_ops.border_align_forward(nchw.transpose(0, 2, 3, 1), one_boxes, 3)
    want = tvm_ops.border_align_forward(one_row, one_boxes, 3)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_dtype_and_zero_element_checks():
    feat, boxes = make(1, 3, 4, 8)
    with pytest.raises(tvm_ops.BadParamError, match=r"boxes must have the dtype of input \(float32\), got float16"):
        tvm_ops.border_align_forward(feat, boxes.astype(np.float16), 4)
    with pytest.raises(tvm_ops.BadParamError, match=r"must be non-zero, got N=0"):
        tvm_ops.border_align_forward(feat[:0], boxes[:0], 4)
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['argmax_idx'\]"):
        tvm_ops.border_align_forward(feat, boxes, 4, out=(None, np.empty((1, 12, 4, 8), np.float32)))
