"""Tensors in and out: numpy arrays and DLPack tensors (torch) without copies.

`describe` reads only metadata, so every check runs before any data is
touched (a 2^31-element broadcast view is rejected, never copied).
`Arrays` then materialises contiguous inputs and allocates outputs of the
caller's kind; the kernels receive them directly (TVM's FFI takes numpy and
torch tensors through DLPack).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import host_buffers
from .errors import BadParamError


@dataclass(frozen=True)
class TensorInfo:
    name: str
    value: object
    shape: tuple
    dtype: str
    contiguous: bool
    kind: str  # "numpy" or "torch"
    device: str  # "cpu" or "cuda"


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "is_contiguous")


def _torch_dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# numpy's dtype.name is computed anew on every access (a few microseconds per call)
_DTYPE_NAMES = {np.dtype(name): name for name in ("float16", "float32", "float64", "int32", "int64")}


def describe(name: str, value) -> TensorInfo:
    """Metadata of one tensor argument; BadParamError if it is no tensor at all."""
    if value is None:
        raise BadParamError(f"{name} is missing (got None)")
    if isinstance(value, np.ndarray):
        return TensorInfo(name, value, tuple(value.shape), _DTYPE_NAMES.get(value.dtype) or value.dtype.name,
                          bool(value.flags.c_contiguous), "numpy", "cpu")
    if _is_torch(value):
        return TensorInfo(name, value, tuple(value.shape), _torch_dtype_name(value.dtype),
                          bool(value.is_contiguous()), "torch", value.device.type)
    if hasattr(value, "__dlpack__"):
        try:
            return describe(name, np.from_dlpack(value))
        except (TypeError, RuntimeError, BufferError) as exc:
            raise BadParamError(f"{name}: cannot read this DLPack tensor on the CPU ({exc})") from exc
    raise BadParamError(f"{name} must be a numpy array or a DLPack tensor, got {type(value).__name__}")


def contiguous(info: TensorInfo):
    """The tensor's data, C-contiguous (copied only when it is not)."""
    if info.contiguous:
        return info.value
    if info.kind == "torch":
        return info.value.contiguous()
    return np.ascontiguousarray(info.value)


def empty_like_kind(kind: str, device: str, shape: tuple, dtype: str, zero: bool):
    """A new output tensor of the caller's kind."""
    if kind == "torch":
        import torch

        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=getattr(torch, dtype), device=device)
    if zero:
        return np.zeros(shape, dtype=dtype)
    return host_buffers.empty(shape, dtype)


def zero(array) -> None:
    """Fill a numpy array or torch tensor with zeros in place."""
    if isinstance(array, np.ndarray):
        array.fill(0)
    else:
        array.zero_()
