"""Calls in a forked child of a process that used the library (a torch DataLoader worker, a
multiprocessing pool started with fork).

fork copies the forking thread alone. TVM's CPU thread pool (one per calling thread) still
counts the workers the parent started, so the child's first parallel kernel would wait for
them for ever; a lock another thread held at the fork would stay held. PyTorch runs a forked
child's ops on one thread for the same reason. So a child runs every CPU call on the
one-core libraries (one_core.py: the same bits, no thread pool), and each module that keeps
a lock or a cache names here what a child starts with instead (`reset_in_child`), run right
after the fork, before the child's own code. Python's own import locks are not reset so: a
fork waits while another thread imports TVM's package or builds (`import_tvm`,
`tvm_import_guard`).
"""

from __future__ import annotations

import os
import threading

_in_child = False
# held while a thread imports TVM's Python package or builds with it, and by a fork: a child
# forked in the middle of an import would find that module's import lock held for ever by a
# thread it does not have (CPython keeps its per-module locks across fork), so a fork waits
_importing_tvm = threading.RLock()


def in_child() -> bool:
    """Whether this process is a forked child of one that imported the library."""
    return _in_child


def reset_in_child(reset) -> None:
    """Run `reset()` in every child forked from now on, right after the fork."""
    if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
        os.register_at_fork(after_in_child=reset)


def _mark_child() -> None:
    global _in_child
    _in_child = True


def tvm_import_guard():
    """The lock a thread holds while it imports TVM's Python package or builds with it (a
    fork waits for it: see _importing_tvm)."""
    return _importing_tvm


def import_tvm():
    """TVM's Python package, imported under tvm_import_guard (a fork waits for the import)."""
    with _importing_tvm:
        import tvm
    return tvm


def _new_guard() -> None:
    global _importing_tvm
    _importing_tvm = threading.RLock()


reset_in_child(_mark_child)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: _importing_tvm.acquire(), after_in_parent=lambda: _importing_tvm.release(),
                        after_in_child=_new_guard)
