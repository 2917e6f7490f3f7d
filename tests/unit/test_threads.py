"""``threads.WorkerPool``: its workers run torch ops on one intra-op thread and leave the
process's setting as it was (in a process of its own: the setting is the process's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCRIPT = """
import concurrent.futures, torch
from tensortorrent_dynamo.threads import WorkerPool
torch.set_num_threads(2)
pool = WorkerPool(3, "tt-test")
def work():
    x = torch.empty(1 << 22)
    x.copy_(torch.ones(1 << 22))  # large enough to run in parallel
    return torch.get_num_threads()
workers = {pool.submit(work).result() for _ in range(6)}
later = concurrent.futures.ThreadPoolExecutor(1).submit(torch.get_num_threads).result()
print(sorted(workers), torch.get_num_threads(), later, pool.threads)
"""


def test_workers_run_on_one_intra_op_thread_and_the_process_keeps_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, timeout=120
    )
    # the workers: one thread each; the pool's maker and a thread made after: still two;
    # every worker started with the pool
    assert done.stdout.split() == ["[1]", "2", "2", "3"], done.stdout + done.stderr


_FORK_SCRIPT = """
import os, torch
from tensortorrent_dynamo.threads import WorkerPool
pool = WorkerPool(2, "tt-test")
assert pool.submit(os.getpid).result(timeout=30) == os.getpid()
pid = os.fork()
if pid == 0:  # the child: exit 0 only if the pool's work is done in this process
    code = 1
    try:
        code = 0 if pool.submit(os.getpid).result(timeout=20) == os.getpid() else 2
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), pool.submit(os.getpid).result(timeout=30) == os.getpid())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_runs_the_work_on_threads_of_its_own() -> None:
    """``multiprocessing`` forks its workers on Linux; the parent's threads are not there:
    the child's work would wait forever (until a call's timeout) on a pool of them."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=120
    )
    # the child's work ran in the child; the parent's pool still works
    assert done.stdout.split() == ["0", "True"], done.stdout + done.stderr
