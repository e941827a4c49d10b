"""One checked call's tensors and its launch: what `Operator.call` and the tuner share.

An Invocation holds the inputs (made contiguous), the outputs (the caller's buffers or
new ones of the caller's kind) and the workspaces the library's plan declares, and runs
a library's kernels on them: zero-fill what the kernels accumulate into, then launch.

A CallPlan is what a checked call leaves for the next call with the same signature
(every argument's kind, shape, dtype, strides, device and writability, every
parameter, the target and which outputs were given): the problem, the kernels, the
output shapes. A repeated call only re-checks the values an operator reads on the host
(`Operator.value_rules`), allocates what it must and launches; CallCache keeps the most
recent plans of each operator.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from . import checks, interop
from .errors import BadParamError


class Invocation:
    def __init__(self, op, problem: checks.Problem, zero_outputs: bool = False):
        self.op, self.problem = op, problem
        self.outputs = outputs(op, problem, zero_outputs)
        self.tensors = {name: interop.contiguous(info) for name, info in problem.inputs.items()}
        self.tensors.update(self.outputs)
        self._workspaces_for = None  # the plan the workspaces in self.tensors were allocated for

    def run(self, kernels) -> None:
        """Launch `kernels` (a build.Kernels) on these tensors."""
        if self._workspaces_for != kernels.plan:
            self.tensors.update(workspaces(self.op, self.problem, kernels.plan))
            self._workspaces_for = kernels.plan
        for name in self.op.zeroed(self.problem, kernels.plan):
            interop.zero(self.tensors[name])
        self.op.launch(kernels, self.problem, self.tensors)

    def returned(self):
        return returned(self.op, self.outputs)


def outputs(op, problem: checks.Problem, zero: bool) -> dict:
    """{name: tensor}: the caller's out= buffers, and new ones of the caller's kind for the rest."""
    made = {}
    for t in op.spec.outputs:
        given = problem.outs.get(t.name)
        made[t.name] = given.value if given is not None else interop.empty_like_kind(
            problem.kind, problem.device, checks.output_shape(op.spec, t.name, problem.sizes),
            op.output_dtype(t, problem), zero=zero)
    return made


def returned(op, tensors: dict):
    """The outputs as the public function returns them: one tensor, or a tuple in spec order."""
    values = [tensors[t.name] for t in op.spec.outputs]
    return values[0] if len(values) == 1 else tuple(values)


def workspaces(op, problem: checks.Problem, plan: dict) -> dict:
    """{name: uninitialised tensor} for the workspaces `op` declares under `plan`."""
    return {name: interop.empty_like_kind(problem.kind, problem.device, shape, dtype, zero=False)
            for name, (shape, dtype) in op.workspaces(problem, plan).items()}


class CallPlan:
    """A checked call, ready to run again on new tensors of the same signature."""

    def __init__(self, op, problem: checks.Problem, kernels):
        self.op, self.problem, self.kernels = op, problem, kernels
        self.new_outputs = [(t.name, checks.output_shape(op.spec, t.name, problem.sizes), op.output_dtype(t, problem))
                            for t in op.spec.outputs if t.name not in problem.outs]
        self.copied = [name for name, info in problem.inputs.items() if not info.ready]
        if kernels is not None:
            self.workspaces = op.workspaces(problem, kernels.plan)
            self.zeroed = op.zeroed(problem, kernels.plan)

    def run(self, inputs: dict, out: dict):
        op, problem = self.op, self.problem
        op.value_rules(problem, inputs)
        outputs = {name: value for name, value in out.items() if value is not None}
        if outputs:
            _refuse_aliases(op.name, inputs, outputs)
        for name, shape, dtype in self.new_outputs:
            outputs[name] = interop.empty_like_kind(problem.kind, problem.device, shape, dtype, zero=problem.empty)
        if problem.empty:  # nothing to compute: the outputs are zeros
            for name in problem.outs:
                interop.zero(outputs[name])
            return returned(op, outputs)
        tensors = dict(inputs)
        for name in self.copied:
            tensors[name] = interop.make_contiguous(inputs[name])
        tensors.update(outputs)
        for name, (shape, dtype) in self.workspaces.items():
            tensors[name] = interop.empty_like_kind(problem.kind, problem.device, shape, dtype, zero=False)
        for name in self.zeroed:
            interop.zero(tensors[name])
        op.launch(self.kernels, problem, tensors)
        return returned(op, outputs)


def _refuse_aliases(op_name: str, inputs: dict, outputs: dict) -> None:
    """BadParamError when an out= buffer shares memory with an input or another output: the
    kernels read their inputs while writing their outputs, so an alias gives wrong results."""
    names = list(outputs) + [name for name, value in inputs.items() if value is not None]
    values = list(outputs.values()) + [value for value in inputs.values() if value is not None]
    clash = interop.first_overlap(values, len(outputs))
    if clash is not None:
        i, j = clash
        raise BadParamError(f"{op_name}: out[{names[i]!r}] shares memory with {names[j]}; "
                            f"give an output buffer of its own")


class CallCache:
    """The most recent CallPlans by call signature: a thread-safe LRU of `size` entries."""

    def __init__(self, size: int):
        self.size = size
        self._plans: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
            return plan

    def put(self, key, plan: CallPlan) -> None:
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
