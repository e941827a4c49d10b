"""ms_deform_attn_forward: properties, agreement with the backward, every CPU kernel, out=."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import metrics
from tvm_ops.ops import get
from tvm_ops.ops import ms_deform_attn_forward as module
from tvm_ops.testing import material

from .test_ms_deform_attn_backward import hand_tuned_and_query_block, make

OP = get("ms_deform_attn_forward")
TESTING = material(OP)


def forward_args(*shape, **kw):
    """make()'s inputs without grad_output: value, shapes, starts, loc, attn."""
    return make(*shape, **kw)[:5]


def check_against_reference(args, out):
    ref = TESTING.output(*args)
    assert out.shape == ref.shape and out.dtype == np.float32
    acc = metrics.accuracy(np.asarray(out), ref, "float32")
    assert acc.failures(OP.spec.accuracy["float32"]) == [], str(acc)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), levels=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=4),
       q=st.integers(1, 12), h=st.integers(1, 3), c=st.sampled_from([1, 5, 16, 32, 33, 70]), p=st.integers(1, 4),
       spill=st.floats(0, 2), seed=st.integers(0, 2**16))
def test_random_shapes_and_locations_outside(b, levels, q, h, c, p, spill, seed):
    args = forward_args(b, levels, q, h, c, p, -spill, 1 + spill, seed)
    check_against_reference(args, tvm_ops.ms_deform_attn_forward(*args))


def test_agrees_with_the_backward_on_every_sample():
    # one level, one point, attn 1: output . g == grad_attn_weight for any g, sample by sample,
    # so both directions picked the same cells and weights (locations on and near cell edges)
    args = forward_args(2, [[5, 7]], 40, 3, 16, 1, seed=4)
    loc = args[3]
    loc[..., 0] = np.round(loc[..., 0] * 14) / 14  # exactly on pixel centres and edges
    loc[:, ::2, ..., 1] = np.nextafter(np.round(loc[:, ::2, ..., 1] * 10) / 10, 2).astype(np.float32)
    args[4][...] = 1.0
    out = tvm_ops.ms_deform_attn_forward(*args)
    g = np.random.default_rng(5).standard_normal(out.shape).astype(np.float32)
    _, _, gattn = tvm_ops.ms_deform_attn_backward(*args, g)
    dot = (out.astype(np.float64) * g).sum(-1)
    assert np.allclose(gattn[..., 0, 0], dot, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("low, high", [(-1.5, -0.01), (1.01, 2.5), (-1e30, 1e30), (-3.0, 4.0)])
def test_locations_outside_on_every_side(low, high):
    args = forward_args(1, [[4, 6], [3, 3]], 20, 2, 9, 3, low, high, seed=3)
    args[3][..., 0] = np.random.default_rng(4).uniform(-0.2, 1.2, args[3][..., 0].shape)
    out = tvm_ops.ms_deform_attn_forward(*args)
    assert np.isfinite(out).all()
    check_against_reference(args, out)


def test_nan_inf_locations_and_bad_level_starts_stay_in_bounds():
    args = forward_args(1, [[3, 4], [2, 2]], 30, 2, 8, 3, seed=5)
    args[3][0, 0, 0, 0, 0, 0] = np.nan
    args[3][0, 1, 0, 1, 1, 1] = np.inf
    for lsi in ([0, 12], [14, -7], [2**30, 9], [-2**31, 2**31 - 1]):
        args[2] = np.asarray(lsi, np.int32)
        out = tvm_ops.ms_deform_attn_forward(*args)
        assert np.isfinite(out).all()
        check_against_reference(args, out)


def test_unused_corners_ignore_infinite_values():
    # a sample at the map's top-left edge uses one corner; the value rows it does not use
    # hold inf, which must not reach the output (0 * inf would be NaN)
    args = forward_args(1, [[3, 3]], 1, 1, 16, 1)
    args[0][...] = np.inf
    args[0][0, 0] = 2.0  # row 0: the one used corner of a sample at h_im = w_im = -0.5
    args[3][...] = 0.0
    out = tvm_ops.ms_deform_attn_forward(*args)
    assert np.all(out == 0.25 * 2.0 * args[4][0, 0, 0, 0, 0])


def test_im2col_step_never_changes_the_result():
    args = forward_args(6, [[5, 3], [2, 2]], 7, 2, 11, 2, -0.1, 1.1)
    results = [tvm_ops.ms_deform_attn_forward(*args, im2col_step=s) for s in (1, 2, 3, 6, 64)]
    assert all(np.array_equal(results[0], other) for other in results[1:])


@pytest.mark.parametrize("c", [32, 37])
def test_every_cpu_kernel_gives_the_same_bits(monkeypatch, c):
    # the private copy and the register tile change where values live, never the order of
    # the sums: each kernel gives the bits of its twin (the vector code of *_fixed_c fuses
    # the multiply-add, the scalar code of a symbolic C does not, so those two agree to
    # rounding); on inputs and outputs off any vector alignment
    from .test_spec_cases import misaligned_copy

    args = [misaligned_copy(a) for a in forward_args(2, [[9, 7], [4, 5], [1, 3]], 25, 3, c, 3, -0.2, 1.2, seed=10)]
    results = {}
    names = module.KERNELS if c == 32 else ("forward", "forward_private")
    for name in names:
        monkeypatch.setattr(module, "cpu_kernel", lambda sizes, plan, name=name: name)
        out = misaligned_copy(np.full((2, 25, 3, c), np.nan, np.float32))
        results[name] = tvm_ops.ms_deform_attn_forward(*args, out=out)
        assert results[name] is out
    for name, out in results.items():
        check_against_reference(args, out)
        twin = name.replace("_private", "") if "_private" in name else name.replace("forward", "forward_private")
        assert np.array_equal(results[twin], out), name


@pytest.mark.parametrize("query_block", [8, 32])
def test_query_blocks_never_change_the_bits(query_block):
    # a block of queries only decides when a corner's row and weight are computed, never the
    # order of a sum; 37 queries leave a partial last block at every size
    args = forward_args(2, [[9, 7], [4, 5], [1, 3]], 37, 3, 32, 3, -0.2, 1.2, seed=11)
    runs = hand_tuned_and_query_block(OP, module.KERNELS, args, [(2, 37, 3, 32)], query_block)
    for name, ((hand_tuned,), (blocks,)) in runs.items():
        check_against_reference(args, blocks)
        assert np.array_equal(hand_tuned, blocks), name


def test_policy_picks_the_private_slice_and_the_fixed_c_kernel():
    plan = OP.schedules["llvm"].defaults
    bev = dict(OP.spec.case("net_bevformer").shape)
    decoder = dict(OP.spec.case("net_detr_decoder").shape)
    assert module.cpu_kernel(bev, plan) == "forward_private_fixed_c"
    assert module.cpu_kernel(decoder, plan) == "forward_fixed_c"
    assert module.cpu_kernel(dict(decoder, C=33), plan) == "forward"
    assert module.cpu_kernel(decoder, dict(plan, private_slice="always", fixed_c=0)) == "forward_private"


@pytest.mark.parametrize("levels, p", [([[3, 4]], 0), ([[0, 4]], 2), ([], 2)])
def test_zero_element_successes_give_zero_output(levels, p):
    args = forward_args(2, levels, 3, 2, 5, p)
    out = np.full((2, 3, 2, 5), 7.0, np.float32)
    assert tvm_ops.ms_deform_attn_forward(*args, out=out) is out
    assert not out.any()


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    args = forward_args(2, [[5, 4]], 6, 2, 9, 2)
    out = tvm_ops.ms_deform_attn_forward(*(torch.from_numpy(a) for a in args))
    assert isinstance(out, torch.Tensor)
    check_against_reference(args, out.numpy())


@pytest.mark.parametrize("change, pattern", [
    (lambda a: a.__setitem__(1, np.array([[3, 4], [2, 2]], np.int32)),
     r"value.shape\[1\] \(K\) must equal sum\(h\*w\) of spatial_shapes = 16, got 14"),
    (lambda a: a.__setitem__(1, np.array([[-3, -4], [2, 1]], np.int32)), r"spatial_shapes must be non-negative"),
    (lambda a: a.__setitem__(3, a[3].astype(np.float16)),
     r"sampling_loc must have the dtype of value \(float32\), got float16"),
    (lambda a: a.__setitem__(4, a[4][..., :2]),
     r"attn_weight.shape\[4\] \(P\) must equal sampling_loc.shape\[4\] = 3, got 2"),
    (lambda a: a.__setitem__(2, a[2].astype(np.int64)), r"level_start_index must have dtype int32, got int64"),
])
def test_bad_inputs_name_the_tensor(change, pattern):
    args = forward_args(2, [[3, 4], [1, 2]], 5, 2, 6, 3)
    change(args)
    with pytest.raises(tvm_ops.BadParamError, match=pattern):
        tvm_ops.ms_deform_attn_forward(*args)


def test_a_level_table_whose_sum_wraps_int64_is_refused():
    args = forward_args(1, [[1, 1]] * 6, 2, 1, 4, 1)  # K = 6
    big = 2**31 - 1  # 4 big^2 + 2^34 + 2 = 2^64 + 6: an int64 sum would come back as K
    args[1] = np.array([[big, big]] * 4 + [[2**17, 2**17], [1, 2]], np.int32)
    with pytest.raises(tvm_ops.BadParamError, match=rf"sum\(h\*w\) of spatial_shapes = {2**64 + 6}, got 6"):
        tvm_ops.ms_deform_attn_forward(*args)


def test_im2col_step_must_divide_the_batch_and_zero_elements_are_refused():
    args = forward_args(6, [[2, 2]], 2, 1, 3, 1)
    with pytest.raises(tvm_ops.BadParamError, match=r"min\(B, im2col_step\) = 4 must divide value.shape\[0\] \(B\) = 6"):
        tvm_ops.ms_deform_attn_forward(*args, im2col_step=4)
    with pytest.raises(tvm_ops.BadParamError, match=r"im2col_step must be >= 1, got 0"):
        tvm_ops.ms_deform_attn_forward(*args, im2col_step=0)
    with pytest.raises(tvm_ops.BadParamError, match=r"B, C, H, Q must be non-zero, got B=1, C=0"):
        tvm_ops.ms_deform_attn_forward(*forward_args(1, [[3, 4]], 3, 2, 0, 2))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['output'\]"):
        tvm_ops.ms_deform_attn_forward(*args, out=np.empty((6, 2, 1, 4), np.float32))
