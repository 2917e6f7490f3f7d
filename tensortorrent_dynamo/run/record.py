"""What a call measured: the spans of compute, copies and reads (:class:`Recorder`), and
the process's resident set size (:func:`rss_bytes`, :class:`RssSampler`)."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import psutil

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]


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
        return int(os.pread(_statm(), 128, 0).split()[1]) * _PAGE_BYTES
    except OSError:
        return int(psutil.Process().memory_info().rss)


# (pid, descriptor) of /proc/self/statm, kept open: reading it again costs 1.5 us where opening
# it each time cost 4.6 us. A forked child opens its own (the path named its parent's).
_statm_fd: tuple[int, int] | None = None


def _statm() -> int:
    global _statm_fd
    pid = os.getpid()
    if _statm_fd is None or _statm_fd[0] != pid:
        _statm_fd = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
    return _statm_fd[1]


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# How often the shared sampler reads the RSS while a call runs. Each sample wakes a thread,
# which on a 2-core host takes a core from the compute: sampling every 2 ms made eight
# 256x4096 by 4096x1024 float32 matmuls 5.8% slower and eight 16x2048 by 2048x2048 ones 9.9%
# slower; every 10 ms, 0.1% and 2.8% (medians of 8 rounds in turn). A call that raises the
# process's peak gets it exactly from the kernel whatever the interval.
RSS_SAMPLE_S = 0.01


def peak_rss_bytes() -> int | None:
    """The highest resident set size this process has had (the kernel's high-water mark,
    ``getrusage``), or ``None`` where it cannot be read."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes there, KiB here


class _Sampler:
    """One background thread per process that reads the RSS every ``interval_s`` while some
    :class:`RssSampler` block is open, and waits, costing nothing, while none is. A thread
    per call cost 185 us a call to start and join on the 2-core development machine."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._cond = threading.Condition()
        self._open: list[RssSampler] = []
        self._thread: threading.Thread | None = None

    def open(self, block: RssSampler) -> None:
        with self._cond:
            self._open.append(block)
            if self._thread is None or not self._thread.is_alive():  # none yet, or forked
                self._thread = threading.Thread(target=self._run, name="tt-rss", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, block: RssSampler) -> None:
        with self._cond:
            self._open.remove(block)

    def _run(self) -> None:
        with self._cond:
            while True:
                while not self._open:
                    self._cond.wait()
                # a block opened meanwhile wakes this wait, for its interval may be shorter
                self._cond.wait(min(b.interval_s for b in self._open))
                if self._open:
                    rss = rss_bytes()
                    for block in self._open:
                        block.peak = max(block.peak, rss)


_SAMPLER = _Sampler(RSS_SAMPLE_S)


class RssSampler:
    """The peak resident set size of this process while the block runs.

    Exact when the block raised the process's peak (the kernel's high-water mark rose while
    it ran, :func:`peak_rss_bytes`); otherwise the highest of the RSS at its start, at its
    end and sampled every ``interval_s`` in between by a thread the process shares (a peak
    shorter than that can then be missed). ``exact`` says which."""

    def __init__(self, interval_s: float = RSS_SAMPLE_S) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self.exact = False
        self._high_before: int | None = None

    def __enter__(self) -> RssSampler:
        self.exact = False
        self._high_before = peak_rss_bytes()
        self.peak = rss_bytes()
        _SAMPLER.open(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _SAMPLER.close(self)
        self.peak = max(self.peak, rss_bytes())
        high = peak_rss_bytes()
        if high is not None and self._high_before is not None and high > self._high_before:
            self.peak, self.exact = max(self.peak, high), True
