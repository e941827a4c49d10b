"""Calls in a forked child of a process that used the library (a torch DataLoader worker, a
multiprocessing pool started with fork).

fork copies the forking thread alone. TVM's CPU thread pool (one per calling thread) still
counts the workers the parent started, so the child's first parallel kernel would wait for
them for ever; a lock another thread held at the fork would stay held. PyTorch runs a forked
child's ops on one thread for the same reason. So a child runs every CPU call on the
one-core libraries (one_core.py: the same bits, no thread pool), and each module that keeps
a lock or a cache names here what a child starts with instead (`reset_in_child`), run right
after the fork, before the child's own code.
"""

from __future__ import annotations

import os

_in_child = False


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


reset_in_child(_mark_child)
