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


class RssSampler:
    """The peak resident set size of this process while the block runs, sampled every
    ``interval_s`` by a background thread (a peak shorter than that can be missed).

    What this thread costs and buys, measured on the 2-core development machine: starting
    and joining it takes 185 us a call, and its wake-ups every 2 ms made eight 256x4096 by
    4096x1024 float32 matmuls 4.5-5.8% slower and eight 16x2048 by 2048x2048 ones 4.8-9.9%
    slower. Yet a disk plan of many small reads runs faster with it: the corpus Llama at
    half its weights took 8-15 ms a call with it (medians of 24-48 calls, nine runs) and
    14-18 ms with no thread alive during the call, or 15-16 ms with one shared thread
    sampling every 10 ms and the kernel's high-water mark (tried, and reverted for this).
    Any thread waking during the call helped (every 10 ms: 7-11 ms a call), where one
    started and joined before the call did not; another
    process waking every 2 ms helped as well (14 ms a call against 18 in that run), so the
    effect is the virtual machine's, not Python's (likely its idle CPUs waking slowly to
    the reads' hand-offs). The calling thread spinning for 2 ms before it blocks on a read
    did not help. Measure both kinds of plan before making this thread cheaper.
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> RssSampler:
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._sample, name="tt-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
