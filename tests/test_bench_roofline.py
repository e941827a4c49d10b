"""The bench's rooflines: a case's io efficiency is against the cache level its bytes fit
in (measured at its size) or DRAM; the compute peak is a measured FMA loop."""

import pytest

from tvm_ops import bench, targets


def test_a_case_is_held_to_the_level_its_bytes_fit_in():
    model = targets.resolve("llvm")
    l2, l3 = targets.cache_bytes(2), targets.cache_bytes(3)
    if not (l2 and l3):
        pytest.skip("the OS does not give this CPU's cache sizes")
    stream = 1e9  # a placeholder DRAM bandwidth: every cache level copies faster
    name, bandwidth = bench.roofline(model, l2 * model.cores / 4, stream)
    assert name == "L2" and bandwidth >= stream
    assert bench.roofline(model, l3 / 4, stream)[0] == "L3"
    assert bench.roofline(model, l3, stream) == ("DRAM", stream)
    assert bench.roofline(targets.cuda("sm_90"), 1024, stream) == ("DRAM", stream)


def test_the_compute_peak_is_measured_and_below_the_nominal_one():
    model = targets.resolve("llvm")
    peak = bench.peak_flops(model)
    # the nominal ceiling: 2 FMA pipes x 2 flops per lane, at a generous 6 GHz
    assert 0 < peak < model.cores * 6e9 * model.lanes("float32") * 4
    assert bench.peak_flops(model) == peak  # once per process
