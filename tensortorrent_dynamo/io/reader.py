"""Reading tensors from disk on background threads, around the page cache.

:class:`DiskReader` reads tensors on background threads into page-aligned buffers from a
:class:`HostBufferPool`, with ``O_DIRECT`` where the filesystem allows it and otherwise
buffered reads whose pages are dropped from the page cache right after. A model streamed
from disk on every call would otherwise fill the page cache and evict what the rest of the
machine needs, and the reads would measure RAM rather than the disk the plan assumed.
A read of a location with a :class:`FileGuard` is verified on a thread of its own before
the bytes are handed on, read once more on a mismatch, and then fails with
:class:`OffloadCorruptError`.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import errno
import logging
import math
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..errors import OffloadError
from ..threads import WorkerPool
from . import page_cache
from .locations import TensorLocation
from .page_cache import PAGE_BYTES, _round_up
from .pool import HostBufferPool, read_buffer_bytes

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_READ_THREADS",
    "INLINE_READ_BYTES",
    "MIN_REQUEST_BYTES",
    "READ_HANDOFF_S",
    "VERIFY_THREADS",
    "DiskReader",
    "ReadResult",
]

log = logging.getLogger(__name__)

# threads that check what the reader threads read: one checks at 10 GiB/s, far above the disk,
# and leaves the other core of a 2-core host to compute (two cost 6% at batch 256 of
# bench.ram_offload, one nothing measurable; bench/verify_cost.py)
VERIFY_THREADS = 1
# Reads of this size split across the reader's threads; see DiskReader for the figures.
DEFAULT_CHUNK_BYTES = 16 * 2**20
DEFAULT_READ_THREADS = 4
# the smallest request a read is split into (a smaller read is one request)
MIN_REQUEST_BYTES = 2**20
# What a read costs beyond the disk's own latency and transfer when no other is in flight:
# handing its requests to the reader threads and its result back (the GIL, the wake-ups).
# On the 2-core development machine a read through the reader on an idle disk took 0.3-0.9
# ms beyond its bytes at the disk's rate (4 KiB to 4 MiB reads), where a raw 4 KiB read
# took 0.04 ms. The planner costs reads with it (``HostProfile.planned_disk_latency_s``).
# Measured instead (a verified 64 KiB read one at a time while the calling thread only waits:
# 0.22-0.26 ms there), it predicted the corpus Llama's disk plan 60-71% faster than it ran:
# its reads of a few KiB come while the calling thread runs many small ops, and took 0.75
# ms each. A verified 4 MiB read one at a time takes about 0.4 ms beyond its bytes too.
READ_HANDOFF_S = 4e-4
# A read of a tensor of at most this many bytes is read by the thread that submits it, and
# checked there: its hand-offs to a reader thread, to the verifier and back cost that thread
# about as much as the read itself and made the read's time depend on when the thread let
# them run. On the 2-core development machine, a verified read waited for at once took
# 119 / 133 / 155 / 181 us through the threads (4 / 32 / 64 / 128 KiB) and 59 / 74 / 92 /
# 121 us on the calling thread (a 1 MiB one 778 and 682); the corpus Llama at half its
# weights (14 reads of 16-44 KiB) took 3.67 ms a call (quartiles 3.61-3.72) reading them
# here against 4.87 (3.76-7.72) through the threads, 40 calls each, in turn. A read in
# flight on the threads still takes some of the calling thread's time (``disk.read_cpu``,
# about 60 us), so a larger read, whose time could hide behind compute, keeps them.
# Only a read submitted while none of the threads' requests is at the disk is made so: one
# made behind them waits for the disk to serve them first, and the calling thread computes
# nothing meanwhile. On an AMD 2-core development machine (a virtual disk serving requests
# in turn) bench.ram_offload's batch-16 plan submits each 16 KiB bias behind its 64 MiB
# weight, and each waited 25 ms: submitting 8 weights and their biases took 160-190 ms of
# the calling thread, the reads alone 190-215 ms, and compute after them ran at the sum of
# the two (260-280 ms) where handed to the threads it ran beside them (200-240 ms).
INLINE_READ_BYTES = 64 * 2**10


@dataclasses.dataclass
class ReadResult:
    """A tensor read by :class:`DiskReader`: ``tensor`` is a view into ``buffer``.

    Give ``buffer`` back with ``pool.give(buffer)`` once ``tensor`` is no longer used; the
    pool lends the same memory to a later read.
    """

    tensor: torch.Tensor
    buffer: torch.Tensor


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
    4 MiB requests with 4 threads, not one), down to ``MIN_REQUEST_BYTES``. A tensor of at
    most ``inline_bytes`` (default ``INLINE_READ_BYTES``) submitted while the threads have
    no request at the disk is read and checked by the thread that submits it, before
    ``submit`` returns (behind their requests it would wait for them); 0 sends every read
    to the threads.

    Reading ``bench.ram_offload``'s 36 streamed 16 MiB chunks (604 MB) cold with
    ``O_DIRECT`` from its checkpoint on the ext4 virtual disk of the 2-core development
    machine, into a pool block faulted in at once (medians of 4 passes, taken in turn, one
    and three reads deep): 1 thread 3.5-3.75 GB/s, 2 threads 3.7-4.1 (8 or 16 MiB chunks),
    4 threads 3.8-4.0 (4 or 16 MiB chunks), 8 threads 3.8-3.9: alike within the disk's
    drift. Hence 4 threads, 16 MiB chunks: the threads only wait on the disk. Where the
    buffers' pages lie matters more than any of these: into a block first written by a
    call's reads, scattered in physical memory, the same reads ran at 1.7-2.4 GB/s
    (:func:`~tensortorrent_dynamo.io.pool.direct_io_memory`).

    Measured before reads landed in such memory: how deep reads queue changed their rate,
    by more than the disk's drift only unverified: 4 MiB reads ran at 2.1-2.3 GB/s one at a
    time and 1.4-1.8 GB/s with seven or fifteen queued (at 1, 2 or 4 threads alike, and
    alike when each read's requests were handed to the threads only once the one before was
    in); verified, one at a time was the slowest (1.8 GB/s against 2.1-2.6 queued), its
    checks no longer overlapping its reads. The planner keeps one rate (a model of the
    slowdown, fitted by the profile, measured no slowdown with the checks on and was not
    kept).
    """

    def __init__(
        self,
        pool: HostBufferPool,
        threads: int = DEFAULT_READ_THREADS,
        direct: bool | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        inline_bytes: int = INLINE_READ_BYTES,
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
        self.inline_bytes = inline_bytes
        self._executor = WorkerPool(threads, "tensortorrent-disk")
        self._verifier = WorkerPool(VERIFY_THREADS, "tensortorrent-verify")
        self._lock = threading.Lock()
        self._files: dict[Path, _OpenFile] = {}
        self._replaced: list[_OpenFile] = []  # may still be read from; closed by close()
        self._bytes_read = 0
        self._verify_s = 0.0
        # reads submitted and not yet complete, since when some have been, and the seconds
        # during which some were (what a timeline of the disk would show as busy)
        self._in_flight = 0
        # requests handed to the threads and not read yet: a small read waits behind them
        self._requests = 0
        self._busy_since = 0.0
        self._busy_s = 0.0
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
    def busy_seconds(self) -> float:
        """Seconds so far during which at least one submitted read was not complete: over
        a call, the call's time the disk was kept busy (its bytes over it, the rate the
        reads got)."""
        with self._lock:
            open_s = time.perf_counter() - self._busy_since if self._in_flight else 0.0
            return self._busy_s + open_s

    @property
    def verify_seconds(self) -> float:
        """Seconds spent verifying checksums so far, all threads summed."""
        with self._lock:
            return self._verify_s

    def submit(self, loc: TensorLocation) -> concurrent.futures.Future[ReadResult]:
        """Start reading ``loc``; the future's result holds the tensor and its pool buffer.
        A tensor of at most ``inline_bytes`` is read (and checked) before this returns.

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
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1
            inline = bool(spans) and loc.nbytes <= self.inline_bytes and self._requests == 0
            if not inline:
                self._requests += len(spans)
        if inline:
            # read here, in one request, and checked here too: the hand-offs would cost
            # this thread more than the read itself
            try:
                self._read_into(job, first, last)
            except BaseException as exc:
                job.error = exc
            spans = []
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
            try:
                self._read_into(job, start, stop)
            finally:
                with self._lock:
                    self._requests -= 1
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
            page_cache.drop(job.file.fd, first, _round_up(start + got, PAGE_BYTES) - first)

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
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_s += time.perf_counter() - self._busy_since
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
        tensor = loc.tensor(buffer[start : start + loc.nbytes].view(loc.dtype))
        with self._lock:
            self._bytes_read += loc.nbytes
        job.future.set_result(ReadResult(tensor, buffer))
