"""What a call measured: the spans of compute, copies and reads (:class:`Recorder`), and
the process's resident set size (:func:`rss_bytes`, :class:`RssSampler`)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import psutil


@dataclasses.dataclass(frozen=True)
class MeasuredEvent:
    """One span of the last run: which resource did what, in seconds from the call start."""

    resource: str
    kind: str
    label: str
    start_s: float
    end_s: float


class Recorder:
    """Measured spans of the latest call (compute per device, copies per link).

    Recording is on every call's path, so a span is kept as a plain tuple (``list.append``
    needs no lock) and made a :class:`MeasuredEvent` only when :attr:`events` is read."""

    def __init__(self) -> None:
        self._spans: list[tuple[str, str, str, float, float]] = []
        self._origin = time.perf_counter()

    @property
    def events(self) -> list[MeasuredEvent]:
        return [MeasuredEvent(*span) for span in list(self._spans)]

    def restart(self) -> None:
        self._spans = []
        self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def add(self, resource: str, kind: str, label: str, start_s: float) -> None:
        self._spans.append((resource, kind, label, start_s, time.perf_counter() - self._origin))


def rss_bytes() -> int:
    """This process's resident set size now (``/proc/self/statm``; psutil elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except OSError:
        return int(psutil.Process().memory_info().rss)


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


SAMPLE_INTERVAL_S = 0.002
"""How often :class:`RssSampler` samples the resident set size while a call runs."""


class RssSampler:
    """The peak resident set size of this process while the block runs, sampled every
    ``SAMPLE_INTERVAL_S`` (a peak shorter than that can be missed) by one thread of the
    process's, which sleeps while no block runs.

    The thread is made once: starting and joining one per call took 185 us a call on one
    2-core development machine and 1.5-1.9 ms on another (a plan's first read issued that
    late into a 5 ms call of the corpus Llama at half its weights), more than the call's
    share of the work. A thread waking during the call is worth keeping, though: on the
    first machine its wake-ups every 2 ms made eight 256x4096 by 4096x1024 float32 matmuls
    4.5-5.8% slower and eight 16x2048 by 2048x2048 ones 4.8-9.9% slower, yet a disk plan of
    many small reads ran faster with it: the corpus Llama at half its weights took 8-15 ms
    a call with it (medians of 24-48 calls, nine runs) and 14-18 ms with no thread alive
    during the call, or 15-16 ms with one thread sampling every 10 ms. Any thread waking
    during the call helped (every 10 ms: 7-11 ms a call), where one started and joined
    before the call did not; another process waking every 2 ms helped as well, so the
    effect is the virtual machine's, not Python's (likely its idle CPUs waking slowly to
    the reads' hand-offs). The calling thread spinning for 2 ms before it blocks on a read
    did not help.
    """

    def __init__(self) -> None:
        self.peak = 0

    def __enter__(self) -> RssSampler:
        self.peak = rss_bytes()
        _SAMPLING.join(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _SAMPLING.leave(self)
        self.peak = max(self.peak, rss_bytes())


class _Sampling:
    """The process's sampling thread and the blocks it samples for."""

    def __init__(self) -> None:
        self._reset()
        # a forked child has no sampling thread, and a lock its parent's thread may have held
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._active: list[RssSampler] = []
        self._running = threading.Event()
        self._thread: threading.Thread | None = None

    def join(self, sampler: RssSampler) -> None:
        with self._lock:
            self._active.append(sampler)
            self._running.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._sample, name="tt-rss", daemon=True)
                self._thread.start()

    def leave(self, sampler: RssSampler) -> None:
        with self._lock:
            self._active = [s for s in self._active if s is not sampler]
            if not self._active:
                self._running.clear()

    def _sample(self) -> None:
        while True:
            self._running.wait()
            time.sleep(SAMPLE_INTERVAL_S)
            rss = rss_bytes()
            with self._lock:
                for sampler in self._active:
                    sampler.peak = max(sampler.peak, rss)


_SAMPLING = _Sampling()
