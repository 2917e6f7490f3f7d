"""DiskReader delivers exact bytes whichever way it reads, and verifies guarded reads."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tensortorrent_dynamo.errors import OffloadCorruptError, OffloadError
from tensortorrent_dynamo.io.locations import FileGuard, TensorLocation
from tensortorrent_dynamo.io.pool import HostBufferPool
from tensortorrent_dynamo.io.reader import INLINE_READ_BYTES, DiskReader
from tensortorrent_dynamo.io.safetensors import write_safetensors

PAGE = 4096


def raw_file(directory: Path, nbytes: int) -> tuple[Path, bytes]:
    data = os.urandom(nbytes)
    path = directory / "raw.bin"
    path.write_bytes(data)
    return path, data


def span(path: Path, offset: int, nbytes: int, dtype: torch.dtype = torch.uint8) -> TensorLocation:
    return TensorLocation("t", path, offset, nbytes, dtype, (nbytes // dtype.itemsize,))


# Offsets and sizes on and off page boundaries, across several 8 KiB chunks, to the last byte.
SPANS = [(0, 1), (0, PAGE), (1, PAGE), (PAGE - 1, 2), (100, 3 * PAGE + 7), (5000, 40000)]
FILE_BYTES = 45000


@pytest.mark.parametrize("inline_bytes", [0, INLINE_READ_BYTES], ids=["threads", "inline"])
@pytest.mark.parametrize("direct", [True, False, None], ids=["direct", "buffered", "auto"])
def test_exact_bytes_every_way(tmp_path: Path, direct: bool | None, inline_bytes: int) -> None:
    path, data = raw_file(tmp_path, FILE_BYTES)
    pool = HostBufferPool()
    with DiskReader(
        pool, threads=3, direct=direct, chunk_bytes=2 * PAGE, inline_bytes=inline_bytes
    ) as reader:
        futures = [(o, n, reader.submit(span(path, o, n))) for o, n in SPANS]
        futures.append((FILE_BYTES - 10, 10, reader.submit(span(path, FILE_BYTES - 10, 10))))
        for offset, nbytes, future in futures:
            result = future.result()
            assert bytes(result.tensor.numpy()) == data[offset : offset + nbytes]
            assert result.buffer.data_ptr() % PAGE == 0
            pool.give(result.buffer)
        assert reader.bytes_read == sum(n for _, n, _ in futures)


def test_views_have_the_locations_dtype_and_shape(tmp_path: Path) -> None:
    tensors = {
        "a": torch.arange(12, dtype=torch.float64).reshape(3, 4),
        "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "c": torch.tensor(7, dtype=torch.int32),
    }
    locations = write_safetensors(tmp_path / "f.safetensors", tensors)
    pool = HostBufferPool()
    with DiskReader(pool) as reader:
        for key, loc in locations.items():
            result = reader.submit(loc).result()
            assert torch.equal(result.tensor, tensors[key])
            assert result.tensor.dtype == loc.dtype and result.tensor.shape == loc.shape
            pool.give(result.buffer)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_a_tensor_not_aligned_to_its_element_size_is_moved(tmp_path: Path, direct: bool) -> None:
    """Other writers may not align tensors; viewing bytes as float32 needs a multiple of 4."""
    values = torch.tensor([1.0, 2.0, -3.5], dtype=torch.float32)
    path = tmp_path / "odd.bin"
    path.write_bytes(b"xyz" + values.numpy().tobytes())
    loc = TensorLocation("v", path, 3, 12, torch.float32, (3,))
    with DiskReader(HostBufferPool(), direct=direct) as reader:
        assert torch.equal(reader.submit(loc).result().tensor, values)


def test_tmpfs_reads_exact_bytes() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    path = shm / f"tensortorrent-test-{os.getpid()}.bin"
    data = os.urandom(3 * PAGE + 5)
    path.write_bytes(data)
    try:
        with DiskReader(HostBufferPool()) as reader:
            result = reader.submit(span(path, 7, len(data) - 7)).result()
            assert bytes(result.tensor.numpy()) == data[7:]
    finally:
        path.unlink()


def refuse_o_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every open with O_DIRECT fail as on a filesystem without it."""
    real_open = os.open

    def open_without_direct(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_without_direct)


def test_falls_back_to_buffered_reads_when_o_direct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path, data = raw_file(tmp_path, 3 * PAGE)
    refuse_o_direct(monkeypatch)
    dropped: list[tuple[int, int]] = []
    real_fadvise = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        dropped.append((offset, length))
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    caplog.set_level(logging.DEBUG, logger="tensortorrent_dynamo.io.reader")
    with DiskReader(HostBufferPool()) as reader:
        result = reader.submit(span(path, 10, 2 * PAGE)).result()
    assert bytes(result.tensor.numpy()) == data[10 : 10 + 2 * PAGE]
    assert "refuses O_DIRECT" in caplog.text
    assert dropped == [(0, 3 * PAGE)], "the pages read are dropped from the page cache"
    with DiskReader(HostBufferPool(), direct=True) as reader, pytest.raises(OffloadError):
        reader.submit(span(path, 0, 1))


def test_a_truncated_file_fails_the_future_and_returns_the_buffer(tmp_path: Path) -> None:
    path, _ = raw_file(tmp_path, PAGE + 100)
    pool = HostBufferPool()
    with DiskReader(pool, chunk_bytes=PAGE) as reader:
        future = reader.submit(span(path, 50, 3 * PAGE))
        with pytest.raises(OffloadError, match="ends at byte"):
            future.result()
        assert reader.bytes_read == 0
    assert pool.held_bytes == 4 * PAGE
    assert pool.trim() == 4 * PAGE, "the buffer went back to the pool, idle"


def test_a_file_replaced_under_the_same_name_is_reopened(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    first = write_safetensors(path, {"w": torch.zeros(4)})["w"]
    with DiskReader(HostBufferPool()) as reader:
        assert torch.equal(reader.submit(first).result().tensor, torch.zeros(4))
        second = write_safetensors(path, {"w": torch.ones(4)})["w"]
        assert torch.equal(reader.submit(second).result().tensor, torch.ones(4))


def test_a_location_that_does_not_fit_its_shape_is_refused(tmp_path: Path) -> None:
    path, _ = raw_file(tmp_path, 64)
    with DiskReader(HostBufferPool()) as reader, pytest.raises(ValueError, match="do not hold"):
        reader.submit(TensorLocation("x", path, 0, 6, torch.float32, (2,)))


def test_a_closed_reader_refuses_reads(tmp_path: Path) -> None:
    path, _ = raw_file(tmp_path, 64)
    reader = DiskReader(HostBufferPool())
    reader.close()
    reader.close()
    with pytest.raises(OffloadError, match="closed"):
        reader.submit(span(path, 0, 8))


def test_one_read_is_shared_by_every_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mib = 2**20
    path, data = raw_file(tmp_path, 16 * mib)
    requests: list[int] = []
    real = DiskReader._read_span

    def record(self: DiskReader, job: Any, start: int, stop: int) -> None:
        requests.append(stop - start)
        real(self, job, start, stop)

    monkeypatch.setattr(DiskReader, "_read_span", record)
    with DiskReader(HostBufferPool(), threads=4, direct=False, inline_bytes=0) as reader:
        result = reader.submit(span(path, 0, 16 * mib)).result()
        assert bytes(result.tensor.numpy()) == data
        assert sorted(requests) == [4 * mib] * 4, "four threads, a quarter each"
        requests.clear()
        reader.submit(span(path, 0, 64 * 1024)).result()
        assert requests == [64 * 1024], "a small read stays one request"


def test_a_small_read_is_made_and_checked_by_the_calling_thread(tmp_path: Path) -> None:
    """A tensor of at most ``inline_bytes`` is read, verified and complete when ``submit``
    returns, read on the calling thread, and counted as the disk's busy time; a byte more
    goes to the reader's threads."""
    path, data = raw_file(tmp_path, 4 * INLINE_READ_BYTES)
    guard = FileGuard(
        path, {"t": (100, INLINE_READ_BYTES, None)}, source="test file", advice="fix it"
    )
    small = guard.locate({"t": span(path, 100, INLINE_READ_BYTES)})["t"]
    readers: list[str] = []
    with DiskReader(HostBufferPool(), direct=False) as reader:
        reader.before_read = lambda loc: readers.append(threading.current_thread().name)
        future = reader.submit(small)
        assert future.done() and readers == [threading.current_thread().name]
        got = future.result()
        assert bytes(got.tensor.numpy()) == data[100 : 100 + INLINE_READ_BYTES]
        reader.pool.give(got.buffer)
        assert reader.busy_seconds > 0 and reader.verify_seconds > 0
        damaged = bytearray(data)
        damaged[100 + INLINE_READ_BYTES - 1] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(OffloadCorruptError, match="fail their checksum"):
            reader.submit(small).result()
        assert readers[1:] == [threading.current_thread().name] * 2, "read, then once more"
        reader.pool.give(reader.submit(span(path, 0, INLINE_READ_BYTES + 1)).result().buffer)
        assert readers[-1].startswith("tensortorrent-disk")
        assert not reader.pool.lent_buffers


def test_a_small_read_behind_a_request_at_the_disk_goes_to_the_threads(tmp_path: Path) -> None:
    """A small read submitted while the threads have a request at the disk is handed to them
    (made by the calling thread, it would wait behind that request: ``submit`` would block
    the caller, who computes nothing meanwhile); once they have none, the next is made
    inline again."""
    path, data = raw_file(tmp_path, 4 * INLINE_READ_BYTES)
    started = threading.Event()
    release = threading.Event()
    readers: list[str] = []
    with DiskReader(HostBufferPool(), threads=2, direct=False) as reader:

        def hold(loc: TensorLocation) -> None:
            readers.append(threading.current_thread().name)
            if threading.current_thread() is not threading.main_thread():
                started.set()
                assert release.wait(timeout=10)

        reader.before_read = hold
        large = dataclasses.replace(span(path, 0, INLINE_READ_BYTES + 1), key="large")
        held = reader.submit(large)
        assert started.wait(timeout=10)
        small = reader.submit(span(path, 2 * INLINE_READ_BYTES, 100))
        assert not small.done(), "submit returned at once, the read handed on"
        release.set()
        got = small.result(timeout=10)
        assert (
            bytes(got.tensor.numpy()) == data[2 * INLINE_READ_BYTES : 2 * INLINE_READ_BYTES + 100]
        )
        assert readers[-1].startswith("tensortorrent-disk")
        reader.pool.give(got.buffer)
        reader.pool.give(held.result(timeout=10).buffer)
        after = reader.submit(span(path, 3 * INLINE_READ_BYTES, 100))
        assert after.done() and readers[-1] == threading.current_thread().name
        reader.pool.give(after.result().buffer)


def test_busy_seconds_count_time_with_reads_in_flight_once(tmp_path: Path) -> None:
    """Two reads in flight together count their common time once; idle time not at all."""
    path, _ = raw_file(tmp_path, FILE_BYTES)
    started = threading.Event()
    release = threading.Event()
    with DiskReader(HostBufferPool(), threads=2, direct=False, inline_bytes=0) as reader:
        assert reader.busy_seconds == 0.0

        def hold(loc: TensorLocation) -> None:
            started.set()
            release.wait(timeout=10)

        reader.before_read = hold
        begin = time.perf_counter()
        futures = [reader.submit(span(path, 0, 100)), reader.submit(span(path, PAGE, 100))]
        assert started.wait(timeout=10)
        time.sleep(0.05)
        assert reader.busy_seconds >= 0.05  # counted while still in flight
        release.set()
        for future in futures:
            reader.pool.give(future.result().buffer)
        elapsed = time.perf_counter() - begin
        busy = reader.busy_seconds
        assert 0.05 <= busy <= elapsed
        time.sleep(0.05)
        assert reader.busy_seconds == busy, "no read in flight: the disk is idle"


@pytest.mark.parametrize("direct", [None, False])
def test_a_guarded_read_is_verified_wherever_the_damage_is(tmp_path: Path, direct: Any) -> None:
    """Requests check the blocks inside them and the completing thread those across two
    requests: a flipped byte anywhere in a tensor (or a row chunk of it) fails its read,
    and an intact tensor reads back exactly, checksums recorded at the first read."""
    origin, nbytes = 1000, 3 * 2**20 + 24  # not page-aligned: blocks straddle the requests
    path, data = raw_file(tmp_path, origin + nbytes + 500)
    whole = span(path, origin, nbytes)
    guard = FileGuard(path, {"t": (origin, nbytes, None)}, source="test file", advice="fix it")
    whole = guard.locate({"t": whole})["t"]
    chunk = dataclasses.replace(whole, offset=origin + 2**20 + 8, nbytes=2**20, shape=(2**20,))
    with DiskReader(HostBufferPool(), threads=4, direct=direct) as reader:
        for loc in (whole, chunk):
            got = reader.submit(loc).result()
            assert got.tensor.numpy().tobytes() == data[loc.offset : loc.offset + loc.nbytes]
            reader.pool.give(got.buffer)
        for position in (0, 2**20 - origin % 2**20, 2**20 + 9, nbytes - 1):
            damaged = bytearray(data)
            damaged[origin + position] ^= 0x01
            path.write_bytes(bytes(damaged))
            with pytest.raises(OffloadCorruptError, match="fail their checksum"):
                reader.submit(whole).result()
            path.write_bytes(data)
        assert reader.verify_seconds > 0
        assert not reader.pool.lent_buffers
