"""Which library a call runs: the best tuning record of the call's shape class, else
the hand-tuned defaults of schedules/<op>.yaml, built one-core (one_core.py) where the
policy runs the call on one core; built on first use, loaded once per process."""

from __future__ import annotations

import dataclasses
import logging
import threading

import numpy as np

from . import build, forked, policy, records, targets

log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded: dict = {}  # (op, dtype, target, knobs, one_core) -> build.Kernels


def _new_lock() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it (building) at the fork


forked.reset_in_child(_new_lock)


def default_variant(op, dtype: str, model: targets.TargetModel, shape_class: str | None = None,
                    one_core: bool = False) -> build.Variant:
    """The best tuning record of `shape_class` (origin "tuned:<case>"), else the hand-tuned defaults.

    Without a shape class (a build for no particular shape) only the hand-tuned defaults apply.
    """
    record = records.best(op, dtype, model, shape_class) if shape_class is not None else None
    if record is not None:
        return build.Variant(op, dtype, model, dict(record["knobs"]), f"tuned:{record.get('case')}", one_core)
    knobs = dict(op.schedules[model.kind].defaults)
    return build.Variant(op, dtype, model, knobs, "hand-tuned", one_core)


def variants(op, dtype: str, model: targets.TargetModel) -> list[build.Variant]:
    """What `build` compiles for (op, dtype, target): the hand-tuned default and every tuned
    class's best; on a CPU each also one-core."""
    found = [default_variant(op, dtype, model)]
    for shape_class in records.tuned_classes(op, dtype, model):
        variant = default_variant(op, dtype, model, shape_class)
        if all(v.knobs != variant.knobs for v in found):
            found.append(variant)
    if model.kind == "llvm":
        found += [dataclasses.replace(v, one_core=True) for v in found]
    return found


def runs_on_one_core(op, problem, model: targets.TargetModel) -> bool:
    """Whether the policy runs `problem` on one core (a CPU call of little work), as every CPU
    call of a forked child does (forked.py).

    The work is the spec's theory for the call's sizes (a size the kernels count, a
    data-dependent output's, is not known yet and counts as 0), against the parallel loops
    the op's call runs with its hand-tuned knobs."""
    if model.kind != "llvm":
        return False
    if forked.in_child():
        return True
    spec = op.spec
    sizes = dict.fromkeys(spec.counted, 0) | problem.sizes
    io_bytes, ops = spec.theory(sizes, np.dtype(problem.dtype).itemsize, problem.params)
    loops = op.parallel_loops(problem, op.schedules[model.kind].defaults)
    return policy.for_target(model).one_core(io_bytes, ops, targets.workers_asleep_between_kernels(), loops)


def kernels(op, dtype: str, model: targets.TargetModel, shape_class: str | None = None,
            one_core: bool = False) -> build.Kernels:
    """The kernels of (op, dtype, target) for the call's shape class, built on first use."""
    variant = default_variant(op, dtype, model, shape_class, one_core)
    if variant.origin == "hand-tuned":
        return _library(variant)
    try:
        return _library(variant)
    except Exception as exc:  # noqa: BLE001 - a bad record must not break the calls of its class
        log.warning("%s: the tuning record %s (knobs %s) does not build or load (%s: %s); using the "
                    "hand-tuned default", op.name, variant.origin, variant.knobs, type(exc).__name__, exc)
        return _library(default_variant(op, dtype, model, one_core=one_core))


def _library(variant: build.Variant) -> build.Kernels:
    key = (variant.op.name, variant.dtype, variant.model.key, tuple(sorted(variant.knobs.items())),
           variant.one_core)
    with _lock:
        if key not in _loaded:
            if variant.origin != "hand-tuned":
                log.info("%s %s: using %s", variant.op.name, variant.dtype, variant.origin)
            _loaded[key] = build.load(build.find_or_build(variant), variant.op)
        return _loaded[key]
