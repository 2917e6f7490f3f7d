"""The background threads TensorTorrent runs torch ops on: each on one intra-op thread.

A torch op that runs in parallel on a thread other than the one that set up torch's intra-op
threads (a large ``copy_`` on a copy engine's thread, say) makes OpenMP start a second team
of threads for it. Once a process has more OpenMP threads than cores, GNU OpenMP stops
spinning between parallel regions, and every parallel region of the main thread then pays
for waking its sleeping threads: on the 2-core development machine a 4x64 by 64x64 matmul
went from 4 us to 50-90 us, a 256x256 one from 170 us to 240-310 us, for the rest of the
process, after one 64 MiB copy on another thread (the small linears of the fidelity bench
ran 5x slower after a virtual-device case had copied its weights). A worker made here sets
its own intra-op threads to one before anything else, so it never starts a team; the
thread that made the pool then sets the process default back to what it had, for the
threads made after.

A forked child has none of its parent's threads (``multiprocessing`` forks its workers on
Linux): work handed to a pool made before the fork would wait for a thread that is not
there, until the call's timeout. A :class:`WorkerPool` starts threads of its own in the
child at its first use there.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

__all__ = ["WorkerPool"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# forks survived: a pool made before the last one has no threads in this process
_forks = 0
_restart_lock = threading.Lock()


def _forked() -> None:
    # runs in the child before anything else: a lock the parent held at the fork is
    # made anew
    global _forks, _restart_lock
    _forks += 1
    _restart_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _one_intra_op_thread() -> None:
    torch.set_num_threads(1)
    # a parallel op once, so that the thread holds its own setting from now on (the
    # default set back by the pool's maker is read by a thread that has not run one yet)
    torch.ones(1 << 16).add_(1)


class WorkerPool:
    """``workers`` threads named ``name``, started now, each running torch ops on one
    intra-op thread; started again in a forked child (see the module's docstring)."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self.name = name
        self._forks = _forks
        self._executor = _started(workers, name)

    def submit(
        self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        if self._forks != _forks:
            self._restart()
        return self._executor.submit(fn, *args, **kwargs)

    def _restart(self) -> None:
        # the parent's executor is dropped, not shut down: its threads are the parent's
        with _restart_lock:
            if self._forks != _forks:
                self._executor = _started(self.workers, self.name)
                self._forks = _forks

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads once the work handed to them is done (``wait``: wait for it)."""
        if self._forks == _forks:
            self._executor.shutdown(wait=wait)

    @property
    def threads(self) -> int:
        """The threads running now (all of them once one has been asked to work)."""
        return len(self._executor._threads) if self._forks == _forks else 0


def _started(workers: int, name: str) -> concurrent.futures.ThreadPoolExecutor:
    threads = torch.get_num_threads()
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix=name, initializer=_one_intra_op_thread
    )
    started = threading.Barrier(workers, timeout=60.0)
    for future in [pool.submit(started.wait) for _ in range(workers)]:
        future.result()
    torch.set_num_threads(threads)
    return pool
