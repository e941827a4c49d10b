"""Tuning records: where they live, how they are read, and which one a call dispatches to.

A record is one JSON line written by `tune` (see tune.py for its fields). Calls
choose kernels by *shape class*: the problem's sizes and parameters with every
integer rounded to the nearest power of two, so a record tuned on one shape
serves the shapes near it (a factor of about 1.4 either way) and no others.
A call whose shape class has no correct record uses the hand-tuned default.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from pathlib import Path

from . import targets
from .paths import file_bytes, records_path

log = logging.getLogger(__name__)


def _bucket(value: int) -> int:
    return 0 if value <= 0 else 2 ** round(math.log2(value))


def shape_class(sizes: dict, params: dict) -> str:
    """'B=2 C=128 ... reduce_type=max': sizes, then params, integers bucketed to a power of two."""
    return _shape_class(tuple(sizes.items()), tuple(sorted(params.items())))


@functools.lru_cache(maxsize=256)  # asked on every call: one class per distinct problem
def _shape_class(sizes: tuple, params: tuple) -> str:
    parts = [f"{name}={_bucket(int(size))}" for name, size in sizes]
    for name, value in params:
        if isinstance(value, str):
            parts.append(f"{name}={value}")
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{name}={_bucket(value)}")
    return " ".join(parts)


def problem_class(op_spec, problem) -> str:
    """The shape class of a checked call (checks.Problem).

    Parameters that define a size symbol are already in the sizes, and optional ones
    may be left to their default, so only the required non-size parameters count."""
    params = {p.name: problem.params.get(p.name) for p in op_spec.params if p.symbol is None and not p.optional}
    # a counted size (data-dependent) is known to a call only when out= gives it
    sizes = {name: size for name, size in problem.sizes.items() if name not in op_spec.counted}
    return shape_class(sizes, params)


_cache: dict = {}  # path -> ((mtime_ns, size), records): re-read only when the file changes
_chosen: dict = {}  # (path, op, dtype, target, defaults, shape class) -> (stamp, best()): asked per call


def _stamp(path: Path):
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def read(path: Path) -> list[dict]:
    """The JSON-lines records of `path` ([] when missing or unreadable, with a warning); a
    torn, foreign or malformed line is skipped."""
    stamp = _stamp(path)
    if stamp is None:
        return []
    cached = _cache.get(str(path))
    if cached and cached[0] == stamp:
        return cached[1]
    try:
        lines = file_bytes(path).splitlines()
    except OSError as exc:  # a folder, no permission: tuning records are optional
        log.warning("cannot read the tuning records %s (%s); using the hand-tuned defaults", path, exc)
        lines = []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            continue
        if _well_formed(row):
            rows.append(row)
    _cache[str(path)] = (stamp, rows)
    return rows


# the record's fields that are names (compared and used as keys): strings where present
NAME_FIELDS = ("op", "dtype", "target", "shape_class", "case", "runner")


def _well_formed(row) -> bool:
    """Whether a parsed line has the fields a record has, of their types (what `tune` writes):
    names are strings, knob values JSON scalars."""
    if not isinstance(row, dict) or not isinstance(row.get("knobs"), dict):
        return False
    if not all(isinstance(row.get(name, ""), str) for name in NAME_FIELDS):
        return False
    if not all(isinstance(value, (str, int, float, bool)) for value in row["knobs"].values()):
        return False
    median = row.get("median_s")
    timed = median is None or (isinstance(median, (int, float)) and not isinstance(median, bool)
                               and math.isfinite(median) and median > 0)
    return timed and isinstance(row.get("status"), str) and isinstance(row.get("correct", False), bool)


def usable(op, dtype: str, model: targets.TargetModel, path: Path | None = None) -> list[dict]:
    """Correct, timed, local records of (op, dtype, target) whose knobs match the schedule file."""
    defaults = op.schedules[model.kind].defaults
    return [r for r in read(path or records_path())
            if r.get("op") == op.name and r.get("dtype") == dtype and r.get("target") == model.key
            and r.get("status") == "ok" and r.get("correct") and r.get("median_s")
            and r.get("runner", "local") == "local"  # measured on this machine, not an RPC board
            and set(r["knobs"]) == set(defaults) and _candidates_only(op, r, op.schedules[model.kind].candidates)
            and _planned(op, model, r)]


def _planned(op, model: targets.TargetModel, row: dict) -> bool:
    """Whether the op's plan takes the record's knobs on this target (a candidate may not fit
    it); a record it refuses is skipped (calls, `build` and `list` alike), with a warning."""
    try:
        op.plan(model, row["knobs"])
    except Exception as exc:  # noqa: BLE001 - whatever a record holds, it must not break a call
        log.warning("%s: ignoring the tuning record of case %s: its knobs %s are refused (%s: %s)", op.name,
                    row.get("case"), row["knobs"], type(exc).__name__, exc)
        return False
    return True


def _candidates_only(op, row: dict, candidates: dict) -> bool:
    """Whether every knob of the record is one of the schedule file's candidates for it, of
    the same type (True is not 1, 1 is not 1.0): the values `tune` searches, and so the only
    ones it writes. Any other record was written by hand or against another schedule file,
    and is skipped (calls, `build` and `list` alike), with a warning. A number outside the
    candidates once reached the kernels: voxel_pooling_backward with task_points = -1 left
    points out of its sum."""
    odd = {name: value for name, value in row["knobs"].items()
           if not any(type(value) is type(c) and value == c for c in candidates[name])}
    if odd:
        log.warning("%s: ignoring the tuning record of case %s: its knobs %s are not among the schedule file's "
                    "candidates", op.name, row.get("case"), odd)
    return not odd


def best(op, dtype: str, model: targets.TargetModel, shape_class: str, path: Path | None = None) -> dict | None:
    """The fastest usable record of `shape_class`, or None.

    Two cases of one class may both have been tuned: a record is ranked by its
    speed-up over the hand-tuned default measured on the same case, then by its median.
    """
    path = path or records_path()
    defaults = op.schedules[model.kind].defaults
    key = (str(path), op.name, dtype, model.key, tuple(sorted(defaults.items())), shape_class)
    stamp = _stamp(path)
    cached = _chosen.get(key)
    if cached is None or cached[0] != stamp:
        rows = [r for r in usable(op, dtype, model, path) if r.get("shape_class") == shape_class]
        base = {r.get("case"): r["median_s"] for r in rows if r["knobs"] == defaults}
        chosen = min(rows, key=lambda r: (r["median_s"] / base.get(r.get("case"), r["median_s"]), r["median_s"]),
                     default=None)
        cached = _chosen[key] = (stamp, chosen)
    return cached[1]


def tuned_classes(op, dtype: str, model: targets.TargetModel, path: Path | None = None) -> list[str]:
    """Every shape class with a usable record, in first-tuned order."""
    return list(dict.fromkeys(r.get("shape_class") for r in usable(op, dtype, model, path)))
