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
"""

from __future__ import annotations

import concurrent.futures
import threading

import torch

__all__ = ["worker_pool"]


def _one_intra_op_thread() -> None:
    torch.set_num_threads(1)
    # a parallel op once, so that the thread holds its own setting from now on (the
    # default set back by the pool's maker is read by a thread that has not run one yet)
    torch.ones(1 << 16).add_(1)


def worker_pool(workers: int, name: str) -> concurrent.futures.ThreadPoolExecutor:
    """A pool of ``workers`` threads named ``name``, started now, each running torch ops on
    one intra-op thread."""
    threads = torch.get_num_threads()
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix=name, initializer=_one_intra_op_thread
    )
    started = threading.Barrier(workers, timeout=60.0)
    for future in [pool.submit(started.wait) for _ in range(workers)]:
        future.result()
    torch.set_num_threads(threads)
    return pool
