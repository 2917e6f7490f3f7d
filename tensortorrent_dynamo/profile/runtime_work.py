"""What the runtime's own work costs the calling thread in a call of a rewritten graph with
several segments: calling a segment, looking up a resident parameter, and prefetching,
waiting for and evicting a streamed one (``RuntimeProbe``).

A rewritten graph calls these between its segments (``run.ops``): none of it is an op of
the model, so the op figures do not hold it, yet the corpus Llama's disk plan, 13 segments
each after a read, spent 0.3-0.4 ms of its 3.3 ms calls in it on the 2-core development
machine (27 resident lookups at 2.1 us, 13 waits at 2.3 us, 13 evicts at 5.0 us, 13
prefetches at about 12 us beyond their reads, and the segment calls). The probe runs the
runtime's own code (``run.ops``, ``run.runtime.Runtime``, ``run.ops.Segment``) on host
tensors, each piece timed right after a segment of small ops has run (as between two
segments of a plan, their code and data are no longer in the caches), and reads nothing:
a streamed parameter's read is timed by ``disk.read_inline`` and the reader's threads, so
the probe's reader hands back reads already done.
"""

from __future__ import annotations

import concurrent.futures
import operator
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
import torch.fx

from ..io.locations import TensorLocation
from ..io.pool import HostBufferPool
from ..io.reader import DiskReader, ReadResult
from ..run import ops
from ..run.record import Recorder
from ..run.residents import DiskTier
from ..run.runtime import Runtime
from ..weights.released import release
from .schema import Figure, RuntimeFigures

RUNTIME_TURNS = 3
"""Turns of ``RuntimeProbe``; each figure is the median of the turns' medians."""
RUNTIME_REPEATS = 200
"""Segment boundaries timed in one turn of ``RuntimeProbe``."""
RESIDENTS = 4
"""Resident parameters looked up at each timed boundary (a layer's few weights)."""
_SEGMENT_ARGS = 3
"""Arguments of the probe's segment, which returns them all (as a tuple, unpacked)."""


class _LandedReads:
    """A disk reader whose reads are done when submitted, into pooled buffers, without
    reading: the probe times what the runtime does around a read, not the read. ``spent``
    adds up the seconds its own submits took (a real submit's work, which
    ``disk.read_inline`` times), for the probe to leave out."""

    def __init__(self, pool: HostBufferPool, nbytes: int) -> None:
        self.pool = pool
        self.nbytes = nbytes
        self.spent = 0.0

    def submit(self, loc: TensorLocation) -> concurrent.futures.Future[ReadResult]:
        begin = time.perf_counter()
        buffer = self.pool.take(self.nbytes)
        future: concurrent.futures.Future[ReadResult] = concurrent.futures.Future()
        future.set_result(ReadResult(tensor=buffer[: loc.nbytes].view(loc.dtype), buffer=buffer))
        self.spent += time.perf_counter() - begin
        return future


def _identity_segment(recorder: Recorder) -> ops.Segment:
    """A host segment whose graph returns its arguments: calling it costs what calling a
    segment does, and nothing more."""
    graph = torch.fx.Graph()
    args = [graph.placeholder(f"arg{i}") for i in range(_SEGMENT_ARGS)]
    graph.output(tuple(args))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return ops.Segment(gm, "submod_0", "cpu", None, "eager", recorder)


class RuntimeProbe:
    """Times the runtime's own work at a segment boundary on the host (see the module),
    once for its three figures. ``segment_ops``: small ops run before each timed boundary,
    as a plan's segments run between them."""

    def __init__(self, segment_ops: Callable[[], None]) -> None:
        self.segment_ops = segment_ops
        self._figures: RuntimeFigures | BaseException | None = None

    def segment_call(self) -> Figure:
        """Seconds a call of a segment costs (``runtime.segment_call``)."""
        return self.figures().segment_call

    def resident(self) -> Figure:
        """Seconds a resident parameter's lookup costs (``runtime.resident``)."""
        return self.figures().resident

    def stream(self) -> Figure:
        """Seconds a streamed parameter's prefetch, wait and evict cost beyond its read
        (``runtime.stream``)."""
        return self.figures().stream

    def figures(self) -> RuntimeFigures:
        """The three figures, measured on the first call (a failure fails all three)."""
        if self._figures is None:
            try:
                self._figures = self._run()
            except BaseException as exc:
                self._figures = exc
        if isinstance(self._figures, BaseException):
            raise self._figures
        return self._figures

    def _run(self) -> RuntimeFigures:
        key = "probe.weight"
        nbytes = 4096
        pool = HostBufferPool()
        location = TensorLocation(
            key=key, path=Path("probe"), offset=0, nbytes=nbytes, dtype=torch.float32, shape=(1024,)
        )
        reads = _LandedReads(pool, nbytes)
        disk = DiskTier(locations={key: location}, reader=cast(DiskReader, reads), pool=pool)
        runtime = Runtime({}, disk=disk)
        holder = torch.nn.Module()
        holder.submod_0 = _identity_segment(runtime.recorder)
        streamed = torch.empty(0)
        release(streamed, location)  # the tensor whose bytes the reads stand for
        residents = [(f"probe.resident{i}", torch.randn(64)) for i in range(RESIDENTS)]
        for name, param in residents:  # held from the first call on, as a plan's are
            runtime.resident.put(name, param, "cpu", param)
        x = torch.randn(16, 64)
        calls, lookups, streams = [], [], []

        def boundary(timed: bool) -> None:
            self.segment_ops()
            reads.spent = 0.0
            begin = time.perf_counter()
            handle = ops.prefetch(runtime, streamed, key, "cpu")
            weight = ops.wait(handle)
            waited = time.perf_counter()
            held = [ops.resident(runtime, p, name, "cpu") for name, p in residents]
            looked = time.perf_counter()
            out = cast(ops.Segment, holder.submod_0)(x, weight, held[0])
            [operator.getitem(out, i) for i in range(_SEGMENT_ARGS)]
            called = time.perf_counter()
            ops.evict(handle)
            end = time.perf_counter()
            if timed:
                streams.append((waited - begin) + (end - called) - reads.spent)
                lookups.append((looked - waited) / RESIDENTS)
                calls.append(called - looked)

        medians: dict[str, list[float]] = {"call": [], "resident": [], "stream": []}
        for _ in range(20):  # untimed: the pool and the code start cold
            boundary(timed=False)
        for _ in range(RUNTIME_TURNS):
            for times in (calls, lookups, streams):
                times.clear()
            runtime.recorder.restart()
            for _ in range(RUNTIME_REPEATS):
                boundary(timed=True)
            medians["call"].append(statistics.median(calls))
            medians["resident"].append(statistics.median(lookups))
            medians["stream"].append(statistics.median(streams))
        how = (
            f"{RUNTIME_REPEATS} segment boundaries on the host, each right after a segment of "
            f"small ops; {RUNTIME_TURNS} turns, the median of each turn's medians"
        )
        return RuntimeFigures(
            segment_call=Figure(
                statistics.median(medians["call"]),
                "s",
                f"a call of a segment whose graph returns its {_SEGMENT_ARGS} arguments, "
                f"unpacked; {how}",
            ),
            resident=Figure(
                statistics.median(medians["resident"]),
                "s",
                f"run.ops.resident on a parameter held on the host, the mean of {RESIDENTS} "
                f"in a row; {how}",
            ),
            stream=Figure(
                statistics.median(medians["stream"]),
                "s",
                "run.ops.prefetch, wait and evict of a parameter whose home is disk, its "
                f"read already done (disk.read_inline times reads); {how}",
            ),
        )
