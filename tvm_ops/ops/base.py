"""What every operator module provides, and the one call path they share.

An operator subclass supplies its checks beyond the spec, its plan (tile sizes
from the policy), its TensorIR computes and schedule recipe, and how to launch
its kernels; `Operator.call` does the rest in one direction:
checks -> kernels (built or loaded) -> tensors in -> launch -> tensors out.
"""

from __future__ import annotations

from .. import checks, interop, records, schedule_file, spec, targets


class Operator:
    name: str = ""
    kernel_names: tuple = ()  # kernels of one call, in launch order
    recipe = None  # the op's schedule module: one function per target kind (llvm, cuda)

    def __init__(self):
        self.spec = spec.load(self.name)
        self.schedules = schedule_file.load(self.name)

    # --- contract -----------------------------------------------------------
    def rules(self, problem: checks.Problem) -> None:
        """Operator-specific checks beyond the spec's shape relations."""

    # --- kernels ------------------------------------------------------------
    def plan(self, model: targets.TargetModel, knobs: dict) -> dict:
        """Tile sizes and other compile-time constants for `model`."""
        raise NotImplementedError

    def computes(self, dtype: str, plan: dict, model: targets.TargetModel) -> dict:
        """{kernel name: PrimFunc}: the TensorIR compute definitions."""
        raise NotImplementedError

    def schedule(self, sch, kernel: str, model: targets.TargetModel, plan: dict) -> None:
        getattr(self.recipe, model.kind)(sch, kernel, model, plan)

    def workspaces(self, problem: checks.Problem, plan: dict) -> dict:
        """{name: (shape, dtype)}: scratch tensors launch finds in `tensors`, uninitialised.

        Declared rather than allocated inside launch, so the tuner can allocate them once
        and replay launch's kernel calls on a remote device."""
        return {}

    def zeroed(self, problem: checks.Problem, plan: dict) -> tuple:
        """Outputs and workspaces the kernels accumulate into (CUDA atomics): the call path
        zero-fills them before launch, and a replay on a remote device does the same."""
        return ()

    def launch(self, kernels: dict, problem: checks.Problem, tensors: dict) -> None:
        """Call the kernels on `tensors`: the inputs, the outputs and the workspaces, by name.

        `kernels.plan` is the plan of the library the kernels come from."""
        raise NotImplementedError

    # --- the call path ----------------------------------------------------------
    def call(self, inputs: dict, params: dict, target, out: dict):
        from .. import dispatch, invocation

        model = targets.resolve(target)
        problem = checks.check(self.spec, inputs, params, out, self.rules)
        device = "cuda" if model.kind == "cuda" else "cpu"
        if problem.device != device:
            from ..errors import BadParamError

            raise BadParamError(f"{self.name}: tensors on {problem.device} cannot run on target "
                                f"{model.kind!r}; move them to {device}")
        if problem.empty:
            for given in problem.outs.values():
                interop.zero(given.value)
            return invocation.returned(self, invocation.outputs(self, problem, zero=True))
        targets.require_runnable(model)
        kernels = dispatch.kernels(self, problem.dtype, model, records.problem_class(self.spec, problem))
        call = invocation.Invocation(self, problem)
        call.run(kernels)
        return call.returned()

    def output_dtype(self, tensor_spec, problem) -> str:
        """The dtype of an output: its own, or that of the input it follows (dtype_of)."""
        while tensor_spec.dtype_of is not None:
            source = tensor_spec.dtype_of
            if source in problem.inputs:
                return problem.inputs[source].dtype
            tensor_spec = self.spec.tensor(source)
        return tensor_spec.dtypes[0]
