"""The operator registry: every module here that defines `OP` is an operator."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path

NOT_OPERATORS = {"base", "task_queue"}  # shared helpers, not operators


@functools.lru_cache(maxsize=None)
def names() -> tuple[str, ...]:
    """Operator module names, found without importing them (no TVM needed)."""
    folder = Path(__file__).parent
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if m.name not in NOT_OPERATORS))


@functools.lru_cache(maxsize=None)
def _registry() -> dict:
    found = {}
    for name in names():
        module = importlib.import_module(f"{__name__}.{name}")
        if hasattr(module, "OP"):
            found[module.OP.name] = module.OP
    return found


def __getattr__(attr):
    if attr == "OPERATORS":
        return _registry()
    raise AttributeError(attr)


def get(name: str):
    from ..errors import BadParamError

    registry = _registry()
    if name not in registry:
        raise BadParamError(f"unknown operator {name!r}; known: {', '.join(registry)}")
    return registry[name]
