"""Spawned worker processes (parallel builds, the tuner's candidates) that die with their parent.

A ProcessPoolExecutor's worker holds both ends of its task queue's pipe, so when its parent
is killed without a chance to shut the pool down (SIGTERM, SIGKILL, a CI timeout) the worker
never reads an end of file: it waits on the queue for ever, a few hundred MB of an idle
Python with TVM loaded. Each worker here watches its parent instead and exits once it is
gone (a build it was compiling leaves its staging folder, which the next build into that
folder removes after STALE_STAGING_S).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
import time

PARENT_POLL_S = 1.0  # how soon an orphaned worker notices


def spawned_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A pool of `workers` spawned processes (no fork: TVM's threads and locks stay behind),
    each exiting when this process is gone."""
    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_exit_with_parent, initargs=(os.getpid(),))


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:  # a dead parent's children are re-parented
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # no clean-up: nobody is left to take the results

    threading.Thread(target=watch, name="tvm_ops-parent-watch", daemon=True).start()
