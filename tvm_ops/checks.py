"""Parameter checks driven by an operator's spec, in the mlu-ops order.

missing tensors -> ranks -> contiguity -> dtypes -> shape relations (and the
operator's own rules) -> large tensors -> zero-element rules. Each failure
names the tensor, the expected and the actual value. Only metadata is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import interop
from .errors import BadParamError, NotSupportedError
from .spec import OpSpec

# the kernels index in int32, and a ceil division by a tile (n + tile - 1) must not wrap
# either: every tensor holds fewer elements than this, so does each of its dimensions
LARGE_TENSOR = 2**31 - 2**20
INT32_MAX = 2**31 - 1  # integer parameters reach the kernels as int32


@dataclass
class Problem:
    """A checked call: sizes of every symbol, the dtype, and what to run."""

    op: str
    dtype: str
    sizes: dict
    inputs: dict  # name -> TensorInfo
    outs: dict  # name -> TensorInfo of caller buffers given with out=
    params: dict
    kind: str  # "numpy" or "torch": the kind of tensor returned
    device: str  # "cpu" or "cuda"
    # where new outputs and workspaces are made: the tensors' device as torch names it ("cuda:1"),
    # not the current CUDA device
    where: str = "cpu"
    empty: bool = False  # a zero-element success: outputs are zeros, no kernel runs
    notes: dict = field(default_factory=dict)  # values an operator's checks derive


def _dims_text(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def int_param(op: str, name: str, value, minimum: int) -> int:
    """`value` as an int: an integer (numpy's too, no bool) within [minimum, INT32_MAX], else
    BadParamError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise BadParamError(f"{op}: {name} must be an integer, got {value!r}")
    if value < minimum:
        raise BadParamError(f"{op}: {name} must be >= {minimum}, got {value}")
    if value > INT32_MAX:
        raise BadParamError(f"{op}: {name} must be <= {INT32_MAX} (an int32 in the kernels), got {value}")
    return int(value)


def _element_strides(value) -> list:
    """A tensor's strides in elements (numpy gives bytes)."""
    if isinstance(value, np.ndarray):
        return [stride // value.itemsize for stride in value.strides]
    return list(value.stride())


def check(spec: OpSpec, inputs: dict, params: dict, outs: dict, op_rules=None, out_as_is=None,
          out_layouts=None) -> Problem:
    """Validate one call; return the Problem or raise before any data is touched. out_as_is(name,
    info): whether the operator writes the out= buffer of output `name` in its own strided
    layout (`Operator.output_taken_as_is`); every other out= buffer must be C-contiguous.
    out_layouts(name): those layouts in words, for the error (`Operator.output_layouts`)."""
    op = spec.op
    # 1. missing tensors (describe raises on None and on non-tensors)
    infos = {t.name: interop.describe(t.name, inputs.get(t.name)) for t in spec.inputs}
    given = {t.name: interop.describe(f"out[{t.name!r}]", outs[t.name])
             for t in spec.outputs if outs.get(t.name) is not None}
    everything = list(infos.values()) + list(given.values())
    first = everything[0]
    for info in everything[1:]:
        if (info.kind, info.where) != (first.kind, first.where):
            raise BadParamError(
                f"{op}: {info.name} is a {info.kind} tensor on {info.where} but {first.name} is a "
                f"{first.kind} tensor on {first.where}; pass all tensors of one kind and device")
    # 2. ranks
    for t in spec.inputs + spec.outputs:
        info = infos.get(t.name) or given.get(t.name)
        if info is not None and len(info.shape) != len(t.dims):
            raise BadParamError(f"{op}: {info.name} must have rank {len(t.dims)} {_dims_text(t.dims)}, "
                                f"got rank {len(info.shape)} with shape {list(info.shape)}")
    # 3. contiguity: inputs are made contiguous later; an output buffer cannot be (but for a
    # layout its operator writes itself)
    for name, info in given.items():
        if not info.writeable:
            raise BadParamError(f"{op}: {info.name} is read-only; give a writeable output buffer")
        if not info.native:
            raise BadParamError(f"{op}: {info.name} has non-native byte order ({info.value.dtype.str}); give a "
                                f"native-order output buffer")
        if info.lazy:
            raise BadParamError(f"{op}: {info.name} is a negated view or a zero tensor, whose memory does not "
                                f"hold its values; give a plain output buffer")
        if not info.contiguous and not (out_as_is is not None and out_as_is(name, info)):
            layouts = out_layouts(name) if out_layouts is not None else ""
            raise NotSupportedError(f"{op}: {info.name} must be C-contiguous{' or ' + layouts if layouts else ''}, "
                                    f"got strides {_element_strides(info.value)} for shape {list(info.shape)}; "
                                    f"{'other ' if layouts else ''}strided outputs are not supported")
    # 4. dtypes
    dtypes = {}
    for t in spec.inputs + spec.outputs:
        info = infos.get(t.name) or given.get(t.name)
        expected = t.dtypes if t.dtype_of is None else (dtypes.get(t.dtype_of),)
        dtypes[t.name] = expected[0] if info is None else info.dtype
        if info is not None and info.dtype not in expected:
            rule = (f"the dtype of {t.dtype_of} ({expected[0]})" if t.dtype_of
                    else f"dtype {' or '.join(expected)}")
            raise BadParamError(f"{op}: {info.name} must have {rule}, got {info.dtype}")
    # 5. shape relations: inputs bind symbols, then scalar parameters, then outputs
    sizes, source = {}, {}

    def bind(name: str, dims, shape, scalar: bool = False):
        for axis, (dim, actual) in enumerate(zip(dims, shape)):
            where = name if scalar else f"{name}.shape[{axis}]"  # a parameter is a size itself
            if isinstance(dim, int):
                if actual != dim:
                    raise BadParamError(f"{op}: {where} must be {dim}, got {actual}")
            elif dim not in sizes:
                sizes[dim], source[dim] = actual, where
            elif sizes[dim] != actual:
                raise BadParamError(f"{op}: {where} ({dim}) must equal {source[dim]} = {sizes[dim]}, got {actual}")

    for t in spec.inputs:
        bind(t.name, t.dims, infos[t.name].shape)
    checked_params = dict(params)
    for p in spec.params:
        value = params.get(p.name)
        if value is None and p.symbol is not None and p.symbol in _output_symbols(spec, given):
            continue  # given by the output buffer instead
        if value is None:
            if p.optional:
                continue
            raise BadParamError(f"{op}: {p.name} is required")
        if p.type == "str":
            if value not in p.choices:
                raise BadParamError(f"{op}: {p.name} must be one of {', '.join(map(repr, p.choices))}, "
                                    f"got {value!r}")
            continue
        checked_params[p.name] = int_param(op, p.name, value, p.minimum)
        if p.symbol is not None:
            bind(p.name, (p.symbol,), (checked_params[p.name],), scalar=True)
    for t in spec.outputs:
        if t.name in given:
            bind(given[t.name].name, t.dims, given[t.name].shape)
    for t in spec.outputs:
        unbound = [d for d in t.dims if isinstance(d, str) and d not in sizes and d not in spec.counted]
        if unbound:
            raise BadParamError(f"{op}: cannot tell {', '.join(unbound)} of {t.name}: pass it or out=")
    float_dtype = dtypes[spec.inputs[0].name]
    problem = Problem(op, float_dtype, sizes, infos, given, checked_params, first.kind, first.device,
                      where=first.where)
    if op_rules is not None:
        op_rules(problem)
    # 6. large tensors
    large = large_tensor(spec, sizes)
    if large is not None:
        name, shape = large
        raise NotSupportedError(f"{op}: {name} has {math.prod(shape)} elements (shape {shape}); tensors of "
                                f"2^31 - 2^20 elements or more are not supported (int32 indexing)")
    # 7. zero-element rules
    zeros = [s for s in spec.zero_bad_param if sizes[s] == 0]
    if zeros:
        got = ", ".join(f"{s}={sizes[s]}" for s in spec.zero_bad_param)
        raise BadParamError(f"{op}: {', '.join(spec.zero_bad_param)} must be non-zero, got {got}")
    problem.empty = problem.empty or any(sizes[s] == 0 for s in spec.zero_empty_success)
    if problem.empty:  # nothing to count: counted sizes are 0
        for s in spec.counted:
            if sizes.setdefault(s, 0) != 0:
                raise BadParamError(f"{op}: {s} is 0 when {', '.join(spec.zero_empty_success)} is 0, got "
                                    f"{sizes[s]} from {source[s]}")
    return problem


def large_tensor(spec: OpSpec, sizes: dict) -> tuple | None:
    """(name, shape) of the first tensor of LARGE_TENSOR elements or more at `sizes`, or None;
    a tensor with a size `sizes` lacks (one the kernels count, within what the inputs hold)
    is skipped."""
    for t in spec.inputs + spec.outputs:
        if all(isinstance(d, int) or d in sizes for d in t.dims):
            shape = list(shape_of(t.dims, sizes))
            if math.prod(shape) >= LARGE_TENSOR:
                return t.name, shape
    return None


def _output_symbols(spec: OpSpec, given: dict) -> set:
    return {d for t in spec.outputs if t.name in given for d in t.dims if isinstance(d, str)}


def output_shape(spec: OpSpec, name: str, sizes: dict) -> tuple:
    """The shape of output `name` for `sizes` (which must hold every symbol of it)."""
    return shape_of(spec.tensor(name).dims, sizes)


def shape_of(dims, sizes: dict) -> tuple:
    """A tensor's shape from its spec dims (ints and symbols) and `sizes`."""
    return tuple(d if isinstance(d, int) else sizes[d] for d in dims)


__all__ = ["Problem", "check", "int_param", "large_tensor", "output_shape", "shape_of", "LARGE_TENSOR"]
