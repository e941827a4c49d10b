"""The operator registry: NAMES lists every operator, one folder each under tvm_ops/ops/.

An operator's folder holds its public function, Operator and kernel names (`__init__.py`),
its TensorIR (`compute.py`) and its per-target schedule recipes (`schedule.py`), these two
imported only to build (they import TVM's compiler, which a call does not need); its
contract and schedule knobs are the package data specs/<op>.yaml and
schedules/<op>.yaml, its testing material tvm_ops/testing/<op>.py.
"""

from __future__ import annotations

import importlib

NAMES = (
    "border_align_backward",
    "border_align_forward",
    "dynamic_scatter_backward",
    "dynamic_scatter_forward",
    "ms_deform_attn_backward",
    "ms_deform_attn_forward",
    "three_interpolate_backward",
    "three_interpolate_forward",
    "three_nn",
    "voxel_pooling_backward",
    "voxel_pooling_forward",
)


def module(name: str):
    """The operator's package; BadParamError for an unknown name."""
    if name not in NAMES:
        from ..errors import BadParamError

        raise BadParamError(f"unknown operator {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def get(name: str):
    """The Operator called `name`."""
    return module(name).OP


def all_operators() -> list:
    return [get(name) for name in NAMES]
