"""The disk tier: weights kept in safetensors files and read back around the page cache.

* :func:`safetensors_locations` indexes a safetensors checkpoint from its header alone, and
  :func:`write_safetensors` writes one atomically (no dependency on the safetensors package).
* :class:`OffloadStore` is a directory of safetensors shards described by ``manifest.json``,
  which records checksums of every tensor's bytes, block by block. A tensor is written once:
  a later write of the same bytes reuses the stored copy after checking it. Every file is
  written to a temporary name, flushed and renamed, so a crash leaves the previous state
  readable, and free space is checked before anything is written.
* :class:`DiskReader` reads tensors on background threads into page-aligned buffers from a
  :class:`HostBufferPool`, with ``O_DIRECT`` where the filesystem allows it and otherwise
  buffered reads whose pages are dropped from the page cache right after. A model streamed
  from disk on every call would otherwise fill the page cache and evict what the rest of the
  machine needs, and the reads would measure RAM rather than the disk the plan assumed.
* :class:`FileGuard` is what a file feeding computations is known to hold: its identity and
  its tensors' block checksums (from the store's manifest, or recorded at the first read of
  a user's checkpoint). The reader verifies every read of a guarded location on a thread of
  its own before handing the bytes on, reads once more on a mismatch, and then fails with
  :class:`OffloadCorruptError`: no computation ever sees unverified bytes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import json
import logging
import math
import mmap
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import crc32c
import torch

from ..errors import CheckpointError, OffloadCorruptError, OffloadError
from ..profile.disk import PAGE_BYTES
from ..units import format_bytes, format_rate

__all__ = [
    "CHECKSUM",
    "MANIFEST_FORMAT",
    "VERIFY_BLOCK_BYTES",
    "DiskReader",
    "FileGuard",
    "HostBufferPool",
    "OffloadStore",
    "ReadResult",
    "TensorLocation",
    "safetensors_locations",
    "write_safetensors",
]

log = logging.getLogger(__name__)

MANIFEST_FORMAT = "tensortorrent-offload/2"
# CRC-32C with the CPU's crc32 instruction (the ``crc32c`` package) runs at about 12 GiB/s on
# the 2-core development machine (zlib's CRC-32 3.4 GiB/s there), releases the GIL for
# buffers of 32 KiB and more, and catches every burst of up to 32 flipped bits: verifying
# every read on a thread beside the reader's keeps up with the disk at a fraction of a core (it
# is bound by memory bandwidth: 12-15 GiB/s with two threads, for xxh3 as for CRC-32C). The store
# guards against damage, not against an adversary, so a cryptographic hash would buy nothing.
CHECKSUM = "crc32c"
# Stored bytes are checksummed in blocks of this size, counted from each tensor's first byte,
# so that a read of part of a tensor (a row chunk) is verified without the rest: the read is
# widened to whole blocks (nothing for a whole tensor or a chunk on a block boundary).
VERIFY_BLOCK_BYTES = 256 * 2**10
# threads that check what the reader threads read: one checks at 10 GiB/s, far above the disk,
# and leaves the other core of a 2-core host to compute (two cost 6% at batch 256 of
# bench.ram_offload, one nothing measurable; bench/verify_cost.py)
VERIFY_THREADS = 1
# Reads of this size split across the reader's threads; see DiskReader for the figures.
DEFAULT_CHUNK_BYTES = 16 * 2**20
DEFAULT_READ_THREADS = 4
# the smallest request a read is split into (a smaller read is one request)
MIN_REQUEST_BYTES = 2**20
DEFAULT_SHARD_BYTES = 256 * 2**20
# A store is verified in pieces of this size, this many in flight.
_VERIFY_PIECE_BYTES = 16 * 2**20
_VERIFY_LOOKAHEAD = 4
# The safetensors package refuses headers above this size; so do we.
_MAX_HEADER_BYTES = 100_000_000
# The safetensors format aligns the start of the data to this many bytes.
_DATA_ALIGNMENT = 8

_MANIFEST = "manifest.json"
# what a write to a full, read-only or forbidden directory fails with
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS})
_LOCK = ".lock"
_TEMP_PREFIX = ".tmp-"
_SHARD_NAME = re.compile(r"shard-[0-9a-f]{16}\.safetensors")

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class TensorLocation:
    """Where one tensor's bytes are: ``nbytes`` bytes at ``offset`` of ``path``, row-major."""

    key: str
    path: Path
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    # what the file is known to hold: a read of a guarded location is verified before use
    guard: FileGuard | None = dataclasses.field(default=None, compare=False, repr=False)

    def rows(self, start: int, stop: int) -> TensorLocation:
        """Where rows ``start:stop`` (along the first dimension) of this tensor are: a
        contiguous byte range of the same stored tensor (the same ``key``)."""
        if not self.shape or not 0 <= start < stop <= self.shape[0]:
            raise ValueError(f"{self.key}: no rows {start}:{stop} in shape {list(self.shape)}")
        row_bytes = self.nbytes // self.shape[0]
        return dataclasses.replace(
            self,
            offset=self.offset + start * row_bytes,
            nbytes=(stop - start) * row_bytes,
            shape=(stop - start, *self.shape[1:]),
        )


@dataclasses.dataclass
class ReadResult:
    """A tensor read by :class:`DiskReader`: ``tensor`` is a view into ``buffer``.

    Give ``buffer`` back with ``pool.give(buffer)`` once ``tensor`` is no longer used; the
    pool lends the same memory to a later read.
    """

    tensor: torch.Tensor
    buffer: torch.Tensor


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def read_buffer_bytes(nbytes: int) -> int:
    """The most a read of an ``nbytes`` tensor takes from the pool: its whole pages plus
    one, since with ``O_DIRECT`` it may start anywhere inside its first page."""
    return _round_up(nbytes, PAGE_BYTES) + PAGE_BYTES


def _names(keys: Sequence[str], limit: int = 8) -> str:
    """``'a', 'b' and 3 more``: a readable list of tensor names."""
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _dtype_name(key: str, dtype: torch.dtype) -> str:
    """The safetensors name of ``dtype``; raises :class:`OffloadError` for one we cannot store."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise OffloadError(
            f"{key}: tensors of dtype {dtype} cannot be stored on disk; the supported dtypes are "
            + ", ".join(str(d) for d in _DTYPES.values())
        )
    return name


def _tensor_bytes(key: str, tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in row-major order.

    A view of its own memory when it is a contiguous CPU tensor (no copy); otherwise a
    contiguous CPU copy. Reinterpreting as uint8 first lets numpy expose dtypes it lacks
    (bfloat16, float8).
    """
    if tensor.device.type == "meta":
        raise OffloadError(f"{key} is on the meta device: it has no bytes to store")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def checksum(data: memoryview | bytes, value: int = 0) -> int:
    """The CRC-32C of ``data``, continuing from the checksum ``value`` of the bytes before it."""
    return int(crc32c.crc32c(data, value))


def block_checksums(data: memoryview | bytes) -> tuple[int, ...]:
    """The checksum of each ``VERIFY_BLOCK_BYTES`` block of ``data`` (the last one shorter)."""
    view = memoryview(data)
    return tuple(
        checksum(view[i : i + VERIFY_BLOCK_BYTES]) for i in range(0, len(view), VERIFY_BLOCK_BYTES)
    )


class FileGuard:
    """What one file that feeds computations is known to hold, so every read is verified.

    ``tensors`` maps each tensor's key to ``(offset, nbytes, sums)``: where it is in the file
    and the checksum of each of its ``VERIFY_BLOCK_BYTES`` blocks, or ``None`` when nothing is
    known yet (a user's checkpoint): then the first read of a block records its checksum and
    every later read is held to it. The file's size, modification time and inode are taken
    when the guard is made; :meth:`check_unchanged` compares them (one ``stat``), which
    catches a checkpoint replaced or rewritten in place between calls even where the blocks
    read so far still match. ``source`` says what the file is and ``advice`` what to do when
    it is damaged, for the error.
    """

    def __init__(
        self,
        path: Path,
        tensors: Mapping[str, tuple[int, int, Sequence[int] | None]],
        source: str,
        advice: str,
    ) -> None:
        self.path = path
        self.source = source
        self.advice = advice
        self._spans = {key: (offset, nbytes) for key, (offset, nbytes, _) in tensors.items()}
        self._sums: dict[str, list[int | None]] = {
            key: list(sums) if sums is not None else [None] * -(-nbytes // VERIFY_BLOCK_BYTES)
            for key, (_, nbytes, sums) in tensors.items()
        }
        self._lock = threading.Lock()
        self.stamp = self._stat()

    def _stat(self) -> tuple[int, int, int]:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise OffloadCorruptError(
                f"{self.source} {self.path} is missing. {self.advice}", list(self._spans)
            ) from None
        return (stat.st_size, stat.st_mtime_ns, stat.st_ino)

    def locate(self, locations: Mapping[str, TensorLocation]) -> dict[str, TensorLocation]:
        """``locations`` (tensors of this file) with this guard attached."""
        return {key: dataclasses.replace(loc, guard=self) for key, loc in locations.items()}

    def check_unchanged(self) -> None:
        """Raise :class:`OffloadCorruptError` when the file was deleted, replaced, resized or
        written since the guard was made."""
        now = self._stat()
        if now != self.stamp:
            size, _, inode = self.stamp
            was = "replaced by another file" if now[2] != inode else "written"
            if now[0] != size:
                was += f", {size} bytes then and {now[0]} now"
            raise OffloadCorruptError(
                f"{self.source} {self.path} was {was} since TensorTorrent started reading it: "
                f"its bytes are no longer the ones planned with. {self.advice}",
                list(self._spans),
            )

    def span(self, loc: TensorLocation) -> tuple[int, int]:
        """The file range to read for ``loc`` so that it covers whole blocks of its tensor."""
        origin, nbytes = self._spans[loc.key]
        first = origin + (loc.offset - origin) // VERIFY_BLOCK_BYTES * VERIFY_BLOCK_BYTES
        last = origin + _round_up(loc.offset + loc.nbytes - origin, VERIFY_BLOCK_BYTES)
        return first, min(last, origin + nbytes)

    def blocks(self, loc: TensorLocation, low: int = 0, high: int | None = None) -> list[int]:
        """The indices of the blocks :meth:`span` of ``loc`` covers that lie wholly inside
        the file range ``[low, high)`` (default: all of them)."""
        origin, _ = self._spans[loc.key]
        first, last = self.span(loc)
        return [
            (start - origin) // VERIFY_BLOCK_BYTES
            for start in range(first, last, VERIFY_BLOCK_BYTES)
            if start >= low and (high is None or min(start + VERIFY_BLOCK_BYTES, last) <= high)
        ]

    def verify(
        self, loc: TensorLocation, data: memoryview, start: int, blocks: Iterable[int]
    ) -> list[int]:
        """Check the blocks ``blocks`` of ``loc``'s tensor in ``data`` (the file's bytes from
        offset ``start``); returns the indices of those that fail. A block seen for the
        first time is recorded."""
        origin, nbytes = self._spans[loc.key]
        end = origin + nbytes
        got = []
        for i in blocks:
            low = origin + i * VERIFY_BLOCK_BYTES
            high = min(low + VERIFY_BLOCK_BYTES, end)
            got.append((i, checksum(data[low - start : high - start])))
        bad = []
        with self._lock:
            known = self._sums[loc.key]
            for i, value in got:
                if known[i] is None:
                    known[i] = value
                elif known[i] != value:
                    bad.append(i)
        return bad

    def corrupt_error(self, loc: TensorLocation, bad: Sequence[int]) -> OffloadCorruptError:
        origin, _ = self._spans[loc.key]
        low = origin + bad[0] * VERIFY_BLOCK_BYTES
        return OffloadCorruptError(
            f"{self.source} {self.path}: the bytes of {loc.key!r} fail their checksum in "
            f"{len(bad)} block(s) of {format_bytes(VERIFY_BLOCK_BYTES)}, from byte {low}, on "
            f"two reads (the file was damaged or overwritten). {self.advice}",
            [loc.key],
        )


def _drop_from_page_cache(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to forget the cached pages of a range that was just read or written."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_create(path: Path) -> Iterator[BinaryIO]:
    """A file written under a temporary name and renamed to ``path`` once complete.

    The data is fsynced before the rename and the directory after it, so ``path`` names
    either the previous file or the complete new one, whenever the machine stops. The
    written pages are dropped from the page cache: the data is not read back soon, and
    writing gigabytes of weights must not evict everything else.
    """
    temp = path.with_name(f"{_TEMP_PREFIX}{secrets.token_hex(6)}-{path.name}")
    try:
        with open(temp, "xb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
            _drop_from_page_cache(file.fileno(), 0, 0)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def safetensors_locations(path: str | os.PathLike[str]) -> dict[str, TensorLocation]:
    """Where each tensor of the safetensors file ``path`` is, read from its header alone.

    The format: an 8-byte little-endian header length, a JSON header mapping each name to
    its dtype, shape and ``data_offsets`` (relative to the end of the header), then the
    data. Raises :class:`CheckpointError` naming the file and the problem when the file is
    missing, truncated or malformed, or holds a dtype we cannot read.
    """
    file = Path(os.path.abspath(path))

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{file}: {problem}")

    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise bad(f"{size} bytes is too short for a safetensors file")
            header_bytes = int.from_bytes(prefix, "little")
            if header_bytes > min(size - 8, _MAX_HEADER_BYTES):
                raise bad(
                    f"the header claims {header_bytes} bytes but the file has {size - 8} after "
                    "the length prefix: truncated, or not a safetensors file"
                )
            raw = f.read(header_bytes)
    except FileNotFoundError:
        raise bad("no such file") from None
    except IsADirectoryError:
        raise bad("is a directory, not a safetensors file") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"the header is not JSON ({exc}): not a safetensors file, or damaged") from None
    if not isinstance(header, dict):
        raise bad(f"the header is a JSON {type(header).__name__}, not an object")
    data_start = 8 + header_bytes
    locations: dict[str, TensorLocation] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise bad(f"tensor {key!r}: expected dtype, shape and two data_offsets") from None
        dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise bad(
                f"tensor {key!r} has dtype {dtype_name!r}, which TensorTorrent cannot read; "
                f"supported: {', '.join(_DTYPES)}"
            )
        ints = [*shape, begin, end] if isinstance(shape, list) else None
        if ints is None or not all(type(n) is int and n >= 0 for n in ints) or end < begin:
            raise bad(f"tensor {key!r}: malformed shape {shape!r} or data_offsets {entry!r}")
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes:
            raise bad(
                f"tensor {key!r} of shape {shape} and dtype {dtype_name} needs {nbytes} bytes "
                f"but its data_offsets span {end - begin}"
            )
        if data_start + end > size:
            raise bad(
                f"tensor {key!r} ends at byte {data_start + end} but the file has {size} bytes: "
                "truncated"
            )
        locations[key] = TensorLocation(key, file, data_start + begin, nbytes, dtype, tuple(shape))
    return locations


@dataclasses.dataclass(frozen=True)
class _Written:
    """What writing one safetensors file produced."""

    locations: dict[str, TensorLocation]
    data_start: int
    header_sums: tuple[int, ...]
    size: int


def _write_file(path: Path, tensors: Sequence[tuple[str, torch.Tensor]]) -> _Written:
    """Write ``tensors`` as the safetensors file ``path``, atomically.

    Tensors are laid out by decreasing element size (stable, so model order is kept within
    a dtype): with the data starting at a multiple of 8, every tensor then starts at a
    multiple of its element size, and a reader can view its bytes in place.
    """
    ordered = sorted(tensors, key=lambda item: -item[1].element_size())
    header: dict[str, Any] = {}
    offset = 0
    for key, tensor in ordered:
        nbytes = tensor.numel() * tensor.element_size()
        header[key] = {
            "dtype": _dtype_name(key, tensor.dtype),
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    # Pad with spaces (valid JSON whitespace) so that the data starts aligned.
    text += b" " * (_round_up(8 + len(text), _DATA_ALIGNMENT) - 8 - len(text))
    head = len(text).to_bytes(8, "little") + text
    with _atomic_create(path) as file:
        file.write(head)
        for key, tensor in ordered:
            file.write(_tensor_bytes(key, tensor))
    start = len(head)
    return _Written(
        locations={
            key: TensorLocation(
                key,
                path,
                start + header[key]["data_offsets"][0],
                tensor.numel() * tensor.element_size(),
                tensor.dtype,
                tuple(tensor.shape),
            )
            for key, tensor in tensors
        },
        data_start=start,
        header_sums=block_checksums(head),
        size=start + offset,
    )


def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor]
) -> dict[str, TensorLocation]:
    """Write ``tensors`` as a safetensors file at ``path``; returns where each one is.

    The file is complete or absent: it is written under a temporary name in the same
    directory, fsynced and renamed. Non-contiguous tensors are written in row-major order.
    """
    file = Path(os.path.abspath(path))
    return _write_file(file, list(tensors.items())).locations


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


@dataclasses.dataclass(frozen=True)
class _OpenFile:
    """A descriptor the reader keeps open, and which file it was opened on."""

    fd: int
    direct: bool
    identity: tuple[int, int]  # (st_dev, st_ino): a file replaced under the same name differs


class _Job:
    """One submitted read: its chunks still out, the first error, the future to complete."""

    def __init__(
        self,
        loc: TensorLocation,
        file: _OpenFile,
        buffer: torch.Tensor,
        file_start: int,
        file_stop: int,
    ) -> None:
        self.loc = loc
        self.file = file
        self.buffer = buffer
        self.file_start = file_start  # file offset of buffer[0]
        self.file_stop = file_stop  # the end of the range read
        self.future: concurrent.futures.Future[ReadResult] = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()  # a read in flight cannot be cancelled
        self.lock = threading.Lock()
        self.remaining = 0
        self.error: BaseException | None = None
        # checksum blocks not checked yet (each request checks those inside it) and failed
        self.unchecked = set(loc.guard.blocks(loc)) if loc.guard is not None else set()
        self.bad: list[int] = []


def _open_direct(path: Path) -> int | None:
    """A descriptor of ``path`` that reads with ``O_DIRECT``, or ``None`` when the filesystem
    refuses (some refuse the open, others only the first read, both with ``EINVAL``)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    probe = mmap.mmap(-1, PAGE_BYTES)
    try:
        os.preadv(fd, [probe], 0)
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.EINVAL:
            return None
        raise
    finally:
        probe.close()
    return fd


class DiskReader:
    """Background threads that read tensors into pooled page-aligned buffers, page cache bypassed.

    ``direct=None`` reads with ``O_DIRECT`` wherever the filesystem allows it (probed per
    file) and elsewhere reads buffered, then drops the pages read with
    ``posix_fadvise(POSIX_FADV_DONTNEED)``; ``True`` insists on ``O_DIRECT``, ``False``
    never uses it. A read is split into requests that the ``threads`` share, so that one
    tensor keeps every thread's request in flight at the disk: at most ``chunk_bytes``
    each, and smaller for a read under ``threads * chunk_bytes`` (a 16 MiB read is four
    4 MiB requests with 4 threads, not one), down to ``MIN_REQUEST_BYTES``.

    Reading a 1 GiB safetensors file cold with ``O_DIRECT`` from the ext4 virtual disk of the
    2-core development machine (medians of 3-5 passes, taken in turn so that the disk's drift
    hits every setting alike; ``dd iflag=direct bs=16M`` gets 0.7-1.0 GB/s there): 1 thread
    0.93-1.17 GB/s, 2 threads 1.19-1.28 GB/s, 4 threads 1.24-1.37 GB/s, for chunks of 4 to
    32 MiB (16 MiB best or tied; 64 MiB no better). Buffered reads with the pages dropped get
    0.86-0.94 GB/s. Hence 4 threads, 16 MiB chunks: the threads only wait on the disk.
    """

    def __init__(
        self,
        pool: HostBufferPool,
        threads: int = DEFAULT_READ_THREADS,
        direct: bool | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        if threads < 1:
            raise ValueError(f"a DiskReader needs at least one thread, got {threads}")
        if chunk_bytes <= 0 or chunk_bytes % PAGE_BYTES:
            raise ValueError(f"chunk_bytes must be a positive multiple of 4096, got {chunk_bytes}")
        if direct and not hasattr(os, "O_DIRECT"):
            raise OffloadError("direct=True: this platform has no O_DIRECT")
        self.pool = pool
        self.direct = direct
        self.threads = threads
        self.chunk_bytes = chunk_bytes
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="tensortorrent-disk"
        )
        self._verifier = concurrent.futures.ThreadPoolExecutor(
            max_workers=VERIFY_THREADS, thread_name_prefix="tensortorrent-verify"
        )
        self._lock = threading.Lock()
        self._files: dict[Path, _OpenFile] = {}
        self._replaced: list[_OpenFile] = []  # may still be read from; closed by close()
        self._bytes_read = 0
        self._verify_s = 0.0
        self._closed = False
        # a test seam: called with each request's location before it is read
        self.before_read: Callable[[TensorLocation], None] | None = None

    def __enter__(self) -> DiskReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def bytes_read(self) -> int:
        """Bytes of tensor data delivered so far (not counting alignment padding)."""
        with self._lock:
            return self._bytes_read

    @property
    def verify_seconds(self) -> float:
        """Seconds spent verifying checksums so far, all threads summed."""
        with self._lock:
            return self._verify_s

    def submit(self, loc: TensorLocation) -> concurrent.futures.Future[ReadResult]:
        """Start reading ``loc``; the future's result holds the tensor and its pool buffer.

        With ``O_DIRECT`` the enclosing page-aligned range is read (a tensor inside a
        safetensors file seldom starts on a page) and the tensor is a view at its offset.
        """
        itemsize = loc.dtype.itemsize
        if loc.nbytes != math.prod(loc.shape) * itemsize or loc.offset < 0:
            raise ValueError(
                f"{loc.key}: {loc.nbytes} bytes at offset {loc.offset} do not hold a "
                f"{loc.dtype} tensor of shape {list(loc.shape)}"
            )
        try:
            file = self._open(loc.path)
        except OSError as exc:
            if loc.guard is not None and isinstance(exc, FileNotFoundError):
                loc.guard.check_unchanged()  # names the missing file and what to do
            raise OffloadError(
                f"cannot open {loc.path} to read {loc.key!r}: {exc.strerror or exc}"
            ) from exc
        # a guarded read covers whole checksum blocks (the tensor's own range, mostly)
        low, high = (
            (loc.offset, loc.offset + loc.nbytes) if loc.guard is None else loc.guard.span(loc)
        )
        if file.direct:
            first, last = low // PAGE_BYTES * PAGE_BYTES, _round_up(high, PAGE_BYTES)
            # Ask for the widest span a tensor of this size can need wherever it starts, so
            # that equal tensors share one capacity in the pool.
            buffer = self.pool.take(read_buffer_bytes(high - low))
        else:
            first, last = low, high
            buffer = self.pool.take(high - low)
        job = _Job(loc, file, buffer, first, last)
        share = _round_up(-(-(last - first) // self.threads), PAGE_BYTES)
        step = min(self.chunk_bytes, max(share, MIN_REQUEST_BYTES))
        spans = [
            (start, min(start + step, last))
            for start in range(first, last if loc.nbytes else first, max(step, PAGE_BYTES))
        ]
        job.remaining = len(spans)
        if not spans:
            self._complete(job)
        for start, stop in spans:
            self._executor.submit(self._read_span, job, start, stop)
        return job.future

    def close(self) -> None:
        """Wait for the reads in flight, stop the threads and close the files."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)
        self._verifier.shutdown(wait=True)
        for file in [*self._files.values(), *self._replaced]:
            os.close(file.fd)
        self._files.clear()
        self._replaced.clear()

    def _open(self, path: Path) -> _OpenFile:
        """The cached descriptor of ``path``, reopened when the file was replaced."""
        stat = os.stat(path)
        identity = (stat.st_dev, stat.st_ino)
        with self._lock:
            if self._closed:
                raise OffloadError("this DiskReader is closed")
            file = self._files.get(path)
            if file is not None and file.identity == identity:
                return file
            if file is not None:
                self._replaced.append(file)
            fd = _open_direct(path) if self.direct is not False else None
            direct = fd is not None
            if fd is None:
                if self.direct:
                    raise OffloadError(
                        f"{path}: the filesystem refuses O_DIRECT; pass direct=None to read it "
                        "buffered, dropping the pages read from the page cache"
                    )
                if self.direct is None:
                    log.debug(
                        "offload: %s refuses O_DIRECT; reading it buffered, with "
                        "posix_fadvise(DONTNEED) after each read",
                        path,
                    )
                fd = os.open(path, os.O_RDONLY)
            file = _OpenFile(fd, direct, identity)
            self._files[path] = file
            return file

    def _read_span(self, job: _Job, start: int, stop: int) -> None:
        """Read bytes ``[start, stop)`` of the job's file into its buffer (one chunk)."""
        try:
            self._read_into(job, start, stop)
            if job.loc.guard is not None:
                # The blocks inside this request are checked on a verifier thread, so this
                # one goes straight on to the next request and the disk stays busy.
                blocks = job.loc.guard.blocks(job.loc, start, stop)
                with job.lock:
                    job.remaining += 1
                self._verifier.submit(self._check_request, job, blocks)
        except BaseException as exc:
            with job.lock:
                job.error = job.error or exc
        self._done_with(job)

    def _check_request(self, job: _Job, blocks: list[int]) -> None:
        """Check the blocks one request read (on a verifier thread)."""
        try:
            bad = self._check(job, blocks)
            with job.lock:
                job.unchecked.difference_update(blocks)
                job.bad += bad
        except BaseException as exc:
            with job.lock:
                job.error = job.error or exc
        self._done_with(job)

    def _done_with(self, job: _Job) -> None:
        """One request or check of ``job`` is over; the last one completes the job."""
        with job.lock:
            job.remaining -= 1
            done = job.remaining == 0
        if done:
            self._complete(job)

    def _read_into(self, job: _Job, start: int, stop: int) -> None:
        """Read bytes ``[start, stop)`` of the job's file into its buffer, or raise."""
        view = job.buffer.numpy().data[start - job.file_start : stop - job.file_start]
        got = 0
        try:
            if self.before_read is not None:
                self.before_read(job.loc)
            while got < len(view):
                n = os.preadv(job.file.fd, [view[got:]], start + got)
                if n == 0:
                    break
                got += n
                if job.file.direct and got % PAGE_BYTES:
                    break  # O_DIRECT stops short of a page only at the end of the file
        except OSError as exc:
            raise OffloadError(
                f"reading {job.loc.key!r} from {job.loc.path} at byte {start + got} failed: "
                f"{exc.strerror or exc} (errno {exc.errno}); the disk or its file system "
                "reports an error"
            ) from exc
        end = job.loc.offset + job.loc.nbytes
        if got < min(stop, end) - start:
            raise OffloadError(
                f"{job.loc.path} ends at byte {start + got}, before the end of "
                f"{job.loc.key!r} at byte {end}: the file is truncated or was replaced"
            )
        if not job.file.direct:
            # Whole pages: the kernel keeps a page only partly inside the range.
            first = start // PAGE_BYTES * PAGE_BYTES
            _drop_from_page_cache(job.file.fd, first, _round_up(start + got, PAGE_BYTES) - first)

    def _check(self, job: _Job, blocks: Iterable[int]) -> list[int]:
        """Check ``blocks`` of a guarded job's buffer; the indices of those that fail."""
        assert job.loc.guard is not None
        begin = time.perf_counter()
        bad = job.loc.guard.verify(job.loc, job.buffer.numpy().data, job.file_start, blocks)
        with self._lock:
            self._verify_s += time.perf_counter() - begin
        return bad

    def _verified(self, job: _Job) -> None:
        """Check the blocks of a guarded job that no request could check alone (those
        across two requests); on any mismatch read the whole range once more (on this
        thread) and check it all again; raise :class:`OffloadCorruptError` if it still
        fails."""
        guard = job.loc.guard
        assert guard is not None
        bad = job.bad + self._check(job, sorted(job.unchecked))
        if bad:
            log.warning(
                "offload: %r from %s failed its checksum; reading it again",
                job.loc.key,
                job.loc.path,
            )
            self._read_into(job, job.file_start, job.file_stop)
            bad = self._check(job, guard.blocks(job.loc))
        if bad:
            raise guard.corrupt_error(job.loc, sorted(bad))

    def _complete(self, job: _Job) -> None:
        """Resolve the job's future once every chunk is in (and verified, when guarded)."""
        if job.error is None and job.loc.guard is not None:
            try:
                self._verified(job)
            except BaseException as exc:
                job.error = exc
        if job.error is not None:
            self.pool.give(job.buffer)
            job.future.set_exception(job.error)
            return
        loc, buffer = job.loc, job.buffer
        start = loc.offset - job.file_start
        if (buffer.storage_offset() + start) % loc.dtype.itemsize:
            # Viewing bytes as a wider dtype needs an aligned start; files from other writers
            # may not align their tensors, so move the bytes to the (aligned) buffer start.
            ctypes.memmove(buffer.data_ptr(), buffer.data_ptr() + start, loc.nbytes)
            start = 0
        tensor = buffer[start : start + loc.nbytes].view(loc.dtype).view(loc.shape)
        with self._lock:
            self._bytes_read += loc.nbytes
        job.future.set_result(ReadResult(tensor, buffer))


@dataclasses.dataclass(frozen=True)
class _Shard:
    """One shard file as written: its size, where its data starts, its header's checksums."""

    size: int
    data_start: int
    header_sums: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "header_sums", tuple(self.header_sums))


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One stored tensor: its shard, where it is in it, and the checksums of its bytes, one
    per ``VERIFY_BLOCK_BYTES`` block."""

    shard: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    sums: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "sums", tuple(self.sums))


@dataclasses.dataclass
class _Manifest:
    """The parsed ``manifest.json``: shards by file name, stored tensors by key."""

    shards: dict[str, _Shard]
    tensors: dict[str, _Entry]

    def keys_in(self, shard: str) -> list[str]:
        """The keys stored in ``shard``, in file order."""
        keys = [k for k, e in self.tensors.items() if e.shard == shard]
        return sorted(keys, key=lambda k: self.tensors[k].offset)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "checksum": CHECKSUM,
                "block_bytes": VERIFY_BLOCK_BYTES,
                "shards": {n: dataclasses.asdict(s) for n, s in self.shards.items()},
                "tensors": {k: dataclasses.asdict(e) for k, e in self.tensors.items()},
            },
            indent=1,
        ).encode()


@dataclasses.dataclass(frozen=True)
class _Damage:
    """A shard that failed verification: what is wrong and the damaged keys."""

    shard: str
    problem: str
    keys: list[str]


class OffloadStore:
    """Safetensors shards in one directory, described by ``manifest.json`` with checksums.

    Each tensor is stored once: :meth:`write` reuses a stored tensor whose dtype, shape and
    checksum match and whose bytes still pass verification, and packs everything else into
    new shards of about ``shard_bytes``. Shards are written completely before the manifest
    names them, and the manifest is replaced atomically, so a crash at any point leaves the
    previous state. An exclusive ``flock`` on ``<directory>/.lock`` serialises writers
    across processes; readers of the manifest take it shared.
    """

    def __init__(
        self, directory: str | os.PathLike[str], shard_bytes: int = DEFAULT_SHARD_BYTES
    ) -> None:
        if shard_bytes <= 0:
            raise ValueError(f"shard_bytes must be positive, got {shard_bytes}")
        self.directory = Path(os.path.abspath(directory))
        self.shard_bytes = shard_bytes

    def write(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, TensorLocation]:
        """Make sure every tensor of ``tensors`` is stored; returns where each one is.

        Other tensors already in the store stay. Raises :class:`OffloadError` for a tensor
        that cannot be stored (a meta tensor, an unsupported dtype).
        """
        with self._locked(exclusive=True):
            manifest = self._load()
            for key, tensor in tensors.items():
                _dtype_name(key, tensor.dtype)
            sums = {key: block_checksums(_tensor_bytes(key, t)) for key, t in tensors.items()}
            stored = {
                key
                for key, tensor in tensors.items()
                if (entry := manifest.tensors.get(key)) is not None
                and entry.dtype == _DTYPE_NAMES[tensor.dtype]
                and entry.shape == tuple(tensor.shape)
                and entry.sums == sums[key]
            }
            damage = self._scan(manifest, stored)
            damaged = {key for d in damage for key in d.keys}
            if damaged:
                log.warning(
                    "offload: %s; rewriting them from the model's weights",
                    "; ".join(f"{self.directory / d.shard} {d.problem}" for d in damage),
                )
            todo = {k: t for k, t in tensors.items() if k not in stored or k in damaged}
            if not todo:
                log.info(
                    "offload: all %d tensors (%s) already stored in %s",
                    len(tensors),
                    format_bytes(sum(manifest.tensors[k].nbytes for k in tensors)),
                    self.directory,
                )
            self._commit(manifest, todo, sums)
            return self._locations(manifest, tensors)

    def locations(
        self, keys: Iterable[str] | None = None, verify: bool = True
    ) -> dict[str, TensorLocation]:
        """Where the stored tensors ``keys`` (default: all) are, from the manifest.

        With ``verify``, every shard holding one of them is read (around the page cache, so
        checking does not warm it) and checked against the manifest; a damaged or missing
        one raises :class:`OffloadCorruptError`. Raises :class:`OffloadError` for a key that
        is not stored.
        """
        with self._locked(exclusive=False):
            manifest = self._load()
            wanted = list(manifest.tensors) if keys is None else list(keys)
            missing = [key for key in wanted if key not in manifest.tensors]
            if missing:
                raise OffloadError(f"{self.directory} does not store {_names(missing)}")
            if verify:
                damage = self._scan(manifest, set(wanted))
                if damage:
                    raise self._corrupt_error(damage)
            return self._locations(manifest, wanted)

    def verify(self) -> list[str]:
        """The keys whose bytes fail their checksum or whose shard is missing or truncated."""
        with self._locked(exclusive=False):
            manifest = self._load()
            return sorted(
                key for d in self._scan(manifest, set(manifest.tensors)) for key in d.keys
            )

    def repair(self, sources: Mapping[str, torch.Tensor]) -> list[str]:
        """Rewrite every damaged tensor from ``sources``; returns the keys rewritten.

        Raises :class:`OffloadCorruptError`, before writing anything, when a damaged tensor
        has no source.
        """
        with self._locked(exclusive=True):
            manifest = self._load()
            damage = self._scan(manifest, set(manifest.tensors))
            unsourced = [
                _Damage(d.shard, d.problem, [k for k in d.keys if k not in sources]) for d in damage
            ]
            unsourced = [d for d in unsourced if d.keys]
            if unsourced:
                raise self._corrupt_error(unsourced, "and no source was given for them")
            todo = {key: sources[key] for d in damage for key in d.keys}
            sums = {key: block_checksums(_tensor_bytes(key, t)) for key, t in todo.items()}
            self._commit(manifest, todo, sums)
            return sorted(todo)

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """Hold ``<directory>/.lock``: exclusively to change the store, shared to read it."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno not in _WRITE_ERRNOS:
                raise
            raise self._write_error(0, None, exc.strerror or str(exc)) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _load(self) -> _Manifest:
        """The manifest; an empty one when none was written yet."""
        path = self.directory / _MANIFEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return _Manifest({}, {})
        try:
            data = json.loads(raw)
            if data.get("format") != MANIFEST_FORMAT or data.get("checksum") != CHECKSUM:
                raise OffloadError(
                    f"{path} is in format {data.get('format')!r} with checksum "
                    f"{data.get('checksum')!r}; this version of TensorTorrent reads "
                    f"{MANIFEST_FORMAT!r} with {CHECKSUM!r}: delete {self.directory} or choose "
                    "another offload_dir"
                )
            shards = {str(n): _Shard(**s) for n, s in data["shards"].items()}
            tensors = {
                str(k): _Entry(**{**e, "shape": tuple(e["shape"])})
                for k, e in data["tensors"].items()
            }
            if any(_SHARD_NAME.fullmatch(name) is None for name in shards):
                raise ValueError("a shard has a name this store does not write")
            if any(e.shard not in shards or e.dtype not in _DTYPES for e in tensors.values()):
                raise ValueError("a tensor names an unknown shard or dtype")
            items: list[_Shard | _Entry] = [*shards.values(), *tensors.values()]
            for item in items:
                for field in dataclasses.fields(item):  # every field not a str holds counts
                    value = getattr(item, field.name)
                    counts = value if isinstance(value, tuple) else (value,)
                    if field.type != "str" and not all(type(n) is int and n >= 0 for n in counts):
                        raise ValueError(f"{field.name} is {value!r}, not a count")
            sizes = {k: math.prod(e.shape) * _DTYPES[e.dtype].itemsize for k, e in tensors.items()}
            if any(e.nbytes != sizes[k] for k, e in tensors.items()):
                raise ValueError("a tensor's size does not match its shape and dtype")
            if data.get("block_bytes") != VERIFY_BLOCK_BYTES:
                raise ValueError(f"checksum blocks of {data.get('block_bytes')!r} bytes")
            blocks = [(e.sums, e.nbytes) for e in tensors.values()]
            blocks += [(s.header_sums, s.data_start) for s in shards.values()]
            if any(len(sums) != -(-n // VERIFY_BLOCK_BYTES) for sums, n in blocks):
                raise ValueError("a checksum list does not cover its bytes")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise OffloadCorruptError(
                f"{path} cannot be read ({exc}); delete {self.directory} and compile again "
                "from the model's weights"
            ) from None
        return _Manifest(shards, tensors)

    def _locations(self, manifest: _Manifest, keys: Iterable[str]) -> dict[str, TensorLocation]:
        """Where the stored tensors ``keys`` are, each guarded by its shard's checksums."""
        keys = list(keys)
        guards = {
            name: FileGuard(
                self.directory / name,
                {
                    k: (
                        manifest.tensors[k].offset,
                        manifest.tensors[k].nbytes,
                        manifest.tensors[k].sums,
                    )
                    for k in manifest.keys_in(name)
                },
                source="offload shard",
                advice=(
                    "The store holds the only copy of these weights (the model's were released "
                    f"to it): delete {self.directory}, reload the model and compile again"
                ),
            )
            for name in sorted({manifest.tensors[k].shard for k in keys})
        }
        locations = {}
        for key in keys:
            entry = manifest.tensors[key]
            locations[key] = TensorLocation(
                key,
                self.directory / entry.shard,
                entry.offset,
                entry.nbytes,
                _DTYPES[entry.dtype],
                entry.shape,
                guards[entry.shard],
            )
        return locations

    def _scan(self, manifest: _Manifest, keys: set[str]) -> list[_Damage]:
        """Check every shard holding one of ``keys``; the damage found to ``keys``.

        A shard that is missing, has another size than written or a damaged header takes
        down all its keys; otherwise each key whose bytes fail their checksum is damaged.
        """
        shards = sorted({manifest.tensors[key].shard for key in keys})
        if not shards:
            return []
        damage: list[_Damage] = []
        start = time.perf_counter()
        scanned = 0
        with DiskReader(HostBufferPool()) as reader:
            for name in shards:
                found = self._check_shard(reader, manifest, name)
                scanned += manifest.shards[name].size
                bad = [key for key in found.keys if key in keys] if found else []
                if found and bad:
                    damage.append(_Damage(name, found.problem, bad))
        elapsed = time.perf_counter() - start
        log.debug(
            "offload: verified %d shards (%s) in %.2f s",
            len(shards),
            format_bytes(scanned),
            elapsed,
        )
        return damage

    def _check_shard(self, reader: DiskReader, manifest: _Manifest, name: str) -> _Damage | None:
        """What is wrong with shard ``name`` and which keys it spoils; ``None`` if it is sound."""
        shard = manifest.shards[name]
        keys = manifest.keys_in(name)
        path = self.directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return _Damage(name, "is missing", keys)
        if size != shard.size:
            problem = f"is {size} bytes, not {shard.size} as written (truncated or overwritten)"
            return _Damage(name, problem, keys)
        header = "<header>"
        ranges = [(header, 0, shard.data_start)]
        ranges += [(k, manifest.tensors[k].offset, manifest.tensors[k].nbytes) for k in keys]
        try:
            sums = _range_checksums(reader, path, size, ranges)
        except (OSError, OffloadError) as exc:
            return _Damage(name, f"cannot be read ({exc})", keys)
        if sums[header] != shard.header_sums:
            return _Damage(name, "has a damaged header (checksum mismatch)", keys)
        bad = [k for k in keys if sums[k] != manifest.tensors[k].sums]
        return _Damage(name, f"fails its checksum for {len(bad)} tensor(s)", bad) if bad else None

    def _commit(
        self,
        manifest: _Manifest,
        todo: Mapping[str, torch.Tensor],
        sums: Mapping[str, tuple[int, ...]],
    ) -> None:
        """Write ``todo`` to new shards, then the manifest naming them, then sweep.

        The free space is checked first. A write that fails (no space, no permission, a
        read-only file system) raises :class:`OffloadError` saying what to do, and the
        shards already written by this call are deleted: the store is as it was.
        """
        if todo:
            total = sum(t.numel() * t.element_size() for t in todo.values())
            # the shards, their headers and the manifest (each block's checksum in JSON)
            needed = total + 2**20 + 512 * len(todo) + 24 * sum(len(v) for v in sums.values())
            free = self._free_bytes()
            if needed > free:
                raise self._write_error(needed, free, "there is not enough free space")
            log.info(
                "offload: writing %d tensors, %s to %s",
                len(todo),
                format_bytes(total),
                self.directory,
            )
            start = time.perf_counter()
            new: list[Path] = []
            try:
                for group in self._pack(todo):
                    name = f"shard-{secrets.token_hex(8)}.safetensors"
                    new.append(self.directory / name)
                    written = _write_file(new[-1], [(k, todo[k]) for k in group])
                    manifest.shards[name] = _Shard(
                        written.size, written.data_start, written.header_sums
                    )
                    for key, loc in written.locations.items():
                        manifest.tensors[key] = _Entry(
                            name,
                            loc.offset,
                            loc.nbytes,
                            _DTYPE_NAMES[loc.dtype],
                            loc.shape,
                            sums[key],
                        )
                used = {e.shard for e in manifest.tensors.values()}
                manifest.shards = {n: s for n, s in manifest.shards.items() if n in used}
                with _atomic_create(self.directory / _MANIFEST) as file:
                    file.write(manifest.to_json())
            except OSError as exc:
                for path in new:
                    path.unlink(missing_ok=True)
                if exc.errno not in _WRITE_ERRNOS:
                    raise
                raise self._write_error(
                    needed, self._free_bytes(), exc.strerror or str(exc)
                ) from exc
            elapsed = time.perf_counter() - start
            log.info(
                "offload: wrote %d tensors, %s in %.2f s (%s)",
                len(todo),
                format_bytes(total),
                elapsed,
                format_rate(total / max(elapsed, 1e-9), "B/s"),
            )
        self._sweep(manifest)

    def _free_bytes(self) -> int:
        """Bytes an unprivileged writer may still write to the store's file system."""
        stat = os.statvfs(self.directory)
        return stat.f_bavail * stat.f_frsize

    def _write_error(self, needed: int, free: int | None, why: str) -> OffloadError:
        room = f", {format_bytes(free)} free" if free is not None else ""
        return OffloadError(
            f"cannot write weights to the offload directory {self.directory}: {why} (this needs "
            f"{format_bytes(needed)}{room}). Choose another offload_dir with room "
            "(options={'offload_dir': ...}) or raise the host budget (budgets={'cpu': ...}) so "
            "that fewer weights live on disk; the model's weights are untouched"
        )

    def _pack(self, todo: Mapping[str, torch.Tensor]) -> list[list[str]]:
        """Group keys, in order, into shards of about ``shard_bytes`` (a larger tensor alone)."""
        groups: list[list[str]] = []
        size = 0
        for key, tensor in todo.items():
            nbytes = tensor.numel() * tensor.element_size()
            if not groups or (size + nbytes > self.shard_bytes and size > 0):
                groups.append([])
                size = 0
            groups[-1].append(key)
            size += nbytes
        return groups

    def _sweep(self, manifest: _Manifest) -> None:
        """Delete temporary files and shards the manifest no longer names.

        Only called under the exclusive lock, when no other writer can be mid-write.
        """
        for entry in os.scandir(self.directory):
            stale = entry.name.startswith(_TEMP_PREFIX) or (
                _SHARD_NAME.fullmatch(entry.name) is not None and entry.name not in manifest.shards
            )
            if stale:
                Path(entry.path).unlink(missing_ok=True)

    def _corrupt_error(self, damage: list[_Damage], why: str = "") -> OffloadCorruptError:
        found = "; ".join(
            f"{self.directory / d.shard} {d.problem}, holding {_names(d.keys)}" for d in damage
        )
        return OffloadCorruptError(
            f"offloaded weights are damaged: {found}{' ' + why if why else ''}. The only copy "
            f"of these weights is corrupt; delete {self.directory} and compile again from the "
            "model's weights",
            [key for d in damage for key in d.keys],
        )


def _range_checksums(
    reader: DiskReader, path: Path, size: int, ranges: list[tuple[str, int, int]]
) -> dict[str, tuple[int, ...]]:
    """The block checksums (as :func:`block_checksums`) of each named byte range
    ``(name, offset, nbytes)`` of ``path``, in one pass.

    The file is read front to back in pieces through ``reader``, a few pieces ahead of the
    checksumming, which overlaps the two; ranges must not overlap.
    """
    sums: dict[str, list[int]] = {name: [] for name, _, _ in ranges}
    partial: dict[str, int] = {}  # the checksum so far of a range's block cut by a piece end
    ordered = sorted(ranges, key=lambda r: r[1])
    pieces = [(p, min(p + _VERIFY_PIECE_BYTES, size)) for p in range(0, size, _VERIFY_PIECE_BYTES)]
    pending: deque[concurrent.futures.Future[ReadResult]] = deque()
    submitted = 0
    current = 0  # the first range not yet fully summed
    for low, high in pieces:
        while submitted < len(pieces) and len(pending) < _VERIFY_LOOKAHEAD:
            p, q = pieces[submitted]
            pending.append(
                reader.submit(TensorLocation(str(path), path, p, q - p, torch.uint8, (q - p,)))
            )
            submitted += 1
        result = pending.popleft().result()
        data = result.tensor.numpy().data
        while current < len(ordered):
            name, offset, nbytes = ordered[current]
            end = offset + nbytes
            pos = max(offset, low)
            while pos < min(end, high):
                block_end = min(offset + _round_up(pos + 1 - offset, VERIFY_BLOCK_BYTES), end)
                stop = min(block_end, high)
                value = checksum(data[pos - low : stop - low], partial.pop(name, 0))
                if stop == block_end:
                    sums[name].append(value)
                else:
                    partial[name] = value
                pos = stop
            if end > high:
                break
            current += 1
        reader.pool.give(result.buffer)
    return {name: tuple(values) for name, values in sums.items()}
