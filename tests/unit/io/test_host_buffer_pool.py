"""HostBufferPool: page-aligned buffers lent, given back, reused and trimmed."""

from __future__ import annotations

import pytest
import torch

from tensortorrent_dynamo.errors import OffloadError
from tensortorrent_dynamo.io.pool import HostBufferPool

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
    pool = HostBufferPool(max_idle_bytes=3 * 4096)
    small, big = pool.take(4096), pool.take(2 * 4096)
    other = pool.take(4096)
    pool.give(small)
    pool.give(big)
    assert pool.held_bytes == 4 * 4096
    pool.give(other)  # 4 pages idle: the oldest (small) goes
    assert pool.held_bytes == 3 * 4096
    assert pool.take(2 * 4096).data_ptr() == big.data_ptr()
    assert pool.take(4096).data_ptr() == other.data_ptr()
