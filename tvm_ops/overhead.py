"""Host time of a repeated public call (`bench --overhead`).

Per operator, on its smallest spec case: the time per call of the public function
called over and over with the same signature (best of `blocks` blocks of `calls` calls),
with and without `out=`, on numpy arrays and on torch tensors; next to it the same
call's kernels alone (the kernel calls that launch makes, replayed directly), the host
time (the same public call with the library's kernels replaced by a Python no-op) and
the PyTorch peer's call on the same inputs. On a tiny case the kernels' time is mostly
the thread pool's wake-up, which varies from call to call, so the host time is measured
with the kernels stubbed rather than as a difference. An operator whose output sizes its
kernels count (dynamic_scatter_forward's voxels) gets, with its kernels stubbed, the counts
of the real call on the same inputs.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass

import numpy as np

from . import dispatch, runner
from .testing import material


@dataclass
class OverheadLine:
    op: str
    case: str
    kernels_us: float  # the launch's kernel calls alone
    calls_us: dict  # "numpy out=", "numpy", "torch out=", "torch" -> us per public call
    host_us: dict  # the same calls with the kernels stubbed out
    peer_us: float | None  # the op's main PyTorch peer on the same case

    def text(self) -> str:
        calls = "  ".join(f"{name} {us:6.1f} (host {self.host_us[name]:5.1f})" for name, us in self.calls_us.items())
        peer = f"  peer {self.peer_us:8.1f}" if self.peer_us is not None else ""
        return f"{self.op:28s} {self.case:24s} kernels {self.kernels_us:6.1f}  {calls}{peer}   us/call"


def per_call_us(fns: dict, calls: int, blocks: int) -> dict:
    """{name: best us per call}: blocks of `calls` calls of each function, interleaved, so
    a noisy moment of the machine hits them alike."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(blocks):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return {name: seconds * 1e6 for name, seconds in best.items()}


def tiny_case(op):
    """The op's spec case with the least theory io that runs kernels (float32, no empty dims)."""
    ok = [c for c in op.spec.cases if c.expect == "ok" and not c.heavy and "float32" in c.dtypes
          and all(c.shape.values()) and c.extra.get("voxel_num", 1) != 0]
    sizes = []
    for case in ok:
        inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
        sizes.append(op.spec.theory(case.shape, 4, params)[0])
    return ok[int(np.argmin(sizes))]


def public_call(op, inputs: dict, params: dict, out: dict | None):
    """A no-argument callable: the public function tvm_ops.<op> on these arguments."""
    import tvm_ops

    function = getattr(tvm_ops, op.name)
    accepted = inspect.signature(function).parameters
    kwargs = {k: v for k, v in {**inputs, **params}.items() if k in accepted}
    if out is not None:
        values = tuple(out[t.name] for t in op.spec.outputs)
        kwargs["out"] = values[0] if len(values) == 1 else values
    return lambda: function(**kwargs)


def kernels_alone(op, inputs: dict, params: dict):
    """A no-argument callable: the kernel calls one launch makes, replayed on the same tensors."""
    op.call(inputs, params, "llvm", {})
    plan = op._calls.get(op._signature(inputs, params, "llvm", {}))
    recorded = []
    recorder = plan.kernels.like({name: (lambda f: lambda *a: recorded.append((f, a)))(fn)
                                  for name, fn in plan.kernels.items()})
    real, plan.kernels = plan.kernels, recorder
    try:
        plan.run(inputs, {})
    finally:
        plan.kernels = real

    def replay():
        for fn, args in recorded:
            fn(*args)

    return replay


def counted_sizes(op, outputs: dict) -> dict:
    """{symbol: size} of the op's counted output sizes, read off the outputs of a real call."""
    return {dim: outputs[t.name].shape[axis] for t in op.spec.outputs for axis, dim in enumerate(t.dims)
            if dim in op.spec.counted}


@contextlib.contextmanager
def kernels_stubbed(op, counted: dict):
    """Calls of `op` whose libraries' kernels do nothing (Python no-ops), for the duration;
    its counted output sizes are `counted` (the stubbed counting kernels write nothing)."""
    real = dispatch.kernels

    def stubbed(*args, **kwargs):
        library = real(*args, **kwargs)
        return library.like({name: lambda *a: None for name in library})

    op.clear_call_cache()
    dispatch.kernels = stubbed
    if op.spec.counted:
        op.count = lambda kernels, problem, tensors: dict(counted)  # shadows the method
    try:
        yield
    finally:
        dispatch.kernels = real
        if op.spec.counted:
            del op.count
        op.clear_call_cache()


def overhead(op, calls: int = 1000, blocks: int = 5, peer: bool = True) -> OverheadLine:
    case = tiny_case(op)
    testing = material(op)
    inputs, params = testing.make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
    calls_of = {"kernels": kernels_alone(op, inputs, params)}
    kinds = {"numpy": lambda x: x}
    try:
        import torch

        kinds["torch"] = lambda x: torch.from_numpy(np.ascontiguousarray(x))
    except ImportError:
        pass
    for kind, convert in kinds.items():
        given = {k: convert(v) for k, v in inputs.items()}
        outputs = op.call(given, params, "llvm", {})
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        out = {t.name: value for t, value in zip(op.spec.outputs, outputs)}
        calls_of[f"{kind} out="] = public_call(op, given, params, out)
        calls_of[kind] = public_call(op, given, params, None)
    results = per_call_us(calls_of, calls, blocks)
    with kernels_stubbed(op, counted_sizes(op, out)):
        host = per_call_us({name: fn for name, fn in calls_of.items() if name != "kernels"}, calls, blocks)
    peer_us = None
    if peer and "torch" in kinds:
        run_peer = next(iter(testing.peers(inputs, params).values()))
        peer_us = per_call_us({"peer": run_peer}, max(1, calls // 10), blocks)["peer"]
    return OverheadLine(op.name, case.name, results.pop("kernels"), results, host, peer_us)
