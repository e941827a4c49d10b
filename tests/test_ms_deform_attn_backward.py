"""ms_deform_attn_backward: properties, checks, out=, interop, both CPU variants."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import build, checks, metrics, targets
from tvm_ops.ops import get
from tvm_ops.ops import ms_deform_attn_backward as module
from tvm_ops.testing import material

from .conftest import computed_kernels, requires_torch

OP = get("ms_deform_attn_backward")
TESTING = material(OP)
NAMES = ("grad_value", "grad_sampling_loc", "grad_attn_weight")



def test_heavy_network_cases_have_reduced_twins():
    heavy = [c.name for c in OP.spec.cases if c.heavy]
    assert sorted(heavy) == ["net_bevformer", "net_detr_decoder", "net_detr_encoder"]
    for name in heavy:
        twin = OP.spec.case(name + "_reduced")
        assert not twin.heavy and twin.shape["C"] == OP.spec.case(name).shape["C"]


def make(b, levels, q, h, c, p, low=0.0, high=1.0, seed=0):
    rng = np.random.default_rng(seed)
    levels = np.asarray(levels, np.int32).reshape(-1, 2)
    hw = levels[:, 0].astype(np.int64) * levels[:, 1]
    k, n = int(hw.sum()), len(levels)
    return [rng.standard_normal((b, k, h, c)).astype(np.float32), levels,
            np.r_[0, np.cumsum(hw)][:n].astype(np.int32),
            rng.uniform(low, high, (b, q, h, n, p, 2)).astype(np.float32),
            rng.uniform(0, 1, (b, q, h, n, p)).astype(np.float32),
            rng.standard_normal((b, q, h, c)).astype(np.float32)]


def check_against_reference(args, outs):
    ref = TESTING.gradients(*args)
    for name, value in zip(NAMES, outs):
        assert value.shape == ref[name].shape and value.dtype == np.float32, name
        acc = metrics.accuracy(np.asarray(value), ref[name], "float32")
        assert acc.failures(OP.spec.accuracy["float32"]) == [], f"{name}: {acc}"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), levels=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=4),
       q=st.integers(1, 12), h=st.integers(1, 3), c=st.sampled_from([1, 5, 16, 33, 70]), p=st.integers(1, 4),
       spill=st.floats(0, 2), seed=st.integers(0, 2**16))
def test_random_shapes_and_locations_outside(b, levels, q, h, c, p, spill, seed):
    args = make(b, levels, q, h, c, p, -spill, 1 + spill, seed)
    outs = tvm_ops.ms_deform_attn_backward(*args)
    check_against_reference(args, outs)


@pytest.mark.parametrize("low, high", [(-1.5, -0.01), (1.01, 2.5), (-1e30, 1e30), (-3.0, 4.0)])
def test_locations_outside_on_every_side(low, high):
    args = make(1, [[4, 6], [3, 3]], 20, 2, 9, 3, low, high, seed=3)
    args[3][..., 0] = np.random.default_rng(4).uniform(-0.2, 1.2, args[3][..., 0].shape)  # x anywhere
    outs = tvm_ops.ms_deform_attn_backward(*args)
    assert all(np.isfinite(o).all() for o in outs)
    check_against_reference(args, outs)


def test_fully_outside_samples_have_zero_gradients():
    args = make(1, [[3, 5]], 6, 2, 7, 2)
    args[3][:, :3] = -1.0  # h_im, w_im <= -1: skipped (strict test)
    args[3][:, 3:, ..., 1] = 1.0 + 1.0 / 3  # h_im == h_l: skipped
    gv, gloc, gattn = tvm_ops.ms_deform_attn_backward(*args)
    assert not gv.any() and not gloc.any() and not gattn.any()


def test_nan_and_inf_locations_contribute_nothing_and_stay_in_bounds():
    args = make(1, [[4, 4]], 4, 1, 16, 2)
    args[3][0, 0, 0, 0, 0, 0] = np.nan
    args[3][0, 1, 0, 0, 1, 1] = np.inf
    args[3][0, 2, 0, 0, 0, 0] = -np.inf
    gv, gloc, gattn = tvm_ops.ms_deform_attn_backward(*args)
    assert np.isfinite(gv).all() and np.isfinite(gloc).all() and np.isfinite(gattn).all()
    assert gloc[0, 0, 0, 0, 0].tolist() == [0, 0] and gattn[0, 1, 0, 0, 1] == 0
    check_against_reference(args, (gv, gloc, gattn))


def test_inconsistent_level_start_index_never_leaves_the_tensors():
    args = make(1, [[3, 4], [2, 2]], 30, 2, 8, 3, seed=5)
    for lsi in ([14, -7], [2**30, 9], [-2**31, 2**31 - 1]):
        args[2] = np.asarray(lsi, np.int32)
        outs = tvm_ops.ms_deform_attn_backward(*args)
        check_against_reference(args, outs)


@pytest.fixture
def fresh_call_plans():
    """The op's calls planned anew during the test and after it (a plan keeps the kernel
    choices its checks made)."""
    OP.clear_call_cache()
    yield
    OP.clear_call_cache()


@pytest.mark.parametrize("private", [False, True])
def test_prefetched_level_with_any_level_start_index(monkeypatch, fresh_call_plans, private):
    # a level over the kernels' prefetch_near_kb (10000 rows x 32 channels, value + gradient
    # 2.5 MB), so the corner-row prefetch runs (the kernels with prefetches, as for tensors
    # beyond the last-level cache), with locations on every side of the map
    monkeypatch.setattr(module, "policy_llvm", lambda sizes, plan: private)
    monkeypatch.setattr(module, "tensors_in_cache", lambda spec, problem: False)
    args = make(1, [[100, 100]], 24, 1, 32, 4, -0.3, 1.3, seed=11)
    for lsi in ([0], [-7], [2**31 - 1], [-2**31], [9990]):
        args[2] = np.asarray(lsi, np.int32)
        check_against_reference(args, tvm_ops.ms_deform_attn_backward(*args))


def test_im2col_step_never_changes_the_result():
    args = make(6, [[5, 3], [2, 2]], 7, 2, 11, 2, -0.1, 1.1)
    results = [tvm_ops.ms_deform_attn_backward(*args, im2col_step=s) for s in (1, 2, 3, 6, 64)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("private", [False, True])
def test_both_cpu_variants(monkeypatch, private):
    monkeypatch.setattr(module, "policy_llvm", lambda sizes, plan: private)
    args = make(2, [[9, 7], [4, 5], [1, 3]], 25, 3, 37, 3, -0.2, 1.2, seed=8)
    check_against_reference(args, tvm_ops.ms_deform_attn_backward(*args))


def test_cpu_variants_are_bit_identical(monkeypatch):
    # both walk a slice's samples in the same order and accumulate in float32 from
    # zero: the private copy changes where the sums live, never their bits
    args = make(2, [[9, 7], [4, 5], [1, 3]], 25, 3, 37, 3, -0.2, 1.2, seed=9)
    results = []
    for private in (False, True):
        monkeypatch.setattr(module, "policy_llvm", lambda sizes, plan, private=private: private)
        results.append(tvm_ops.ms_deform_attn_backward(*args))
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_kernels_with_c_compiled_in_give_the_same_bits(monkeypatch):
    # C == fixed_c (32) runs the *_fixed_c kernels: same loop order, so the same bits as
    # the symbolic-C kernels, on inputs and outputs off any vector alignment (constant
    # strides must not let LLVM assume aligned rows)
    from .test_spec_cases import misaligned_copy

    args = [misaligned_copy(a) for a in make(2, [[9, 7], [4, 5], [1, 3]], 25, 3, 32, 3, -0.2, 1.2, seed=10)]
    results = {}
    for name in module.KERNELS:
        monkeypatch.setattr(module, "cpu_kernel", lambda sizes, plan, in_cache, name=name: name)
        outs = [misaligned_copy(np.full(shape, np.nan, np.float32))
                for shape in (args[0].shape, args[3].shape, args[4].shape)]
        results[name] = tvm_ops.ms_deform_attn_backward(*args, out=outs)
    check_against_reference(args, results["backward"])
    for name, outs in results.items():
        for a, b in zip(results["backward"], outs):
            assert np.array_equal(a, b), name


def cpu_kernels(op, **knobs):
    """The float32 CPU kernels of `op` built with `knobs` over the hand-tuned ones."""
    variant = build.Variant(op, "float32", targets.resolve("llvm"), {**op.schedules["llvm"].defaults, **knobs}, "test")
    return build.load(build.find_or_build(variant), op)


def hand_tuned_and_query_block(op, names, args, out_shapes, query_block):
    """{kernel name: (its outputs from the hand-tuned library, from one built with
    query_block)} on `args`, the outputs NaN-filled before each run."""
    libraries = cpu_kernels(op), cpu_kernels(op, query_block=query_block)
    results = {}
    for name in names:
        runs = []
        for kernels in libraries:
            outs = [np.full(shape, np.nan, np.float32) for shape in out_shapes]
            kernels[name](*args, *outs)
            runs.append(outs)
        results[name] = tuple(runs)
    return results


@pytest.mark.parametrize("query_block", [8, 32])
def test_query_blocks_never_change_the_bits(query_block):
    # a block of queries only decides when a sample's cell is computed, never the order of a
    # sum; 37 queries leave a partial last block at every size
    args = make(2, [[9, 7], [4, 5], [1, 3]], 37, 3, 32, 3, -0.2, 1.2, seed=11)
    shapes = (args[0].shape, args[3].shape, args[4].shape)
    for name, (hand_tuned, blocks) in hand_tuned_and_query_block(OP, module.KERNELS, args, shapes, query_block).items():
        check_against_reference(args, blocks)
        for a, b in zip(hand_tuned, blocks):
            assert np.array_equal(a, b), name


def test_c_compiled_in_is_picked_only_for_its_c():
    plan = OP.schedules["llvm"].defaults
    bev = dict(OP.spec.case("net_bevformer").shape)
    decoder = dict(OP.spec.case("net_detr_decoder").shape)
    assert plan["fixed_c"] == bev["C"] == decoder["C"] == 32
    assert module.cpu_kernel(bev, plan) == "backward_private_fixed_c"
    assert module.cpu_kernel(decoder, plan) == "backward_fixed_c"
    assert module.cpu_kernel(dict(decoder, C=33), plan) == "backward"
    assert module.cpu_kernel(decoder, dict(plan, fixed_c=0)) == "backward"


def test_kernels_without_prefetches_serve_calls_that_fit_in_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(targets, "cache_bytes", lambda level: 32 << 20 if level == 3 else None)
    plan = OP.schedules["llvm"].defaults
    assert int(plan["prefetch"]) > 0
    problems = {name: checks.Problem(OP.name, "float32", dict(OP.spec.case(name).shape), {}, {}, {"im2col_step": 64},
                                     "numpy", "cpu")
                for name in ("net_detr_decoder_reduced", "net_detr_decoder", "net_bevformer")}
    for name, problem in problems.items():  # 21 MB of io bytes, then 82 MB and 2.4 GB, against 32 MiB
        assert module.tensors_in_cache(OP.spec, problem) == (name == "net_detr_decoder_reduced"), name
    decoder = dict(OP.spec.case("net_detr_decoder_reduced").shape)
    assert module.cpu_kernel(decoder, plan, in_cache=True) == "backward_fixed_c_in_cache"
    assert module.cpu_kernel(decoder, plan, in_cache=False) == "backward_fixed_c"
    assert module.cpu_kernel(decoder, dict(plan, prefetch=0), in_cache=True) == "backward_fixed_c"  # none built
    assert "backward_in_cache" not in computed_kernels(OP, "float32", OP.plan(targets.resolve("llvm"),
                                                                              dict(plan, prefetch=0)),
                                                       targets.resolve("llvm"))
    monkeypatch.setattr(targets, "cache_bytes", lambda level: None)  # not known: the prefetches stay
    assert not module.tensors_in_cache(OP.spec, problems["net_detr_decoder_reduced"])


def test_policy_picks_the_private_slice_for_dense_sampling():
    plan = OP.schedules["llvm"].defaults
    bev = OP.spec.case("net_bevformer").shape
    decoder = OP.spec.case("net_detr_decoder").shape
    assert module.policy_llvm(bev, plan) and not module.policy_llvm(decoder, plan)
    assert module.policy_llvm(decoder, dict(plan, private_slice="always"))


def test_one_library_serves_many_shapes():
    tvm_ops.ms_deform_attn_backward(*make(1, [[2, 2]], 1, 1, 1, 1))
    before = build.build_count
    for shape in [(2, [[3, 3]], 4, 2, 5, 2), (1, [[6, 2], [1, 1]], 9, 4, 32, 4), (3, [[1, 1]], 2, 1, 17, 1)]:
        args = make(*shape)
        check_against_reference(args, tvm_ops.ms_deform_attn_backward(*args))
    assert build.build_count == before


# --- zero elements ---------------------------------------------------------------
@pytest.mark.parametrize("levels, p", [([[3, 4]], 0), ([[0, 4]], 2), ([], 2), ([[0, 0]], 0)])
def test_zero_element_successes_give_zero_outputs(levels, p):
    args = make(2, levels, 3, 2, 5, p)
    out = tuple(np.full(a.shape, 7.0, np.float32) for a in (args[0], args[3], args[4]))
    result = tvm_ops.ms_deform_attn_backward(*args, out=out)
    assert all(r is o for r, o in zip(result, out))
    assert not any(o.any() for o in out)


# --- out= --------------------------------------------------------------------
def test_out_triple_is_written_in_place_with_none_entries():
    args = make(2, [[5, 4]], 6, 2, 9, 2)
    gv = np.full(args[0].shape, 3.0, np.float32)
    gattn = np.full(args[4].shape, -1.0, np.float32)
    result = tvm_ops.ms_deform_attn_backward(*args, out=(gv, None, gattn))
    assert result[0] is gv and result[2] is gattn and result[1].shape == args[3].shape
    check_against_reference(args, result)


def test_out_checks():
    args = make(2, [[5, 4]], 6, 2, 9, 2)
    with pytest.raises(tvm_ops.BadParamError, match=r"out must be a triple"):
        tvm_ops.ms_deform_attn_backward(*args, out=np.zeros_like(args[0]))
    with pytest.raises(tvm_ops.BadParamError, match=r"out must be a triple"):
        tvm_ops.ms_deform_attn_backward(*args, out=(None, None))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_sampling_loc'\].shape\[1\] \(Q\) must equal"):
        tvm_ops.ms_deform_attn_backward(*args, out=(None, np.zeros((2, 5, 2, 1, 2, 2), np.float32), None))
    with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_value'\] must have the dtype of value"):
        tvm_ops.ms_deform_attn_backward(*args, out=(np.zeros(args[0].shape, np.float16), None, None))
    strided = np.zeros(args[4].shape + (2,), np.float32)[..., 0]
    with pytest.raises(tvm_ops.NotSupportedError, match=r"out\['grad_attn_weight'\] must be C-contiguous"):
        tvm_ops.ms_deform_attn_backward(*args, out=(None, None, strided))


# --- checks: type, status and a message naming the tensor ------------------------
GOOD = make(2, [[3, 4], [2, 1]], 5, 2, 6, 3)
ARGS = ("value", "spatial_shapes", "level_start_index", "sampling_loc", "attn_weight", "grad_output")


def call(im2col_step=64, **changes):
    args = dict(zip(ARGS, GOOD), **changes)
    return tvm_ops.ms_deform_attn_backward(*(args[k] for k in ARGS), im2col_step)


@pytest.mark.parametrize("changes, error, pattern", [
    ({"value": None}, tvm_ops.BadParamError, r"value is missing"),
    ({"attn_weight": [[1.0]]}, tvm_ops.BadParamError, r"attn_weight must be a numpy array"),
    ({"value": np.zeros((2, 14, 2), np.float32)}, tvm_ops.BadParamError,
     r"value must have rank 4 \[B, K, H, C\], got rank 3"),
    ({"spatial_shapes": np.zeros((2,), np.int32)}, tvm_ops.BadParamError, r"spatial_shapes must have rank 2"),
    ({"level_start_index": np.zeros((2, 1), np.int32)}, tvm_ops.BadParamError, r"level_start_index must have rank 1"),
    ({"sampling_loc": np.zeros((2, 5, 2, 2, 3), np.float32)}, tvm_ops.BadParamError, r"sampling_loc must have rank 6"),
    ({"attn_weight": np.zeros((2, 5, 2, 2), np.float32)}, tvm_ops.BadParamError, r"attn_weight must have rank 5"),
    ({"grad_output": np.zeros((2, 5, 12), np.float32)}, tvm_ops.BadParamError, r"grad_output must have rank 4"),
    ({"value": GOOD[0].astype(np.float64)}, tvm_ops.BadParamError, r"value must have dtype float32, got float64"),
    ({"spatial_shapes": GOOD[1].astype(np.int64)}, tvm_ops.BadParamError,
     r"spatial_shapes must have dtype int32, got int64"),
    ({"level_start_index": GOOD[2].astype(np.float32)}, tvm_ops.BadParamError,
     r"level_start_index must have dtype int32, got float32"),
    ({"sampling_loc": GOOD[3].astype(np.float16)}, tvm_ops.BadParamError,
     r"sampling_loc must have the dtype of value \(float32\), got float16"),
    ({"grad_output": GOOD[5].astype(np.float64)}, tvm_ops.BadParamError, r"grad_output must have the dtype of value"),
    ({"sampling_loc": np.zeros((3, 5, 2, 2, 3, 2), np.float32)}, tvm_ops.BadParamError,
     r"sampling_loc.shape\[0\] \(B\) must equal value.shape\[0\] = 2, got 3"),
    ({"sampling_loc": np.zeros((2, 5, 3, 2, 3, 2), np.float32)}, tvm_ops.BadParamError,
     r"sampling_loc.shape\[2\] \(H\) must equal value.shape\[2\] = 2, got 3"),
    ({"spatial_shapes": np.zeros((2, 3), np.int32)}, tvm_ops.BadParamError,
     r"spatial_shapes.shape\[1\] must be 2, got 3"),
    ({"level_start_index": np.zeros((3,), np.int32)}, tvm_ops.BadParamError,
     r"level_start_index.shape\[0\] \(L\) must equal spatial_shapes.shape\[0\] = 2, got 3"),
    ({"sampling_loc": np.zeros((2, 5, 2, 3, 3, 2), np.float32)}, tvm_ops.BadParamError,
     r"sampling_loc.shape\[3\] \(L\) must equal spatial_shapes.shape\[0\] = 2, got 3"),
    ({"sampling_loc": np.zeros((2, 5, 2, 2, 3, 3), np.float32)}, tvm_ops.BadParamError,
     r"sampling_loc.shape\[5\] must be 2, got 3"),
    ({"attn_weight": np.zeros((2, 5, 2, 2, 4), np.float32)}, tvm_ops.BadParamError,
     r"attn_weight.shape\[4\] \(P\) must equal sampling_loc.shape\[4\] = 3, got 4"),
    ({"attn_weight": np.zeros((2, 4, 2, 2, 3), np.float32)}, tvm_ops.BadParamError,
     r"attn_weight.shape\[1\] \(Q\) must equal sampling_loc.shape\[1\] = 5, got 4"),
    ({"grad_output": np.zeros((2, 5, 2, 7), np.float32)}, tvm_ops.BadParamError,
     r"grad_output.shape\[3\] \(C\) must equal value.shape\[3\] = 6, got 7"),
    ({"grad_output": np.zeros((2, 6, 2, 6), np.float32)}, tvm_ops.BadParamError,
     r"grad_output.shape\[1\] \(Q\) must equal sampling_loc.shape\[1\] = 5, got 6"),
    ({"spatial_shapes": np.array([[3, 4], [2, 2]], np.int32)}, tvm_ops.BadParamError,
     r"value.shape\[1\] \(K\) must equal sum\(h\*w\) of spatial_shapes = 16, got 14"),
    ({"spatial_shapes": np.array([[-3, -4], [2, 1]], np.int32)}, tvm_ops.BadParamError,
     r"spatial_shapes must be non-negative"),
])
def test_bad_inputs(changes, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        call(**changes)
    assert info.value.status == error.status


@pytest.mark.parametrize("step, pattern", [
    (0, r"im2col_step must be >= 1, got 0"), (-3, r"im2col_step must be >= 1"),
    (2.0, r"im2col_step must be an integer"), (None, r"im2col_step is required")])
def test_bad_im2col_step(step, pattern):
    with pytest.raises(tvm_ops.BadParamError, match=pattern):
        call(im2col_step=step)


def test_im2col_step_must_divide_the_batch():
    args = make(6, [[2, 2]], 2, 1, 3, 1)
    for step in (1, 2, 3, 6, 7, 64):  # min(B, step) divides B
        tvm_ops.ms_deform_attn_backward(*args, im2col_step=step)
    for step in (4, 5):
        with pytest.raises(tvm_ops.BadParamError, match=rf"min\(B, im2col_step\) = {step} must divide "
                                                        r"value.shape\[0\] \(B\) = 6"):
            tvm_ops.ms_deform_attn_backward(*args, im2col_step=step)


@pytest.mark.parametrize("b, q, h, c, pattern", [
    (0, 3, 2, 5, r"B, C, H, Q must be non-zero, got B=0"), (1, 3, 2, 0, r"got B=1, C=0"),
    (1, 3, 0, 5, r"H=0"), (1, 0, 2, 5, r"Q=0")])
def test_zero_element_bad_params(b, q, h, c, pattern):
    with pytest.raises(tvm_ops.BadParamError, match=pattern):
        tvm_ops.ms_deform_attn_backward(*make(b, [[3, 4]], q, h, c, 2))


def test_checks_run_in_the_mlu_ops_order():
    with pytest.raises(tvm_ops.BadParamError, match="rank"):
        call(value=np.zeros((2, 14, 2), np.float64))
    with pytest.raises(tvm_ops.BadParamError, match="dtype"):
        call(value=np.zeros((3, 14, 2, 6), np.float64))
    with pytest.raises(tvm_ops.BadParamError, match=r"shape\[0\] \(B\)"):  # shapes before im2col / K rules
        call(im2col_step=4, value=np.zeros((3, 15, 2, 6), np.float32))


def test_large_tensors_are_not_supported_without_touching_data():
    huge = np.broadcast_to(np.zeros(1, np.float32), (1, 2**16, 2**10, 32))  # 2^31 elements, no memory
    args = [huge, np.array([[256, 256]], np.int32), np.zeros(1, np.int32),
            np.zeros((1, 1, 2**10, 1, 1, 2), np.float32), np.zeros((1, 1, 2**10, 1, 1), np.float32),
            np.zeros((1, 1, 2**10, 32), np.float32)]
    with pytest.raises(tvm_ops.NotSupportedError, match=r"value has 2147483648 elements") as info:
        tvm_ops.ms_deform_attn_backward(*args)
    assert info.value.status == "NOT_SUPPORTED"


# --- torch interop ------------------------------------------------------------
@requires_torch
def test_torch_in_torch_out_and_out_buffers():
    import torch

    args = make(2, [[4, 5], [2, 3]], 7, 2, 10, 2, -0.1, 1.1)
    targs = [torch.from_numpy(a) for a in args]
    outs = tvm_ops.ms_deform_attn_backward(*targs)
    assert all(isinstance(o, torch.Tensor) for o in outs)
    check_against_reference(args, [o.numpy() for o in outs])
    buffers = (torch.full(args[0].shape, 2.0), None, torch.full(args[4].shape, 2.0))
    result = tvm_ops.ms_deform_attn_backward(*targs, out=buffers)
    assert result[0] is buffers[0] and result[2] is buffers[2]
    check_against_reference(args, [o.numpy() for o in result])


@requires_torch
def test_mixed_kinds_are_rejected():
    import torch

    args = make(1, [[2, 2]], 2, 1, 3, 1)
    with pytest.raises(tvm_ops.BadParamError, match="spatial_shapes is a numpy tensor on cpu but value is a torch"):
        tvm_ops.ms_deform_attn_backward(torch.from_numpy(args[0]), *args[1:])


@requires_torch
def test_the_rows_peer_is_left_out_where_its_rows_would_not_fit(monkeypatch):
    """Its graph keeps every picked corner row (net_bevformer's: 7.6 GB)."""
    case = OP.spec.case("bnd_odd_levels_c5")
    data, params = TESTING.make_inputs(case, "float32", np.random.default_rng(1))
    assert set(TESTING.peers(data, params)) == {"autograd(grid_sample)", "autograd(index_select)"}
    monkeypatch.setattr(TESTING, "ROWS_PEER_MAX_BYTES", 0)
    assert set(TESTING.peers(data, params)) == {"autograd(grid_sample)"}


@requires_torch
def test_torch_peer_matches_the_reference():
    case = OP.spec.case("bnd_odd_levels_c5")
    data, params = TESTING.make_inputs(case, "float32", np.random.default_rng(1))
    peer = [g.numpy() for g in TESTING.torch_peer(data, params)()]
    ref = TESTING.reference(data, params)
    for name, value in zip(NAMES, peer):
        acc = metrics.accuracy(value, ref[name], "float32")
        assert acc.failures(OP.spec.accuracy["float32"]) == [], f"{name}: {acc}"
