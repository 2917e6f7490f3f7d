"""Reusable page-aligned host buffers that disk reads land in, pinned for CUDA.

Allocating and faulting in a fresh buffer for every read costs as much as the read, so
:class:`HostBufferPool` keeps buffers by capacity and lends them again.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from ..errors import OffloadError
from .page_cache import PAGE_BYTES, _round_up

__all__ = ["HostBufferPool", "read_buffer_bytes"]


def read_buffer_bytes(nbytes: int) -> int:
    """The most a read of an ``nbytes`` tensor takes from the pool: its whole pages plus
    one, since with ``O_DIRECT`` it may start anywhere inside its first page."""
    return _round_up(nbytes, PAGE_BYTES) + PAGE_BYTES


# glibc's mallopt parameter: the size from which allocations are served by mmap
_M_MMAP_THRESHOLD = -3


def bound_heap_retention(threshold: int = 128 << 10) -> bool:
    """Have glibc serve every allocation of ``threshold`` bytes or more with its own mmap,
    returned to the system when freed; ``False`` where that cannot be set (not glibc).

    By default glibc raises that threshold to the size of each large block freed, up to
    32 MiB, so that weights streamed through buffers of a few MiB each call end up in
    its heaps, which keep freed memory: hundreds of MiB of RSS beyond what the plan
    holds (measured: about 120 MiB on a 1.5 GiB model streaming half its weights). A
    disk tier sets it once, to glibc's own starting value, fixed (it is the process's
    setting)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


class HostBufferPool:
    """Reusable host buffers for disk reads: page-aligned (for ``O_DIRECT``), pinned when ``pin``.

    Allocating and faulting in a fresh buffer for every read costs as much as the read;
    streaming the same model on every call needs the same sizes each time, so buffers are
    kept by capacity (a multiple of 4 KiB) and lent again. A buffer dropped by the pool
    (:meth:`trim`) is freed once nothing else refers to it.
    """

    def __init__(self, pin: bool = False, max_idle_bytes: int | None = None) -> None:
        if pin and not torch.cuda.is_available():
            raise OffloadError(
                "pinned host buffers need CUDA, and torch.cuda.is_available() is False"
            )
        self.pin = pin
        # idle buffers beyond this many bytes are dropped, least recently returned first
        # (``None``: keep them all)
        self.max_idle_bytes = max_idle_bytes
        self._lock = threading.Lock()
        self._idle: dict[int, list[torch.Tensor]] = {}
        self._idle_order: list[int] = []  # capacities of idle buffers, oldest first
        self._lent: dict[int, int] = {}  # data_ptr -> capacity
        self._held = 0

    @property
    def held_bytes(self) -> int:
        """Bytes of every buffer the pool owns, idle or lent."""
        with self._lock:
            return self._held

    def take(self, nbytes: int) -> torch.Tensor:
        """A 1-D uint8 buffer of at least ``nbytes`` bytes whose address is page-aligned."""
        if nbytes < 0:
            raise ValueError(f"cannot take a buffer of {nbytes} bytes")
        capacity = max(PAGE_BYTES, _round_up(nbytes, PAGE_BYTES))
        with self._lock:
            idle = self._idle.get(capacity)
            if idle:
                buffer = idle.pop()
                self._idle_order.reverse()
                self._idle_order.remove(capacity)  # the newest of this capacity
                self._idle_order.reverse()
                self._lent[buffer.data_ptr()] = capacity
                return buffer
        # One page more than asked, sliced at the first aligned address; the slice keeps the
        # whole allocation alive, and both go when the last reference does.
        base = torch.empty(capacity + PAGE_BYTES, dtype=torch.uint8, pin_memory=self.pin)
        skip = -base.data_ptr() % PAGE_BYTES
        buffer = base[skip : skip + capacity]
        with self._lock:
            self._held += capacity
            self._lent[buffer.data_ptr()] = capacity
        return buffer

    def give(self, buffer: torch.Tensor) -> None:
        """Return a buffer from :meth:`take` for reuse; its contents may be overwritten at once."""
        with self._lock:
            capacity = self._lent.get(buffer.data_ptr())
            if capacity is None or buffer.numel() != capacity:
                raise ValueError(
                    "not a buffer lent by this pool, or given back twice "
                    "(give back ReadResult.buffer, not ReadResult.tensor)"
                )
            del self._lent[buffer.data_ptr()]
            self._idle.setdefault(capacity, []).append(buffer)
            self._idle_order.append(capacity)
            if self.max_idle_bytes is not None:
                idle_bytes = sum(self._idle_order)
                while idle_bytes > self.max_idle_bytes:
                    oldest = self._idle_order.pop(0)
                    self._idle[oldest].pop(0)
                    idle_bytes -= oldest
                    self._held -= oldest

    def trim(self) -> int:
        """Drop every idle buffer; returns the bytes released."""
        with self._lock:
            freed = sum(len(buffers) * capacity for capacity, buffers in self._idle.items())
            self._idle.clear()
            self._idle_order.clear()
            self._held -= freed
        return freed
