"""Every operator's non-heavy spec cases, every dtype, against its float64 reference on the CPU.

Heavy cases (the full network shapes) run with `python -m tvm_ops test` and `bench`.
"""

import numpy as np
import pytest

from tvm_ops import checks, runner, targets
from tvm_ops.ops import all_operators
from tvm_ops.testing import material

CASES = [(op, case, dtype) for op in all_operators() for case in op.spec.cases if not case.heavy
         for dtype in case.dtypes]


@pytest.mark.parametrize("op, case, dtype", CASES, ids=[f"{o.name}-{c.name}-{d}" for o, c, d in CASES])
def test_spec_case(op, case, dtype):
    result = runner.run_case(op, case, dtype, targets.resolve("llvm"))
    assert result.verdict == "pass", result.detail


def misaligned_copy(array, dtype=None):
    """A contiguous copy of `array` that starts one element past a 64-byte boundary."""
    array = np.asarray(array)
    dtype = np.dtype(dtype or array.dtype)
    base = np.empty(array.size + 64, dtype)
    skip = (-base.ctypes.data % 64) // dtype.itemsize + 1
    view = base[skip:skip + array.size].reshape(array.shape)
    view[...] = array
    assert view.ctypes.data % 64 != 0 and view.flags.c_contiguous
    return view


# TVM declares parameter buffers 64-byte aligned; numpy gives small arrays 16 bytes, and a
# view can start anywhere. A kernel that relied on the declaration (aligned vector moves)
# would fault or read garbage here.
FIRST_OK = [(op, next(c for c in op.spec.cases if not c.heavy and c.expect == "ok" and c.set != "network"))
            for op in all_operators()]


@pytest.mark.parametrize("op, case", FIRST_OK, ids=[o.name for o, _ in FIRST_OK])
def test_inputs_and_outputs_off_any_vector_alignment(op, case):
    dtype = case.dtypes[0]
    inputs, params = material(op).make_inputs(case, dtype, runner.case_rng(op.name, case.name, dtype))
    reference = material(op).reference(inputs, params)
    checked = checks.check(op.spec, inputs, params, {}, op.rules)
    outs = {}
    for t in op.spec.outputs:
        out_dtype = np.dtype(op.output_dtype(t, checked))
        poison = np.nan if out_dtype.kind == "f" else -7  # what the kernels must overwrite
        outs[t.name] = misaligned_copy(np.full(reference[t.name].shape, poison, out_dtype))
    op.call({name: misaligned_copy(value) for name, value in inputs.items()}, params,
            targets.resolve("llvm"), outs)
    _, failures = runner.compare(op, dtype, outs, reference)
    assert not failures, failures
