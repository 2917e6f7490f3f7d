"""Reads through the runtime's disk reader, timed one at a time and queued.

The planner costs each streamed weight's read at these rates: a read issued while no other
is in flight (the disk idle) runs slower than one issued behind another (queued). On the
2-core development machine's virtual disk, verified 16 MiB reads took 7.6 ms one at a time
and 6.0-6.3 ms queued two or three deep (6.5 and 5.6 in another run; in a slow spell of the
disk both 9.7-10.0 ms): a read's requests start together and finish together, and with no
read queued behind them the disk idles while the last ones finish and the result is handed
back. The rate of each kind is the slope of a line through a small and a large read (the
bytes between them over the time between them), so that what a read costs beyond its bytes
stays out of it: that fixed cost is not measured here, the calling thread being idle while
it waits (a call's small ops hold the interpreter that the reader's hand-offs need; see
``io.reader.READ_HANDOFF_S``).
"""

from __future__ import annotations

import collections
import statistics
import time
from concurrent.futures import Future

import torch

from ..io.locations import FileGuard, TensorLocation
from ..io.pool import HostBufferPool
from ..io.reader import DEFAULT_CHUNK_BYTES, DiskReader, ReadResult
from ..units import format_bytes, format_seconds
from .disk import DiskBench
from .schema import Figure

READ_TURNS = 3
"""Turns of each kind of read, taken in turn so that the disk's drift hits all alike; each
figure is fitted to the medians over turns."""
SMALL_BYTES = 64 * 2**10
"""The small read: a few blocks, nearly all fixed cost."""
SMALL_READS = 16
"""Reads of the small size a turn times."""
LARGE_READS = 4
"""Reads of the large size a turn times (64 MiB at 16 MiB)."""
QUEUED_DEPTH = 2
"""Reads in flight for the queued figures: each read is issued while the one before it is
still in flight, as a double-buffered stream issues them (three deep ran no faster)."""

FIGURES = ("reader_read", "reader_idle_read")
"""The ``DiskFigures`` fields a :class:`ReadProbe` measures."""


class ReadProbe:
    """Times reads of a small and a large size through a :class:`DiskReader`, verified as
    the runtime verifies every read (a checksum per block, recorded at the first read of
    each as for a user's checkpoint), one at a time and ``QUEUED_DEPTH`` in flight.

    :meth:`read` is the profile's step (the queued rate); :meth:`figures` gives both
    ``DiskFigures`` fields once it ran, or both absent with the step's note when it failed.
    """

    def __init__(self, bench: DiskBench) -> None:
        self.bench = bench
        self._figures: dict[str, Figure] | None = None

    def read(self) -> Figure:
        """Measure, and return the queued rate (``DiskFigures.reader_read``)."""
        self._figures = self._measure()
        return self._figures["reader_read"]

    def figures(self, step: Figure) -> dict[str, Figure]:
        """Both figures, or each absent with ``step``'s note (the step failed)."""
        if self._figures is not None:
            return self._figures
        return {key: Figure.absent("B/s", step.note or "not measured") for key in FIGURES}

    def _sizes(self) -> tuple[int, int]:
        """The small and the large read: ``SMALL_BYTES``, and the reader's chunk or half the
        file (the disk bench's file is a whole number of 4 MiB blocks)."""
        return SMALL_BYTES, min(DEFAULT_CHUNK_BYTES, self.bench.nbytes // 2)

    def _locations(self, size: int) -> list[TensorLocation]:
        """Guarded reads of ``size`` bytes, one at each multiple of ``size`` in the file."""
        path = self.bench.read_file()
        raw = {
            f"probe{size}@{offset}": TensorLocation(
                f"probe{size}@{offset}", path, offset, size, torch.uint8, (size,)
            )
            for offset in range(0, self.bench.nbytes - size + 1, size)
        }
        guard = FileGuard(
            path,
            {key: (loc.offset, loc.nbytes, None) for key, loc in raw.items()},
            source="disk bench file",
            advice="measure the profile again",
        )
        return list(guard.locate(raw).values())

    def _measure(self) -> dict[str, Figure]:
        small, large = self._sizes()
        kinds = [(small, SMALL_READS, 1), (small, SMALL_READS, QUEUED_DEPTH)]
        kinds += [(large, LARGE_READS, 1), (large, LARGE_READS, QUEUED_DEPTH)]
        times: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
        places = {size: self._locations(size) for size in (small, large)}
        # each read starts where the one before ended (round again from the file's start),
        # so that no kind re-reads what the kind before it just read
        cursor = 0
        pool = HostBufferPool()
        with DiskReader(pool) as reader:
            for turn in range(READ_TURNS):
                for size, count, depth in kinds if turn % 2 == 0 else kinds[::-1]:
                    futures: collections.deque[Future[ReadResult]] = collections.deque()
                    start = time.perf_counter()
                    for _ in range(count):
                        slot = -(-cursor // size) % len(places[size])
                        cursor = (slot + 1) * size
                        futures.append(reader.submit(places[size][slot]))
                        if len(futures) >= depth:
                            pool.give(futures.popleft().result().buffer)
                    while futures:
                        pool.give(futures.popleft().result().buffer)
                    times[(size, depth)].append((time.perf_counter() - start) / count)
        how = (
            f"the slope through {format_bytes(small)} and {format_bytes(large)} reads "
            f"({SMALL_READS} and {LARGE_READS} a turn) through a DiskReader (its default "
            f"threads and requests) from {self.bench.weights_path.parent}, each verified as "
            f"the runtime's reads are: the bytes between the sizes over the time between "
            f"them, each time the median over {READ_TURNS} turns (each kind in turn) of a "
            "turn's time over its reads"
        )
        out: dict[str, Figure] = {}
        for key, depth, which in (
            (
                "reader_read",
                QUEUED_DEPTH,
                f"issued while another is in flight ({QUEUED_DEPTH} deep)",
            ),
            ("reader_idle_read", 1, "issued while no other is in flight"),
        ):
            t_small = statistics.median(times[(small, depth)])
            t_large = statistics.median(times[(large, depth)])
            seen = (
                f"{format_seconds(t_small)} a {format_bytes(small)} read, "
                f"{format_seconds(t_large)} a {format_bytes(large)} one"
            )
            if t_large <= t_small:
                note = f"the larger reads took no longer than the smaller ones ({seen})"
                out[key] = Figure.absent("B/s", note)
                continue
            rate = (large - small) / (t_large - t_small)
            out[key] = Figure(rate, "B/s", f"the rate of a read {which}: {how}; {seen}")
        return out
