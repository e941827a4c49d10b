"""One checked call's tensors and its launch: what `Operator.call` and the tuner share.

An Invocation holds the inputs (made contiguous), the outputs (the caller's buffers or
new ones of the caller's kind) and the workspaces the library's plan declares, and runs
a library's kernels on them: zero-fill what the kernels accumulate into, then launch.
"""

from __future__ import annotations

import json

from . import checks, interop


class Invocation:
    def __init__(self, op, problem: checks.Problem, zero_outputs: bool = False):
        self.op, self.problem = op, problem
        self.outputs = outputs(op, problem, zero_outputs)
        self.tensors = {name: interop.contiguous(info) for name, info in problem.inputs.items()}
        self.tensors.update(self.outputs)
        self._workspaces_for = None  # the plan the workspaces in self.tensors were allocated for

    def run(self, kernels) -> None:
        """Launch `kernels` (a build.Kernels) on these tensors."""
        plan_key = json.dumps(kernels.plan or {}, sort_keys=True, default=str)
        if self._workspaces_for != plan_key:
            self.tensors.update({
                name: interop.empty_like_kind(self.problem.kind, self.problem.device, shape, dtype, zero=False)
                for name, (shape, dtype) in self.op.workspaces(self.problem, kernels.plan).items()})
            self._workspaces_for = plan_key
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
