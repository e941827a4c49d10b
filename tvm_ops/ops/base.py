"""What every operator module provides, and the one call path they share.

An operator subclass supplies the math (TensorIR computes, a float64
reference), its plan (tile sizes from the policy) and how to launch its
kernels; `Operator.call` does the rest in one direction:
checks -> kernels (built or loaded) -> tensors in -> launch -> tensors out.
"""

from __future__ import annotations

import importlib

import numpy as np

from .. import checks, interop, records, schedule_file, spec, targets


def peer_tensor(value):
    """A numpy input as a torch tensor on torch's default device (the peer's device)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(value)).to(torch.get_default_device())


class Operator:
    name: str = ""
    kernel_names: tuple = ()  # kernels of one call, in launch order

    def __init__(self):
        self.spec = spec.load(self.name)
        self.schedules = schedule_file.load(self.name)
        self.recipe = importlib.import_module(f"tvm_ops.schedules.{self.name}")

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

    # --- testing and benchmarking ---------------------------------------------
    def make_inputs(self, case: spec.Case, dtype: str, rng: np.random.Generator) -> tuple[dict, dict]:
        raise NotImplementedError

    def reference(self, inputs: dict, params: dict) -> dict:
        raise NotImplementedError

    def torch_peer(self, inputs: dict, params: dict):
        """A no-argument callable computing the outputs with PyTorch eager ops."""
        raise NotImplementedError

    def torch_peers(self, inputs: dict, params: dict) -> dict:
        """{name: callable}: the peers `bench` times, the first being the one the ratio uses.

        Peers build their tensors with `peer_tensor` and torch's factory functions, so
        under `with torch.device("cuda"):` the same peer runs on the GPU."""
        return {"torch": self.torch_peer(inputs, params)}

    # --- the call path ----------------------------------------------------------
    def call(self, inputs: dict, params: dict, target, out: dict):
        from .. import build

        model = targets.resolve(target)
        problem = checks.check(self.spec, inputs, params, out, self.rules)
        shapes = {t.name: checks.output_shape(self.spec, t.name, problem.sizes) for t in self.spec.outputs}
        device = "cuda" if model.kind == "cuda" else "cpu"
        if problem.device != device:
            from ..errors import BadParamError

            raise BadParamError(f"{self.name}: tensors on {problem.device} cannot run on target "
                                f"{model.kind!r}; move them to {device}")
        results = {}
        for t in self.spec.outputs:
            given = problem.outs.get(t.name)
            dtype = self._dtype_of(t, problem)
            results[t.name] = given.value if given is not None else interop.empty_like_kind(
                problem.kind, problem.device, shapes[t.name], dtype, zero=problem.empty)
        if problem.empty:
            for name, given in problem.outs.items():
                interop.zero(given.value)
            return self._returned(results)
        targets.require_runnable(model)
        kernels = build.kernels(self, problem.dtype, model, records.problem_class(self.spec, problem))
        tensors = {name: interop.contiguous(info) for name, info in problem.inputs.items()}
        tensors.update(results)
        tensors.update(self.allocate_workspaces(problem, kernels.plan))
        for name in self.zeroed(problem, kernels.plan):
            interop.zero(tensors[name])
        self.launch(kernels, problem, tensors)
        return self._returned(results)

    def allocate_workspaces(self, problem: checks.Problem, plan: dict) -> dict:
        return {name: interop.empty_like_kind(problem.kind, problem.device, shape, dtype, zero=False)
                for name, (shape, dtype) in self.workspaces(problem, plan).items()}

    def _dtype_of(self, tensor_spec, problem) -> str:
        while tensor_spec.dtype_of is not None:
            source = tensor_spec.dtype_of
            if source in problem.inputs:
                return problem.inputs[source].dtype
            tensor_spec = self.spec.tensor(source)
        return tensor_spec.dtypes[0]

    def _returned(self, results: dict):
        values = [results[t.name] for t in self.spec.outputs]
        return values[0] if len(values) == 1 else tuple(values)



