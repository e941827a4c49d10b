"""Every operator's non-heavy spec cases, every dtype, against its float64 reference on the CPU.

Heavy cases (the full network shapes) run with `python -m tvm_ops test` and `bench`.
"""

import pytest

from tvm_ops import runner, targets
from tvm_ops.ops import OPERATORS

CASES = [(op, case, dtype) for op in OPERATORS.values() for case in op.spec.cases if not case.heavy
         for dtype in case.dtypes]


@pytest.mark.parametrize("op, case, dtype", CASES, ids=[f"{o.name}-{c.name}-{d}" for o, c, d in CASES])
def test_spec_case(op, case, dtype):
    result = runner.run_case(op, case, dtype, targets.resolve("llvm"))
    assert result.verdict == "pass", result.detail
