"""The reused host blocks behind large numpy outputs (tvm_ops/host_buffers.py)."""

import gc

import numpy as np
import pytest

from tvm_ops import host_buffers, runner, targets
from tvm_ops.testing import material

from .conftest import requires_torch
from .test_spec_cases import FIRST_OK

SMALL = 4096  # bytes: the tests lower the size threshold so small arrays use the cache


@pytest.fixture
def cache(monkeypatch):
    monkeypatch.setattr(host_buffers, "MIN_BYTES", SMALL)
    monkeypatch.setenv("TVM_OPS_HOST_CACHE_MB", "1")
    host_buffers.release()
    yield host_buffers
    host_buffers.release()


def address(array) -> int:
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize("shape", [(3,), (25, 38, 100), (1 << 20,)])
@pytest.mark.parametrize("make", ["empty", "allocator"])
def test_outputs_start_on_a_cache_line(shape, make):
    # medium ones from numpy, large ones from the reused blocks: both on a 64-byte boundary;
    # tiny ones are plain np.empty; a call plan's allocator gives what empty gives
    if make == "empty":
        array = host_buffers.empty(shape, np.float32)
    else:
        array = host_buffers.allocator(shape, np.float32)()
    if array.nbytes >= host_buffers.ALIGN_MIN_BYTES:
        assert address(array) % host_buffers.LINE_BYTES == 0
    assert array.shape == shape and array.flags.c_contiguous and array.flags.writeable


def test_a_dead_array_block_is_reused(cache):
    first = cache.empty((32, 64), np.float32)
    where = address(first)
    assert first.shape == (32, 64) and first.dtype == np.float32 and first.flags.writeable
    del first
    gc.collect()
    assert cache.cached_bytes() == 32 * 64 * 4
    again = cache.empty((64, 32), np.float32)  # same byte size, another shape
    assert address(again) == where and cache.cached_bytes() == 0


def test_a_live_view_keeps_its_block_out_of_the_cache(cache):
    first = cache.empty((1024,), np.float64)
    view = first[10:20]
    view[:] = 5.0
    del first
    gc.collect()
    other = cache.empty((1024,), np.float64)
    assert cache.cached_bytes() == 0
    assert not np.shares_memory(other, view)
    other[:] = -1.0
    assert (view == 5.0).all()


def test_free_blocks_stay_under_the_limit(cache, monkeypatch):
    monkeypatch.setenv("TVM_OPS_HOST_CACHE_MB", str(3 * SMALL / (1 << 20)))
    arrays = [cache.empty((SMALL // 4,), np.float32) for _ in range(5)]
    del arrays
    gc.collect()
    assert cache.cached_bytes() == 3 * SMALL
    cache.release()
    assert cache.cached_bytes() == 0


def test_a_new_size_displaces_the_sizes_given_back_longest_ago(cache, monkeypatch):
    """Over the limit, the free blocks of the least recently given back sizes go first (an
    output of a size no call asks for again must not hold the cache for good); a block larger
    than the whole limit is not kept and displaces nothing."""
    monkeypatch.setenv("TVM_OPS_HOST_CACHE_MB", str(3 * SMALL / (1 << 20)))
    other = SMALL + 1024  # bytes: another size
    old = [cache.empty((SMALL // 4,), np.float32) for _ in range(2)]
    del old
    gc.collect()
    assert cache.cached_bytes() == 2 * SMALL
    new = cache.empty((other // 4,), np.float32)
    where = address(new)
    del new
    gc.collect()
    assert cache.cached_bytes() == SMALL + other  # one old block dropped to keep the new size
    huge = cache.empty((SMALL,), np.float32)  # 4 * SMALL bytes: over the limit on its own
    del huge
    gc.collect()
    assert cache.cached_bytes() == SMALL + other
    again = cache.empty((other // 4,), np.float32)
    assert address(again) == where and cache.cached_bytes() == SMALL
    assert address(cache.empty((SMALL // 4,), np.float32)) != where and cache.cached_bytes() == 0


def test_sizes_without_a_free_block_are_forgotten(cache, monkeypatch):
    """The free list holds only sizes with a block: a size not kept (over the limit), taken
    again or displaced leaves no entry behind (data-dependent sizes would pile up)."""
    monkeypatch.setenv("TVM_OPS_HOST_CACHE_MB", str(2 * SMALL / (1 << 20)))
    huge = cache.empty((SMALL,), np.float32)  # 4 * SMALL bytes: over the limit on its own
    del huge
    gc.collect()
    assert list(cache._free) == []
    first = cache.empty((SMALL // 4,), np.float32)
    del first
    gc.collect()
    assert list(cache._free) == [SMALL]
    taken = cache.empty((SMALL // 4,), np.float32)
    assert list(cache._free) == []
    bigger = cache.empty(((SMALL + 1024) // 4,), np.float32)
    del taken
    gc.collect()
    del bigger  # SMALL + 1024 more bytes than the limit allows beside SMALL: SMALL's block goes
    gc.collect()
    assert list(cache._free) == [SMALL + 1024]


def test_limit_zero_turns_the_cache_off(cache, monkeypatch):
    monkeypatch.setenv("TVM_OPS_HOST_CACHE_MB", "0")
    array = cache.empty((SMALL,), np.float32)
    assert isinstance(array.base, np.ndarray)  # numpy's own memory, not a cached block
    del array
    gc.collect()
    assert cache.cached_bytes() == 0


@pytest.mark.parametrize("limit", ["lots", "inf", "nan", ""])
def test_a_bad_limit_is_a_clear_error(cache, monkeypatch, limit):
    from tvm_ops import BadParamError

    monkeypatch.setenv("TVM_OPS_HOST_CACHE_MB", limit)
    with pytest.raises(BadParamError, match="TVM_OPS_HOST_CACHE_MB must be a number of MiB"):
        cache.empty((SMALL,), np.float32)


@requires_torch
def test_a_torch_tensor_over_the_array_keeps_the_block(cache):
    import torch

    array = cache.empty((SMALL,), np.float32)
    tensor = torch.from_numpy(array)
    del array
    gc.collect()
    assert cache.cached_bytes() == 0
    del tensor
    gc.collect()
    assert cache.cached_bytes() == SMALL * 4


@pytest.mark.parametrize("op, case", FIRST_OK, ids=[o.name for o, _ in FIRST_OK])
def test_outputs_on_reused_poisoned_blocks_are_right(cache, monkeypatch, op, case):
    # every output and workspace comes from the cache (threshold 1 byte), on blocks
    # filled with 0xff bytes (NaN floats, -1 ints): the kernels must overwrite every
    # element, exactly as on fresh memory
    monkeypatch.setattr(host_buffers, "MIN_BYTES", 1)
    taken = []
    take = host_buffers._take
    monkeypatch.setattr(host_buffers, "_take", lambda n: taken.append(take(n)) or taken[-1])
    dtype = case.dtypes[0]
    model = targets.resolve("llvm")
    inputs, params = material(op).make_inputs(case, dtype, runner.case_rng(op.name, case.name, dtype))
    reference = material(op).reference(inputs, params)
    op.call(inputs, params, model, {})  # its outputs die at once: their blocks are cached
    gc.collect()
    for blocks in host_buffers._free.values():
        for block in blocks:
            block[:] = b"\xff" * len(block)
    taken.clear()
    again = op.call(inputs, params, model, {})
    again = again if isinstance(again, tuple) else (again,)
    assert any(block is not None for block in taken), "no block was reused"
    _, failures = runner.compare(op, dtype, dict(zip([t.name for t in op.spec.outputs], again)), reference)
    assert not failures, failures


@pytest.mark.parametrize("kind", ["numpy", pytest.param("torch", marks=requires_torch)])
def test_workspaces_are_disjoint_line_aligned_views_of_one_block(kind):
    """Whatever the caller's kind, a CPU call's workspaces are numpy views (no caller sees
    them; a torch view costs ~1 us each, numpy's ~0.2)."""
    from tvm_ops import interop

    specs = {"a": ((5,), "int32"), "b": ((3, 7), "int64"), "empty": ((0,), "int32"), "c": ((17,), "float32")}
    views = interop.carved(kind, "cpu", interop.block_layout(specs))
    spans = []
    for name, (shape, dtype) in specs.items():
        view = views[name]
        assert type(view) is np.ndarray, name
        assert view.shape == shape and view.dtype == np.dtype(dtype), name
        assert view.ctypes.data % host_buffers.LINE_BYTES == 0, name
        spans.append((view.ctypes.data, view.ctypes.data + view.nbytes))
        view[...] = 7  # every element writable
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no two overlap


def test_no_workspace_allocates_nothing(monkeypatch):
    """An operator without workspaces gets an empty dict of views and no block allocated."""
    from tvm_ops import interop

    def refuse(*args, **kwargs):
        raise AssertionError("a block was allocated for no workspace")

    monkeypatch.setattr(interop, "empty_like_kind", refuse)
    assert interop.carved("numpy", "cpu", interop.block_layout({})) == {}



@requires_torch
def test_a_large_torch_cpu_output_reuses_a_dead_outputs_block(cache):
    """Large uninitialised CPU torch outputs are views of the reused blocks (PyTorch maps a
    fresh block per large tensor: a page fault per page); zeroed ones are torch's own."""
    import torch

    from tvm_ops import interop

    first = interop.empty_like_kind("torch", "cpu", (32, 64), "float32", zero=False)
    assert type(first) is torch.Tensor and first.dtype == torch.float32 and first.shape == (32, 64)
    where = first.data_ptr()
    del first
    gc.collect()
    assert cache.cached_bytes() == 32 * 64 * 4
    again = interop.empty_like_kind("torch", "cpu", (64, 32), "float32", zero=False)
    assert again.data_ptr() == where and cache.cached_bytes() == 0
    zeros = interop.empty_like_kind("torch", "cpu", (64, 32), "float32", zero=True)
    assert not zeros.any() and cache.cached_bytes() == 0
    small = interop.empty_like_kind("torch", "cpu", (SMALL // 8,), "float32", zero=False)
    del small
    gc.collect()
    assert cache.cached_bytes() == 0  # below the threshold: torch's own memory


@requires_torch
def test_a_large_strided_torch_input_is_copied_into_a_reused_block(cache):
    """A large strided CPU torch input (a sum loss's broadcast gradient) is made dense in a
    reused block, not in a fresh torch allocation that faults in every page; the call sees
    the same values either way."""
    import torch

    import tvm_ops
    from tvm_ops import interop

    broadcast = torch.tensor(0.5).expand(16, 64)  # every stride 0
    dense = interop.make_contiguous(broadcast)
    assert dense.is_contiguous() and bool((dense == 0.5).all())
    del dense
    gc.collect()
    assert cache.cached_bytes() == 16 * 64 * 4  # the copy's block came back to the cache
    rng = np.random.default_rng(4)
    idx = torch.from_numpy(rng.integers(0, 8, (2, 32, 3)).astype(np.int32))
    weight = torch.from_numpy(rng.uniform(0, 1, (2, 32, 3)).astype(np.float32))
    strided = torch.tensor(1.5).expand(2, 16, 32)
    got = tvm_ops.three_interpolate_backward(strided, idx, weight, 8)
    want = tvm_ops.three_interpolate_backward(strided.contiguous(), idx, weight, 8)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@requires_torch
def test_a_torch_call_returns_its_output_in_a_reused_block(cache):
    """Two calls on torch tensors: the second output lands in the first's block once that
    one is dead, and both hold the right values."""
    import torch

    import tvm_ops

    rng = np.random.default_rng(3)
    grad = torch.from_numpy(rng.standard_normal((2, 8, 16)).astype(np.float32))
    idx = torch.from_numpy(rng.integers(0, 64, (2, 16, 3)).astype(np.int32))
    weight = torch.from_numpy(rng.uniform(0, 1, (2, 16, 3)).astype(np.float32))
    first = tvm_ops.three_interpolate_backward(grad, idx, weight, 64)  # 4 KiB: from the cache
    expected, where = first.clone(), first.data_ptr()
    del first
    gc.collect()
    again = tvm_ops.three_interpolate_backward(grad, idx, weight, 64)
    assert again.data_ptr() == where
    torch.testing.assert_close(again, expected, rtol=0, atol=0)


@requires_torch
def test_torch_ops_with_outputs_in_reused_blocks_pass_opcheck(cache):
    """A torch custom op whose output is a view of a reused block (with the threshold
    lowered: the forward's 5 KiB output) still passes torch.library.opcheck and trains."""
    import torch

    from tvm_ops import functional

    idx = torch.randint(0, 6, (1, 20, 3), dtype=torch.int32)
    weight = torch.rand(1, 20, 3)
    features = torch.randn(1, 64, 6, requires_grad=True)
    torch.library.opcheck(torch.ops.tvm_ops.three_interpolate_forward.default, (features, idx, weight))
    torch.library.opcheck(torch.ops.tvm_ops.three_interpolate_backward.default,
                          (torch.randn(1, 64, 20), idx, weight, 6))
    functional.three_interpolate(features, idx, weight).square().sum().backward()
    assert features.grad.shape == (1, 64, 6) and torch.isfinite(features.grad).all()
