"""Per-target schedule settings, loaded from schedules/<op>.yaml.

Each target section holds only what code reads: the reduction strategy (`list`
shows it), the policy input it overrides (`onchip`: the memory the plan sizes its
tiles from, policy.ONCHIP; default none) and the tunable knobs with their default
and candidate values, which the op's plan() and the recipe in
tvm_ops/ops/<op>/schedule.py read. Any other key is an error, so nothing unread
can sit in a file; explanations are YAML comments, measurements docs/kernels/.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import paths, policy
from .spec import SpecError
from .targets import TARGET_KINDS

REDUCTIONS = ("owner", "atomic", "private")
FILE_KEYS = ("op",) + TARGET_KINDS
SECTION_KEYS = ("reduction", "onchip", "knobs")
KNOB_KEYS = ("default", "candidates")


@dataclass(frozen=True)
class TargetSchedule:
    target: str
    reduction: str
    onchip: str  # the on-chip memory the plan sizes tiles from (policy.for_target)
    defaults: dict  # knob -> default value
    candidates: dict  # knob -> tuple of candidate values


def _section(path: Path, target: str, body) -> TargetSchedule:
    def fail(key, problem):
        raise SpecError(f"{path.name}: key '{target}.{key}': {problem}")

    if not isinstance(body, dict):
        fail("", "expected a mapping")
    for key in body:
        if key not in SECTION_KEYS:
            fail(key, f"unknown key (a target section holds {', '.join(SECTION_KEYS)})")
    reduction = body.get("reduction")
    if reduction not in REDUCTIONS:
        fail("reduction", f"expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    onchip = body.get("onchip", "none")
    if onchip not in policy.ONCHIP:
        fail("onchip", f"expected one of {', '.join(policy.ONCHIP)}, got {onchip!r}")
    knobs = body.get("knobs")
    if not isinstance(knobs, dict) or not knobs:
        fail("knobs", "expected a mapping of knob: {default, candidates}")
    defaults, candidates = {}, {}
    for name, knob in knobs.items():
        if not isinstance(knob, dict) or "default" not in knob:
            fail(f"knobs.{name}", "expected {default: ..., candidates: [...]}")
        for key in knob:
            if key not in KNOB_KEYS:
                fail(f"knobs.{name}.{key}", "unknown key (a knob holds default and candidates)")
        values = knob.get("candidates", [knob["default"]])
        if not isinstance(values, list) or knob["default"] not in values:
            fail(f"knobs.{name}.candidates", "expected a list that contains the default")
        defaults[name], candidates[name] = knob["default"], tuple(values)
    return TargetSchedule(target, reduction, onchip, defaults, candidates)


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
    for key in data:
        if key not in FILE_KEYS:
            raise SpecError(f"{path.name}: key '{key}': unknown key (the file holds {', '.join(FILE_KEYS)})")
    missing = [t for t in TARGET_KINDS if t not in data]
    if missing:
        raise SpecError(f"{path.name}: key '{missing[0]}': missing (every target needs a section)")
    return {t: _section(path, t, data[t]) for t in TARGET_KINDS}
