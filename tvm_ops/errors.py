"""Error types, one per mlu-ops status.

Every parameter check raises one of these before any kernel runs, so callers can
catch `OpError` (or `ValueError` for bad parameters) and read `.status`.
"""


class OpError(Exception):
    """Base of all tvm_ops errors; `status` is the mlu-ops status name."""

    status = "INTERNAL_ERROR"


class BadParamError(OpError, ValueError):
    """The caller passed something the operator's contract forbids."""

    status = "BAD_PARAM"


class NotSupportedError(OpError):
    """A valid request this library does not handle (huge or strided tensors...)."""

    status = "NOT_SUPPORTED"


class NotDeterministicError(NotSupportedError, RuntimeError):
    """A call whose kernels add in an order that changes from run to run (CUDA atomics),
    made while `torch.use_deterministic_algorithms(True)` is set: refused, as PyTorch
    refuses its own such operations (also a RuntimeError, which PyTorch raises there)."""


class ArchMismatchError(OpError):
    """The requested target cannot run here (no GPU for target='cuda'...)."""

    status = "ARCH_MISMATCH"


class ExecutionFailedError(OpError):
    """The environment failed the call: a library could not be written to its folder (a
    full disk, no permission) or built."""

    status = "EXECUTION_FAILED"
