"""The resident set size a call reaches is sampled by one thread of the process's, not one
started per call."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from tensortorrent_dynamo.run.record import SAMPLE_INTERVAL_S, RssSampler


def _samplers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tt-rss"]


def test_a_peak_inside_the_block_is_sampled_and_no_thread_is_started_per_block() -> None:
    with RssSampler():
        pass
    (thread,) = _samplers()
    for _ in range(3):
        with RssSampler() as rss:
            start = rss.peak
            # 64 MiB touched, held for several sampling intervals, freed before the block ends
            held = torch.ones(16 * 2**20)
            time.sleep(10 * SAMPLE_INTERVAL_S)
            del held
        assert rss.peak >= start + 48 * 2**20, (rss.peak, start)
        assert _samplers() == [thread], "a block started a sampling thread of its own"


def test_a_block_that_ends_leaves_the_others_sampled() -> None:
    with RssSampler() as outer:
        start = outer.peak
        with RssSampler():  # another call, in and out
            pass
        held = torch.ones(16 * 2**20)  # 64 MiB, after the other call ended
        time.sleep(10 * SAMPLE_INTERVAL_S)
        del held
    assert outer.peak >= start + 48 * 2**20, (outer.peak, start)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_samples_with_a_thread_of_its_own() -> None:
    with RssSampler():  # the parent's thread exists, and may hold its lock at the fork
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if a sampling thread of its own runs
            code = 1
            try:
                with RssSampler() as rss:
                    start = rss.peak
                    # no torch op: OpenMP's threads are not forked, and a parallel op hangs
                    held = b"\x01" * (64 * 2**20)
                    time.sleep(10 * SAMPLE_INTERVAL_S)
                    del held
                code = 0 if rss.peak >= start + 48 * 2**20 and _samplers() else 1
            finally:
                os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    raise AssertionError("the forked child hung in RssSampler")
