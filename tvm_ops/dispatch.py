"""Which library a call runs: the best tuning record of the call's shape class, else
the hand-tuned defaults of schedules/<op>.yaml; built on first use, loaded once per process."""

from __future__ import annotations

import logging
import threading

from . import build, paths, records, targets

log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded: dict = {}  # (op, dtype, target, knobs) -> build.Kernels


def default_variant(op, dtype: str, model: targets.TargetModel, shape_class: str | None = None) -> build.Variant:
    """The best tuning record of `shape_class` (origin "tuned:<case>"), else the hand-tuned defaults.

    Without a shape class (a build for no particular shape) only the hand-tuned defaults apply.
    """
    record = records.best(op, dtype, model, shape_class) if shape_class is not None else None
    if record is not None:
        return build.Variant(op, dtype, model, dict(record["knobs"]), f"tuned:{record.get('case')}")
    knobs = dict(op.schedules[model.kind].defaults)
    return build.Variant(op, dtype, model, knobs, "hand-tuned")


def variants(op, dtype: str, model: targets.TargetModel) -> list[build.Variant]:
    """What `build` compiles for (op, dtype, target): the hand-tuned default and every tuned class's best."""
    found = [default_variant(op, dtype, model)]
    for shape_class in records.tuned_classes(op, dtype, model):
        variant = default_variant(op, dtype, model, shape_class)
        if all(v.knobs != variant.knobs for v in found):
            found.append(variant)
    return found


def kernels(op, dtype: str, model: targets.TargetModel, shape_class: str | None = None) -> build.Kernels:
    """The kernels of (op, dtype, target) for the call's shape class, built on first use."""
    variant = default_variant(op, dtype, model, shape_class)
    if variant.origin == "hand-tuned":
        return _library(variant)
    try:
        return _library(variant)
    except Exception as exc:  # noqa: BLE001 - a bad record must not break the calls of its class
        log.warning("%s: the tuning record %s (knobs %s) does not build or load (%s: %s); using the "
                    "hand-tuned default", op.name, variant.origin, variant.knobs, type(exc).__name__, exc)
        return _library(default_variant(op, dtype, model))


def _library(variant: build.Variant) -> build.Kernels:
    key = (variant.op.name, variant.dtype, variant.model.key, tuple(sorted(variant.knobs.items())))
    with _lock:
        if key not in _loaded:
            if variant.origin != "hand-tuned":
                log.info("%s %s: using %s", variant.op.name, variant.dtype, variant.origin)
            entry = build.find_entry(variant)
            if entry is None:
                log.info("building %s for %s (first use; this compiles for a few seconds)",
                         variant.entry_name, variant.model.key)
                entry = build.build_entry(variant, paths.writable_cache_dir())
            _loaded[key] = build.load(entry, variant.op)
        return _loaded[key]
