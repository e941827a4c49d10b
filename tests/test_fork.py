"""Calls in a forked child of a process that used the library (tvm_ops/forked.py): a torch
DataLoader worker, a fork multiprocessing pool. Each test forks; the child reports through
its exit status, and a child that hangs fails the test when its time is up."""

import os
import threading
import time

import numpy as np
import pytest

from tvm_ops import build, dispatch, forked, host_buffers, runner, targets
from tvm_ops.ops import get
from tvm_ops.testing import material

from .conftest import requires_torch

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
CHILD_SECONDS = 120  # a hung child is killed after this


def in_child(check) -> int:
    """Fork; the child runs check() (True: exit status 0) and leaves without running anything
    of the parent's; the parent waits at most CHILD_SECONDS and returns the status."""
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = bool(check())
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + CHILD_SECONDS
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {CHILD_SECONDS} s")


def parallel_case(name: str, case: str):
    """(function, its inputs) of a case the policy runs on every core in the parent."""
    op = get(name)
    spec_case = next(c for c in op.spec.cases if c.name == case)
    inputs, params = material(op).make_inputs(spec_case, "float32", runner.case_rng(op.name, case, "float32"))
    return op, inputs, params


def test_a_child_of_a_process_that_ran_parallel_kernels_gets_the_same_bits():
    # the parent's TVM thread pool has workers; the child's copy of it has none, so the
    # child runs one-core libraries (no pool): it must return, with the parent's bits
    op, inputs, params = parallel_case("three_interpolate_backward", "net_16x128x512_m256")
    model = targets.resolve("llvm")
    problem_runs_on_one_core = dispatch.runs_on_one_core(op, op._checked(inputs, params, "llvm", {}).problem, model)
    assert not problem_runs_on_one_core  # parallel in the parent
    expected = op.call(inputs, params, "llvm", {})

    def child():
        again = op.call(inputs, params, "llvm", {})
        return forked.in_child() and np.array_equal(again.view(np.int32), expected.view(np.int32))

    assert in_child(child) == 0
    assert not forked.in_child()


def test_a_child_forked_while_another_thread_builds_is_not_blocked(monkeypatch):
    # a thread inside a library's key (its sources hashed) and dispatch's lock at the fork:
    # the child's own calls must not wait for either
    op = get("three_nn")
    inside, release = threading.Event(), threading.Event()
    digest = build.source_digest

    def slow_digest(operator):
        inside.set()
        release.wait(30)
        return digest(operator)

    monkeypatch.setattr(build, "source_digest", slow_digest)
    variant = build.Variant(op, "float32", targets.resolve("llvm"), dict(op.schedules["llvm"].defaults), "test")
    with dispatch._lock:  # as a build holds it
        worker = threading.Thread(target=lambda: variant.key)
        worker.start()
        assert inside.wait(30)

        def child():
            other = build.Variant(op, "float32", targets.resolve("llvm"), dict(op.schedules["llvm"].defaults), "t")
            monkeypatch.setattr(build, "source_digest", digest)
            return bool(other.key) and dispatch._lock.acquire(timeout=5)

        status = in_child(child)
    release.set()
    worker.join(30)
    assert status == 0


def test_a_fork_waits_for_a_thread_importing_tvm_or_building():
    """A child forked in the middle of another thread's `import tvm` would find that module's
    import lock held for ever (measured: the child's first call hung); the fork waits for the
    guard that the import (forked.import_tvm) and every build (build.build_entry) hold."""
    holding, released_at = threading.Event(), []

    def importer():
        with forked.tvm_import_guard():
            holding.set()
            time.sleep(0.5)
            released_at.append(time.monotonic())

    worker = threading.Thread(target=importer)
    worker.start()
    assert holding.wait(30)
    status = in_child(lambda: forked.tvm_import_guard().acquire(timeout=5))  # the child's guard is free
    forked_at = time.monotonic()
    worker.join(30)
    assert status == 0 and released_at and forked_at >= released_at[0]
    assert forked.import_tvm() is __import__("tvm")


def test_a_childs_writes_to_a_reused_block_stay_in_the_child():
    # blocks of large outputs are private mappings: the child's copy is its own
    array = host_buffers.empty(((host_buffers.MIN_BYTES // 4),), np.float32)
    array[:] = 1.0

    def child():
        array[:] = 2.0  # the child's copy
        again = host_buffers.empty(array.shape, np.float32)  # no free block inherited
        again[:] = 3.0
        return True

    assert in_child(child) == 0
    assert np.all(array == 1.0)


def test_a_block_given_back_inside_a_garbage_collection_under_the_lock_does_not_deadlock():
    # _give_back is a finalizer: a collection may run it on a thread that holds the lock
    def give_back_under_the_lock():
        with host_buffers._lock:
            array = host_buffers.empty(((host_buffers.MIN_BYTES // 4),), np.float32)
            del array  # its block comes back here, the lock held

    worker = threading.Thread(target=give_back_under_the_lock, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive()


@requires_torch
def test_dataloader_workers_run_a_torch_function_after_the_parent_did():
    import torch

    from tvm_ops import functional

    features = torch.randn(2, 64, 1024)
    indices = torch.randint(0, 1024, (2, 4096, 3), dtype=torch.int32)
    weight = torch.rand(2, 4096, 3)
    expected = functional.three_interpolate(features, indices, weight)  # parallel, in the parent

    class Repeat(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return functional.three_interpolate(features, indices, weight)

    loader = torch.utils.data.DataLoader(Repeat(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", timeout=CHILD_SECONDS)
    results = list(loader)
    assert len(results) == 4 and all(torch.equal(result, expected) for result in results)
