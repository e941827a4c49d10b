"""Reused host memory for large numpy outputs (and large CPU torch ones, as views).

glibc serves blocks above its mmap threshold (at most 32 MiB) with a fresh
mmap on every call and unmaps them on free, so a new 41 MB output costs a page
fault per page and the kernel zeroes every page before the op writes it: on
the Deformable-DETR decoder case that was ~30% of a call (7.3 -> 5.0 ms
measured, same process). Smaller blocks glibc already reuses.

This keeps such blocks when their arrays die and hands them out again for the
next output of the same byte size, like PyTorch's CUDA caching allocator. A block
goes back only when no array or view of it is alive (a weak reference on the
ctypes object every view keeps as its base), so two live outputs never share
memory. Blocks are private mappings: a forked child's copy of an output is its own
(copy on write), and a child starts with no free blocks. Reused memory is not
zeroed: the CPU kernels write every element of their outputs (np.empty gives no
zeros either), and outputs that must start at zero are allocated with np.zeros,
never from here.

A large uninitialised CPU torch output is `torch.from_numpy` of such an array
(interop.empty_like_kind): PyTorch's CPU allocator maps a fresh block for each large
tensor too (67 ms of page faults for the 303 MB gradient of a voxel_pooling training
step). The tensor keeps the array alive, so the block comes back when the tensor dies;
its storage cannot be resized.

Free blocks are kept up to $TVM_OPS_HOST_CACHE_MB (default 1024; 0 turns the
cache off), those of the sizes given back longest ago dropped first to make room;
`release()` drops them all.

Every output of ALIGN_MIN_BYTES or more starts on a cache line (LINE_BYTES), as
PyTorch's CPU tensors do (numpy's large arrays start 16 bytes into one): CPU kernels
whose threads own neighbouring column blocks of an output (border_align_backward)
would otherwise share the boundary lines between cores, which cost that op ~30%.
Smaller outputs are plain np.empty: aligning one costs ~1 us of a call's host time,
more than such an output can lose to a shared line. Workspaces are always aligned
(`line_aligned`): a meta_schedule kernel may vectorise over them with aligned moves,
since TVM declares every buffer parameter 64-byte aligned.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
import threading
import weakref

import numpy as np

from . import forked

# Below this glibc reuses freed blocks itself (its mmap threshold stops growing at 32 MiB).
MIN_BYTES = 32 << 20
# outputs start on a multiple of this (a cache line)
LINE_BYTES = 64
# from this size on
ALIGN_MIN_BYTES = 64 << 10
# numpy dtypes by name: a lookup where np.dtype(name) parses (it runs per output of a call)
DTYPES = {name: np.dtype(name) for name in ("float16", "float32", "float64", "int8", "int32", "int64", "uint8")}

# re-entrant: _give_back is a finalizer and may run inside a garbage collection anywhere,
# this module included (nothing under the lock creates an object that could start one)
_lock = threading.RLock()
_free: dict[int, list[mmap.mmap]] = {}  # byte size -> its unused blocks (never none), least recent size first
_free_bytes = 0


def _start_afresh_in_child() -> None:
    global _lock, _free_bytes
    _lock = threading.RLock()  # another thread of the parent may have held it at the fork
    _free.clear()  # the parent's free blocks: copies the child need not keep
    _free_bytes = 0


forked.reset_in_child(_start_afresh_in_child)


def limit_bytes() -> int:
    """How many bytes of free blocks are kept ($TVM_OPS_HOST_CACHE_MB)."""
    raw = os.environ.get("TVM_OPS_HOST_CACHE_MB", "1024")
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = math.nan
    if not math.isfinite(megabytes):
        from .errors import BadParamError

        raise BadParamError(f"TVM_OPS_HOST_CACHE_MB must be a number of MiB (0 turns the cache off), got {raw!r}")
    return max(0, int(megabytes * (1 << 20)))


def dtype_of(dtype) -> np.dtype:
    """The numpy dtype of a name (or of a dtype)."""
    return DTYPES.get(dtype) or np.dtype(dtype)


def reused(shape: tuple, dtype) -> bool:
    """Whether empty() takes an array of this shape and dtype from the reused blocks."""
    return _reuses(math.prod(shape) * dtype_of(dtype).itemsize)


def _reuses(nbytes: int) -> bool:
    return nbytes >= MIN_BYTES and limit_bytes() > 0


def empty(shape: tuple, dtype, line_aligned: bool = False) -> np.ndarray:
    """An uninitialised C-contiguous array, starting on a cache line unless it is small (or
    always, with line_aligned), from a reused block when it is large."""
    dtype = dtype_of(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < ALIGN_MIN_BYTES and nbytes < MIN_BYTES and not line_aligned:
        return np.empty(shape, dtype)
    if not _reuses(nbytes):
        return _on_a_line(shape, dtype, nbytes)
    block = _take(nbytes)
    if block is None:
        # page-aligned, anonymous and private (Python's default, MAP_SHARED, would leave a
        # forked child writing into the parent's outputs)
        block = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            block.madvise(mmap.MADV_HUGEPAGE)  # as numpy does for its large blocks
    owner = (ctypes.c_char * nbytes).from_buffer(block)
    # every view of the array keeps `owner` alive; when the last one dies the block is free
    weakref.finalize(owner, _give_back, block).atexit = False
    return np.frombuffer(owner, dtype).reshape(shape)


def allocator(shape: tuple, dtype):
    """A no-argument callable returning empty(shape, dtype), its size tests made once (a call
    plan allocates its outputs of one shape and dtype on every call)."""
    dtype = dtype_of(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < min(ALIGN_MIN_BYTES, MIN_BYTES):
        return functools.partial(np.empty, shape, dtype)
    if nbytes < MIN_BYTES:
        return functools.partial(_on_a_line, shape, dtype, nbytes)
    return functools.partial(empty, shape, dtype)  # reads the cache's limit on every call


def _on_a_line(shape: tuple, dtype: np.dtype, nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + LINE_BYTES, np.uint8)
    # ctypes.addressof rather than raw.ctypes.data (which builds a helper object: ~1 us
    # more), one constructor rather than a slice, a view and a reshape
    start = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % LINE_BYTES
    return np.ndarray(shape, dtype, raw, start)


def line_aligned(value):
    """A numpy array copied to start on a cache line (as PyTorch's CPU tensors and TVM's
    buffers do; numpy's large arrays start 16 bytes into one), or `value` itself when it
    already does or is no numpy array."""
    if not isinstance(value, np.ndarray) or value.ctypes.data % LINE_BYTES == 0:
        return value
    aligned = empty(value.shape, value.dtype, line_aligned=True)
    aligned[...] = value
    return aligned


def cached_bytes() -> int:
    """Bytes held in free blocks now."""
    return _free_bytes


def release() -> None:
    """Drop every free block (their memory returns to the OS)."""
    global _free_bytes
    with _lock:
        _free.clear()
        _free_bytes = 0


def _take(nbytes: int):
    global _free_bytes
    with _lock:
        blocks = _free.get(nbytes)
        if not blocks:
            return None
        _free_bytes -= nbytes
        block = blocks.pop()
        if not blocks:
            del _free[nbytes]  # a size with no free block is forgotten (sizes come and go)
        return block


def _give_back(block: mmap.mmap) -> None:
    # Runs while the last owner is being freed, so the block is still exported to it:
    # a block larger than the limit is simply not kept (closing it here would raise); it is
    # unmapped when its last reference goes. To keep one within the limit, the free blocks
    # of the sizes given back longest ago are dropped first (a block of a size no call asks
    # for again, e.g. an output of a data-dependent or a per-image size, would otherwise hold
    # its place for good). Whatever may allocate runs before the lock: a garbage collection
    # started under it could run this finalizer again in the middle of its update.
    global _free_bytes
    nbytes = len(block)
    try:
        limit = limit_bytes()
    except ValueError:  # a bad setting, reported by the next large output's call
        return
    fresh: list = []  # the size's list, should it have none
    oldest_first = list(_free)  # the sizes, least recently given back first
    with _lock:
        blocks = _free.pop(nbytes, fresh)  # out of the order: back in as the most recent, if kept
        if nbytes <= limit:
            i = 0
            while _free_bytes + nbytes > limit and i < len(oldest_first):
                size = oldest_first[i]
                victims = _free.get(size)  # (nbytes was taken out above: never its own)
                if victims:
                    victims.pop()  # unmapped as its last reference goes (free: no view of it is alive)
                    _free_bytes -= size
                    if not victims:
                        del _free[size]
                else:
                    i += 1
            if _free_bytes + nbytes <= limit:
                blocks.append(block)
                _free_bytes += nbytes
        if blocks:
            _free[nbytes] = blocks
