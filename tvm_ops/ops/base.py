"""What every operator module provides, and the one call path they share.

An operator subclass supplies its checks beyond the spec, its plan (tile sizes
from the policy), its TensorIR computes and schedule recipe, and how to launch
its kernels; `Operator.call` does the rest in one direction:
checks -> kernels (built or loaded) -> tensors in -> launch -> tensors out.
"""

from __future__ import annotations

import importlib

from .. import checks, interop, records, schedule_file, spec, targets


class Operator:
    name: str = ""
    kernel_names: tuple = ()  # kernels of one call, in launch order
    # the workspaces count or launch read on the host, where an op lists them: a call plan
    # that reuses its host workspaces hands the others to the kernels as TVM tensors made
    # once (a numpy argument costs each kernel call ~90 ns to convert); None: all stay numpy
    host_workspaces: tuple | None = None

    def __init__(self):
        from ..invocation import CallCache

        self.spec = spec.load(self.name)
        self.schedules = schedule_file.load(self.name)
        self._calls = CallCache(self.CALL_CACHE_SIZE)
        self._input_names = tuple(t.name for t in self.spec.inputs)
        self._output_names = tuple(t.name for t in self.spec.outputs)

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
        """Apply the op's recipe for `model.kind` (a function of its `schedule` module)."""
        # imported here, as `computes` imports the op's compute module: both need TVM's
        # compiler, which a call of an already built library does not (its first call in a
        # process would import TVM's Python package: ~1 s)
        recipes = importlib.import_module(f"{type(self).__module__}.schedule")
        getattr(recipes, model.kind)(sch, kernel, model, plan)

    def workspaces(self, problem: checks.Problem, plan: dict) -> dict:
        """{name: (shape, dtype)}: scratch tensors launch finds in `tensors`, uninitialised.

        Declared rather than allocated inside launch, so the tuner can allocate them once
        and replay launch's kernel calls on a remote device."""
        return {}

    def taken_as_is(self, problem: checks.Problem) -> tuple:
        """Inputs that launch takes in their own layout although not contiguous (it converts
        them itself, faster than a generic copy); the others are made contiguous first."""
        return ()

    def output_taken_as_is(self, name: str, info) -> bool:
        """Whether launch writes the out= buffer `info` (checks.TensorInfo) of output `name` in
        its own layout although not contiguous (none by default: every out= buffer C-contiguous)."""
        return False

    def output_layouts(self, name: str) -> str:
        """The strided layouts of output_taken_as_is, in words, for the error a strided out=
        buffer of output `name` gets ("": none, C-contiguous only)."""
        return ""

    def parallel_loops(self, problem: checks.Problem, knobs: dict) -> int:
        """How many parallel loops a CPU call of `problem` runs with these knobs (each hands
        out its work and waits for TVM's workers: the policy's one-core threshold scales with
        them). One, unless an op's call runs more."""
        return 1

    def zeroed(self, problem: checks.Problem, plan: dict) -> tuple:
        """Outputs and workspaces the kernels accumulate into (CUDA atomics): the call path
        zero-fills them before launch, and a replay on a remote device does the same."""
        return ()

    def adds_in_any_order(self, problem: checks.Problem, plan: dict) -> bool:
        """Whether the kernels add floats in an order that changes from run to run (CUDA
        atomics), so that a call's bits may differ between runs: PyTorch's deterministic
        mode refuses such a call (interop.refuse_if_deterministic). None do by default."""
        return False

    def count(self, kernels: dict, problem: checks.Problem, tensors: dict) -> dict:
        """{symbol: size} of the spec's `counted` sizes (data-dependent outputs): runs the
        kernels that count, into workspaces, and reads the counts on the host. The call path
        then allocates those outputs (or checks the out= ones) and calls launch."""
        raise NotImplementedError

    def launch(self, kernels: dict, problem: checks.Problem, tensors: dict) -> None:
        """Call the kernels on `tensors`: the inputs, the outputs and the workspaces, by name.

        `kernels.plan` is the plan of the library the kernels come from."""
        raise NotImplementedError

    def value_rules(self, problem: checks.Problem, inputs: dict) -> None:
        """Checks of input values (not metadata), run on every call, repeated ones included;
        device tensors are read through interop.host_values (once per tensor and version)."""

    # --- the call path ----------------------------------------------------------
    CALL_CACHE_SIZE = 256  # call signatures remembered per operator

    def call(self, inputs: dict, params: dict, target, out: dict):
        """Run the operator; a call with the signature of a recent one skips the checks of
        metadata, the kernel lookup and the dictionary building (invocation.CallPlan)."""
        key = self._signature(inputs, params, target, out)
        plan = self._calls.get(key) if key is not None else None
        if plan is None:
            plan = self._checked(inputs, params, target, out)
            if key is not None:
                self._calls.put(key, plan)
        return plan.run(inputs, out)

    def _signature(self, inputs: dict, params: dict, target, out: dict):
        if not isinstance(target, (str, targets.TargetModel)):
            return None
        names = tuple(params)
        return interop.call_signature([names, target], ((inputs, self._input_names), (out, self._output_names),
                                                        (params, names)))

    def _checked(self, inputs: dict, params: dict, target, out: dict):
        """The full path: every check, then the kernels for the call's shape class."""
        from .. import dispatch
        from ..invocation import CallPlan

        model = targets.resolve(target)
        problem = checks.check(self.spec, inputs, params, out, self.rules, self.output_taken_as_is,
                               self.output_layouts)
        device = "cuda" if model.kind == "cuda" else "cpu"
        if problem.device != device:
            from ..errors import BadParamError

            raise BadParamError(f"{self.name}: tensors on {problem.device} cannot run on target "
                                f"{model.kind!r}; move them to {device}")
        if problem.empty:
            return CallPlan(self, problem, None)
        targets.require_runnable(model)
        if problem.kind == "torch" and model.kind == "llvm":  # kernels taking turns with torch's ops
            targets.sleep_workers_between_kernels()
        one_core = dispatch.runs_on_one_core(self, problem, model)
        return CallPlan(self, problem, dispatch.kernels(self, problem.dtype, model,
                                                        records.problem_class(self.spec, problem), one_core))

    def clear_call_cache(self) -> None:
        """Forget the remembered call signatures: the next calls take the full path again
        (and see changed tuning records or environment variables)."""
        self._calls.clear()

    def output_dtype(self, tensor_spec, problem) -> str:
        """The dtype of an output: its own, or that of the input it follows (dtype_of)."""
        while tensor_spec.dtype_of is not None:
            source = tensor_spec.dtype_of
            if source in problem.inputs:
                return problem.inputs[source].dtype
            tensor_spec = self.spec.tensor(source)
        return tensor_spec.dtypes[0]
