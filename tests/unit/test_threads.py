"""``threads.worker_pool``: its workers run torch ops on one intra-op thread and leave the
process's setting as it was (in a process of its own: the setting is the process's)."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import concurrent.futures, torch
from tensortorrent_dynamo.threads import worker_pool
torch.set_num_threads(2)
pool = worker_pool(3, "tt-test")
def work():
    x = torch.empty(1 << 22)
    x.copy_(torch.ones(1 << 22))  # large enough to run in parallel
    return torch.get_num_threads()
workers = {pool.submit(work).result() for _ in range(6)}
later = concurrent.futures.ThreadPoolExecutor(1).submit(torch.get_num_threads).result()
print(sorted(workers), torch.get_num_threads(), later, len(pool._threads))
"""


def test_workers_run_on_one_intra_op_thread_and_the_process_keeps_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, timeout=120
    )
    # the workers: one thread each; the pool's maker and a thread made after: still two;
    # every worker started with the pool
    assert done.stdout.split() == ["[1]", "2", "2", "3"], done.stdout + done.stderr
