"""How a checked call runs: the one launch path of public calls and of the tuner.

A CallPlan is a checked call ready to run (the problem, the kernels, the shapes and
dtypes of the outputs it allocates, the workspaces and zero-fills the kernels' plan
declares). `Operator.call` keeps the plan of each recent call signature (every
argument's kind, shape, dtype, strides, device and writability, a torch tensor's
requires_grad too, every parameter, the target and which outputs were given) in a
CallCache and runs it on the next call's
tensors: only the values an operator reads on the host (`Operator.value_rules`) are
checked again, then outputs and workspaces are allocated and the kernels launched. The
tuner runs a plan per candidate library on pre-allocated outputs given as out=.

Small host workspaces are carved once and reused by the next call of the same plan on the
same thread (`REUSED_WORKSPACE_BYTES`): no caller ever sees a workspace, the calls of one
thread never overlap, and carving a dozen views costs microseconds of a small call. Each
thread keeps the last plan's block per operator, so memory stays bounded however many
plans the cache holds. Where an op lists the ones the host reads (`Operator.host_workspaces`), the others are
held as TVM tensors of the same memory, which the kernels take without a conversion.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from . import checks, forked, interop
from .errors import BadParamError

# host workspace blocks up to this size are reused by the next call of their plan on the
# same thread (dynamic_scatter_forward's twelve: ~40 bytes a point, 6 us to carve per call)
REUSED_WORKSPACE_BYTES = 1 << 20
_held = threading.local()  # operator name -> (the last CallPlan, its carved workspaces)
_caches: weakref.WeakSet = weakref.WeakSet()  # every CallCache, emptied in a forked child


def _forget_in_child() -> None:
    """A forked child plans its calls anew (on one core: forked.py), with locks of its own."""
    global _held
    _held = threading.local()
    for cache in list(_caches):
        cache._plans, cache._lock, cache._latest = OrderedDict(), threading.Lock(), None


forked.reset_in_child(_forget_in_child)


def new_tensors(problem: checks.Problem, specs: dict, zero: bool) -> dict:
    """{name: tensor of the caller's kind and device} for {name: (shape, dtype)}."""
    return {name: interop.empty_like_kind(problem.kind, problem.where, shape, dtype, zero)
            for name, (shape, dtype) in specs.items()}


def output_specs(op, problem: checks.Problem, sizes: dict | None = None) -> dict:
    """{name: (shape, dtype)} of the outputs the caller did not give with out=, for `sizes`
    (default: the problem's; an output with a counted size it lacks is left out)."""
    sizes = problem.sizes if sizes is None else sizes
    return {t.name: (checks.output_shape(op.spec, t.name, sizes), op.output_dtype(t, problem))
            for t in op.spec.outputs
            if t.name not in problem.outs and all(isinstance(d, int) or d in sizes for d in t.dims)}


def _check_counted(op, problem: checks.Problem, counted: dict) -> None:
    """BadParamError when an out= buffer's counted size differs from the kernels' count."""
    for t in op.spec.outputs:
        given = problem.outs.get(t.name)
        if given is None:
            continue
        for axis, dim in enumerate(t.dims):
            if dim in counted and given.shape[axis] != counted[dim]:
                raise BadParamError(f"{op.name}: out[{t.name!r}].shape[{axis}] ({dim}) must be {counted[dim]}, "
                                    f"the count of this input, got {given.shape[axis]}")


def _returned_names(op):
    """What a call returns: the one output's name, or the tuple of them in spec order."""
    names = tuple(t.name for t in op.spec.outputs)
    return names[0] if len(names) == 1 else names


def _returned(outputs: dict, names):
    """The outputs as the public function returns them: one tensor, or a tuple in spec order."""
    return outputs[names] if type(names) is str else tuple(map(outputs.__getitem__, names))


class CallPlan:
    """A checked call, ready to run on any tensors of the same signature."""

    def __init__(self, op, problem: checks.Problem, kernels):
        self.op, self.problem, self.kernels = op, problem, kernels
        self.new_outputs = output_specs(op, problem)
        self.allocators = {name: interop.allocator(problem.kind, problem.where, shape, dtype, zero=problem.empty)
                           for name, (shape, dtype) in self.new_outputs.items()}
        # the outputs allocated once the kernels have counted their sizes: (name, shape with the
        # symbol of each counted size in its place, dtype), the rest of each shape known now
        self.late_outputs = [(t.name, tuple(problem.sizes.get(d, d) if isinstance(d, str) else d for d in t.dims),
                              op.output_dtype(t, problem)) for t in op.spec.outputs
                             if t.name not in problem.outs and t.name not in self.new_outputs]
        as_is = op.taken_as_is(problem) if kernels is not None else ()
        self.copied = [name for name, info in problem.inputs.items() if not info.ready and name not in as_is]
        self.given, self.returned_names = tuple(problem.outs), _returned_names(op)
        # the caller's torch buffers: refused if one requires grad (in grad mode, read per call),
        # their versions counted up once written
        self.count_writes = interop.write_counter() if problem.kind == "torch" and self.given else None
        self.given_requiring_grad = tuple(name for name, info in problem.outs.items()
                                          if info.kind == "torch" and info.value.requires_grad)
        self.workspaces = (0, ())
        # PyTorch's deterministic mode is read on every call: it may change between calls
        self.order_varies = (kernels is not None and problem.kind == "torch"
                             and op.adds_in_any_order(problem, kernels.plan))
        if kernels is not None:  # None: an empty problem, whose outputs are zeros
            self.workspaces = interop.block_layout(op.workspaces(problem, kernels.plan))
            self.reuses_workspaces = problem.device == "cpu" and 0 < self.workspaces[0] <= REUSED_WORKSPACE_BYTES
            self.zeroed = op.zeroed(problem, kernels.plan)
            # the workspaces held as TVM tensors (a zero-filled one stays numpy: the host fills it)
            self.kernel_only, host = [], op.host_workspaces
            if self.reuses_workspaces and host is not None:
                self.kernel_only = [name for name, *_ in self.workspaces[1] if name not in (*host, *self.zeroed)]

    def run(self, inputs: dict, out: dict):
        op, problem = self.op, self.problem
        if self.order_varies:
            interop.refuse_if_deterministic(op.name)
        op.value_rules(problem, inputs)
        outputs = {name: out[name] for name in self.given}  # the signature says which were given
        if outputs:
            if self.given_requiring_grad:
                interop.refuse_grad_outputs(op.name, {name: outputs[name] for name in self.given_requiring_grad})
            _refuse_aliases(op.name, inputs, outputs)
        for name, allocate in self.allocators.items():
            outputs[name] = allocate()
        if problem.empty:
            for name in problem.outs:
                interop.zero(outputs[name])
            return self._handed_back(outputs)
        tensors = {**inputs, **outputs}
        for name in self.copied:
            tensors[name] = interop.make_contiguous(inputs[name])
        if self.workspaces[1]:
            tensors.update(self._workspaces())
        for name in self.zeroed:
            interop.zero(tensors[name])
        if op.spec.counted:  # data-dependent output sizes: count, then allocate the rest
            counted = op.count(self.kernels, problem, tensors)
            if self.given:
                _check_counted(op, problem, counted)
            for name, dims, dtype in self.late_outputs:
                shape = tuple([counted[d] if type(d) is str else d for d in dims])
                outputs[name] = tensors[name] = interop.empty_like_kind(problem.kind, problem.where, shape, dtype,
                                                                        zero=False)
        op.launch(self.kernels, problem, tensors)
        return self._handed_back(outputs)

    def _handed_back(self, outputs: dict):
        """What the call returns, the caller's torch out= buffers' writes counted first."""
        if self.count_writes is not None:
            self.count_writes([outputs[name] for name in self.given])
        return _returned(outputs, self.returned_names)

    def _workspaces(self) -> dict:
        """{name: workspace}: views of a new block, or of this thread's block of the previous
        call of this plan (reuses_workspaces)."""
        if not self.reuses_workspaces:
            return interop.carved(self.problem.kind, self.problem.where, self.workspaces)
        held = _held.__dict__
        last = held.get(self.op.name)
        if last is not None and last[0] is self:
            return last[1]
        views = interop.carved(self.problem.kind, self.problem.where, self.workspaces)
        for name in self.kernel_only:
            views[name] = interop.kernel_tensor(views[name])
        held[self.op.name] = (self, views)
        return views


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
        self._latest = None  # the plan last put or moved to the end
        _caches.add(self)

    def get(self, key):
        # no lock on the hit path (each dict operation is atomic); put and clear take it
        plan = self._plans.get(key)
        # the plan of the last call again (a loop of one call) is already the most recent one:
        # moving it would hash the key a second time (~0.4 us of a five-array call)
        if plan is not None and plan is not self._latest:
            try:
                self._plans.move_to_end(key)
            except KeyError:  # another thread's put evicted it meanwhile: still a valid plan
                pass
            self._latest = plan
        return plan

    def put(self, key, plan: CallPlan) -> None:
        with self._lock:
            self._plans[key] = plan
            self._latest = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._latest = None

    def __len__(self) -> int:
        return len(self._plans)
