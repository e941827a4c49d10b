"""The repeated-call path: one full check per call signature, every bad input still caught,
a bounded and thread-safe cache, and no host synchronisation on CUDA."""

import concurrent.futures as cf
import os

import numpy as np
import pytest

import tvm_ops
from tvm_ops import checks, runner, targets
from tvm_ops.invocation import CallCache
from tvm_ops.ops import NAMES, get
from tvm_ops.testing import material

from .conftest import gpu_skip_reason, requires_torch


def first_ok(op):
    return next(c for c in op.spec.cases if c.expect == "ok" and not c.heavy and all(c.shape.values()))


def generated(op, case, dtype="float32"):
    return material(op).make_inputs(case, dtype, runner.case_rng(op.name, case.name, dtype))


@pytest.fixture
def check_count(monkeypatch):
    counted = []
    real = checks.check
    monkeypatch.setattr(checks, "check", lambda *a, **k: counted.append(1) or real(*a, **k))
    return counted


@pytest.mark.parametrize("name", NAMES)
def test_a_repeated_call_runs_the_checks_once_and_gives_the_same_result(name, check_count):
    op = get(name)
    op.clear_call_cache()
    inputs, params = generated(op, first_ok(op))
    first = op.call(inputs, params, "llvm", {})
    first = first if isinstance(first, tuple) else (first,)
    out = {t.name: np.full_like(v, np.nan if v.dtype.kind == "f" else -7) for t, v in zip(op.spec.outputs, first)}
    for _ in range(5):
        again = op.call(inputs, params, "llvm", {})
        op.call(inputs, params, "llvm", out)
        for a, b, c in zip(first, again if isinstance(again, tuple) else (again,), out.values()):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)
    assert len(check_count) == 2  # one signature without out=, one with


@pytest.mark.parametrize("name", NAMES)
def test_bad_cases_still_raise_after_a_good_call(name):
    op = get(name)
    inputs, params = generated(op, first_ok(op))
    op.call(inputs, params, "llvm", {})
    for case in op.spec.cases:
        if case.expect == "ok" or case.heavy:
            continue
        bad_inputs, bad_params = generated(op, case)
        for _ in range(2):  # the second time the signature has been seen (and was refused)
            with pytest.raises(tvm_ops.OpError) as raised:
                op.call(bad_inputs, bad_params, "llvm", {})
            assert raised.value.status == case.expect


def test_bad_values_with_the_same_shapes_still_raise():
    op = get("ms_deform_attn_backward")
    inputs, params = generated(op, first_ok(op))
    op.call(inputs, params, "llvm", {})
    wrong = dict(inputs, spatial_shapes=inputs["spatial_shapes"] + np.int32(1))
    with pytest.raises(tvm_ops.BadParamError, match=r"sum\(h\*w\)"):
        op.call(wrong, params, "llvm", {})
    op.call(inputs, params, "llvm", {})  # and the good values still run


def test_a_changed_parameter_or_given_output_is_a_new_signature(check_count):
    op = get("three_interpolate_backward")
    op.clear_call_cache()
    inputs, params = generated(op, first_ok(op))
    op.call(inputs, params, "llvm", {})
    with pytest.raises(tvm_ops.BadParamError):
        op.call(inputs, dict(params, m=-1), "llvm", {})
    ro = op.call(inputs, params, "llvm", {})
    ro.flags.writeable = False  # a read-only out= buffer has another signature than a writable one
    op.call(inputs, params, "llvm", {"grad_features": np.empty_like(ro)})
    assert len(check_count) == 3


def test_clear_call_cache_forgets_every_signature(check_count):
    op = get("three_interpolate_backward")
    inputs, params = generated(op, first_ok(op))
    tvm_ops.clear_call_cache()
    op.call(inputs, params, "llvm", {})
    op.call(inputs, params, "llvm", {})
    tvm_ops.clear_call_cache()
    assert len(op._calls) == 0
    op.call(inputs, params, "llvm", {})
    assert len(check_count) == 2


def test_the_cache_is_bounded(monkeypatch):
    op = get("three_interpolate_backward")
    op.clear_call_cache()
    monkeypatch.setattr(op._calls, "size", 8)
    rng = np.random.default_rng(0)
    for m in range(1, 20):
        op.call({"grad_output": rng.uniform(size=(1, 2, 3)).astype(np.float32),
                 "indices": rng.integers(0, m, (1, 3, 3)).astype(np.int32),
                 "weights": rng.uniform(size=(1, 3, 3)).astype(np.float32)}, {"m": m}, "llvm", {})
    assert len(op._calls) == 8


def test_the_cache_forgets_the_least_recently_used_signature():
    cache = CallCache(3)
    plans = {name: object() for name in "abcde"}
    for name in "abc":
        cache.put(name, plans[name])
    assert cache.get("a") is plans["a"] and cache.get("a") is plans["a"]  # the second: already the latest
    cache.put("d", plans["d"])  # b is the least recent now
    assert cache.get("b") is None and cache.get("a") is plans["a"]
    cache.get("c")
    cache.get("d")
    cache.put("e", plans["e"])  # a, used before c and d
    assert [cache.get(name) for name in "acde"] == [None, plans["c"], plans["d"], plans["e"]]


def test_threads_with_different_signatures_agree_with_one_thread():
    op = get("three_interpolate_backward")
    rng = np.random.default_rng(1)
    problems = []
    for i in range(12):
        b, c, n, m = 1 + i % 3, 2 + i % 5, 4 + i, 3 + i % 4
        problems.append(({"grad_output": rng.uniform(-1, 1, (b, c, n)).astype(np.float32),
                          "indices": rng.integers(0, m, (b, n, 3)).astype(np.int32),
                          "weights": rng.uniform(0, 1, (b, n, 3)).astype(np.float32)}, {"m": m}))
    op.clear_call_cache()
    alone = [op.call(i, p, "llvm", {}) for i, p in problems]
    op.clear_call_cache()
    with cf.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            together = list(pool.map(lambda ip: op.call(ip[0], ip[1], "llvm", {}), problems * 4))
            for a, b in zip(alone * 4, together):
                np.testing.assert_array_equal(a, b)


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def test_reused_workspaces_carry_nothing_from_one_call_to_the_next():
    """A plan's small host workspaces are reused by its next call on the same thread: what
    the last call left in them (here every byte overwritten) changes no result."""
    reusing = []
    host = targets.host_cpu()
    for name in NAMES:
        op = get(name)
        op.clear_call_cache()
        plan = op.plan(host, op.schedules["llvm"].defaults)
        for case in op.spec.cases:
            if case.expect != "ok" or case.heavy or not all(case.shape.values()):
                continue
            inputs, params = generated(op, case)
            if not op.workspaces(checks.check(op.spec, inputs, params, {}, op.rules), plan):
                continue  # no workspace to reuse: no need to run it
            first = as_tuple(op.call(inputs, params, "llvm", {}))
            call_plan = op._calls.get(op._signature(inputs, params, "llvm", {}))
            if not call_plan.reuses_workspaces:
                continue
            reusing.append(name)
            held = call_plan._workspaces()
            assert call_plan._workspaces() is held
            for fill in (0xFF, 0x7F, 0x00):
                for view in held.values():  # numpy views, or TVM tensors for the kernels alone
                    np.from_dlpack(view).reshape(-1).view(np.uint8).fill(fill)
                for a, b in zip(first, as_tuple(op.call(inputs, params, "llvm", {})), strict=True):
                    np.testing.assert_array_equal(a, b, err_msg=f"{name} {case.name} after bytes {fill:#x}")
    # dynamic_scatter_forward's radix grouping, dynamic_scatter_backward's max
    assert {"dynamic_scatter_forward", "dynamic_scatter_backward"} <= set(reusing)


def test_workspaces_only_kernels_take_are_held_as_tvm_tensors_of_the_block():
    op = get("dynamic_scatter_forward")
    op.clear_call_cache()
    rng = np.random.default_rng(5)
    inputs = {"feats": rng.uniform(-1, 1, (300, 8)).astype(np.float32),
              "coors": rng.integers(-1, 9, (300, 3)).astype(np.int32)}
    first = op.call(inputs, {"reduce_type": "sum"}, "llvm", {})
    held = op._calls.get(op._signature(inputs, {"reduce_type": "sum"}, "llvm", {}))._workspaces()
    assert isinstance(held["count"], np.ndarray)  # read on the host
    kernel_only = [name for name, view in held.items() if not isinstance(view, np.ndarray)]
    assert "order" in kernel_only and "start" in kernel_only
    block = held["count"].base  # the carved block
    for name in kernel_only:  # the same block's memory
        assert np.shares_memory(np.from_dlpack(held[name]), block)
    for a, b in zip(first, op.call(inputs, {"reduce_type": "sum"}, "llvm", {}), strict=True):
        np.testing.assert_array_equal(a, b)


def test_threads_sharing_a_plan_with_workspaces_agree_with_one_thread():
    op = get("dynamic_scatter_forward")
    rng = np.random.default_rng(2)
    problems = [({"feats": rng.uniform(-1, 1, (600, 16)).astype(np.float32),
                  "coors": rng.integers(-1, 6, (600, 3)).astype(np.int32)}, {"reduce_type": reduce})
                for reduce in ("max", "sum", "mean") for _ in range(3)]
    op.clear_call_cache()
    alone = [op.call(i, p, "llvm", {}) for i, p in problems]
    with cf.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            together = list(pool.map(lambda ip: op.call(ip[0], ip[1], "llvm", {}), problems * 4))
            for a, b in zip(alone * 4, together):
                for x, y in zip(a, b, strict=True):
                    np.testing.assert_array_equal(x, y)


@requires_torch
def test_torch_tensors_take_the_same_path():
    import torch

    op = get("border_align_backward")
    inputs, params = generated(op, first_ok(op))
    expected = op.call(inputs, params, "llvm", {})
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    for _ in range(3):
        np.testing.assert_array_equal(op.call(tensors, params, "llvm", {}).numpy(), expected)


@requires_torch
def test_a_tensor_subclass_defined_anywhere_is_a_torch_tensor():
    import torch

    class Tagged(torch.Tensor):  # defined outside torch's modules
        pass

    op = get("three_interpolate_forward")
    inputs, params = generated(op, first_ok(op))
    expected = op.call(inputs, params, "llvm", {})
    tensors = {k: torch.from_numpy(v).as_subclass(Tagged) for k, v in inputs.items()}
    out = op.call(tensors, params, "llvm", {})
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), expected)


@requires_torch
def test_a_torch_call_on_the_cpu_has_tvms_workers_sleep_between_kernels(monkeypatch):
    """torch callers' kernels take turns with torch's own parallel ops: TVM's workers must not
    spin between kernels there (targets.sleep_workers_between_kernels); numpy callers keep
    TVM's spinning workers, and a value the caller set wins."""
    import torch

    from tvm_ops import targets

    op = get("three_interpolate_backward")
    inputs, params = generated(op, first_ok(op))
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    monkeypatch.delenv(targets.SPIN_ENV, raising=False)
    op.clear_call_cache()
    op.call(inputs, params, "llvm", {})
    assert targets.SPIN_ENV not in os.environ
    op.call(tensors, params, "llvm", {})
    assert os.environ[targets.SPIN_ENV] == "0"
    monkeypatch.setenv(targets.SPIN_ENV, "1000")
    op.clear_call_cache()
    op.call(tensors, params, "llvm", {})
    assert os.environ[targets.SPIN_ENV] == "1000"


@requires_torch
def test_no_device_to_host_copy_in_a_repeated_cuda_call():
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    for name in NAMES:
        op = get(name)
        if op.spec.counted:
            continue  # reading its data-dependent output sizes is the call's one synchronisation
        inputs, params = generated(op, first_ok(op))
        tensors = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
        first = op.call(tensors, params, "cuda", {})
        outs = first if isinstance(first, tuple) else (first,)
        out = dict(zip((t.name for t in op.spec.outputs), outs))
        op.call(tensors, params, "cuda", out)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            op.call(tensors, params, "cuda", out)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def _on_gpus(monkeypatch, indices: dict):
    """describe() reporting the named torch tensors as CUDA tensors on those GPU indices (the
    checks read only metadata, so a machine without GPUs can see what they decide)."""
    import dataclasses

    from tvm_ops import interop

    real = interop.describe
    monkeypatch.setattr(interop, "describe", lambda name, value: dataclasses.replace(
        real(name, value), device="cuda", device_index=indices[name]) if name in indices else real(name, value))


@requires_torch
def test_outputs_are_made_on_the_inputs_gpu_and_two_gpus_are_refused(monkeypatch):
    import torch

    from tvm_ops import interop

    op = get("three_interpolate_backward")
    inputs, params = generated(op, first_ok(op))
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    _on_gpus(monkeypatch, dict.fromkeys(tensors, 1))
    problem = checks.check(op.spec, tensors, params, {}, op.rules)
    assert (problem.device, problem.where) == ("cuda", "cuda:1")  # not the current device, whichever
    make = interop.allocator(problem.kind, problem.where, (4, 3), "float32", zero=False)
    assert make.keywords["device"] == torch.device("cuda", 1)
    _on_gpus(monkeypatch, dict(dict.fromkeys(tensors, 1), weights=0))
    with pytest.raises(tvm_ops.BadParamError, match="weights is a torch tensor on cuda:0 but grad_output is a torch "
                                                    "tensor on cuda:1"):
        checks.check(op.spec, tensors, params, {}, op.rules)
    monkeypatch.undo()
    assert checks.check(op.spec, tensors, params, {}, op.rules).where == "cpu"


@requires_torch
def test_a_call_on_a_gpu_other_than_the_current_one_runs_there():
    import torch

    reason = gpu_skip_reason()
    if reason or torch.cuda.device_count() < 2:
        pytest.skip(reason or "one CUDA GPU visible (this test needs two)")
    for name in NAMES:
        op = get(name)
        inputs, params = generated(op, first_ok(op))
        on = {i: {k: torch.from_numpy(v).to(f"cuda:{i}") for k, v in inputs.items()} for i in (0, 1)}
        with torch.cuda.device(0):
            results = [op.call(on[i], params, "cuda", {}) for i in (0, 1)]
            mixed = dict(on[1], **{next(iter(on[0])): next(iter(on[0].values()))})
            with pytest.raises(tvm_ops.BadParamError, match="pass all tensors of one kind and device"):
                op.call(mixed, params, "cuda", {})
        results = [r if isinstance(r, tuple) else (r,) for r in results]
        for a, b in zip(*results):
            assert b.device == torch.device("cuda", 1)
            torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_the_overhead_bench_reports_every_call_kind(name):
    from tvm_ops import overhead

    line = overhead.overhead(get(name), calls=20, blocks=2, peer=False)
    assert line.kernels_us > 0 and set(line.calls_us) == set(line.host_us)
    assert {"numpy out=", "numpy"} <= set(line.calls_us)
    assert all(0 < line.host_us[k] for k in line.calls_us)


def test_an_out_buffer_that_aliases_an_input_is_refused():
    op = get("ms_deform_attn_backward")
    inputs, params = generated(op, first_ok(op))
    for _ in range(2):  # the checked call and the repeated one
        with pytest.raises(tvm_ops.BadParamError, match="shares memory with value"):
            tvm_ops.ms_deform_attn_backward(**inputs, **params, out=(inputs["value"], None, None))
    # two outputs that share one element
    value_shape, attn_shape = inputs["value"].shape, inputs["attn_weight"].shape
    n_value, n_attn = int(np.prod(value_shape)), int(np.prod(attn_shape))
    buffer = np.empty(n_value + n_attn, np.float32)
    grad_value = buffer[:n_value].reshape(value_shape)
    grad_attn = buffer[n_value - 1:n_value - 1 + n_attn].reshape(attn_shape)
    with pytest.raises(tvm_ops.BadParamError, match="out\\['grad_value'\\] shares memory with grad_attn_weight"):
        tvm_ops.ms_deform_attn_backward(**inputs, **params, out=(grad_value, None, grad_attn))


def test_overlaps_are_found_whoever_owns_the_memory():
    from tvm_ops.interop import first_overlap

    owner, buffer = np.zeros(64, np.float32), bytearray(256)
    on_bytes, again_on_bytes = np.frombuffer(buffer, np.float32), np.frombuffer(buffer, np.float32)
    assert first_overlap([owner[:8], owner[4:12]], 1) == (0, 1)
    assert first_overlap([owner[:8].reshape(2, 4), owner[::7]], 1) == (0, 1)
    assert first_overlap([on_bytes[:8], again_on_bytes[6:9]], 1) == (0, 1)  # one buffer, two arrays
    assert first_overlap([np.zeros(8), owner[:8], on_bytes[:8], np.ones(3), owner[8:]], 2) is None
    assert first_overlap([np.zeros(8), owner[:8], np.ones(3), on_bytes[1:], owner[7:9]], 2) == (1, 4)


@requires_torch
def test_an_overlap_through_a_torch_tensor_is_found():
    import torch
    from tvm_ops.interop import first_overlap

    shared = torch.zeros(16)
    assert first_overlap([shared.numpy()[:4], shared.numpy()[3:]], 1) == (0, 1)
    assert first_overlap([np.zeros(4), shared.numpy()[:4], np.zeros(2), shared.numpy()[3:]], 2) == (1, 3)


@pytest.mark.parametrize("value", [2**31, 2**32 + 10, 2**40])
def test_integer_parameters_beyond_int32_are_refused(value):
    op = get("border_align_backward")
    inputs, params = generated(op, first_ok(op))
    with pytest.raises(tvm_ops.BadParamError, match="must be <= 2147483647"):
        op.call(inputs, dict(params, pool_size=value), "llvm", {})
