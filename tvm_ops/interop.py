"""Tensors in and out: numpy arrays and DLPack tensors (torch) without copies.

`describe` reads only metadata, so every check runs before any data is
touched (a 2^31-element broadcast view is rejected, never copied).
The call plan (invocation.CallPlan) then makes inputs contiguous
(`make_contiguous`) and allocates outputs of the caller's kind (`allocator`,
`empty_like_kind`); the kernels receive them directly (TVM's FFI takes numpy and
torch tensors through DLPack).
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass

import numpy as np

from . import forked, host_buffers
from .errors import BadParamError, NotDeterministicError

log = logging.getLogger(__name__)
COPY_WARN_BYTES = 1 << 30  # a copy of an input this large is worth a word


@dataclass(frozen=True)
class TensorInfo:
    name: str
    value: object
    shape: tuple
    dtype: str
    contiguous: bool
    kind: str  # "numpy" or "torch"
    device: str  # "cpu" or "cuda"
    native: bool = True  # numpy: native byte order (DLPack takes no other)
    writeable: bool = True  # numpy: not read-only (DLPack exports no read-only array)
    lazy: bool = False  # torch: its memory does not hold its values (lazy_values)
    device_index: int | None = None  # torch: the device's index (which GPU), None on the CPU

    @property
    def where(self) -> str:
        """The device as torch names it: "cpu", "cuda:1"."""
        return self.device if self.device_index is None else f"{self.device}:{self.device_index}"

    @property
    def ready(self) -> bool:
        """Whether the kernels can take the tensor as it is (else contiguous() copies it)."""
        return self.contiguous and self.native and self.writeable and not self.lazy


def _is_torch(value) -> bool:
    # a subclass too, wherever it is defined; a torch tensor exists only once torch is imported
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def lazy_values(tensor) -> bool:
    """Whether a torch tensor's memory does not hold its values: a negated view (the negative
    bit of `conj().imag` or `_neg_view`, applied only when read through torch) or an
    efficient zero tensor (no memory). The kernels read memory, so such a tensor is copied."""
    return tensor.is_neg() or tensor._is_zerotensor()


def resolved(tensor):
    """A torch tensor whose memory holds its values (itself unless lazy_values)."""
    if tensor._is_zerotensor():
        tensor = tensor.clone()  # memory of its own, zero-filled
    return tensor.resolve_neg()


def host_array(value) -> np.ndarray:
    """The values of a numpy array or torch tensor as numpy (a device tensor copied to the host;
    force: detached, and lazy values resolved, as `resolved` does)."""
    if isinstance(value, np.ndarray):
        return value
    return value.numpy(force=True)


def torch_dtype_name(dtype) -> str:
    """A torch dtype's name as the checks and allocators take it ("float32")."""
    return str(dtype).replace("torch.", "")


# numpy's dtype.name is computed anew on every access (a few microseconds per call)
_DTYPE_NAMES = {dtype: name for name, dtype in host_buffers.DTYPES.items()}


def describe(name: str, value) -> TensorInfo:
    """Metadata of one tensor argument; BadParamError if it is no tensor at all."""
    if value is None:
        raise BadParamError(f"{name} is missing (got None)")
    if isinstance(value, np.ndarray):
        if isinstance(value, np.ma.MaskedArray):
            raise BadParamError(f"{name} is a masked array, whose mask the kernels would not see; give "
                                f".filled(value) or .data")
        return TensorInfo(name, value, tuple(value.shape), _DTYPE_NAMES.get(value.dtype) or value.dtype.name,
                          bool(value.flags.c_contiguous), "numpy", "cpu", value.dtype.isnative,
                          bool(value.flags.writeable))
    if _is_torch(value):
        require_dense(name, value)
        return TensorInfo(name, value, tuple(value.shape), torch_dtype_name(value.dtype),
                          bool(value.is_contiguous()), "torch", value.device.type,
                          lazy=lazy_values(value), device_index=value.device.index)
    if hasattr(value, "__dlpack__"):
        try:
            return describe(name, np.from_dlpack(value))
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise BadParamError(f"{name}: cannot read this DLPack tensor on the CPU ({exc})") from exc
    raise BadParamError(f"{name} must be a numpy array or a DLPack tensor, got {type(value).__name__}")


def require_dense(name: str, tensor) -> None:
    """BadParamError for a torch tensor whose elements are not strided memory (sparse, mkldnn,
    nested): the kernels read memory."""
    if tensor.is_nested:
        raise BadParamError(f"{name} is a nested tensor; give a dense tensor of one shape")
    if tensor.layout is not sys.modules["torch"].strided:
        raise BadParamError(f"{name} is a {tensor.layout} tensor; give a dense (strided) one, e.g. .to_dense()")


def contiguous(info: TensorInfo):
    """The tensor as the kernels take it: C-contiguous, native byte order, exportable through
    DLPack (copied only when it is not)."""
    return info.value if info.ready else make_contiguous(info.value)


def make_contiguous(value):
    """`value` ready for the kernels: a C-contiguous, native-order numpy array that DLPack
    exports (a read-only input is passed as a view of its memory that is not marked
    read-only: the kernels only read their inputs), or a contiguous torch tensor."""
    nbytes = math.prod(value.shape) * (value.itemsize if isinstance(value, np.ndarray) else value.element_size())
    if nbytes >= COPY_WARN_BYTES:
        log.warning("copying a %s input of shape %s (%.1f GB) to a contiguous one; pass it contiguous to "
                    "avoid the copy", "strided or broadcast" if isinstance(value, np.ndarray) else "strided",
                    list(value.shape), nbytes / 1e9)
    if not isinstance(value, np.ndarray):
        value = resolved(value)
        shape, dtype = tuple(value.shape), torch_dtype_name(value.dtype)
        if value.device.type == "cpu" and dtype in host_buffers.DTYPES and host_buffers.reused(shape, dtype):
            # a large copy into a reused host block, as large outputs are (empty_like_kind): a
            # fresh one faults in every page (a training step's broadcast gradient of 268 MB:
            # ~65000 faults)
            return empty_like_kind("torch", "cpu", shape, dtype, zero=False).copy_(value)
        return value.contiguous()
    value = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
    if not value.flags.writeable:
        value = np.asarray(_Unmarked(value))
    return value


class _Unmarked:
    """The array interface of a read-only array without its read-only mark (DLPack cannot
    export read-only arrays); holds the array so its memory lives as long as the view."""

    def __init__(self, array: np.ndarray):
        self.array = array
        pointer, _read_only = array.__array_interface__["data"]
        self.__array_interface__ = dict(array.__array_interface__, data=(pointer, False))


def empty_like_kind(kind: str, device: str, shape: tuple, dtype: str, zero: bool, line_aligned: bool = False):
    """A new output tensor of the caller's kind on `device` (torch's name of it: "cpu", "cuda:1";
    numpy: on a cache line if it is not small, or always with line_aligned). A large
    uninitialised CPU torch tensor is a view of a reused host block (host_buffers), as a numpy
    output is: a fresh one costs a page fault per page (67 ms for the 303 MB gradient of a
    voxel_pooling training step, 0.6 ms reused)."""
    if kind == "torch":
        import torch

        if device == "cpu" and not zero and host_buffers.reused(shape, dtype):
            return torch.from_numpy(host_buffers.empty(shape, dtype))
        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=getattr(torch, dtype), device=device)
    if zero:
        return np.zeros(shape, dtype=dtype)
    return host_buffers.empty(shape, dtype, line_aligned)


def allocator(kind: str, device: str, shape: tuple, dtype: str, zero: bool):
    """A no-argument callable returning a new output as empty_like_kind(...) would: a call
    plan makes its outputs' allocators once and runs them on every call (an uninitialised
    numpy output of a call's size costs ~1 us this way against ~3)."""
    if kind == "numpy" and not zero:
        return host_buffers.allocator(tuple(shape), dtype)
    nbytes = math.prod(shape) * host_buffers.dtype_of(dtype).itemsize
    if kind == "torch" and (zero or device != "cpu" or nbytes < host_buffers.MIN_BYTES):
        import torch  # never from a reused block: torch's allocator itself (~0.7 us less a call)

        make = torch.zeros if zero else torch.empty
        # the sizes as separate ints: torch parses them ~0.3 us faster than one tuple
        sizes = tuple(shape) or ((),)  # torch.empty() takes no zero ints for a 0-d tensor
        return functools.partial(make, *sizes, dtype=getattr(torch, dtype), device=torch.device(device))
    return functools.partial(empty_like_kind, kind, device, tuple(shape), dtype, zero)


def block_layout(specs: dict) -> tuple:
    """(block bytes, ((name, first byte, bytes, shape, dtype), ...)): {name: (shape, dtype)}
    laid out in one block, each tensor starting on a cache line (for `carved`). Computed
    per call plan, so on the checked path of every new signature: dtype objects looked up,
    not built (dynamic_scatter_forward's twelve workspaces 5.3 -> 2.5 us)."""
    parts, total, line = [], 0, host_buffers.LINE_BYTES
    for name, (shape, dtype) in specs.items():
        dtype = host_buffers.dtype_of(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        parts.append((name, total, nbytes, tuple(shape), dtype))
        total += -(-nbytes // line) * line
    return total, tuple(parts)


def carved(kind: str, device: str, layout: tuple) -> dict:
    """{name: uninitialised tensor}, views of one new block laid out by block_layout: one
    allocation for a call's workspaces instead of one each (a host allocation costs
    microseconds). Host workspaces are numpy arrays whatever the caller's kind: no caller
    sees them, and a torch view costs ~1 us where numpy's costs ~0.2 (16 workspaces: 20 us of
    a torch call); device ones are torch tensors on the caller's device."""
    total, parts = layout
    if not parts:  # most operators have no workspace: no allocation (3 us of a call)
        return {}
    if device == "cpu":
        kind = "numpy"
    block = empty_like_kind(kind, device, (total,), "uint8", zero=False, line_aligned=True)
    if kind == "torch":
        import torch

        return {name: block[first:first + nbytes].view(getattr(torch, dtype.name)).view(shape)
                for name, first, nbytes, shape, dtype in parts}
    # one constructor per view (a slice, a view and a reshape each cost ~3x as much)
    return {name: np.ndarray(shape, dtype, block, first) for name, first, nbytes, shape, dtype in parts}


def kernel_tensor(array: np.ndarray):
    """A TVM tensor of `array`'s memory (which it keeps alive): a kernel takes it as it is,
    where it converts a numpy argument on every call."""
    import tvm_ffi

    return tvm_ffi.from_dlpack(array)


def zero(array) -> None:
    """Fill a numpy array or torch tensor with zeros in place."""
    if isinstance(array, np.ndarray):
        array.fill(0)
    else:
        array.zero_()


def call_signature(head: list, groups) -> tuple | None:
    """A hashable summary of what the checks and the kernel choice read of a call's
    arguments: `head`, then per argument of `groups` ((dict, names) pairs; a name the dict
    lacks reads None) its kind, shape, dtype, strides, device and writability (a tensor) or
    its value (a scalar); None when an argument has none (the call then takes the checked
    path every time). A call plan's key is built and hashed on every call: a numpy array
    adds its own shape and strides tuples, its dtype and writability, four entries and no
    tuple of its own (a tuple per argument cost ~0.7 us of a five-array call, unpacking the
    shape and strides ~0.5 us, gathering the arguments into one tuple first ~0.25 us).
    Unambiguous: an array's part starts with a tuple of ints, the others with None or a
    tuple that starts with a type or "torch"."""
    key = head
    for arguments, names in groups:
        for name in names:
            value = arguments.get(name)
            if type(value) is np.ndarray:  # the common case inline
                key += (value.shape, value.strides, value.dtype, value.flags.writeable)
            elif value is None:
                key.append(None)
            else:
                part = signature(value)
                if part is None:
                    return None
                key.append(part)
    return tuple(key)


def signature(value):
    """A hashable summary of a tensor argument (its kind, shape, dtype, strides, device and
    writability) or of a scalar argument; None when the argument has none."""
    kind = _SIGNED.get(type(value))
    if kind is None:
        kind = _SIGNED[type(value)] = _signature_kind(value)
    if kind == "scalar":
        return type(value), value
    if kind == "numpy":
        return np.ndarray, value.shape, value.dtype, value.strides, value.flags.writeable
    if kind == "torch":
        if value.layout is not _TORCH_STRIDED[0]:  # sparse, mkldnn: the checked path refuses them
            return None
        try:
            return ("torch", value.shape, value.dtype, value.stride(), value.device, value.requires_grad,
                    lazy_values(value))
        except RuntimeError:  # a nested tensor has no sizes: the checked path refuses it
            return None
    return None


_SIGNED: dict = {}  # type -> how signature() reads it, decided once per type


def _signature_kind(value) -> str:
    if value is None or type(value) in (bool, int, str):
        return "scalar"
    if type(value) is np.ndarray:
        return "numpy"
    if not _is_torch(value):
        return "none"
    _TORCH_STRIDED[0] = sys.modules["torch"].strided
    return "torch"


_TORCH_STRIDED = [None]  # torch.strided, once torch's first tensor is signed (torch stays unimported)


_host_results: dict = {}  # (host values, dtype, shape, convert) -> convert's result
_host_results_lock = threading.Lock()  # its eviction: two threads must not drop one entry
_per_version: dict = {}  # (id(device tensor), make) -> (its version, make's result); dropped when it dies
_per_version_lock = threading.Lock()


def _new_locks() -> None:
    global _host_results_lock, _per_version_lock
    _host_results_lock, _per_version_lock = threading.Lock(), threading.Lock()  # held by another thread at a fork


forked.reset_in_child(_new_locks)


def host_values(value, convert):
    """convert(the tensor's values as numpy): read on every call for host tensors (cheap: small
    tensors); for a device tensor once per tensor object and version (torch's counter of
    in-place changes), so repeated calls with the same tensor never copy it to the host."""
    if isinstance(value, np.ndarray) or value.device.type == "cpu":
        array = host_array(value)
        key = (array.tobytes(), array.dtype.str, array.shape, convert)  # small tensors: cheap to key
        result = _host_results.get(key)  # no lock on a hit (a dict read is atomic)
        if result is None:
            result = convert(array)
            with _host_results_lock:
                _host_results[key] = result
                while len(_host_results) > 64:
                    _host_results.pop(next(iter(_host_results)))
        return result
    return per_version(value, convert, _read_to_host)


def refuse_if_deterministic(op_name: str) -> None:
    """Follow `torch.use_deterministic_algorithms` for a call whose kernels add in any order
    (Operator.adds_in_any_order), as PyTorch does for its own such operations: with the mode
    set, NotDeterministicError (a RuntimeError too), or a warning under `warn_only=True`."""
    import torch

    if not torch.are_deterministic_algorithms_enabled():
        return
    message = (f"{op_name}: its CUDA kernels add with atomics, in an order that changes from run to run, "
               f"but torch.use_deterministic_algorithms(True) is set; run it on the CPU (deterministic), or "
               f"set warn_only=True to accept it (docs/semantics.md, Determinism)")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, stacklevel=5)  # the public call's caller
        return
    raise NotDeterministicError(message)


def refuse_grad_outputs(op_name: str, outputs: dict) -> None:
    """BadParamError for an out= torch tensor that requires grad while grad mode is on, as
    PyTorch's own out= functions refuse it: autograd cannot follow a write into it (the
    differentiable functions are tvm_ops.functional)."""
    import torch

    if not torch.is_grad_enabled():
        return
    for name, tensor in outputs.items():
        if tensor.requires_grad:
            raise BadParamError(f"{op_name}: out[{name!r}] requires grad, and autograd cannot follow a write "
                                f"into it; give a buffer without requires_grad, call under torch.no_grad(), or "
                                f"use tvm_ops.functional")


def write_counter():
    """torch's increment_version, which counts a write into torch tensors as an in-place
    operation does (their version): a graph that saved one of them for its backward then
    refuses to use the new values. Looked up once per call plan (importing it cost ~0.5 us)."""
    from torch.autograd.graph import increment_version

    return increment_version


def _read_to_host(value, convert):
    return convert(host_array(value))  # the one synchronisation per tensor and version


def per_version(value, key, make=None):
    """make(value, key) (key(value) without make), computed once per torch tensor object,
    version (its counter of in-place changes) and key; forgotten when the tensor dies."""
    entry = (id(value), key)
    with _per_version_lock:
        cached = _per_version.get(entry)
    if cached is not None and cached[0] == value._version:
        return cached[1]
    result = key(value) if make is None else make(value, key)
    with _per_version_lock:
        if entry not in _per_version:
            weakref.finalize(value, _per_version.pop, entry, None)
        _per_version[entry] = (value._version, result)
    return result


def first_overlap(tensors: list, first: int):
    """(i, j), i < first and i < j, of the first two tensors (all of one kind) that may share
    memory, or None."""
    if isinstance(tensors[0], np.ndarray):
        # telling owners apart (~0.15 us a tensor) pays where there are more pairs than tensors
        pairs = first * len(tensors) - first * (first + 1) // 2
        owners = [_own_allocation(t) for t in tensors] if pairs > len(tensors) else None
        for i in range(first):
            for j in range(i + 1, len(tensors)):
                if owners and owners[i] is not None and owners[j] is not None and owners[i] is not owners[j]:
                    continue  # two live allocations of numpy's own: disjoint
                if np.may_share_memory(tensors[i], tensors[j]):  # bounds only, but ~0.35 us a pair
                    return i, j
        return None
    ranges = [_torch_range(t) for t in tensors]  # each tensor's byte range, once
    for i in range(first):
        start, end, device = ranges[i]
        for j in range(i + 1, len(ranges)):
            other = ranges[j]
            if start < other[1] and other[0] < end and device == other[2]:
                return i, j
    return None


def _own_allocation(array: np.ndarray):
    """The ndarray whose own allocation holds `array`'s elements (numpy points a view's base
    at the array owning its memory), or None where the memory is another object's: a bytes
    buffer, a memory map, a torch tensor, a C library's."""
    owner = array if array.base is None else array.base
    return owner if isinstance(owner, np.ndarray) and owner.flags.owndata else None


def _torch_range(t) -> tuple:
    """(first byte, one past the last byte, device) of a torch tensor's elements."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.nbytes, t.device
    size = t.element_size()
    if t.numel() == 0:
        return start, start, t.device
    low = sum(min(0, (n - 1) * s) for n, s in zip(t.shape, t.stride()))
    high = sum(max(0, (n - 1) * s) for n, s in zip(t.shape, t.stride()))
    return start + low * size, start + (high + 1) * size, t.device
