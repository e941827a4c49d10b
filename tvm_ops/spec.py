"""Operator contracts, loaded from specs/<op>.yaml and validated on load.

A spec states tensors (symbolic dims and dtypes), scalar parameters, the
zero-element rules, accuracy thresholds, theory io/ops formulas and the test
cases. The checks in `checks.py` and the test/bench commands read it; nothing
about an operator's contract is hard-coded twice.
"""

from __future__ import annotations

import ast
import functools
import operator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import paths
from .errors import OpError

DTYPES = ("float32", "float16", "int32")
CASE_SETS = ("network", "boundary", "random")


class SpecError(OpError):
    """A spec or schedule file is malformed; the message names the file and key."""

    status = "BAD_SPEC"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dims: tuple  # symbol names (str) or fixed sizes (int)
    dtypes: tuple  # allowed dtypes; empty when dtype_of is set
    dtype_of: str | None  # follows another tensor's dtype


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # "int" or "str"
    symbol: str | None  # the dim symbol an integer parameter defines
    minimum: int
    choices: tuple  # accepted strings (type str)
    optional: bool  # may be None (the operator picks a default)


@dataclass(frozen=True)
class Case:
    name: str
    set: str
    shape: dict  # symbol -> size
    dtypes: tuple
    expect: str = "ok"  # "ok", or the status the call must fail with (BAD_PARAM...)
    extra: dict = field(default_factory=dict)  # op-specific generator settings
    heavy: bool = False  # too big for the test suite: run by `test` and `bench` only


@dataclass(frozen=True)
class OpSpec:
    op: str
    path: Path
    inputs: tuple  # TensorSpec, in argument order
    outputs: tuple
    params: tuple  # ParamSpec
    zero_bad_param: tuple  # symbols that must not be 0
    zero_empty_success: tuple  # symbols whose 0 means: nothing to do, outputs zero
    accuracy: dict  # dtype -> {metric: threshold}
    theory_io: str
    theory_ops: str | None
    cases: tuple
    theory_io_by: dict = field(default_factory=dict)  # {str param: {value: io formula}}
    counted: tuple = ()  # output size symbols the kernels count (data-dependent, e.g. voxels)
    exact: tuple = ()  # outputs that must equal the reference (indices, counts)

    @property
    def float_dtypes(self) -> tuple:
        first = self.inputs[0]
        return tuple(d for d in first.dtypes if d.startswith("float"))

    def tensor(self, name: str) -> TensorSpec:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def cases_in(self, which: str) -> list:
        return [c for c in self.cases if which == "all" or c.set == which]

    def case(self, name: str) -> Case:
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(f"{self.op} has no case {name!r}; cases: {', '.join(c.name for c in self.cases)}")

    def theory(self, shape: dict, itemsize: int, params: dict | None = None) -> tuple[float, float | None]:
        """(io bytes, ops) of the formulas for one shape (and the call's parameters)."""
        env = dict(shape, itemsize=itemsize)
        # ops may name integer parameters (pool_size...): None when the call's are not given
        ops_env = {name: value for name, value in (params or {}).items() if type(value) is int} | env
        try:
            ops = evaluate(self.theory_ops, ops_env) if self.theory_ops else None
        except KeyError:
            ops = None
        io = self.theory_io
        for name, table in self.theory_io_by.items():
            io = table.get(str((params or {}).get(name)), io)
        return evaluate(io, env), ops


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}


def evaluate(expression: str, env: dict) -> float:
    """Evaluate an arithmetic formula over shape symbols (no names beyond env, no calls);
    KeyError names a symbol env lacks."""
    return _formula(expression)(env)


@functools.lru_cache(maxsize=None)
def _formula(expression: str):
    """The formula as a function of env, parsed once: a new shape's call evaluates the theory
    formulas for the policy (parsing them on every such call cost ~60 us of its checked path)."""

    def build(node):
        if isinstance(node, ast.Expression):
            return build(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            value = node.value
            return lambda env: value
        if isinstance(node, ast.Name):
            name = node.id
            return lambda env: env[name]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            combine, left, right = _BINOPS[type(node.op)], build(node.left), build(node.right)
            return lambda env: combine(left(env), right(env))
        raise ValueError(f"unsupported syntax in formula {expression!r}")

    return build(ast.parse(expression, mode="eval"))


class _Reader:
    """Typed access to a YAML mapping that names the file and key on every error."""

    def __init__(self, path: Path, data, where: str = ""):
        self.path, self.data, self.where = path, data, where

    def fail(self, key: str, problem: str):
        raise SpecError(f"{self.path.name}: key '{self.where}{key}': {problem}")

    def get(self, key: str, kind, default=...):
        if not isinstance(self.data, dict):
            self.fail("", "expected a mapping")
        if key not in self.data:
            if default is ...:
                self.fail(key, "missing")
            return default
        value = self.data[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            self.fail(key, f"expected {names}, got {type(value).__name__}")
        return value

    def child(self, key: str, value) -> "_Reader":
        return _Reader(self.path, value, f"{self.where}{key}.")


def _tensors(reader: _Reader, key: str) -> tuple:
    section = reader.get(key, dict)
    tensors = []
    for name, body in section.items():
        r = reader.child(f"{key}.{name}", body)
        dims = tuple(r.get("dims", list))
        for d in dims:
            if not isinstance(d, (str, int)) or isinstance(d, bool):
                r.fail("dims", f"entries must be symbols or integers, got {d!r}")
        dtype_of = r.get("dtype_of", str, None)
        dtypes = tuple(r.get("dtypes", list, []))
        if not dtypes and dtype_of is None:
            r.fail("dtypes", "give dtypes or dtype_of")
        for d in dtypes:
            if d not in DTYPES:
                r.fail("dtypes", f"unknown dtype {d!r}; known: {', '.join(DTYPES)}")
        tensors.append(TensorSpec(name, dims, dtypes, dtype_of))
    return tuple(tensors)


def _cases(reader: _Reader, symbols: set, float_dtypes: tuple) -> tuple:
    cases, seen = [], set()
    for i, body in enumerate(reader.get("cases", list)):
        r = reader.child(f"cases[{i}]", body)
        name = r.get("name", str)
        if name in seen:
            r.fail("name", f"duplicate case name {name!r}")
        seen.add(name)
        case_set = r.get("set", str)
        if case_set not in CASE_SETS:
            r.fail("set", f"expected one of {', '.join(CASE_SETS)}, got {case_set!r}")
        shape = r.get("shape", dict)
        missing = symbols - set(shape)
        if missing:
            r.fail("shape", f"missing symbols {', '.join(sorted(missing))}")
        for sym, size in shape.items():
            if not isinstance(size, int) or size < 0:
                r.fail(f"shape.{sym}", f"expected a non-negative integer, got {size!r}")
        dtypes = tuple(r.get("dtypes", list, list(float_dtypes)))
        for d in dtypes:
            if d not in float_dtypes:
                r.fail("dtypes", f"{d!r} is not a dtype of this op ({', '.join(float_dtypes)})")
        expect = r.get("expect", str, "ok")
        if expect not in ("ok", "BAD_PARAM", "NOT_SUPPORTED"):
            r.fail("expect", f"expected ok, BAD_PARAM or NOT_SUPPORTED, got {expect!r}")
        extra = r.get("extra", dict, {})
        heavy = r.get("heavy", bool, False)
        cases.append(Case(name, case_set, dict(shape), dtypes, expect, dict(extra), heavy))
    return tuple(cases)


def parse(path: Path) -> OpSpec:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path.name}: not valid YAML: {exc}") from exc
    reader = _Reader(path, data)
    op = reader.get("op", str)
    stem = Path(path.name).stem
    if op != stem:
        reader.fail("op", f"must match the file name {stem!r}, got {op!r}")
    inputs, outputs = _tensors(reader, "inputs"), _tensors(reader, "outputs")
    names = {t.name for t in inputs + outputs}
    for t in inputs + outputs:
        if t.dtype_of is not None and t.dtype_of not in names:
            reader.fail(f"{t.name}.dtype_of", f"names no tensor: {t.dtype_of!r}")
    params = []
    for name, body in reader.get("params", dict, {}).items():
        r = reader.child(f"params.{name}", body)
        kind = r.get("type", str, "int")
        if kind not in ("int", "str"):
            r.fail("type", f"expected int or str, got {kind!r}")
        choices = tuple(r.get("choices", list, []))
        if kind == "str" and not choices:
            r.fail("choices", "a str parameter lists its accepted values")
        params.append(ParamSpec(name, kind, r.get("symbol", str, None), r.get("min", int, 0), choices,
                                r.get("optional", bool, False)))
    symbols = {d for t in inputs + outputs for d in t.dims if isinstance(d, str)}
    input_symbols = {d for t in inputs for d in t.dims if isinstance(d, str)}
    counted = tuple(reader.get("counted", list, []))
    for sym in counted:
        if sym not in symbols or sym in input_symbols or any(p.symbol == sym for p in params):
            reader.fail("counted", f"{sym!r} must be a size of outputs only (no input or parameter gives it)")
    exact = tuple(reader.get("exact", list, []))
    for name in exact:
        if name not in {t.name for t in outputs}:
            reader.fail("exact", f"{name!r} is not an output")
    zero = reader.child("zero_elements", reader.get("zero_elements", dict))
    zero_bad, zero_empty = tuple(zero.get("bad_param", list, [])), tuple(zero.get("empty_success", list, []))
    for sym in zero_bad + zero_empty:
        if sym not in symbols:
            zero.fail("", f"unknown symbol {sym!r}")
    accuracy = reader.get("accuracy", dict)
    for dtype, limits in accuracy.items():
        r = reader.child(f"accuracy.{dtype}", limits)
        if not isinstance(limits, dict):
            r.fail("", "expected a mapping of metric: threshold")
        for metric in limits:
            if metric not in ("diff1", "diff2", "diff3"):
                r.fail(metric, "expected diff1, diff2 or diff3")
            r.get(metric, (int, float))
    theory = reader.child("theory", reader.get("theory", dict))
    theory_io, theory_ops = theory.get("io_bytes", str), theory.get("ops", str, None)
    # io_bytes_by: {param: {value: formula}}: a str parameter that changes what is read
    by = theory.get("io_bytes_by", dict, {})
    io_by = {}
    for name, table in by.items():
        param = next((p for p in params if p.name == name and p.type == "str"), None)
        if param is None or not isinstance(table, dict):
            theory.fail("io_bytes_by", f"{name!r} must be a str parameter mapped to {{value: formula}}")
        for value in table:
            if value not in param.choices:
                theory.fail(f"io_bytes_by.{name}", f"{value!r} is not one of {', '.join(param.choices)}")
        io_by[name] = {str(v): str(f) for v, f in table.items()}
    probe = {s: 3 for s in symbols} | {"itemsize": 4}
    formulas = [("io_bytes", theory_io), ("ops", theory_ops)]
    formulas += [(f"io_bytes_by.{n}.{v}", f) for n, table in io_by.items() for v, f in table.items()]
    for key, formula in formulas:
        if formula is None:
            continue
        try:
            # only ops may name integer parameters: io sizes the shape alone
            evaluate(formula, probe | ({p.name: 3 for p in params if p.type == "int"} if key == "ops" else {}))
        except (KeyError, ValueError, SyntaxError) as exc:
            theory.fail(key, f"bad formula {formula!r}: {exc}")
    float_dtypes = tuple(d for d in inputs[0].dtypes if d.startswith("float"))
    for dtype in float_dtypes:
        if dtype not in accuracy:
            reader.fail("accuracy", f"no thresholds for {dtype}")
    cases = _cases(reader, symbols, float_dtypes)
    return OpSpec(op, path, inputs, outputs, tuple(params), zero_bad, zero_empty,
                  accuracy, theory_io, theory_ops, cases, io_by, counted, exact)


@functools.lru_cache(maxsize=None)
def load(op: str) -> OpSpec:
    path = paths.data_file("specs", op)
    if not path.is_file():
        raise SpecError(f"{path.name}: no spec file for operator {op!r} in the package data tvm_ops.specs")
    return parse(path)
