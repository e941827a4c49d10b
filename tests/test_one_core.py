"""One-core builds of the CPU kernels (tvm_ops/one_core.py): no parallel launch, the same
bits as the parallel kernels, and the call path runs them for small work only."""

import dataclasses
import re

import numpy as np
import pytest

from tvm_ops import build, checks, dispatch, policy, records, runner, targets
from tvm_ops.invocation import CallPlan
from tvm_ops.ops import all_operators, get
from tvm_ops.testing import material

HOST = targets.resolve("llvm")
OPS = all_operators()
PARALLEL_LAUNCH = "__TVMBackendParallelLaunch"


def _call_graph(llvm_ir: str) -> dict:
    """{function: the globals its body names} of an LLVM IR module."""
    graph = {}
    for match in re.finditer(r"^define [^@]*@([\w.$]+)\(.*?^}", llvm_ir, re.M | re.S):
        graph[match.group(1)] = set(re.findall(r"@([\w.$]+)", match.group(0))) - {match.group(1)}
    return graph


def _reaches(graph: dict, start: str, name: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == name:
            return True
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return False


def _kernel_ir(variant) -> dict:
    dispatch.kernels(variant.op, variant.dtype, variant.model, one_core=variant.one_core)  # built if missing
    return _call_graph((build.find_entry(variant) / "kernels.ll").read_text())


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_one_core_kernels_never_reach_the_thread_pool(op):
    parallel = dispatch.default_variant(op, "float32", HOST)
    one_core = dataclasses.replace(parallel, one_core=True)
    assert one_core.key != parallel.key
    graphs = {False: _kernel_ir(parallel), True: _kernel_ir(one_core)}
    assert [build.manifest(build.find_entry(v))["one_core"] for v in (parallel, one_core)] == [False, True]
    held = build.manifest(build.find_entry(one_core))["kernels"]  # what the library holds
    assert held == build.manifest(build.find_entry(parallel))["kernels"]
    launching = [name for name in held if _reaches(graphs[False], f"__tvm_ffi_{name}", PARALLEL_LAUNCH)]
    assert launching, f"{op.name}: no kernel has a parallel loop"
    for name in held:
        assert not _reaches(graphs[True], f"__tvm_ffi_{name}", PARALLEL_LAUNCH), name


def _shape_and_bits(value) -> tuple:
    array = runner.to_numpy(value)
    return array.shape, np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_one_core_kernels_write_the_same_bits_as_the_parallel_ones(op):
    """Every small float32 spec case, both builds on the same inputs (the spec-case tests
    check whichever build the policy picks against the reference)."""
    compared = 0
    for case in op.spec.cases:
        if case.heavy or case.expect != "ok" or "float32" not in case.dtypes:
            continue
        inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
        problem = checks.check(op.spec, inputs, params, {}, op.rules)
        if problem.empty:
            continue
        runs = []
        for one_core in (False, True):
            kernels = dispatch.kernels(op, "float32", HOST, records.problem_class(op.spec, problem), one_core)
            result = CallPlan(op, problem, kernels).run(inputs, {})
            runs.append([_shape_and_bits(v) for v in (result if isinstance(result, tuple) else (result,))])
        for t, a, b in zip(op.spec.outputs, *runs):
            assert a == b, f"{case.name}: {t.name} differs"
        compared += 1
    assert compared >= 3, f"{op.name}: only {compared} cases compared"


def test_the_policy_runs_small_work_on_one_core_and_more_of_it_with_sleeping_workers(monkeypatch):
    op = get("three_interpolate_backward")
    monkeypatch.delenv(targets.SPIN_ENV, raising=False)
    spinning_io, _ = policy.ONE_CORE_BELOW["spinning"]
    asleep_io, _ = policy.ONE_CORE_BELOW["asleep"]
    rng = np.random.default_rng(0)

    def one_core(io_bytes):
        """(the call's theory io, whether it runs on one core) with about io_bytes of io"""
        b, n, m = 2, 64, 64
        c = io_bytes // (4 * b * (n + m))  # grad_output [B, C, N] and the [B, C, M] result dominate
        inputs = {"grad_output": rng.standard_normal((b, c, n), np.float32),
                  "indices": rng.integers(0, m, (b, n, 3), dtype=np.int32),
                  "weights": rng.random((b, n, 3), np.float32)}
        problem = checks.check(op.spec, inputs, {"m": m}, {}, op.rules)
        return op.spec.theory(problem.sizes, 4, problem.params)[0], dispatch.runs_on_one_core(op, problem, HOST)

    io_at, small = one_core(spinning_io // 2)
    assert io_at < spinning_io and small
    io_at, small = one_core(2 * spinning_io)
    assert spinning_io <= io_at < asleep_io and not small
    monkeypatch.setenv(targets.SPIN_ENV, "0")  # workers asleep: a wake-up costs more
    assert one_core(2 * spinning_io)[1]
    io_at, small = one_core(2 * asleep_io)
    assert io_at >= asleep_io and not small
    assert not dispatch.runs_on_one_core(op, checks.check(op.spec, {
        "grad_output": np.zeros((1, 1, 4), np.float32), "indices": np.zeros((1, 4, 3), np.int32),
        "weights": np.zeros((1, 4, 3), np.float32)}, {"m": 4}, {}, op.rules), targets.resolve("cuda:sm_90"))
