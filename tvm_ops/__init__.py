"""tvm_ops: perception-network operators compiled with Apache TVM for CPUs and NVIDIA GPUs.

One function per operator (named after it); numpy in -> numpy out, torch in ->
torch out. Operator functions are imported on first use, so `import
tvm_ops.policy` (pure arithmetic) does not load TVM.
"""

import importlib

from .errors import ArchMismatchError, BadParamError, NotSupportedError, OpError
from .ops import names as _operator_names

__all__ = ["ArchMismatchError", "BadParamError", "NotSupportedError", "OpError", *_operator_names()]


def __getattr__(name):
    if name in _operator_names():
        function = getattr(importlib.import_module(f"tvm_ops.ops.{name}"), name)
        globals()[name] = function  # later lookups find it without this hook
        return function
    raise AttributeError(f"module 'tvm_ops' has no attribute {name!r}")
