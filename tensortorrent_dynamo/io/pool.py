"""Reusable page-aligned host buffers that disk reads land in, pinned for CUDA.

Allocating and faulting in a fresh buffer for every read costs as much as the read, so
:class:`HostBufferPool` lends buffers from one reserved block of memory, in turn (a ring:
streamed weights are read and let go in the order a model uses them), and keeps other
buffers by capacity to lend again.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import mmap
import threading

import torch

from ..errors import OffloadError
from .page_cache import PAGE_BYTES, _round_up

__all__ = ["HUGE_PAGE_BYTES", "HostBufferPool", "direct_io_memory", "read_buffer_bytes"]


# a transparent huge page on x86-64 and most arm64 kernels: buffers this large or larger get
# pages of their own (direct_io_memory)
HUGE_PAGE_BYTES = 2 << 20


def read_buffer_bytes(nbytes: int) -> int:
    """The most a read of an ``nbytes`` tensor takes from the pool: its whole pages plus
    one, since with ``O_DIRECT`` it may start anywhere inside its first page."""
    return _round_up(nbytes, PAGE_BYTES) + PAGE_BYTES


# glibc's mallopt parameters: the free memory at the top of a heap past which it is given
# back, and the size from which allocations are served by mmap
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's ceiling for the mmap threshold it raises by itself on a 64-bit system, and the trim
# threshold it pairs with it (twice that)
KEPT_MMAP_THRESHOLD = 32 << 20
KEPT_TRIM_THRESHOLD = 2 * KEPT_MMAP_THRESHOLD
# set once a disk tier bounded what the heaps keep: it then stays bounded
_retention_bounded = False


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_free_heap() -> bool:
    """Give back to the system the free memory glibc's heaps keep (``malloc_trim(0)``):
    ``False`` where there is none to give or it cannot be asked (not glibc).

    Compiling a graph allocates and frees hundreds of MiB of small blocks (Dynamo's and
    AOTAutograd's tracing, fake tensors, the cost graph's work). glibc keeps freed blocks
    in the middle of its heaps resident, so without this the process stays that much
    larger for good: 250 MiB on the generate bench's 1.5 GiB Qwen3 at batch 16 (decode
    steps at 2.42 GiB RSS instead of 2.18), more than its memory limit allowed."""
    libc = _libc()
    try:
        return libc is not None and bool(libc.malloc_trim(0))
    except AttributeError:
        return False


def keep_heap_for_calls() -> bool:
    """Have glibc keep the memory a call frees for the next call: blocks under
    ``KEPT_MMAP_THRESHOLD`` served from its heaps, and up to ``KEPT_TRIM_THRESHOLD`` free at a
    heap's top kept rather than given back. ``False`` where it is not set: a disk tier has
    bounded what the heaps keep (:func:`bound_heap_retention`, which wins), or not glibc.

    glibc starts by serving every block of 128 KiB or more with an mmap of its own, given
    back when freed, and raises that threshold only as such blocks are freed; until it has,
    and whenever it trims a heap's top, the activations of a call are fresh pages, each
    faulted in on first touch. A fault costs about 3 us a 4 KiB page on the 2-core
    development machine (0.8 ms a MiB, 25 times the time to write the memory): calls of four
    transformer blocks (dim 256, 8 x 128 tokens) took 52-153 ms with 0-8,000 faults each,
    and 42-57 ms with none once set. These are the values glibc itself would end at, set at
    once and fixed: the heaps keep at most what the calls' own peak held."""
    libc = _libc()
    if libc is None or _retention_bounded:
        return False
    try:
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD)
        )
    except AttributeError:
        return False


def bound_heap_retention(threshold: int = 128 << 10) -> bool:
    """Have glibc serve every allocation of ``threshold`` bytes or more with its own mmap,
    returned to the system when freed, and give back the free memory past ``threshold`` at a
    heap's top; ``False`` where that cannot be set (not glibc).

    By default glibc raises that threshold to the size of each large block freed, up to
    32 MiB, so that weights streamed through buffers of a few MiB each call end up in
    its heaps, which keep freed memory: hundreds of MiB of RSS beyond what the plan
    holds (measured: about 120 MiB on a 1.5 GiB model streaming half its weights). A
    disk tier sets it once, to glibc's own starting value, fixed (it is the process's
    setting), and it then stays set: :func:`keep_heap_for_calls` no longer applies."""
    global _retention_bounded
    _retention_bounded = True
    libc = _libc()
    try:
        return (
            libc is not None
            and bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
            and bool(libc.mallopt(_M_TRIM_THRESHOLD, threshold))
        )
    except AttributeError:
        return False


def _aligned(nbytes: int, pin: bool) -> torch.Tensor:
    """A 1-D uint8 tensor of ``nbytes`` bytes at a page-aligned address: one page more is
    allocated and sliced at its first aligned address; the slice keeps the whole allocation
    alive, and both go when the last reference does."""
    base = torch.empty(nbytes + PAGE_BYTES, dtype=torch.uint8, pin_memory=pin)
    skip = -base.data_ptr() % PAGE_BYTES
    return base[skip : skip + nbytes]


def direct_io_memory(nbytes: int) -> torch.Tensor:
    """A 1-D uint8 tensor of ``nbytes`` bytes on pages of its own (a private anonymous
    mapping, so page-aligned), on huge pages where the kernel grants them on request, every
    page faulted in now, in one pass; the mapping lives as long as the tensor.

    ``O_DIRECT`` reads land in these pages, and how fast depends on where the pages are: the
    kernel splits a read into one segment per run of physically contiguous pages, and a
    device takes only so many segments a request. On the 2-core development machine, reading
    ``bench.ram_offload``'s 36 streamed 16 MiB chunks three deep from one file, in turn: into
    a ``torch.empty`` block first written by a call's reads (as the pool's block was) 1.7-2.4
    GB/s, with 2,200-4,100 runs in each 16 MiB buffer; into blocks faulted in one pass, or
    by reads with nothing else running, 3.5-3.9 GB/s with 20-50 runs. Faulting in one pass
    was not always enough (in one process of two such a block read no faster), so huge
    pages are asked for: 2 MiB runs, where transparent huge pages are enabled (shared
    anonymous memory would need shmem's setting instead, off by default); with them the
    block held 9-12 runs a 16 MiB buffer and read at 3.6-3.9 GB/s."""
    size = max(nbytes, PAGE_BYTES)
    private = getattr(mmap, "MAP_PRIVATE", None)
    anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
    if private is None or anonymous is None:  # not a POSIX system
        return _aligned(nbytes, pin=False)
    # A huge page covers an aligned 2 MiB range wholly inside the mapping: start the buffer
    # at the mapping's first such boundary (the pages skipped are never touched, so never
    # resident), so that all its whole 2 MiB ranges can be huge.
    spare = HUGE_PAGE_BYTES if size >= HUGE_PAGE_BYTES else 0
    region = mmap.mmap(-1, size + spare, flags=private | anonymous)
    hugepage = getattr(mmap, "MADV_HUGEPAGE", None)
    if hugepage is not None:
        with contextlib.suppress(OSError):  # a hint: the kernel may not offer them
            region.madvise(hugepage)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # holds the mapping alive
    skip = -whole.data_ptr() % HUGE_PAGE_BYTES if spare else 0
    memory = whole[skip : skip + size]
    memory.zero_()
    return memory[:nbytes]


@dataclasses.dataclass
class _Lent:
    offset: int
    capacity: int
    given: bool = False


class _Ring:
    """A block of memory lent in turn: each buffer right after the previous one, wrapping
    to the start once the end is reached and the start was given back. Buffers given back
    out of turn are reused once those lent before them are given back too."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        # pinned memory is CUDA's to place; other memory gets pages of its own, faulted in now
        self.memory = _aligned(nbytes, pin) if pin else direct_io_memory(nbytes)
        self.size = nbytes
        self._lent: collections.deque[_Lent] = collections.deque()  # in the order lent
        self._by_ptr: dict[int, _Lent] = {}

    @property
    def lent(self) -> int:
        """Buffers lent and not given back yet."""
        return len(self._by_ptr)

    @property
    def idle(self) -> bool:
        return not self._lent

    def take(self, capacity: int) -> torch.Tensor | None:
        """A buffer of ``capacity`` bytes (a multiple of the page), or ``None`` when the
        ring has no room for it now."""
        if not self._lent:
            offset = 0
        else:
            first, last = self._lent[0], self._lent[-1]
            head = last.offset + last.capacity
            if last.offset >= first.offset:  # the lent span does not wrap: room at both ends
                offset = head if head + capacity <= self.size else 0
                if offset == 0 and capacity > first.offset:
                    return None
            elif head + capacity <= first.offset:
                offset = head
            else:
                return None
        if offset + capacity > self.size:
            return None
        lent = _Lent(offset, capacity)
        self._lent.append(lent)
        buffer = self.memory[offset : offset + capacity]
        self._by_ptr[buffer.data_ptr()] = lent
        return buffer

    def give(self, buffer: torch.Tensor) -> bool:
        """Take ``buffer`` back; ``False`` when the ring did not lend it."""
        lent = self._by_ptr.get(buffer.data_ptr())
        if lent is None or buffer.numel() != lent.capacity:
            return False
        del self._by_ptr[buffer.data_ptr()]
        lent.given = True
        while self._lent and self._lent[0].given:
            self._lent.popleft()
        while self._lent and self._lent[-1].given:
            self._lent.pop()
        return True


class HostBufferPool:
    """Reusable host buffers for disk reads: page-aligned (for ``O_DIRECT``), pinned when ``pin``.

    Allocating and faulting in a fresh buffer for every read costs as much as the read
    (on a virtual machine, more: the page faults): :meth:`reserve` sets aside a block that
    buffers are lent from in turn, and a buffer the block has no room for is allocated on
    its own, kept idle by capacity (a multiple of 4 KiB) within ``max_held_bytes`` and lent
    again. A buffer dropped by the pool (:meth:`trim`) is freed once nothing else refers to
    it.
    """

    def __init__(self, pin: bool = False, max_held_bytes: int | None = None) -> None:
        if pin and not torch.cuda.is_available():
            raise OffloadError(
                "pinned host buffers need CUDA, and torch.cuda.is_available() is False"
            )
        self.pin = pin
        # while the pool holds more than this many bytes (idle and lent), idle buffers are
        # dropped, least recently returned first (``None``: keep them all)
        self.max_held_bytes = max_held_bytes
        self._lock = threading.Lock()
        self._idle: dict[int, list[torch.Tensor]] = {}
        self._idle_order: list[int] = []  # capacities of idle buffers, oldest first
        self._lent: dict[int, int] = {}  # data_ptr -> capacity
        self._held = 0  # of the buffers allocated on their own, idle and lent
        self._ring: _Ring | None = None
        self._ring_wanted = 0

    def reserve(self, nbytes: int) -> None:
        """Lend buffers from a block of at least ``nbytes`` bytes, allocated once (now, or
        once every buffer lent from a smaller one is back)."""
        with self._lock:
            self._ring_wanted = max(self._ring_wanted, _round_up(nbytes, PAGE_BYTES))
            self._renew_ring()

    def _renew_ring(self) -> None:
        have = self._ring.size if self._ring is not None else 0
        if self._ring_wanted > have and (self._ring is None or self._ring.idle):
            self._ring = None  # the old block goes before the new one is allocated
            self._ring = _Ring(self._ring_wanted, self.pin)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the block buffers are lent from in turn (0 without one)."""
        with self._lock:
            return self._ring.size if self._ring is not None else 0

    @property
    def lent_buffers(self) -> int:
        """Buffers lent and not given back yet."""
        with self._lock:
            return len(self._lent) + (self._ring.lent if self._ring is not None else 0)

    @property
    def held_bytes(self) -> int:
        """Bytes of every buffer the pool owns, idle or lent, and of its reserved block."""
        with self._lock:
            return self._held + (self._ring.size if self._ring is not None else 0)

    def take(self, nbytes: int) -> torch.Tensor:
        """A 1-D uint8 buffer of at least ``nbytes`` bytes whose address is page-aligned."""
        if nbytes < 0:
            raise ValueError(f"cannot take a buffer of {nbytes} bytes")
        capacity = max(PAGE_BYTES, _round_up(nbytes, PAGE_BYTES))
        with self._lock:
            if self._ring is not None:
                buffer = self._ring.take(capacity)
                if buffer is not None:
                    return buffer
            idle = self._idle.get(capacity)
            if idle:
                buffer = idle.pop()
                self._idle_order.reverse()
                self._idle_order.remove(capacity)  # the newest of this capacity
                self._idle_order.reverse()
                self._lent[buffer.data_ptr()] = capacity
                return buffer
        if self.pin or capacity < HUGE_PAGE_BYTES:
            buffer = _aligned(capacity, self.pin)
        else:
            buffer = direct_io_memory(capacity)
        with self._lock:
            self._held += capacity
            self._lent[buffer.data_ptr()] = capacity
        return buffer

    def give(self, buffer: torch.Tensor) -> None:
        """Return a buffer from :meth:`take` for reuse; its contents may be overwritten at once."""
        with self._lock:
            if self._ring is not None and self._ring.give(buffer):
                self._renew_ring()
                return
            capacity = self._lent.get(buffer.data_ptr())
            if capacity is None or buffer.numel() != capacity:
                raise ValueError(
                    "not a buffer lent by this pool, or given back twice "
                    "(give back ReadResult.buffer, not ReadResult.tensor)"
                )
            del self._lent[buffer.data_ptr()]
            self._idle.setdefault(capacity, []).append(buffer)
            self._idle_order.append(capacity)
            if self.max_held_bytes is not None:
                while self._held > self.max_held_bytes and self._idle_order:
                    oldest = self._idle_order.pop(0)
                    self._idle[oldest].pop(0)
                    self._held -= oldest

    def trim(self) -> int:
        """Drop every idle buffer; returns the bytes released."""
        with self._lock:
            freed = sum(len(buffers) * capacity for capacity, buffers in self._idle.items())
            self._idle.clear()
            self._idle_order.clear()
            self._held -= freed
        return freed
