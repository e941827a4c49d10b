"""diff1..diff4 on hand-made arrays, checked against the formulas by hand."""

import math

import numpy as np
import pytest

from tvm_ops import metrics


def test_diff1_and_diff2_by_hand():
    e = np.array([1.0, 2.0, 4.0])
    b = np.array([1.0, 2.5, 3.0])
    # sum|e-b| = 0 + 0.5 + 1 = 1.5 ; sum|b| = 6.5
    assert metrics.diff1(e, b) == pytest.approx(1.5 / (6.5 + 1e-9))
    # sum (e-b)^2 = 0.25 + 1 = 1.25 ; sum b^2 = 1 + 6.25 + 9 = 16.25
    assert metrics.diff2(e, b) == pytest.approx(math.sqrt(1.25 / (16.25 + 1e-9)))


def test_diff3_uses_absolute_error_below_eps():
    b = np.array([0.0, 2.0, 1e-7])
    e = np.array([3e-7, 2.2, 2e-7])
    # |b| < 1e-6 -> absolute error (3e-7, 1e-7); else relative 0.2/2 = 0.1
    assert metrics.diff3(e, b, 1e-6) == pytest.approx(0.1)
    assert metrics.diff3(np.array([5e-7]), np.array([0.0]), 1e-6) == pytest.approx(5e-7)


def test_diff4_fraction_of_results_below_reference():
    b = np.arange(200, dtype=np.float64)
    e = b.copy()
    e[:50] -= 0.5  # 50 below
    e[50:150] += 0.5  # 100 above
    assert metrics.diff4(e, b) == pytest.approx(50 / 150)


def test_diff4_is_undefined_with_fewer_than_100_distinct_pairs():
    b = np.zeros(1000)
    e = np.full(1000, 1.0)  # 1000 unequal elements but one distinct pair
    assert metrics.diff4(e, b) == -1.0
    assert metrics.diff4(b, b) == -1.0


def test_biased_result_fails():
    b = np.arange(1, 301, dtype=np.float64)
    e = b * (1 + 1e-7)  # every error on one side
    acc = metrics.accuracy(e, b, "float32")
    assert acc.diff4 == 0.0  # no result lies below its reference
    assert any("biased" in p for p in acc.failures({"diff1": 1e-5, "diff2": 1e-5}))


def test_thresholds_and_nonfinite_positions():
    b = np.array([1.0, np.nan, 3.0])
    ok = metrics.accuracy(np.array([1.0, np.nan, 3.0]), b, "float32")
    assert ok.failures({"diff1": 1e-5}) == []
    moved = metrics.accuracy(np.array([np.nan, 2.0, 3.0]), b, "float32")
    assert any("NaN/Inf" in p for p in moved.failures({}))
    off = metrics.accuracy(np.array([1.1, np.nan, 3.0]), b, "float32")
    assert any("diff1" in p for p in off.failures({"diff1": 1e-5}))
    assert off.failures({"diff1": 1.0, "diff2": 1.0}) == []


def test_nan_metric_fails():
    acc = metrics.Accuracy(float("nan"), 0.0, 0.0, -1.0, True)
    assert acc.failures({"diff1": 1.0}) == ["diff1 is nan"]


def test_chunked_metrics_match_the_direct_formulas(monkeypatch):
    rng = np.random.default_rng(3)
    b = rng.standard_normal(10_000)
    e = b + rng.standard_normal(10_000) * 1e-3
    monkeypatch.setattr(metrics, "CHUNK", 777)
    acc = metrics.accuracy(e, b, "float32")
    assert acc.diff1 == pytest.approx(metrics.diff1(e, b))
    assert acc.diff2 == pytest.approx(metrics.diff2(e, b))
    assert acc.diff3 == metrics.diff3(e, b, 1e-6)
    assert acc.diff4 == metrics.diff4(e, b) and not acc.diff4_sampled


def test_diff4_on_huge_outputs_uses_an_even_subset(monkeypatch):
    b = np.arange(1, 5001, dtype=np.float64)
    e = b.copy()
    e[::2] += 0.5
    e[1::2] -= 0.5
    monkeypatch.setattr(metrics, "DIFF4_MAX_PAIRS", 1000)
    acc = metrics.accuracy(e, b, "float32")
    assert acc.diff4_sampled and acc.diff4 == pytest.approx(0.5)
    biased = metrics.accuracy(b + 0.5, b, "float32")
    assert biased.diff4_sampled and biased.diff4 == 0.0
