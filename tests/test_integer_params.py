"""Every integer parameter of every operator, at random values on both sides of int32:
out of range -> BadParamError before any kernel runs; in range -> the reference's answer
or the library's own error, never a truncated value or a raw exception."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_ops
from tvm_ops import checks, overhead, runner
from tvm_ops.ops import NAMES, get
from tvm_ops.testing import material

INT_PARAMS = [(name, p.name, p.minimum) for name in NAMES for p in get(name).spec.params if p.type == "int"]
VALUES = st.one_of(st.integers(-2**70, -1), st.integers(0, 40), st.integers(checks.INT32_MAX + 1, 2**70))


@pytest.mark.parametrize("name, param, minimum", INT_PARAMS, ids=[f"{n}.{p}" for n, p, _ in INT_PARAMS])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_an_integer_parameter_is_checked_or_honoured(name, param, minimum, value):
    op = get(name)
    case = overhead.tiny_case(op)
    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(name, case.name, "float32"))
    params = dict(params, **{param: value})
    if value < minimum or value > checks.INT32_MAX:
        with pytest.raises(tvm_ops.BadParamError, match=param):
            op.call(inputs, params, "llvm", {})
        return
    try:
        outputs = op.call(inputs, params, "llvm", {})
    except tvm_ops.OpError:
        return  # e.g. a size that no longer matches the tensors: the library's own error
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    results = {t.name: v for t, v in zip(op.spec.outputs, outputs)}
    _, failures = runner.compare(op, "float32", results, material(op).reference(inputs, params))
    assert not failures, failures
