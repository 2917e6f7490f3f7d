"""Which pages of a private file mapping were written since it was made: the process's page
map (``/proc/self/pagemap``, Linux).

A released weight's storage is its bytes in a file, mapped copy-on-write
(:mod:`..weights.released`): a write to it, even one that moves no version counter
(``p.data += delta``), makes the kernel copy each page it touches into anonymous memory and
never reaches the file. The page map has one 64-bit entry per page of the address space (bit
63: present, 62: swapped, 61: a page of a file or of shared memory; readable without privilege
since Linux 4.2, which hides only the frame numbers), so the pages copied on write are found
without touching the mapping: 8 bytes read per 4 KiB page, about 0.4 ms for 256 MiB on the
2-core development machine. Where the page map cannot be read (another system, a sandbox
without it), :func:`copied_ranges` returns ``None``.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np

from .page_cache import PAGE_BYTES

__all__ = ["copied_ranges", "pages_copied"]

log = logging.getLogger(__name__)

_PAGEMAP = "/proc/self/pagemap"
_ENTRY_BYTES = 8
_lock = threading.Lock()
# (the process it was opened in, its descriptor): a child of ``fork`` opens its own, since
# the parent's descriptor reads the parent's page map
_opened: tuple[int, int | None] | None = None


def _pagemap() -> int | None:
    global _opened
    pid = os.getpid()
    with _lock:
        if _opened is None or _opened[0] != pid:
            try:
                fd: int | None = os.open(_PAGEMAP, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                log.debug("cannot read %s (%s): writes through .data go unseen", _PAGEMAP, exc)
                fd = None
            _opened = (pid, fd)
        return _opened[1]


def copied_ranges(address: int, nbytes: int) -> list[tuple[int, int]] | None:
    """The address ranges ``(start, stop)`` within ``[address, address + nbytes)`` of a
    private file mapping whose pages were copied on write (present and not a file's page, or
    swapped out), each run of such pages once; ``None`` where the page map cannot be read.

    A page at either end may hold bytes of a neighbour too: a range there says that the page
    was written, not that these bytes were."""
    if nbytes <= 0:
        return []
    fd = _pagemap()
    if fd is None:
        return None
    first = address // PAGE_BYTES
    last = (address + nbytes - 1) // PAGE_BYTES
    try:
        raw = os.pread(fd, (last - first + 1) * _ENTRY_BYTES, first * _ENTRY_BYTES)
    except OSError as exc:
        log.debug("cannot read %s (%s): writes through .data go unseen", _PAGEMAP, exc)
        return None
    flags = np.frombuffer(raw, dtype="<u8") >> np.uint64(61)  # bits 63, 62, 61, as _copied
    copied = (flags == 0b100) | ((flags & np.uint64(0b010)) != 0)
    if not copied.any():
        return []
    # runs of copied pages: where the flag turns on and off
    edges = np.flatnonzero(np.diff(np.concatenate(([False], copied, [False])).astype(np.int8)))
    ranges = []
    for start_page, stop_page in zip(edges[0::2], edges[1::2], strict=True):
        start = max(address, (first + int(start_page)) * PAGE_BYTES)
        stop = min(address + nbytes, (first + int(stop_page)) * PAGE_BYTES)
        ranges.append((start, stop))
    return ranges


def _copied(entry: int) -> bool:
    """Whether a page map entry is of a page copied on write: present and not a file's page
    (bits 63 and 61), or swapped out (bit 62)."""
    flags = entry >> 61
    return flags == 0b100 or bool(flags & 0b010)


def pages_copied(pages: tuple[int, ...]) -> bool | None:
    """Whether any of ``pages`` (page numbers: addresses over ``PAGE_BYTES``) of a private
    file mapping was copied on write; ``None`` where the page map cannot be read."""
    fd = _pagemap()
    if fd is None:
        return None
    try:
        return any(
            _copied(int.from_bytes(os.pread(fd, _ENTRY_BYTES, page * _ENTRY_BYTES), "little"))
            for page in pages
        )
    except OSError as exc:
        log.debug("cannot read %s (%s): writes through .data go unseen", _PAGEMAP, exc)
        return None
