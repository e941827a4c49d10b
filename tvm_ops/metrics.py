"""mlu-ops accuracy metrics (diff1..diff4) and the verdict against a spec's thresholds.

e is the kernel's result, b the float64 reference. Non-finite values are
compared by position first (a NaN must land exactly where the reference has
one); the metrics then run over the finite elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPS = {"float32": 1e-6, "float16": 1e-4, "int32": 1e-6}
DIFF4_MIN_PAIRS = 100
# diff4 deduplicates (e, b) pairs, which costs a sort. Above this many unequal
# elements it runs on an evenly strided subset of that size (reported as
# diff4_sampled); every other metric always covers every element.
DIFF4_MAX_PAIRS = 1 << 20
CHUNK = 1 << 22  # elements per pass: keeps temporaries small on 10^8-element outputs


@dataclass(frozen=True)
class Accuracy:
    diff1: float
    diff2: float
    diff3: float
    diff4: float  # -1 when undefined (fewer than 100 distinct unequal pairs)
    nonfinite_match: bool
    diff4_sampled: bool = False

    def failures(self, limits: dict) -> list[str]:
        """Why this result fails `limits` ({metric: threshold}); empty when it passes."""
        problems = []
        if not self.nonfinite_match:
            problems.append("NaN/Inf positions differ from the reference")
        for name in ("diff1", "diff2", "diff3"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                problems.append(f"{name} is {value}")
            elif name in limits and value > limits[name]:
                problems.append(f"{name} {value:.3g} > {limits[name]:.3g}")
        if self.diff4 != -1 and self.diff4 in (0.0, 1.0):
            problems.append(f"diff4 is {self.diff4:g}: every error lies on one side (biased)")
        return problems


def diff1(e: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(e - b).sum() / (np.abs(b).sum() + 1e-9))


def diff2(e: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.square(e - b).sum() / (np.square(b).sum() + 1e-9)))


def diff3(e: np.ndarray, b: np.ndarray, eps: float) -> float:
    if e.size == 0:
        return 0.0
    err = np.abs(e - b)
    absb = np.abs(b)
    rel = np.where(absb < eps, err, err / np.where(absb < eps, 1.0, absb))
    return float(rel.max())


def diff4(e: np.ndarray, b: np.ndarray) -> float:
    unequal = e != b
    e, b = e[unequal], b[unequal]
    order = np.lexsort((b, e))  # equal pairs become neighbours
    e, b = e[order], b[order]
    distinct = np.ones(e.size, bool)
    distinct[1:] = (e[1:] != e[:-1]) | (b[1:] != b[:-1])
    if np.count_nonzero(distinct) < DIFF4_MIN_PAIRS:
        return -1.0
    return float((e[distinct] < b[distinct]).mean())


def _chunks(result, reference):
    e_all, b_all = np.asarray(result).ravel(), np.asarray(reference).ravel()
    if e_all.shape != b_all.shape:
        raise ValueError(f"result has {e_all.size} elements, reference {b_all.size}")
    for start in range(0, e_all.size, CHUNK):
        yield (e_all[start:start + CHUNK].astype(np.float64, copy=False),
               b_all[start:start + CHUNK].astype(np.float64, copy=False))


def accuracy(result, reference, dtype: str) -> Accuracy:
    """All four metrics in passes over 4M-element chunks (outputs reach 10^8 elements)."""
    eps = EPS.get(dtype, 1e-6)
    abs_err = abs_ref = sq_err = sq_ref = worst = 0.0
    match, unequal_count = True, 0
    for e, b in _chunks(result, reference):
        finite_e, finite_b = np.isfinite(e), np.isfinite(b)
        if not (finite_e.all() and finite_b.all()):
            match = match and bool(np.array_equal(finite_e, finite_b)
                                   and np.array_equal(e[~finite_e], b[~finite_b], equal_nan=True))
            keep = finite_e & finite_b
            e, b = e[keep], b[keep]
        err = e - b
        abs_err += float(np.abs(err).sum())
        abs_ref += float(np.abs(b).sum())
        sq_err += float(np.dot(err, err))
        sq_ref += float(np.dot(b, b))
        worst = max(worst, diff3(e, b, eps))
        unequal_count += int(np.count_nonzero(err))
    # diff4: every unequal pair, or an evenly strided subset of them when there are too many
    stride = max(1, -(-unequal_count // DIFF4_MAX_PAIRS))
    picked_e, picked_b, seen = [], [], 0
    for e, b in _chunks(result, reference):
        keep = np.flatnonzero((e != b) & np.isfinite(e) & np.isfinite(b))
        first = (-seen) % stride
        picked_e.append(e[keep[first::stride]])
        picked_b.append(b[keep[first::stride]])
        seen += keep.size
    d4 = diff4(np.concatenate(picked_e), np.concatenate(picked_b)) if unequal_count else -1.0
    return Accuracy(abs_err / (abs_ref + 1e-9), float(np.sqrt(sq_err / (sq_ref + 1e-9))), worst, d4,
                    match, stride > 1)
