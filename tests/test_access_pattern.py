"""Access-pattern rooflines: the pattern kernel touches exactly the rows it is given, and
the operators' patterns name the rows their references read or update."""

import numpy as np
import pytest

from tvm_ops import bench, runner, targets
from tvm_ops.access_pattern import (AHEADS, STREAM_MIN_BYTES, STREAMED_TASK_GROUPS, AccessPattern, csr, fixed_groups,
                                    run_pattern, streamable)
from tvm_ops.ops import cpu_ir, get
from tvm_ops.testing import material

MODEL = targets.resolve("llvm")


def _random_pattern(rng, rows, width, groups, fan, gather, scatter, distinct=False):
    if distinct:  # every row in at most one entry: a scatter without races
        index = rng.permutation(rows)[:groups * fan].reshape(groups, fan)
    else:
        index = rng.integers(0, rows, (groups, fan))
    used = rng.random((groups, fan)) < 0.7
    offsets, flat = fixed_groups(index, used)
    return AccessPattern(rows, width, offsets, flat, gather, scatter), index, used


@pytest.mark.parametrize("width", [1, 3, 32, 80, 512])
@pytest.mark.parametrize("ahead", AHEADS)
def test_the_gather_sums_each_groups_rows(width, ahead):
    rng = np.random.default_rng(width)
    pattern, index, used = _random_pattern(rng, 50, width, 40, 6, gather=True, scatter=False)
    table = rng.uniform(-1, 1, (50, width)).astype(np.float32)
    _, out = run_pattern(MODEL, pattern, table, np.zeros((40, width)), ahead)
    expected = np.stack([table[index[g][used[g]]].astype(np.float64).sum(0) for g in range(40)])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not cpu_ir.has_streaming_stores(MODEL.features()), reason="no x86 non-temporal stores here")
@pytest.mark.parametrize("width", [16, 80, 512])
def test_the_streamed_gather_writes_the_same_sums(width):
    rng = np.random.default_rng(width)
    groups = 2 * STREAMED_TASK_GROUPS + 200  # whole tasks and a tail
    pattern, index, used = _random_pattern(rng, 50, width, groups, 3, gather=True, scatter=False)
    table = rng.uniform(-1, 1, (50, width)).astype(np.float32)
    _, cached = run_pattern(MODEL, pattern, table, np.zeros((groups, width)))
    _, streamed = run_pattern(MODEL, pattern, table, np.zeros((groups, width)), streamed=True)
    np.testing.assert_array_equal(streamed, cached)
    assert np.isfinite(streamed).all() and (streamed != 0).any()


def test_only_a_large_gathered_output_of_whole_lines_is_also_timed_streamed():
    groups = STREAM_MIN_BYTES // (16 * 4)

    def pattern(width, groups, gather=True, scatter=False, dtype="float32"):
        return AccessPattern(8, width, np.zeros(groups + 1, np.int32), np.zeros(0, np.int32), gather, scatter,
                             dtype)

    x86 = cpu_ir.has_streaming_stores(MODEL.features())  # any vector width: stores of whole lines
    assert streamable(MODEL, pattern(16, groups)) == x86
    assert not streamable(MODEL, pattern(16, groups - 1))  # below STREAM_MIN_BYTES
    assert not streamable(MODEL, pattern(24, groups))  # rows not whole lines
    assert not streamable(MODEL, pattern(16, groups, scatter=True))
    assert not streamable(MODEL, pattern(16, groups, dtype="float16"))


@pytest.mark.parametrize("width", [1, 16, 80])
def test_the_scatter_zeroes_the_table_then_adds_each_groups_source_row(width):
    rng = np.random.default_rng(width)
    pattern, index, used = _random_pattern(rng, 300, width, 40, 6, gather=False, scatter=True, distinct=True)
    src = rng.uniform(-1, 1, (40, width)).astype(np.float32)
    updated, _ = run_pattern(MODEL, pattern, np.zeros((300, width)), src)
    expected = np.zeros((300, width), np.float32)
    for g in range(40):
        expected[index[g][used[g]]] += src[g]
    np.testing.assert_array_equal(updated, expected)  # (the kernel's table starts as NaN)


def test_csr_keeps_each_groups_entries_in_their_order():
    offsets, index = csr(np.array([2, 0, 2, 1, 0]), np.array([10, 11, 12, 13, 14]), 4)
    assert offsets.tolist() == [0, 2, 3, 5, 5]
    assert index.tolist() == [11, 14, 13, 10, 12]


def test_a_malformed_pattern_is_refused():
    with pytest.raises(ValueError, match="outside"):
        AccessPattern(4, 1, np.array([0, 1]), np.array([4]), True, False)
    with pytest.raises(ValueError, match="offsets"):
        AccessPattern(4, 1, np.array([0, 2]), np.array([1]), True, False)


def _case_inputs(op_name, case_name):
    op = get(op_name)
    case = next(c for c in op.spec.cases if c.name == case_name)
    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
    return op, inputs, params


def test_ms_deform_attn_patterns_touch_the_rows_the_gradient_reaches():
    op, inputs, params = _case_inputs("ms_deform_attn_backward", "net_bevformer_reduced")
    B, K, H, C = inputs["value"].shape
    grad_value = material(op).reference(inputs, params)["grad_value"]
    reached = np.flatnonzero(np.abs(grad_value).sum(-1).transpose(0, 2, 1).reshape(-1))  # rows (b, h, k)
    backward = material(op).access_pattern(inputs, params)
    forward = material("ms_deform_attn_forward").access_pattern(inputs, params)
    assert backward.scatter and backward.gather and forward.gather and not forward.scatter
    assert backward.rows == forward.rows == B * H * K and backward.width == C
    assert np.array_equal(np.unique(backward.index), reached)
    assert np.array_equal(np.sort(backward.index), np.sort(forward.index))  # the same corners, two orders
    assert len(forward.offsets) - 1 == B * H * inputs["sampling_loc"].shape[1]  # a group per (b, h, q)


def test_dynamic_scatter_forward_pattern_sums_are_the_voxel_sums():
    op, inputs, params = _case_inputs("dynamic_scatter_forward", "net_4294x128_m3435_sum")
    pattern = material(op).access_pattern(inputs, params)
    _, out = run_pattern(MODEL, pattern, inputs["feats"], np.zeros((len(pattern.offsets) - 1, pattern.width)))
    np.testing.assert_allclose(out, material(op).reference(inputs, params)["voxel_feats"], rtol=1e-5, atol=1e-5)


def test_voxel_pooling_backward_pattern_gathers_each_kept_points_row():
    op, inputs, params = _case_inputs("voxel_pooling_backward", "net_2x20000x80_128x128")
    pattern = material(op).access_pattern(inputs, params)
    _, out = run_pattern(MODEL, pattern, inputs["grad_output"].reshape(-1, pattern.width),
                         np.zeros((len(pattern.offsets) - 1, pattern.width)))
    expected = material(op).reference(inputs, params)["grad_input_features"]
    assert 0 < np.diff(pattern.offsets).sum() < len(pattern.offsets) - 1  # some points kept, some dropped
    np.testing.assert_array_equal(out, expected.reshape(out.shape).astype(np.float32))


def test_the_bench_holds_a_case_with_a_pattern_to_it():
    op, _, _ = _case_inputs("ms_deform_attn_forward", "net_detr_decoder_reduced")
    case = next(c for c in op.spec.cases if c.name == "net_detr_decoder_reduced")
    line = bench.bench_case(op, case, "float32", MODEL, 1e10, repeat=1, peer=False)
    assert line.roofline == "gather" and line.roofline_gbps > 0
    assert line.io_efficiency == pytest.approx(line.gbps / line.roofline_gbps)
    assert "of gather" in line.text()
