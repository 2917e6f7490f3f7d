"""The peak RSS of a call: the kernel's high-water mark where the call raised it, else samples
from the one thread the process shares."""

from __future__ import annotations

import mmap
import sys
import threading
import time

import pytest

from tensortorrent_dynamo.run import record
from tensortorrent_dynamo.run.record import RssSampler, peak_rss_bytes, rss_bytes

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and KiB")


def _touch(nbytes: int) -> mmap.mmap:
    """``nbytes`` of fresh anonymous memory, every page written (resident)."""
    block = mmap.mmap(-1, nbytes)
    for offset in range(0, nbytes, mmap.PAGESIZE):
        block[offset] = 1
    return block


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tt-rss"]


@linux
def test_a_block_that_raises_the_process_peak_gets_it_exactly() -> None:
    # more than this process has ever held, so the block raises its high-water mark
    size = (peak_rss_bytes() or 0) - rss_bytes() + (64 << 20)
    with RssSampler(interval_s=60.0) as rss:  # no sample: the kernel's figure alone
        block = _touch(size)
        block.close()  # freed before the block ends: only the high-water mark saw it
    assert rss.exact
    assert rss.peak >= rss_bytes() + size - (8 << 20)
    assert rss.peak == peak_rss_bytes()


@linux
def test_a_peak_under_the_process_high_water_mark_is_sampled() -> None:
    hold = _touch(32 << 20)
    hold.close()  # the process's peak is now at least 32 MiB above what it holds
    with RssSampler(interval_s=0.001) as rss:
        block = _touch(16 << 20)
        time.sleep(0.05)  # many samples while the 16 MiB is resident
        during = rss_bytes()
        block.close()
    assert not rss.exact
    assert rss.peak >= during - (4 << 20)
    assert rss.peak < peak_rss_bytes()  # not the process's peak, which came before


def test_one_thread_serves_every_call_and_sleeps_between_them() -> None:
    for _ in range(5):
        with RssSampler():
            pass
    assert len(_sampler_threads()) == 1
    assert not record._SAMPLER._open  # closed blocks are no longer sampled
    first = _sampler_threads()[0]
    with RssSampler() as outer, RssSampler(interval_s=0.001) as inner:
        time.sleep(0.02)
    assert _sampler_threads() == [first]
    assert outer.peak > 0 and inner.peak > 0


def test_a_nested_block_does_not_stop_the_sampling_of_the_outer_one() -> None:
    with RssSampler(interval_s=0.001) as outer:
        with RssSampler(interval_s=0.001):
            pass
        assert outer in record._SAMPLER._open
        block = _touch(8 << 20)
        time.sleep(0.03)
        during = rss_bytes()
        block.close()
    assert outer.peak >= during - (4 << 20)
