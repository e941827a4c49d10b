"""tvm_ops: perception-network operators compiled with Apache TVM for CPUs and NVIDIA GPUs.

One function per operator (named after it); numpy in -> numpy out, torch in ->
torch out. Operator functions are imported on first use, so `import
tvm_ops.policy` (pure arithmetic) does not load TVM, and `import tvm_ops` loads
neither TVM nor torch.
"""

from .errors import (ArchMismatchError, BadParamError, ExecutionFailedError, NotDeterministicError, NotSupportedError,
                     OpError)
from .ops import NAMES as _OPERATOR_NAMES

__all__ = ["ArchMismatchError", "BadParamError", "ExecutionFailedError", "NotDeterministicError", "NotSupportedError",
           "OpError", "clear_call_cache", *_OPERATOR_NAMES]


def clear_call_cache() -> None:
    """Forget every remembered call signature, so the next calls take the full path again:
    a repeated call uses the library and checks of its signature's first call, so changed
    tuning records or environment variables reach new signatures only until this is called."""
    import sys

    for name in _OPERATOR_NAMES:
        module = sys.modules.get(f"{__name__}.ops.{name}")
        if module is not None:
            module.OP.clear_call_cache()


def __getattr__(name):
    if name in _OPERATOR_NAMES:
        from .ops import module

        function = getattr(module(name), name)
        globals()[name] = function  # later lookups find it without this hook
        return function
    raise AttributeError(f"module 'tvm_ops' has no attribute {name!r}")
