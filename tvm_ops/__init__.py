"""tvm_ops: perception-network operators compiled with Apache TVM for CPUs and NVIDIA GPUs.

One function per operator (named after it); numpy in -> numpy out, torch in ->
torch out. Operator functions are imported on first use, so `import
tvm_ops.policy` (pure arithmetic) does not load TVM, and `import tvm_ops` loads
neither TVM nor torch.
"""

from .errors import ArchMismatchError, BadParamError, NotSupportedError, OpError
from .ops import NAMES as _OPERATOR_NAMES

__all__ = ["ArchMismatchError", "BadParamError", "NotSupportedError", "OpError", *_OPERATOR_NAMES]


def __getattr__(name):
    if name in _OPERATOR_NAMES:
        from .ops import module

        function = getattr(module(name), name)
        globals()[name] = function  # later lookups find it without this hook
        return function
    raise AttributeError(f"module 'tvm_ops' has no attribute {name!r}")
