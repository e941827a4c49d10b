"""Kernels whose cores take tasks from a shared counter (ops/task_queue.py): which core runs
which task changes from run to run, the results must not."""

import os
import subprocess
import sys

import pytest

# ms_deform_attn_backward's two CPU kernels (private slice and in place, C = 32 compiled in
# and symbolic C) and border_align_backward's main and tail kernels, in a fresh process
CHILD = """
import hashlib, numpy as np, tvm, tvm_ops
from tvm_ops import spec, targets
from tvm_ops.ops import ms_deform_attn_backward as msda, border_align_backward as ba
from tvm_ops.testing import material
parts = []
for name, shape, levels in (("private", dict(B=2, K=60, H=3, C=32, L=2, Q=80, P=4), [[5, 6], [6, 5]]),
                            ("in_place", dict(B=2, K=900, H=3, C=20, L=1, Q=9, P=2), [[30, 30]])):
    case = spec.Case(name, "random", shape, ("float32",), extra={"levels": levels, "loc_low": -0.1, "loc_high": 1.1})
    data, params = material(msda.OP).make_inputs(case, "float32", np.random.default_rng(3))
    plan = msda.OP.plan(targets.resolve("llvm"), dict(msda.OP.schedules["llvm"].defaults))
    assert msda.cpu_kernel(shape, plan).startswith("backward_private") == (name == "private")
    parts += [o.tobytes() for o in msda.OP.call(data, params, "llvm", {})]
for c in (256, 141):  # 141: main kernel and both tail owners (16-lane vectors, then scalars)
    case = spec.Case("b", "random", dict(N=2, K=12 * 9, C=c, H=12, W=9, Q=4 * c), ("float32",),
                     extra={"pool_size": 6, "boxes": "partly_outside"})
    data, params = material(ba.OP).make_inputs(case, "float32", np.random.default_rng(5))
    parts.append(ba.OP.call(data, params, "llvm", {}).tobytes())
print(tvm.runtime.num_threads(), hashlib.sha256(b"".join(parts)).hexdigest())
"""


def _digest(threads: int) -> tuple[int, str]:
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), TVM_OPS_RECORDS=os.devnull)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    used, digest = done.stdout.split()[-2:]
    return int(used), digest


def test_same_bits_whichever_core_takes_which_task():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: TVM caps its pool at the cores, so no second thread count exists")
    (one, a), (two, b), (_, c) = _digest(1), _digest(2), _digest(2)
    assert (one, two) == (1, 2)
    assert a == b == c
