"""Per-target schedule descriptions, loaded from schedules/<op>.yaml.

Each target section documents the plan (reduction strategy, task split,
on-chip memory) and lists the tunable knobs with their default and candidate
values. The recipe in tvm_ops/ops/<op>/schedule.py reads the knob values.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import paths
from .spec import SpecError
from .targets import TARGET_KINDS

REDUCTIONS = ("owner", "atomic", "private")


@dataclass(frozen=True)
class TargetSchedule:
    target: str
    reduction: str
    description: dict  # the rest of the section, for people and `list`
    defaults: dict  # knob -> default value
    candidates: dict  # knob -> tuple of candidate values


def _section(path: Path, target: str, body) -> TargetSchedule:
    def fail(key, problem):
        raise SpecError(f"{path.name}: key '{target}.{key}': {problem}")

    if not isinstance(body, dict):
        fail("", "expected a mapping")
    reduction = body.get("reduction")
    if reduction not in REDUCTIONS:
        fail("reduction", f"expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    knobs = body.get("knobs")
    if not isinstance(knobs, dict) or not knobs:
        fail("knobs", "expected a mapping of knob: {default, candidates}")
    defaults, candidates = {}, {}
    for name, knob in knobs.items():
        if not isinstance(knob, dict) or "default" not in knob:
            fail(f"knobs.{name}", "expected {default: ..., candidates: [...]}")
        values = knob.get("candidates", [knob["default"]])
        if not isinstance(values, list) or knob["default"] not in values:
            fail(f"knobs.{name}.candidates", "expected a list that contains the default")
        defaults[name], candidates[name] = knob["default"], tuple(values)
    description = {k: v for k, v in body.items() if k != "knobs"}
    return TargetSchedule(target, reduction, description, defaults, candidates)


@functools.lru_cache(maxsize=None)
def load(op: str) -> dict:
    """{target kind: TargetSchedule} for one operator."""
    path = paths.data_file("schedules", op)
    if not path.is_file():
        raise SpecError(f"{path.name}: no schedule file for operator {op!r} in the package data tvm_ops.schedules")
    return parse(path, op)


def parse(path: Path, op: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path.name}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or data.get("op") != op:
        raise SpecError(f"{path.name}: key 'op': must be {op!r}")
    missing = [t for t in TARGET_KINDS if t not in data]
    if missing:
        raise SpecError(f"{path.name}: key '{missing[0]}': missing (every target needs a section)")
    return {t: _section(path, t, data[t]) for t in TARGET_KINDS}
