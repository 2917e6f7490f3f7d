"""The page map: which pages of a private file mapping were copied on write."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import pytest

from tensortorrent_dynamo.io import pagemap
from tensortorrent_dynamo.io.page_cache import PAGE_BYTES

pytestmark = pytest.mark.skipif(
    not os.access("/proc/self/pagemap", os.R_OK), reason="the page map is Linux's"
)


def _mapped(path: Path, pages: int) -> tuple[mmap.mmap, int]:
    path.write_bytes(os.urandom(pages * PAGE_BYTES))
    with open(path, "rb") as file:
        region = mmap.mmap(
            file.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
    return region, ctypes.addressof(ctypes.c_char.from_buffer(region))


def test_only_pages_written_are_copied(tmp_path: Path) -> None:
    """Pages never touched and pages read are the file's; a write copies just the pages it
    touches, and runs of them come back as one range, clipped to the range asked about."""
    region, address = _mapped(tmp_path / "f", 16)
    size = 16 * PAGE_BYTES
    assert pagemap.copied_ranges(address, size) == []
    assert sum(region[i] for i in range(0, size, PAGE_BYTES)) >= 0  # read every page
    assert pagemap.copied_ranges(address, size) == []
    region[3 * PAGE_BYTES + 7] = 1
    region[4 * PAGE_BYTES] = 1
    region[9 * PAGE_BYTES + 100] = 1
    assert pagemap.copied_ranges(address, size) == [
        (address + 3 * PAGE_BYTES, address + 5 * PAGE_BYTES),
        (address + 9 * PAGE_BYTES, address + 10 * PAGE_BYTES),
    ]
    # a range starting and ending inside copied pages is clipped to itself
    inside = (address + 4 * PAGE_BYTES + 10, address + 9 * PAGE_BYTES + 20)
    assert pagemap.copied_ranges(inside[0], inside[1] - inside[0]) == [
        (inside[0], address + 5 * PAGE_BYTES),
        (address + 9 * PAGE_BYTES, inside[1]),
    ]
    assert pagemap.copied_ranges(address + 5 * PAGE_BYTES, 4 * PAGE_BYTES) == []
    # a few pages (a sample's) alike
    assert pagemap.copied_ranges(address + 2 * PAGE_BYTES, 2 * PAGE_BYTES) == [
        (address + 3 * PAGE_BYTES, address + 4 * PAGE_BYTES)
    ]
    assert pagemap.copied_ranges(address, 0) == []


def test_without_a_page_map_nothing_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pagemap, "_PAGEMAP", "/nonexistent/pagemap")
    monkeypatch.setattr(pagemap, "_opened", None)
    assert pagemap.copied_ranges(4096, 4096) is None
    monkeypatch.setattr(pagemap, "_opened", None)  # the next caller opens the real one


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")
def test_a_child_process_reads_its_own_page_map(tmp_path: Path) -> None:
    """After ``fork`` the parent's descriptor would read the parent's page map: a page the
    child writes is seen by the child."""
    region, address = _mapped(tmp_path / "f", 2)
    assert pagemap.copied_ranges(address, 2 * PAGE_BYTES) == []  # opened in the parent
    pid = os.fork()
    if pid == 0:  # the child
        region[0] = 1
        seen = pagemap.copied_ranges(address, 2 * PAGE_BYTES)
        sys.stdout.flush()
        os._exit(0 if seen == [(address, address + PAGE_BYTES)] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pagemap.copied_ranges(address, 2 * PAGE_BYTES) == []
