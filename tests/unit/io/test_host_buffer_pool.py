"""HostBufferPool: page-aligned buffers lent, given back, reused and trimmed."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tensortorrent_dynamo.errors import OffloadError
from tensortorrent_dynamo.io.pool import HostBufferPool, release_free_heap
from tensortorrent_dynamo.run.record import rss_bytes

PAGE = 4096


def test_pool_lends_aligned_buffers_and_reuses_them() -> None:
    pool = HostBufferPool()
    a = pool.take(10)
    b = pool.take(PAGE + 1)
    assert a.dtype == torch.uint8 and a.dim() == 1
    assert (a.numel(), b.numel()) == (PAGE, 2 * PAGE), "capacities are whole pages"
    assert a.data_ptr() % PAGE == 0 and b.data_ptr() % PAGE == 0
    assert pool.held_bytes == 3 * PAGE
    pool.give(a)
    assert pool.take(PAGE).data_ptr() == a.data_ptr(), "same capacity: reused"
    assert pool.take(PAGE).data_ptr() != a.data_ptr(), "a lent buffer is not lent twice"
    pool.give(b)
    with pytest.raises(ValueError, match="given back twice"):
        pool.give(b)
    with pytest.raises(ValueError, match="not a buffer lent"):
        pool.give(torch.empty(PAGE, dtype=torch.uint8))
    assert pool.held_bytes == 4 * PAGE
    assert pool.trim() == 2 * PAGE
    assert pool.held_bytes == 2 * PAGE and pool.trim() == 0


def test_pinned_pool_needs_cuda() -> None:
    if torch.cuda.is_available():
        pool = HostBufferPool(pin=True)
        buffer = pool.take(100)
        assert buffer.is_pinned() and buffer.data_ptr() % PAGE == 0
    else:
        with pytest.raises(OffloadError, match="CUDA"):
            HostBufferPool(pin=True)


def test_pool_keeps_idle_buffers_within_its_cap_dropping_the_oldest() -> None:
    pool = HostBufferPool(max_held_bytes=3 * PAGE)
    small, big = pool.take(PAGE), pool.take(2 * PAGE)
    pool.give(small)
    pool.give(big)
    assert pool.held_bytes == 3 * PAGE, "within the cap: both kept idle"
    assert pool.take(PAGE).data_ptr() == small.data_ptr()
    extra = pool.take(PAGE)  # none idle of its size: a new one, 4 pages held
    pool.give(extra)  # over the cap: the oldest idle buffer (big) goes
    assert pool.held_bytes == 2 * PAGE
    assert pool.take(PAGE).data_ptr() == extra.data_ptr()


def test_a_reserved_block_lends_buffers_in_turn_and_reuses_them() -> None:
    pool = HostBufferPool(max_held_bytes=0)
    pool.reserve(4 * PAGE + 1)  # whole pages: 5
    assert pool.reserved_bytes == 5 * PAGE == pool.held_bytes
    a, b, c = pool.take(2 * PAGE), pool.take(PAGE), pool.take(2 * PAGE)
    assert b.data_ptr() == a.data_ptr() + 2 * PAGE, "each right after the one before"
    assert c.data_ptr() == b.data_ptr() + PAGE and c.data_ptr() % PAGE == 0
    assert pool.lent_buffers == 3 and pool.held_bytes == 5 * PAGE, "all from the block"
    pool.give(a)
    d = pool.take(2 * PAGE)  # no room at the end: wraps to the start, given back
    assert d.data_ptr() == a.data_ptr()
    e = pool.take(PAGE)  # b is still lent: the block has no room, a buffer of its own
    assert not a.data_ptr() <= e.data_ptr() < a.data_ptr() + 5 * PAGE
    assert pool.held_bytes == 6 * PAGE
    pool.give(e)
    assert pool.held_bytes == 5 * PAGE, "max_held_bytes=0: a buffer of its own is freed"
    pool.give(c)  # out of turn: reused only once b, lent before it, is back
    assert pool.take(PAGE).data_ptr() != c.data_ptr()
    with pytest.raises(ValueError, match="given back twice"):
        pool.give(c)


def test_a_larger_reserve_waits_for_the_buffers_lent_from_the_block() -> None:
    pool = HostBufferPool()
    pool.reserve(2 * PAGE)
    lent = pool.take(PAGE)
    pool.reserve(8 * PAGE)
    assert pool.reserved_bytes == 2 * PAGE, "a buffer of the old block is still lent"
    pool.give(lent)
    assert pool.reserved_bytes == 8 * PAGE
    pool.reserve(4 * PAGE)
    assert pool.reserved_bytes == 8 * PAGE, "never smaller"
    assert [pool.take(PAGE).data_ptr() % PAGE for _ in range(8)] == [0] * 8
    assert pool.held_bytes == 8 * PAGE


def _resident_pages(buffer: torch.Tensor) -> int:
    """How many of ``buffer``'s pages are in memory (the present bit of /proc/self/pagemap,
    readable without privileges)."""
    first, pages = buffer.data_ptr() // PAGE, buffer.numel() // PAGE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = pagemap.read(pages * 8)
    return sum(entries[8 * i + 7] >> 7 for i in range(pages))


def _mapping(buffer: torch.Tensor) -> tuple[str, list[str]]:
    """The permissions of the mapping holding ``buffer`` (``rw-p``: private) and its flags
    (``hg``: huge pages asked for with ``MADV_HUGEPAGE``), from /proc/self/smaps."""
    address = buffer.data_ptr()
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        low, dash, high = line.split()[0].partition("-")
        if dash and int(low, 16) <= address < int(high, 16):
            for field in lines[i + 1 :]:
                if field.startswith("VmFlags:"):
                    return line.split()[1], field.split()[1:]
    raise AssertionError("no mapping holds the buffer")


# a kernel built with transparent huge pages (one without refuses MADV_HUGEPAGE)
_THP = Path("/sys/kernel/mm/transparent_hugepage").is_dir()


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/pagemap: Linux only")
def test_the_reserved_block_is_faulted_in_at_once_on_huge_pages_where_offered() -> None:
    # O_DIRECT reads into pages faulted in bit by bit during calls (scattered in physical
    # memory) ran at half the rate of reads into pages faulted in one pass.
    pool = HostBufferPool()
    pool.reserve(32 << 20)
    block = pool.take(32 << 20)
    assert block.data_ptr() % PAGE == 0
    assert _resident_pages(block) == (32 << 20) // PAGE, "every page in memory before a read"
    # huge pages asked for (whether the kernel grants them depends on its memory), on a
    # private mapping: shared anonymous memory follows shmem's setting, off by default
    permissions, flags = _mapping(block)
    assert permissions.endswith("p") and ("hg" in flags or not _THP), (permissions, flags)
    big = pool.take(8 << 20)  # no room in the block: a buffer of its own, alike
    assert _resident_pages(big) == (8 << 20) // PAGE
    assert "hg" in _mapping(big)[1] or not _THP
    # at a huge page's boundary, so that each whole 2 MiB of it can be one
    assert block.data_ptr() % (2 << 20) == 0 and big.data_ptr() % (2 << 20) == 0


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_free_heap_memory_is_given_back_to_the_system() -> None:
    # small blocks come from glibc's heap, where freed ones stay resident: the last one
    # allocated is kept, so the heap cannot simply shrink from its top
    blocks = [bytearray(4096) for _ in range(40_000)]  # 160 MiB, every page touched
    last = blocks[-1]
    del blocks
    before = rss_bytes()
    assert release_free_heap()
    assert rss_bytes() < before - (64 << 20), "most of the 160 MiB freed went back"
    assert len(last) == 4096


_CALLS = """
import resource, sys, torch
from tensortorrent_dynamo.io.pool import bound_heap_retention, keep_heap_for_calls
if sys.argv[1] == "keep":
    assert keep_heap_for_calls()
else:
    assert bound_heap_retention()
def call():  # a call's activations: 40 blocks of 1 MiB, freed at its end
    blocks = [torch.ones(1 << 18) for _ in range(40)]
    del blocks
call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    call()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap")
def test_kept_heap_serves_the_next_calls_without_faulting_in_fresh_pages() -> None:
    # a fresh process each: the setting is the process's
    def faults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _CALLS, mode], capture_output=True, text=True, check=True
        )
        return int(out.stdout.split()[-1])

    # 10 calls of 40 MiB (102,400 pages). glibc's own policy is no yardstick: it faulted in
    # most of them afresh in most processes and in almost none in others (1,792 or ~102,000
    # faults, at random from one process to the next), so the one to beat is the bounded heap,
    # which maps every block of a call afresh in every process
    bounded = faults("bounded")
    kept = max(faults("keep") for _ in range(2))
    assert bounded > 50_000, bounded
    assert kept < bounded / 20, (kept, bounded)
