"""Pages: the size the kernel caches and ``O_DIRECT`` aligns to, and dropping a file's pages.

Weights streamed from disk on every call would otherwise fill the page cache and evict what
the rest of the machine needs, and reads would measure RAM rather than the disk: what was
just read or written is dropped from the cache with ``posix_fadvise(POSIX_FADV_DONTNEED)``
(:func:`drop`), or, where a platform lacks it, the whole page cache as root
(:func:`drop_file`, for the disk bench).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PAGE_BYTES", "drop", "drop_file"]

PAGE_BYTES = 4096
_DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def drop(fd: int, offset: int = 0, length: int = 0) -> bool:
    """Ask the kernel to forget the cached pages of a range that was just read or written
    (``length`` 0: to the end of the file); ``False`` where the platform cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    return True


def drop_file(fd: int) -> str:
    """Drop the file's pages from the page cache; returns how, or ``""`` when impossible."""
    if drop(fd):
        return "posix_fadvise(POSIX_FADV_DONTNEED)"
    if os.geteuid() == 0 and os.access(_DROP_CACHES, os.W_OK):
        os.sync()
        _DROP_CACHES.write_text("1\n")
        return "writing 1 to /proc/sys/vm/drop_caches"
    return ""
