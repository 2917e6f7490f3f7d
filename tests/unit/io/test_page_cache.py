"""page_cache: a file's pages dropped with posix_fadvise, the whole cache as root without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensortorrent_dynamo.io import page_cache
from tensortorrent_dynamo.io.page_cache import PAGE_BYTES


def test_drop_asks_the_kernel_to_forget_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int, int]] = []

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length, advice))

    monkeypatch.setattr(os, "posix_fadvise", record)
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(2 * PAGE_BYTES))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert page_cache.drop(fd, PAGE_BYTES, PAGE_BYTES)
        assert page_cache.drop_file(fd) == "posix_fadvise(POSIX_FADV_DONTNEED)"
    finally:
        os.close(fd)
    dontneed = os.POSIX_FADV_DONTNEED
    assert calls == [(PAGE_BYTES, PAGE_BYTES, dontneed), (0, 0, dontneed)]


def test_without_posix_fadvise_only_root_drops_the_whole_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "posix_fadvise")
    target = tmp_path / "drop_caches"
    target.write_text("")
    monkeypatch.setattr(page_cache, "_DROP_CACHES", target)
    monkeypatch.setattr(os, "sync", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert not page_cache.drop(0)
    assert page_cache.drop_file(0) == "" and target.read_text() == ""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert page_cache.drop_file(0) == "writing 1 to /proc/sys/vm/drop_caches"
    assert target.read_text() == "1\n"
