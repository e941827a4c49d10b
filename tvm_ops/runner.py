"""Run an operator's spec cases against its float64 reference (the `test` command and pytest)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from . import metrics
from .errors import ArchMismatchError, OpError
from .targets import TargetModel
from .testing import material


@dataclass
class CaseResult:
    op: str
    case: str
    dtype: str
    target: str
    verdict: str  # "pass", "fail" or "skip"
    accuracy: metrics.Accuracy | None = None
    detail: str = ""


def case_rng(op: str, case: str, dtype: str) -> np.random.Generator:
    """A seed per (op, case, dtype), stable across runs and processes."""
    return np.random.default_rng(zlib.crc32(f"{op}/{case}/{dtype}".encode()))


def to_target(model: TargetModel, inputs: dict) -> dict:
    """Inputs as the target wants them: numpy for the CPU, torch CUDA tensors for a GPU."""
    if model.kind == "llvm":
        return inputs
    import torch

    return {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in inputs.items()}


def to_numpy(value) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.cpu().numpy()


def run_case(op, case, dtype: str, model: TargetModel) -> CaseResult:
    result = CaseResult(op.name, case.name, dtype, model.key, "fail")
    testing = material(op)
    inputs, params = testing.make_inputs(case, dtype, case_rng(op.name, case.name, dtype))
    try:
        outputs = op.call(to_target(model, inputs), params, model, {})
    except ArchMismatchError as exc:
        result.verdict, result.detail = "skip", str(exc)
        return result
    except OpError as exc:
        if case.expect == exc.status:
            result.verdict, result.detail = "pass", f"raised {exc.status} as the spec expects"
        else:
            result.detail = f"{type(exc).__name__}: {exc}"
        return result
    if case.expect != "ok":
        result.detail = f"expected {case.expect}, but the call succeeded"
        return result
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    results = {t.name: value for t, value in zip(op.spec.outputs, outputs)}
    result.accuracy, problems = compare(op, dtype, results, testing.reference(inputs, params))
    result.detail = "; ".join(problems)
    result.verdict = "fail" if problems else "pass"
    return result


def compare(op, dtype: str, results: dict, reference: dict) -> tuple[metrics.Accuracy | None, list[str]]:
    """(the worst output's metrics, every failure) of `results` against the spec's thresholds."""
    limits = op.spec.accuracy[dtype]
    problems, worst = [], None
    for t in op.spec.outputs:
        result = to_numpy(results[t.name])
        acc = metrics.accuracy(result, reference[t.name], dtype)
        worst = acc if worst is None or acc.diff2 > worst.diff2 else worst
        failures = acc.failures(limits)
        if t.name in op.spec.exact and not failures:
            wrong = np.count_nonzero(result != reference[t.name])
            failures += [f"{wrong} of {result.size} elements differ from the reference"] if wrong else []
        problems += [f"{t.name}: {p}" for p in failures]
    return worst, problems
