"""Where tensors' bytes are in files (:class:`TensorLocation`), the checksums of those bytes,
block by block, and the guard that holds every read to them.

* :func:`checksum` is CRC-32C and :func:`block_checksums` sums bytes in blocks of
  ``VERIFY_BLOCK_BYTES``, so that a read of part of a tensor is verified without the rest.
* :class:`FileGuard` is what a file feeding computations is known to hold: its identity and
  its tensors' block checksums (from the store's manifest, or recorded at the first read of
  a user's checkpoint). The reader verifies every read of a guarded location against it
  before handing the bytes on, and fails with :class:`OffloadCorruptError` on a mismatch
  that a second read does not cure: no computation ever sees unverified bytes.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import crc32c
import torch

from ..errors import OffloadCorruptError
from ..units import format_bytes
from .page_cache import _round_up

__all__ = [
    "CHECKSUM",
    "VERIFY_BLOCK_BYTES",
    "FileGuard",
    "TensorLocation",
    "block_checksums",
    "checksum",
    "dense",
]

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


def dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``strides`` lay out a tensor of ``shape`` over exactly as many elements as it
    has, each once (in any order of its dimensions: row-major, ``channels_last``, ...)."""
    if len(strides) != len(shape) or 0 in shape:
        return False
    expected = 1
    for size, stride in sorted(zip(shape, strides, strict=True), key=lambda d: (d[1], d[0])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


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


@dataclasses.dataclass(frozen=True)
class TensorLocation:
    """Where one tensor's bytes are: ``nbytes`` bytes at ``offset`` of ``path``, row-major,
    or in the order of ``strides`` (a dense tensor of another memory format, as
    ``channels_last`` convolution weights are: its bytes as they are in memory)."""

    key: str
    path: Path
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    # what the file is known to hold: a read of a guarded location is verified before use
    guard: FileGuard | None = dataclasses.field(default=None, compare=False, repr=False)
    # the tensor's strides, where its bytes are not row-major
    strides: tuple[int, ...] | None = None

    def tensor(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor whose bytes ``flat`` (1-D, of this location's dtype) holds: of its
        shape, and of its strides where they are not row-major."""
        if self.strides is None:
            return flat.view(self.shape)
        return flat.as_strided(self.shape, self.strides)

    def rows(self, start: int, stop: int) -> TensorLocation:
        """Where rows ``start:stop`` (along the first dimension) of this tensor are: a
        contiguous byte range of the same stored tensor (the same ``key``)."""
        if not self.shape or not 0 <= start < stop <= self.shape[0]:
            raise ValueError(f"{self.key}: no rows {start}:{stop} in shape {list(self.shape)}")
        if self.strides is not None:
            raise ValueError(f"{self.key}: its rows are not contiguous (strides {self.strides})")
        row_bytes = self.nbytes // self.shape[0]
        return dataclasses.replace(
            self,
            offset=self.offset + start * row_bytes,
            nbytes=(stop - start) * row_bytes,
            shape=(stop - start, *self.shape[1:]),
        )
