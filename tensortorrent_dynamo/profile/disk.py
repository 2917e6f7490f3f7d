"""Disk bandwidth and latency at the offload directory, with the page cache kept out of it.

Reads use ``O_DIRECT`` into buffers of the memory the runtime reads into where the
filesystem allows it.
Elsewhere the file is written, flushed, and evicted from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``, or ``/proc/sys/vm/drop_caches`` as root) before it
is read, so the figures are the disk's and not RAM's. Each method string says which was used.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from ..io import page_cache
from ..io.page_cache import PAGE_BYTES
from ..io.pool import direct_io_memory
from ..units import format_bytes
from .schema import Figure

BLOCK_BYTES = 4 * 1024**2
_LATENCY_WARMUP = 5
# Timed passes over the file per requested sample. On virtual disks passes come fast or slow
# (here 1.1 and 2.4 GB/s, dd alike), in spells that may outlast a whole measurement: a rate
# is the bytes of all timed passes over their total time, what streaming many of them would
# get, never a median that lands on one of the two; the method gives single passes' range.
PASSES_PER_SAMPLE = 2


def writable_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot hold offloaded data, or ``None`` when a file can be made there."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".tensortorrent-probe-"):
            pass
    except OSError as exc:
        return f"offload dir {directory} is not writable ({exc.strerror or exc})"
    return None


def filesystem(directory: Path) -> str:
    """``"ext4 on /dev/vda"``: the filesystem holding ``directory``, as psutil reports it."""
    real = os.path.realpath(directory)
    best = None
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) > len(best.mountpoint)):
            best = part
    return f"{best.fstype} on {best.device}" if best else "unknown filesystem"


class DiskBench:
    """Write bandwidth, read bandwidth and 4 KiB random-read latency of one scratch file.

    ``direct=None`` uses ``O_DIRECT`` when the filesystem supports it; ``False`` forces
    buffered I/O with page-cache eviction. ``close()`` removes the file.
    """

    def __init__(
        self,
        directory: Path,
        nbytes: int,
        samples: int,
        reads: int,
        budget_s: float,
        direct: bool | None = None,
    ) -> None:
        self.directory = directory
        self.path = directory / f".tensortorrent-diskbench-{os.getpid()}.bin"
        # The file the read and latency figures time: written once, before the write passes.
        self.weights_path = directory / f".tensortorrent-diskbench-{os.getpid()}-read.bin"
        self._weights_written = False
        free = psutil.disk_usage(str(directory)).free
        # Leave most of the free space alone: the bench must never fill the disk.
        self.nbytes = min(nbytes, free // 4) // BLOCK_BYTES * BLOCK_BYTES
        self.samples = samples
        self.reads = reads
        self.budget_s = budget_s
        self.free = free
        self.fs = filesystem(directory)
        self.block = mmap.mmap(-1, BLOCK_BYTES)
        self.block.write(os.urandom(BLOCK_BYTES))
        # What the write passes write: random bytes, no block repeated, so that neither a
        # compressing filesystem nor storage that stores a repeated block once can make the
        # file cheaper than weights of its size (made on the first write pass).
        self._content: mmap.mmap | None = None
        self.evicted_by = ""
        try:
            self.direct = self._direct_works() if direct is None else direct
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        self.weights_path.unlink(missing_ok=True)
        self.block.close()
        if self._content is not None:
            self._content.close()

    def _direct_works(self) -> bool:
        flag = getattr(os, "O_DIRECT", 0)
        if not flag or self.nbytes == 0:
            return False
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | flag, 0o600)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return False
            raise
        try:
            os.pwrite(fd, self.block, 0)
            os.preadv(fd, [self.block], 0)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return False
            raise
        finally:
            os.close(fd)
        return True

    def _open(self, flags: int, path: Path | None = None) -> int:
        flags |= os.O_DIRECT if self.direct else 0
        return os.open(self.path if path is None else path, flags, 0o600)

    def _where(self) -> str:
        note = " (tmpfs keeps files in RAM)" if self.fs.startswith("tmpfs") else ""
        return f"{self.directory}, {self.fs}{note}"

    def _cache_note(self) -> str:
        if self.direct or self.evicted_by:
            return ""
        return "the page cache could not be dropped here: this may be memory speed"

    def _passes(self, once: Callable[[], float], share: float) -> list[float]:
        """Seconds of each timed pass of ``once``: ``PASSES_PER_SAMPLE`` per requested sample.

        One untimed warm-up pass comes first; passes stop early past ``share`` of the budget.
        """
        deadline = time.perf_counter() + share * self.budget_s
        once()
        times: list[float] = []
        while len(times) < self.samples * PASSES_PER_SAMPLE:
            times.append(once())
            if len(times) % PASSES_PER_SAMPLE == 0 and time.perf_counter() > deadline:
                break
        return times

    def _rate(self, times: list[float]) -> tuple[float, str]:
        """The rate of all ``times`` together, and how it was found."""
        low, high = self.nbytes / max(times) / 1e9, self.nbytes / min(times) / 1e9
        how = (
            f"size x {len(times)} passes / their total time (single passes "
            f"{low:.2f}-{high:.2f} GB/s), after 1 warm-up pass"
        )
        return self.nbytes * len(times) / sum(times), how

    def _buffer(self) -> memoryview:
        """A new buffer of a block's size, of the memory the runtime's reads land in
        (:func:`~tensortorrent_dynamo.io.pool.direct_io_memory`: pages of its own, faulted in
        at once, huge where the kernel grants them), so that a read is timed into pages laid
        out as the reader's are: where they lie changes the rate of ``O_DIRECT`` reads by up to
        2x. Each pass gets its own, so that no single buffer's placement skews every pass.
        """
        return direct_io_memory(BLOCK_BYTES).numpy().data  # faulted in already

    def _write_once(self) -> float:
        if self._content is None:
            self._content = mmap.mmap(-1, self.nbytes)
            rng = random.Random(1)
            # a block at a time: one randbytes call cannot make 256 MiB
            for _ in range(0, self.nbytes, BLOCK_BYTES):
                self._content.write(rng.randbytes(BLOCK_BYTES))
        content = memoryview(self._content)
        fd = self._open(os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            start = time.perf_counter()
            for offset in range(0, self.nbytes, BLOCK_BYTES):
                block = content[offset : offset + BLOCK_BYTES]
                if os.pwrite(fd, block, offset) != BLOCK_BYTES:
                    raise OSError(errno.EIO, f"short write to {self.path}")
            os.fsync(fd)
            return time.perf_counter() - start
        finally:
            os.close(fd)
            content.release()

    def _write_as_offloaded(self) -> None:
        """Write the file the reads time, once, as offloaded weights are: buffered, then fsync.

        Random bytes, no block repeated nor shared with the write passes' file, written
        before them: weights are neither repeated blocks nor just rewritten, and storage may
        serve either faster. A precaution, not a finding: where the bench read 2.6-3.3 GB/s
        against 1.0-1.35 for ``dd`` passes' mean, single ``dd`` passes also reached 2.4
        (fast and slow spells of the disk, see ``PASSES_PER_SAMPLE``).
        """
        if self._weights_written:
            return
        rng = random.Random(2)
        with open(self.weights_path, "wb") as file:
            for _ in range(0, self.nbytes, BLOCK_BYTES):
                file.write(rng.randbytes(BLOCK_BYTES))
            file.flush()
            os.fsync(file.fileno())
        self._weights_written = True

    def read_file(self) -> Path:
        """The file the reads time (written now if it was not yet), for other measurements
        that need the disk busy with reads; removed by ``close()``."""
        self._write_as_offloaded()
        return self.weights_path

    def _read_once(self) -> float:
        buf = self._buffer()
        fd = self._open(os.O_RDONLY, self.weights_path)
        try:
            if not self.direct:
                self.evicted_by = page_cache.drop_file(fd)
            start = time.perf_counter()
            for offset in range(0, self.nbytes, BLOCK_BYTES):
                if os.preadv(fd, [buf], offset) <= 0:
                    raise OSError(errno.EIO, f"{self.weights_path} is shorter than written")
            return time.perf_counter() - start
        finally:
            os.close(fd)
            buf.release()

    def free_figure(self) -> Figure:
        """Free space at the directory when the bench started."""
        return Figure(float(self.free), "B", f"psutil.disk_usage({str(self.directory)!r}).free")

    def write(self) -> Figure:
        """Sequential write bandwidth: bytes over the time of writes, each with its fsync."""
        self._write_as_offloaded()
        value, rate = self._rate(self._passes(self._write_once, 0.4))
        how = "O_DIRECT writes" if self.direct else "buffered writes"
        return Figure(
            value=value,
            unit="B/s",
            method=(
                f"{how} of a {format_bytes(self.nbytes)} file of random bytes, no block "
                f"repeated, in {format_bytes(BLOCK_BYTES)} blocks from a page-aligned buffer, "
                f"then fsync; {rate}; at {self._where()}"
            ),
        )

    def read(self) -> Figure:
        """Sequential read bandwidth, with the page cache kept out."""
        self._write_as_offloaded()
        value, rate = self._rate(self._passes(self._read_once, 0.4))
        if self.direct:
            how = "O_DIRECT reads"
        else:
            evict = self.evicted_by or "nothing (no way to drop the page cache)"
            how = f"buffered reads after evicting the file from the page cache by {evict}"
        return Figure(
            value=value,
            unit="B/s",
            method=(
                f"{how} of a {format_bytes(self.nbytes)} file of random bytes, no block "
                "repeated, written once as offloaded weights are (buffered, fsync) before "
                f"the write passes, in {format_bytes(BLOCK_BYTES)} blocks into a new buffer "
                "of the reader's memory each pass (pages of its own, faulted in at once, huge "
                f"where granted); {rate}; at {self._where()}"
            ),
            note=self._cache_note(),
        )

    def latency(self) -> Figure:
        """Median time of one 4 KiB read at a random aligned offset of the file."""
        self._write_as_offloaded()
        page = mmap.mmap(-1, PAGE_BYTES)
        fd = self._open(os.O_RDONLY, self.weights_path)
        try:
            if not self.direct:
                self.evicted_by = page_cache.drop_file(fd)
                if hasattr(os, "posix_fadvise"):
                    # Without read-ahead, each read costs one trip to the disk.
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            rng = random.Random(0)
            pages = self.nbytes // PAGE_BYTES
            deadline = time.perf_counter() + 0.2 * self.budget_s
            times: list[float] = []
            for i in range(_LATENCY_WARMUP + self.reads):
                offset = rng.randrange(pages) * PAGE_BYTES
                start = time.perf_counter()
                os.preadv(fd, [page], offset)
                if i >= _LATENCY_WARMUP:
                    times.append(time.perf_counter() - start)
                if times and time.perf_counter() > deadline:
                    break
        finally:
            os.close(fd)
            page.close()
        how = "O_DIRECT" if self.direct else f"buffered, after {self.evicted_by or 'no eviction'}"
        return Figure(
            value=statistics.median(times),
            unit="s",
            method=(
                f"median of {len(times)} reads of 4 KiB at random aligned offsets ({how}) "
                f"after {_LATENCY_WARMUP} warm-up reads; at {self._where()}"
            ),
            note=self._cache_note(),
        )
