"""Measurements inside a competitor's process: dropping the page cache, RSS and its peak
(``/proc/self/status``, ``clear_refs``), bytes fetched from storage (``/proc/self/io``),
parameter bytes, and tensors read by a ``DiskReader`` all at once."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
CLEAR_REFS = Path("/proc/self/clear_refs")


def drop_page_cache(path: Path = DROP_CACHES) -> str | None:
    """``sync; echo 3 > drop_caches``; ``None`` when done, else why the cache was kept."""
    try:
        os.sync()
        with open(path, "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"page cache not dropped: cannot write {path} ({exc.strerror or exc})"
    return None


def evict_files(root: Path) -> str | None:
    """Evict every file under ``root`` from the page cache
    (``posix_fadvise(POSIX_FADV_DONTNEED)`` after a sync); ``None`` when done, else why not.

    Cold weights without a cold process: dropping the whole page cache evicts the program's
    own code too (torch's libraries, Python's modules), whose pages the next call faults
    back in, where no user's next call does: the corpus Llama at half its weights took 4.6
    ms a call with the cache kept, 7.6 ms after ``echo 1 > drop_caches`` and 5.0 after
    ``echo 2`` (dentries and inodes alone), its reads 0.24, 0.28 and 0.25 ms each."""
    # here, not at the top: a competitor's process imports this module, and nothing of the
    # project's before its RSS baseline
    from tensortorrent_dynamo.io import page_cache

    os.sync()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            if not page_cache.drop(fd):
                return "page cache kept: this platform has no posix_fadvise"
        finally:
            os.close(fd)
    return None


def proc_status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile and RssShmem of this process, in bytes."""
    keys = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in keys:
                out[name] = int(rest.split()[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0)."""
    try:
        CLEAR_REFS.write_text("5\n")
    except OSError:
        return False
    return True


def io_read_bytes() -> int | None:
    """Bytes this process caused to be fetched from storage (``/proc/self/io``)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return None


def lifetime_peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class PeakRss:
    """The process's peak RSS over spans: VmHWM is reset at the start of each span, and the
    lifetime peak is kept here (a reset lowers ``ru_maxrss`` too)."""

    def __init__(self) -> None:
        self.seen = 0

    def reset(self) -> bool:
        self.seen = max(self.seen, proc_status().get("VmHWM", 0))
        return reset_peak_rss()

    def lifetime(self) -> int:
        return max(self.seen, proc_status().get("VmHWM", 0), lifetime_peak_rss())


def read_all(reader: Any, locations: Iterable[Any]) -> float:
    """Seconds a ``DiskReader`` takes to read every one of ``locations``, all submitted at
    once and all waited for; their buffers go back to its pool afterwards."""
    start = time.perf_counter()
    reads = [future.result() for future in [reader.submit(loc) for loc in locations]]
    seconds = time.perf_counter() - start
    for read in reads:
        reader.pool.give(read.buffer)
    return seconds
