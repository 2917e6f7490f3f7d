"""Benchmarks of the host: matmul FLOP/s per dtype, memory bandwidth and per-op latency of each
device, host<->device and device<->device copy bandwidth, and the disk tier.

Every figure is a median over timed samples taken after untimed warm-up calls, but the disk's
read and write rates, which are bytes over the total time of their passes (see ``disk``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
from torch._dispatch.python import no_python_dispatcher

from ..compiling.direct import direct_calls
from ..errors import OffloadError
from ..flops import FlopCount
from ..io.locations import FileGuard, TensorLocation
from ..io.pool import HostBufferPool
from ..io.reader import DEFAULT_CHUNK_BYTES, INLINE_READ_BYTES, DiskReader, ReadResult
from ..units import format_bytes
from .detect import cpu_model, cuda_properties, current_fingerprint, detect_cuda_devices
from .disk import DiskBench, writable_problem
from .runtime_work import RuntimeProbe
from .schema import (
    ATTENTION_SHAPE,
    ATTENTION_TOKENS,
    INLINE_PROBE_BYTES,
    SMALL_STREAM_BYTES,
    WIDE_ROWS_N,
    DeviceFigures,
    DiskFigures,
    Figure,
    LinkFigure,
    Measurements,
    Mode,
    RuntimeFigures,
)

Progress = Callable[[int, int, str], None]
"""Called before each step with (steps done, steps in all, label of the step)."""

SHORT_NOTE = "not measured by the short profile; run `tensortorrent validate-hardware`"
NO_CUDA = "no CUDA device"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MIB = 1024**2


@dataclasses.dataclass(frozen=True)
class Budget:
    """Sizes and repeats of one measuring mode."""

    repeats: int
    """Timed samples per figure; the median is reported."""
    warmup: int
    """Untimed calls before the samples (plus one that calibrates the sample length)."""
    sample_s: float
    """Each sample repeats its call for about this long."""
    figure_s: float
    """A matmul figure's size is chosen to take about this long at most."""
    cpu_matmul_n: int
    gpu_matmul_n: int
    cpu_copy_bytes: int
    gpu_copy_bytes: int
    link_bytes: int
    disk_bytes: int
    disk_samples: int
    """Timed samples of the disk file, each way (the disk varies more than the CPU)."""
    disk_reads: int
    disk_budget_s: float
    dtypes: tuple[torch.dtype, ...]
    matmul_rows: tuple[int, ...]
    """The rows of the few-row matmul figures (``matmul_rows_flops``), below the square size
    (the matmul size of the mode), which is measured so too."""


BUDGETS: dict[Mode, Budget] = {
    "short": Budget(
        repeats=5,
        warmup=1,
        sample_s=0.04,
        figure_s=0.5,
        cpu_matmul_n=1024,
        gpu_matmul_n=4096,
        cpu_copy_bytes=64 * _MIB,
        gpu_copy_bytes=256 * _MIB,
        link_bytes=64 * _MIB,
        # The disk too, briefly: a plan that reads weights from disk is timed by its rate.
        disk_bytes=32 * _MIB,
        disk_samples=3,
        disk_reads=50,
        disk_budget_s=1.5,
        # bfloat16 too: the dtype most large models run in, at a rate of its own
        dtypes=(torch.float32, torch.bfloat16),
        matmul_rows=(1, 4, 16, 64, 256),
    ),
    "quick": Budget(
        repeats=5,
        warmup=1,
        sample_s=0.05,
        figure_s=0.5,
        cpu_matmul_n=1024,
        gpu_matmul_n=4096,
        cpu_copy_bytes=64 * _MIB,
        gpu_copy_bytes=256 * _MIB,
        link_bytes=64 * _MIB,
        disk_bytes=64 * _MIB,
        disk_samples=5,
        disk_reads=200,
        disk_budget_s=3.0,
        dtypes=DTYPES,
        matmul_rows=(1, 4, 16, 64, 256),
    ),
    "full": Budget(
        repeats=7,
        warmup=2,
        sample_s=0.2,
        figure_s=3.0,
        cpu_matmul_n=2048,
        gpu_matmul_n=8192,
        cpu_copy_bytes=256 * _MIB,
        gpu_copy_bytes=1024 * _MIB,
        link_bytes=256 * _MIB,
        disk_bytes=256 * _MIB,
        disk_samples=5,
        disk_reads=1000,
        disk_budget_s=20.0,
        dtypes=DTYPES,
        matmul_rows=(1, 4, 16, 64, 256),
    ),
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def _sync(devices: tuple[str, ...]) -> Callable[[], None]:
    cuda = [torch.device(d) for d in devices if d.startswith("cuda")]

    def sync() -> None:
        for dev in cuda:
            torch.cuda.synchronize(dev)

    return sync


def time_per_call(
    fn: Callable[[], object], sync: Callable[[], None], budget: Budget
) -> tuple[float, int]:
    """Median seconds per call of ``fn``, and the most calls a sample made.

    After ``budget.warmup`` untimed calls, and untimed calls for ``budget.sample_s`` more (a
    first figure in a process measured a third low without them: threads and caches still
    cold), one timed call sets how many calls make a sample of about ``budget.sample_s``; a
    sample stops early past twice that (a busy machine must not stretch the run). ``sync``
    waits for queued device work before each clock read.
    """
    for _ in range(budget.warmup):
        fn()
    sync()
    warm_until = time.perf_counter() + budget.sample_s
    while time.perf_counter() < warm_until:
        fn()
        sync()
    start = time.perf_counter()
    fn()
    sync()
    one = time.perf_counter() - start
    calls = max(1, int(budget.sample_s / max(one, 1e-9)))
    samples = []
    most = 0
    for _ in range(budget.repeats):
        done = 0
        start = time.perf_counter()
        while done < calls:
            fn()
            done += 1
            if time.perf_counter() - start > 2 * budget.sample_s:
                break
        sync()
        samples.append((time.perf_counter() - start) / done)
        most = max(most, done)
    return statistics.median(samples), most


def _how(budget: Budget, calls: int) -> str:
    return (
        f"median over {budget.repeats} samples of up to {calls} call(s) "
        f"after {budget.warmup + 1} warm-up call(s) and {budget.sample_s:g} s of them"
    )


def _threads(device: str) -> str:
    return f", {torch.get_num_threads()} torch threads" if device == "cpu" else ""


def _matmul_size(device: str, dtype: torch.dtype, cap: int, budget: Budget) -> int:
    """The largest square size up to ``cap`` whose figure fits in ``budget.figure_s``.

    Doubles from 128 while the next size (about eight times the work) would still fit, so
    a dtype the device runs slowly gets a smaller matrix instead of taking minutes, and a
    fast one gets the largest, which a busy machine's scheduling hiccups disturb least.
    """
    sync = _sync((device,))
    calls = budget.warmup + 1 + budget.repeats
    n = 128
    while n < cap:
        a = torch.ones(n, n, device=device, dtype=dtype)
        torch.mm(a, a)
        sync()
        times: list[float] = []
        for _ in range(3):
            start = time.perf_counter()
            torch.mm(a, a)
            sync()
            times.append(time.perf_counter() - start)
        if 8 * min(times) * calls > budget.figure_s:
            break
        n = min(cap, 2 * n)
    return n


def square_n(device: str, budget: Budget) -> int:
    """The largest square matmul size of ``budget`` on ``device`` (the host's, or an
    accelerator's), which its few-row figures are measured at too."""
    return budget.cpu_matmul_n if device == "cpu" else budget.gpu_matmul_n


def matmul_flops(device: str, dtype: torch.dtype, budget: Budget) -> Figure:
    """FLOP/s of ``torch.mm`` on square matrices (2*n^3 FLOP per call)."""
    name = dtype_name(dtype)
    cap = square_n(device, budget)
    n = _matmul_size(device, dtype, cap, budget)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    per_call, calls = time_per_call(lambda: torch.mm(a, b, out=out), _sync((device,)), budget)
    precision = (
        f", float32 matmul precision {torch.get_float32_matmul_precision()!r}"
        if dtype == torch.float32
        else ""
    )
    return Figure(
        value=2 * n**3 / per_call,
        unit="FLOP/s",
        method=(
            f"torch.mm of two {n}x{n} {name} matrices, 2*n^3 FLOP / {_how(budget, calls)}"
            f"{_threads(device)}{precision}"
        ),
    )


def attention_flops(device: str, budget: Budget, tokens: int | None = None) -> Figure:
    """FLOP/s of ``scaled_dot_product_attention`` in float32 at ``ATTENTION_SHAPE`` (at
    ``tokens`` tokens where given), causal, its FLOPs counted as a cost graph counts them
    (``FlopCounterMode``): attention runs far below the square matmul's rate, its products
    small and a softmax between, and further below it over few tokens."""
    batch, heads, shape_tokens, size = ATTENTION_SHAPE
    tokens = tokens or shape_tokens
    q, k, v = (torch.randn(batch, heads, tokens, size, device=device) for _ in range(3))

    def call() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    with FlopCount() as counter:
        call()
    flops = counter.total
    per_call, calls = time_per_call(call, _sync((device,)), budget)
    return Figure(
        value=flops / per_call,
        unit="FLOP/s",
        method=(
            f"torch.nn.functional.scaled_dot_product_attention of float32 query, key and value "
            f"of {batch}x{heads}x{tokens}x{size}, causal; its {flops / 1e6:.0f} MFLOP as "
            f"FlopCounterMode counts them / {_how(budget, calls)}{_threads(device)}"
        ),
    )


# Bytes of weights a few-row matmul figure cycles through: more than a CPU's or a GPU's
# caches hold, so that each call reads its weight from memory, as a model's layers do. On
# the 2-core development machine (480 MiB of L3 reported, shared with other machines) a
# float32 matmul at 4 rows ran at 69 GFLOP/s cycling through 64 MiB of 1024x1024 weights,
# 41 through 256 MiB and 38 through 1 GiB (31-33 for 2048- and 4096-wide layers); at 16
# rows 127, 90 and 81: a model's weights of a few hundred MiB ran at the larger sets' rates.
ROWS_WEIGHT_BYTES = {"cpu": 256 * _MIB, "cuda": 256 * _MIB}


def _weights(n: int, count: int, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """``count`` n x n weights laid out as a linear layer's (out x in), transposed as it
    multiplies them. Filled with a constant, which times as random values do (no
    denormals) and is made many times faster than ``randn``'s hundreds of MiB."""
    return [torch.full((n, n), 0.5, device=device, dtype=dtype).t() for _ in range(count)]


def _cycling_matmul(
    device: str, dtype: torch.dtype, rows: int, n: int
) -> tuple[Callable[[], None], int]:
    """A call of ``torch.mm`` of a ``rows`` x n matrix by the next of enough n x n weights
    (``_weights``) to exceed the caches (``ROWS_WEIGHT_BYTES``), and how many weights."""
    kind = "cpu" if device == "cpu" else "cuda"
    itemsize = torch.empty((), dtype=dtype).element_size()
    copies = max(1, -(-ROWS_WEIGHT_BYTES[kind] // (n * n * itemsize)))
    weights = _weights(n, copies, device, dtype)
    a = torch.randn(rows, n, device=device).to(dtype)
    out = torch.empty(rows, n, device=device, dtype=dtype)
    turn = [0]

    def call() -> None:
        torch.mm(a, weights[turn[0]], out=out)
        turn[0] = (turn[0] + 1) % copies

    return call, copies


def matmul_rows_sizes(device: str, budget: Budget) -> tuple[int, ...]:
    """The rows the few-row matmul figures of ``device`` are measured at: the mode's, then
    the square size, the same way (the weights too large for the caches)."""
    n = square_n(device, budget)
    return (*(r for r in budget.matmul_rows if r < n), n)


def matmul_rows_flops(
    device: str, dtype: torch.dtype, rows: int, budget: Budget, n: int | None = None
) -> Figure:
    """FLOP/s of ``torch.mm`` of a ``rows`` x n matrix by n x n weights, transposed as a
    linear layer's are (2*rows*n^2 FLOP per call), each call the next of enough weights to
    exceed the caches: at few rows a matmul reads its weight for few FLOPs and runs far
    below the square rate (on the 2-core development machine, float32 at 1 row ran at 17-21
    GFLOP/s, at 16 rows at 75-90, square at 230-290). ``n``: the mode's square size unless
    given."""
    name = dtype_name(dtype)
    n = n or square_n(device, budget)
    itemsize = torch.empty((), dtype=dtype).element_size()
    call, copies = _cycling_matmul(device, dtype, rows, n)
    per_call, calls = time_per_call(call, _sync((device,)), budget)
    return Figure(
        value=2 * rows * n * n / per_call,
        unit="FLOP/s",
        method=(
            f"torch.mm of a {rows}x{n} {name} matrix by {copies} transposed {n}x{n} ones in turn "
            f"({format_bytes(copies * n * n * itemsize)} of weights), 2*rows*n^2 FLOP / "
            f"{_how(budget, calls)}{_threads(device)}"
        ),
    )


SLOWDOWN_ROWS = 16
"""The rows of the matmul timed with and without disk reads (``compute_slowdown``): a
small batch's, where a matmul is bound by reading its weights from memory."""
SLOWDOWN_READS_IN_FLIGHT = 2
"""Reads kept in flight while the matmul is timed, as a double-buffered stream does."""
SLOWDOWN_TURNS = 3
"""Turns of the matmul alone and of the stream, taken in turn; each figure is the median of
its turns (a reader's first turn is often its slowest)."""
STREAM_READS = 24
"""Reads of one turn of the stream (384 MiB of 16 MiB reads: about 0.1 s at 4 GB/s)."""


def _guarded_pieces(
    bench: DiskBench, piece: int, stride: int | None = None
) -> list[TensorLocation]:
    """Locations of ``piece`` bytes every ``stride`` (default ``piece``) of the disk bench's
    file, guarded as the runtime guards every weight it reads (the checksum of each block,
    recorded at its first read as for a user's checkpoint), so that reading them verifies
    them."""
    path = bench.read_file()
    step = stride or piece
    unguarded = {
        f"probe@{offset}": TensorLocation(
            f"probe@{offset}", path, offset, piece, torch.uint8, (piece,)
        )
        for offset in range(0, bench.nbytes - piece + 1, step)
    }
    guard = FileGuard(
        path,
        {key: (loc.offset, loc.nbytes, None) for key, loc in unguarded.items()},
        source="disk bench file",
        advice="measure the profile again",
    )
    return list(guard.locate(unguarded).values())


class StreamProbe:
    """The host streaming weights from disk as a small-batch plan does, timed for three
    figures: the rate its reads run at (``disk.stream``), how many times longer its matmuls
    take than alone (``disk.compute_slowdown``), and the rate of the same stream in reads
    of ``SMALL_STREAM_BYTES`` (``disk.stream_small``).

    The runtime reads a streamed weight through a :class:`~..io.reader.DiskReader`, each
    read verified on the verifier thread (a checksum per block), submitted by the calling
    thread a read ahead of the segment that waits for it, which then computes on it and
    gives its buffer back. This does the same: keep ``SLOWDOWN_READS_IN_FLIGHT`` reads of
    ``DEFAULT_CHUNK_BYTES`` (a streamed chunk's size) of the disk bench's file in flight,
    wait for the oldest, multiply ``SLOWDOWN_ROWS`` rows by a float32 weight of the read's
    size (timed; a resident one, cycling through more than the caches hold), give the
    buffer back and submit the next read. The stream's rate is its bytes over its time;
    the slowdown is the median matmul in it over the median alone.

    It replaced a probe that timed a tight loop of matmuls while two other threads kept
    reads in flight, which measured 1.54-2.12x on the 2-core development machine where the
    runtime's streamed segments computed 1.0-1.17x their time alone (the corpus of
    ``bench.fidelity`` at batch 16, ``bench.ram_offload``'s layers at batch 256), so the
    simulator costed a streamed small batch's compute up to 31% above what it measured; and
    the disk bench's raw reads (4.1-4.5 GB/s there) ran faster than the reader's reads in a
    call (3.4-3.8 GB/s), which the simulator costed reads at, 20-26% under a call's disk time.
    This loop measured 1.00-1.18x and 3.4-3.9 GB/s there in twelve profiles of the fidelity
    bench (the disk's own rate 3.3-4.6 GB/s in the same profiles).

    The small stream runs the same loop with reads of ``SMALL_STREAM_BYTES`` and a weight of
    their size, as many bytes: where the reads land decides how fast they run (the pool's
    buffers, ``io.pool.direct_io_memory``), and a stream of small reads lands in few
    buffers, three of 4 MiB against three of 16 MiB. On the 2-core development machine
    (2026-12-05) the reader read 2.9-3.2 GB/s into 12 MiB of buffers and 1.8-1.9 GB/s into
    48 MiB, alone; this probe measured 1.74-2.32 GB/s for the small stream against
    1.93-1.96 for the other; and ``bench.ram_offload``'s batch-16 call ran 5.6% faster in
    4 MiB chunks than in 16 MiB ones (10% with reads two segments ahead; medians of the
    ratios of 16 calls taken in turn in one process), where its batch-256 call ran 16%
    slower. With ``stream_chunk_bytes="auto"`` (opt-in) the planner plans a disk plan in
    row chunks of both sizes, each costed at its stream's rate, and keeps the faster
    (``plan.chunk_sizes``).
    """

    def __init__(self, bench: DiskBench, budget: Budget) -> None:
        self._bench = bench
        self._budget = budget
        self._figures: tuple[Figure, Figure, Figure] | BaseException | None = None

    def rate(self) -> Figure:
        """Bytes per second of the stream's reads (``disk.stream``)."""
        return self._measure()[0]

    def slowdown(self) -> Figure:
        """The stream's matmul time over its time alone (``disk.compute_slowdown``)."""
        return self._measure()[1]

    def small_rate(self) -> Figure:
        """Bytes per second of the stream's reads in reads of ``SMALL_STREAM_BYTES``
        (``disk.stream_small``)."""
        return self._measure()[2]

    def _measure(self) -> tuple[Figure, Figure, Figure]:
        if self._figures is None:
            try:
                self._figures = self._run()
            except BaseException as exc:  # every figure fails with it, the stream run once
                self._figures = exc
        if isinstance(self._figures, BaseException):
            raise self._figures
        return self._figures

    def _run(self) -> tuple[Figure, Figure, Figure]:
        budget = self._budget
        pieces = _guarded_pieces(self._bench, min(self._bench.nbytes, DEFAULT_CHUNK_BYTES))
        small_pieces = _guarded_pieces(self._bench, min(self._bench.nbytes, SMALL_STREAM_BYTES))
        piece, small_piece = pieces[0].nbytes, small_pieces[0].nbytes
        small_reads = STREAM_READS * piece // small_piece  # as many bytes
        n = max(1, math.isqrt(piece // 4))  # a float32 weight of the read's size
        call, copies = _cycling_matmul("cpu", torch.float32, SLOWDOWN_ROWS, n)
        small_call, _ = _cycling_matmul(
            "cpu", torch.float32, SLOWDOWN_ROWS, max(1, math.isqrt(small_piece // 4))
        )

        def stream(
            reader: DiskReader,
            pool: HostBufferPool,
            locations: list[TensorLocation],
            reads: int,
            compute: Callable[[], None],
        ) -> tuple[float, float]:
            """Seconds of one turn of the stream, and its median matmul's."""
            times: list[float] = []
            flight: list[concurrent.futures.Future[ReadResult]] = []
            submitted = 0
            start = time.perf_counter()
            for _ in range(reads):
                while submitted < reads and len(flight) < SLOWDOWN_READS_IN_FLIGHT:
                    flight.append(reader.submit(locations[submitted % len(locations)]))
                    submitted += 1
                landed = flight.pop(0).result()
                begin = time.perf_counter()
                compute()
                times.append(time.perf_counter() - begin)
                pool.give(landed.buffer)
            return time.perf_counter() - start, statistics.median(times)

        alone: list[float] = []
        streamed: list[float] = []
        rates: list[float] = []
        small_rates: list[float] = []
        # each stream's buffers in a pool of its own: its reads land in those few alone
        pool, small_pool = HostBufferPool(), HostBufferPool()
        with DiskReader(pool) as reader, DiskReader(small_pool) as small_reader:
            # untimed: the pools' buffers and the threads start cold
            stream(reader, pool, pieces, STREAM_READS, call)
            stream(small_reader, small_pool, small_pieces, small_reads, small_call)
            for _ in range(SLOWDOWN_TURNS):
                alone.append(time_per_call(call, _sync(("cpu",)), budget)[0])
                seconds, matmul = stream(reader, pool, pieces, STREAM_READS, call)
                rates.append(STREAM_READS * piece / seconds)
                streamed.append(matmul)
                seconds, _ = stream(small_reader, small_pool, small_pieces, small_reads, small_call)
                small_rates.append(small_reads * small_piece / seconds)
        how = (
            f"{STREAM_READS} reads of {format_bytes(piece)} from {pieces[0].path.parent} "
            f"through a DiskReader, {SLOWDOWN_READS_IN_FLIGHT} in flight, each verified as the "
            "runtime's reads are (a checksum per block), and on each as it lands a torch.mm "
            f"of a {SLOWDOWN_ROWS}x{n} float32 matrix by a transposed {n}x{n} one ({copies} "
            "in turn), as a small batch's streamed plan runs; "
            f"{SLOWDOWN_TURNS} turns after an untimed one, each after the matmul timed alone"
        )
        return (
            Figure(
                value=statistics.median(rates),
                unit="B/s",
                method=f"bytes over the time of the stream: {how}; the median of its turns",
            ),
            Figure(
                value=statistics.median(streamed) / statistics.median(alone),
                unit="x",
                method=(
                    "the median matmul in the stream over its median alone (the median of "
                    f"each over its turns): {how}"
                ),
            ),
            Figure(
                value=statistics.median(small_rates),
                unit="B/s",
                method=(
                    f"bytes over the time of the stream in {small_reads} reads of "
                    f"{format_bytes(small_piece)} (as many bytes, buffers of their own, a "
                    "weight of a read's size), each turn right after the other stream's: "
                    f"{how}; the median of its turns"
                ),
            ),
        )


SMALL_READ_BYTES = 2 * INLINE_READ_BYTES
"""The size of ``SmallReadProbe``'s reads in flight: a small weight, of about the smallest
size the runtime hands to the reader's threads (``io.reader.INLINE_READ_BYTES``)."""
SMALL_READS = 200
"""Reads of one turn of ``SmallReadProbe``."""
SMALL_SEGMENT_REPEATS = 4
"""Times ``SmallReadProbe``'s segment runs its five ops (about 55 us on the 2-core
development machine, a small streamed segment's time)."""
_SEGMENT_OPS = 5 * SMALL_SEGMENT_REPEATS


class SmallReadProbe:
    """What a small read through the disk reader takes from the host's compute while in
    flight (``disk.read_cpu``), as a plan streaming a small model's weights reads them: one
    at a time, each submitted just before a short segment of small ops runs on the calling
    thread, then waited for; and the time of a read small enough for the calling thread to
    make itself (``disk.read_inline``).

    The reader's threads hand a read on, read it and check it under the interpreter lock
    the calling thread's ops take between them: on the 2-core development machine a
    segment of five small ops (t, mm, a view, silu, a view) took 15 us alone and 53 us with
    one 44 KiB read in flight; four in a row 56 and 127 us; sixteen 192 and 291 us. The
    corpus Llama's disk plan, whose 14 reads of 16-44 KiB come between segments of a few
    ops, computed 1.4-2.5x what the simulator predicted for it, where its compute alone (no
    disk tier) was predicted within 17%. The figure is the segment's median time with a
    read in flight less its median alone (it measured 11-107 us there with reads of 32 KiB,
    mostly 50-70). Reads that small are now made by the calling thread
    (``io.reader.INLINE_READ_BYTES``): ``disk.read_inline`` is the median time of a verified
    32 KiB read made so, each right after :data:`EVICT_BYTES` written and the segment run.
    What comes before a read slows it: there 89 us after no op, 108 after 60 and 161 after
    300; and on 2026-12-06 95-99 us right after another read, 88-128 after the segment,
    181-190 after 32 MiB written, 191-220 after a millisecond's sleep. Until methods revision
    15 the reads came after the segment alone, and the corpus Llama's disk plan, whose 13
    reads come after segments of 60 us to 1.3 ms and the runtime's own work, read for 2.5-3.2
    ms a call where 1.6-1.7 ms were predicted (its reads 150-290 us each, median 189).
    """

    def __init__(self, bench: DiskBench) -> None:
        self._bench = bench

    def read_cpu(self) -> Figure:
        """Seconds of the host's compute one read takes while in flight (``disk.read_cpu``)."""
        piece = min(self._bench.nbytes, SMALL_READ_BYTES)
        # a piece every MiB: no read is of a block a read before it just brought in
        pieces = _guarded_pieces(self._bench, piece, max(piece, 2**20))
        segment = _small_segment()
        alone: list[float] = []
        flying: list[float] = []
        pool = HostBufferPool()
        with DiskReader(pool, inline_bytes=0) as reader:
            for _ in range(20):  # untimed: the threads, the pool and the ops start cold
                segment()
                pool.give(reader.submit(pieces[0]).result().buffer)
            for turn in range(SLOWDOWN_TURNS):
                turn_alone, turn_flying = [], []
                for i in range(SMALL_READS):
                    begin = time.perf_counter()
                    segment()
                    turn_alone.append(time.perf_counter() - begin)
                    read = reader.submit(pieces[(turn * SMALL_READS + i) % len(pieces)])
                    begin = time.perf_counter()
                    segment()
                    turn_flying.append(time.perf_counter() - begin)
                    pool.give(read.result().buffer)
                alone.append(statistics.median(turn_alone))
                flying.append(statistics.median(turn_flying))
        return Figure(
            value=max(0.0, statistics.median(flying) - statistics.median(alone)),
            unit="s",
            method=(
                "a segment's time with a read in flight less its time alone "
                f"({statistics.median(alone) * 1e6:.0f} us): {SMALL_READS} reads of "
                f"{format_bytes(piece)} of the disk bench's file one at a time through a "
                "DiskReader, each verified as the runtime's are, submitted just before the "
                f"segment ({_SEGMENT_OPS} small ops: t, mm, views, silu on 16x64 and 128x64 "
                "float32) runs on the calling thread, then waited for, the "
                f"segment also timed alone before each; {SLOWDOWN_TURNS} turns, the median "
                "of each turn's medians"
            ),
        )

    def read_inline(self) -> Figure:
        """Seconds a small read takes the thread that makes it itself (``disk.read_inline``)."""
        piece = min(self._bench.nbytes, INLINE_PROBE_BYTES)
        pieces = _guarded_pieces(self._bench, piece, max(piece, 2**20))
        segment = _small_segment()
        evict = torch.empty(EVICT_BYTES, dtype=torch.uint8)
        medians: list[float] = []
        pool = HostBufferPool()
        with DiskReader(pool, inline_bytes=piece) as reader:
            for i in range(20):  # untimed: the pool, the file and the ops start cold
                segment()
                pool.give(reader.submit(pieces[i % len(pieces)]).result().buffer)
            for turn in range(SLOWDOWN_TURNS):
                times = []
                for i in range(SMALL_READS):
                    evict.fill_(i)
                    segment()
                    begin = time.perf_counter()
                    read = reader.submit(pieces[(turn * SMALL_READS + i) % len(pieces)])
                    times.append(time.perf_counter() - begin)
                    pool.give(read.result().buffer)
                medians.append(statistics.median(times))
        return Figure(
            value=statistics.median(medians),
            unit="s",
            method=(
                f"{SMALL_READS} reads of {format_bytes(piece)} of the disk bench's file, each "
                "at another MiB, made by the calling thread through a DiskReader and verified "
                f"as the runtime's are, each after {format_bytes(EVICT_BYTES)} written and the "
                f"segment of {_SEGMENT_OPS} small ops run; {SLOWDOWN_TURNS} turns, the median "
                "of each turn's medians"
            ),
        )


def _small_segment() -> Callable[[], None]:
    """A segment of ``_SEGMENT_OPS`` small ops, as a small model's streamed plan runs
    between two reads."""
    x = torch.randn(16, 64)
    w = torch.randn(128, 64)

    def segment() -> None:
        for _ in range(SMALL_SEGMENT_REPEATS):
            t = torch.ops.aten.t.default(w)
            mm = torch.ops.aten.mm.default(x, t)
            v = torch.ops.aten._unsafe_view.default(mm, [2, 8, 128])
            torch.ops.aten.silu.default(v)
            torch.ops.aten.view.default(x, [16, 64])

    return segment


def memory_bandwidth(device: str, budget: Budget) -> Figure:
    """Bytes read plus bytes written per second by a large ``Tensor.copy_`` on one device."""
    nbytes = budget.cpu_copy_bytes if device == "cpu" else budget.gpu_copy_bytes
    what = f"Tensor.copy_ of {format_bytes(nbytes)} on {device}"
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    per_call, calls = time_per_call(lambda: dst.copy_(src), _sync((device,)), budget)
    return Figure(
        value=2 * nbytes / per_call,
        unit="B/s",
        method=(
            f"{what} into a second tensor; 2 x size (read + written) / "
            f"{_how(budget, calls)}{_threads(device)}"
        ),
    )


# the probe of the per-op cost: decoder layers at this width, sequence and depth
PROBE_WIDTH, PROBE_TOKENS, PROBE_LAYERS = 32, 8, 3
EACH_OP_CALLS = 10
"""Calls of one op in each sample of ``OpProbe._each_op``."""
EVICT_BYTES = 32 * 2**20
"""What ``OpProbe`` writes before each call it times cold, and ``SmallReadProbe`` before
each read it makes inline: past the per-core caches of today's CPUs, as a model's weights
streamed between two calls are. On the 2-core development
machine (4 MiB of L2 a core) the probe's cold calls took 0.05 ms longer than back to back
after 1 MiB written, 0.19 ms after 4 MiB, 0.25 after 8 and 0.27-0.37 after 16 to 64 MiB."""


def _probe_layer(x: torch.Tensor, ids: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    """One decoder layer as the models planned are made of, with what their graphs build
    around it (a token embedding, a causal mask from positions, RMS and layer norms,
    projections with and without bias, rotary embedding, attention through
    ``scaled_dot_product_attention`` and spelled out with a softmax, gated and plain
    activations), for ``op_latency``."""
    import torch.nn.functional as F

    wq, wk, wv, wo, w1, w2, w3, bias, norm, table, cos, sin = weights
    b, s, d = x.shape
    x = x + F.embedding(ids, table)
    positions = torch.arange(s, device=x.device)
    mask = torch.where(positions[None, :] <= positions[:, None], 0.0, float("-inf"))

    def rms(t: torch.Tensor) -> torch.Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * norm

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, 4, d // 4).transpose(1, 2)

    def rope(t: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

    h = rms(x)
    q, k, v = heads(F.linear(h, wq)), heads(F.linear(h, wk)), heads(F.linear(h, wv, bias))
    a = F.scaled_dot_product_attention(rope(q), rope(k), v, attn_mask=mask)
    x = x + F.linear(a.transpose(1, 2).reshape(b, s, d), wo)
    h = F.layer_norm(x, (d,), norm, bias)
    scores = torch.softmax(h @ h.transpose(1, 2) / 8.0, dim=-1)
    x = x + torch.relu(scores @ h)
    return x + F.linear(F.silu(F.linear(h, w1)) * F.gelu(F.linear(h, w3)), w2)


def _probe_graph(device: str) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """The aten graph of ``PROBE_LAYERS`` probe layers and its arguments on ``device``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    d, s = PROBE_WIDTH, PROBE_TOKENS
    shapes = [(1, s, d), *[(d, d)] * 4, (2 * d, d), (d, 2 * d), (2 * d, d), (d,), (d,)]
    shapes += [(16, d), (s, d // 4), (s, d // 4)]
    args = [torch.randn(shape, device=device) for shape in shapes]
    args.insert(1, torch.arange(s, device=device).remainder(16).view(1, s))

    def layers(x: torch.Tensor, ids: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        for _ in range(PROBE_LAYERS):
            x = _probe_layer(x, ids, *weights)
        return x

    with torch.no_grad():
        return make_fx(layers)(*args), args


@dataclasses.dataclass
class OpProbe:
    """The per-op cost of ``device``, measured on the probe graph (``_probe_graph``) as an
    eager segment runs it (direct calls): ``latency`` times the graph as a whole, each
    call's time over its ops; after it, on the host, ``per_op`` holds each op's own fixed
    cost and ``cold`` what a call pays the first time it runs a kind of op with cold
    caches (an accelerator's ops are queued, and timing one alone would time its launch
    and a wait)."""

    device: str
    budget: Budget
    per_op: dict[str, Figure] = dataclasses.field(default_factory=dict)
    cold: Figure | None = None

    def latency(self) -> Figure:
        """Time per op of the probe graph: the fixed cost of one operation as an eager
        segment pays it, over the mix of ops models are made of (each the generated code's
        call, the dispatch, allocating the output; on an accelerator, the launch). On the
        2-core development machine: 3.5 us an op, where a row of one-element ``aten.add``
        measured 2.4-2.7 us and a small Llama's graph ran at 3.5-4 us an op."""
        import operator

        from ..cost_graph import op_name

        gm, args = _probe_graph(self.device)
        graph = direct_calls(gm)  # as an eager segment runs
        names = {n.name: op_name(n) for n in gm.graph.nodes if n.op == "call_function"}
        nodes = [
            n
            for n in graph.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem
        ]
        with torch.no_grad():
            per_call, calls = time_per_call(
                lambda: graph(*args), _sync((self.device,)), self.budget
            )
            if self.device == "cpu":
                self.per_op = self._each_op(graph, args, names, per_call)
                self.cold = self._cold(graph, args, len(self.per_op))
        return Figure(
            value=per_call / len(nodes),
            unit="s",
            method=(
                f"the aten graph of {PROBE_LAYERS} decoder layers of width {PROBE_WIDTH} at "
                f"{PROBE_TOKENS} tokens ({len(nodes)} ops: views, matmuls, elementwise ops, "
                f"norms, masks, embedding, attention) on {self.device}, time per call / "
                f"{len(nodes)}; {_how(self.budget, calls)}{_threads(self.device)}"
            ),
        )

    @property
    def _passes(self) -> int:
        """Calls of the probe graph that ``_each_op`` and ``_cold`` each time one by one."""
        return max(5, self.budget.repeats * 6)

    def _each_op(
        self,
        graph: torch.fx.GraphModule,
        args: list[torch.Tensor],
        names: dict[str, str],
        per_call: float,
    ) -> dict[str, Figure]:
        """Each op of ``graph`` timed in a loop of its own on the arguments it gets as the
        graph runs (the median of ``_passes`` samples of ``EACH_OP_CALLS`` calls), all of
        them scaled by one factor so that a pass adds up to ``per_call``; by op name, the
        median over the op's nodes.

        An op costs more in the mix of a graph than called again and again (its code and
        the dispatcher's paths for it cold): on the 2-core development machine the probe
        graph ran at 1.9-2.1x the sum of its ops alone. Timing each op once per pass as the
        graph runs (as this did before) put that whole mix cost on the few nodes of each
        kind, and three samples of an ``addmm`` came out 11.5 us where a graph of 200 small
        linear layers paid 4-5 (it predicted that graph 41-86% slow); timed alone and scaled
        by the one factor, 10-20% slow (once 10% fast) in five profiles."""
        passes = self._passes
        env: dict[torch.fx.Node, Any] = {}
        given = iter(args)
        alone: dict[torch.fx.Node, float] = {}
        clock = time.perf_counter
        for node in graph.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(given)
                continue
            if node.op != "call_function":
                continue
            call_args = torch.fx.node.map_arg(node.args, env.__getitem__)
            call_kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
            env[node] = node.target(*call_args, **call_kwargs)
            if names.get(node.name, "getitem") == "getitem":
                continue
            for _ in range(EACH_OP_CALLS):  # untimed: the op's code into the caches
                node.target(*call_args, **call_kwargs)
            samples = []
            for _ in range(passes):
                start = clock()
                for _ in range(EACH_OP_CALLS):
                    node.target(*call_args, **call_kwargs)
                samples.append((clock() - start) / EACH_OP_CALLS)
            alone[node] = statistics.median(samples)
        scale = per_call / sum(alone.values())
        by_op: dict[str, list[float]] = {}
        for node, seconds in alone.items():
            by_op.setdefault(names[node.name], []).append(seconds * scale)
        method = (
            f"each op of the op latency's probe graph timed in a loop of its own on the "
            f"arguments it gets in the graph, median of {passes} samples of {EACH_OP_CALLS} "
            f"calls, scaled so that the graph's ops add up to its time per call "
            f"(x{scale:.2f}: the mix's cost over its ops alone); the median over the op's "
            f"nodes{_threads(self.device)}"
        )
        return {
            name: Figure(statistics.median(t), "s", f"{method}: {len(t)} node(s)")
            for name, t in sorted(by_op.items())
        }

    def _cold(self, graph: torch.fx.GraphModule, args: list[torch.Tensor], kinds: int) -> Figure:
        """What a call of ``graph`` pays beyond its time called back to back when the caches
        were evicted before it (:data:`EVICT_BYTES` written), over its ``kinds`` kinds of
        op: the median over ``_passes`` pairs of a call right after another and, the caches
        then evicted, a cold one, of the cold call's extra time.

        Taken in pairs since methods revision 14: a median of cold calls less the graph's
        time per call measured before (as it was) moved with the machine's speed between the
        two, and came out 3.0 to 6.9 us a kind in short profiles of one hour on the 2-core
        development machine, where the probe split into 3, 10 or 29 segments with a 32 KiB
        read before each (as a streamed plan runs) paid 5.9-6.9 us a kind in each segment;
        at 3.0 us the compute of a small Llama's 13 disk segments was predicted 21% under
        what it measured, at 6 us within 1%."""
        passes = self._passes
        evict = torch.empty(EVICT_BYTES, dtype=torch.uint8)
        extras: list[float] = []
        clock = time.perf_counter
        for turn in range(passes):
            graph(*args)  # the graph's code and data in the caches
            start = clock()
            graph(*args)
            warm = clock() - start
            evict.fill_(turn)
            start = clock()
            graph(*args)
            extras.append(clock() - start - warm)
        extra = max(0.0, statistics.median(extras))
        return Figure(
            extra / max(1, kinds),
            "s",
            f"the op latency's probe graph timed with {format_bytes(EVICT_BYTES)} written "
            f"before a call and right after another, median over {passes} such pairs of the "
            f"first's extra time ({extra * 1e6:.0f} us), over its {kinds} kinds of "
            f"op{_threads(self.device)}",
        )


def copy_bandwidth(src_device: str, dst_device: str, pinned: bool, budget: Budget) -> Figure:
    """Bytes per second of one ``Tensor.copy_`` between two devices (pinned host memory or not)."""
    host = "pinned" if pinned else "pageable"
    what = f"Tensor.copy_ of {format_bytes(budget.link_bytes)} from {src_device} to {dst_device}"
    if "cpu" in (src_device, dst_device):
        what += f" ({host} host memory)"
    src = torch.ones(budget.link_bytes, dtype=torch.uint8, device=src_device)
    dst = torch.empty(budget.link_bytes, dtype=torch.uint8, device=dst_device)
    if pinned:
        src, dst = (t.pin_memory() if t.device.type == "cpu" else t for t in (src, dst))
    sync = _sync((src_device, dst_device))
    per_call, calls = time_per_call(lambda: dst.copy_(src, non_blocking=pinned), sync, budget)
    return Figure(
        value=budget.link_bytes / per_call,
        unit="B/s",
        method=f"{what}; size / {_how(budget, calls)}",
    )


@dataclasses.dataclass(frozen=True)
class _Step:
    key: tuple[str, ...]
    label: str
    unit: str
    run: Callable[[], Figure]


def _link_ends(name: str, dev: str) -> tuple[str, str]:
    return ("cpu", dev) if name.startswith("h2d") else (dev, "cpu")


_HOST_LINKS = ("h2d pageable", "h2d pinned", "d2h pageable", "d2h pinned")


def links_without_cuda() -> list[LinkFigure]:
    """Every link kind, absent because there is no CUDA device."""
    absent = Figure.absent("B/s", NO_CUDA)
    host = [LinkFigure(name, *_link_ends(name, "cuda"), absent) for name in _HOST_LINKS]
    return [*host, LinkFigure("d2d", "cuda", "cuda", absent)]


def _plan_links(cuda: list[str], mode: Mode) -> tuple[list[_Step], list[LinkFigure]]:
    """Steps for the links measured in ``mode``, and the absent ones with their reason."""
    budget = BUDGETS[mode]
    if not cuda:
        return [], links_without_cuda()
    steps, absent = [], []
    for dev in cuda:
        for name in _HOST_LINKS:
            src, dst = _link_ends(name, dev)
            if mode == "short" and "pageable" in name:
                absent.append(LinkFigure(name, src, dst, Figure.absent("B/s", SHORT_NOTE)))
                continue
            pinned = "pinned" in name
            run = functools.partial(copy_bandwidth, src, dst, pinned, budget)
            steps.append(_Step(("link", name, src, dst), f"{name} {src}->{dst}", "B/s", run))
    if len(cuda) == 1 or mode == "short":
        reason = SHORT_NOTE if mode == "short" else "only one CUDA device"
        absent.append(LinkFigure("d2d", "cuda", "cuda", Figure.absent("B/s", reason)))
    else:
        for src in cuda:
            for dst in (d for d in cuda if d != src):
                run = functools.partial(copy_bandwidth, src, dst, False, budget)
                steps.append(_Step(("link", "d2d", src, dst), f"d2d {src}->{dst}", "B/s", run))
    return steps, absent


def _plan_disk(
    offload_dir: Path | None, mode: Mode
) -> tuple[DiskBench | None, list[_Step], DiskFigures | None]:
    """The disk bench and its steps, or the absent disk section saying why there is none."""
    budget = BUDGETS[mode]
    if offload_dir is None:
        return None, [], DiskFigures.absent("no offload directory was given")
    problem = writable_problem(offload_dir)
    if problem:
        return None, [], DiskFigures.absent(problem, str(offload_dir))
    try:
        bench = DiskBench(
            offload_dir,
            budget.disk_bytes,
            budget.disk_samples,
            budget.disk_reads,
            budget.disk_budget_s,
        )
    except OSError as exc:
        reason = f"cannot measure the disk at {offload_dir} ({exc.strerror or exc})"
        return None, [], DiskFigures.absent(reason, str(offload_dir))
    if bench.nbytes == 0:
        bench.close()
        reason = f"only {format_bytes(bench.free)} free at {offload_dir}"
        return None, [], DiskFigures.absent(reason, str(offload_dir))
    # The write step creates the file that the read and latency steps use.
    probe = StreamProbe(bench, budget)
    small = SmallReadProbe(bench)
    steps = [
        _Step(("disk", "write"), f"disk write at {offload_dir}", "B/s", bench.write),
        _Step(("disk", "read"), f"disk read at {offload_dir}", "B/s", bench.read),
        _Step(("disk", "latency"), f"disk 4 KiB latency at {offload_dir}", "s", bench.latency),
        _Step(("disk", "stream"), "disk reads while the cpu computes", "B/s", probe.rate),
        _Step(
            ("disk", "stream_small"),
            "small disk reads while the cpu computes",
            "B/s",
            probe.small_rate,
        ),
        _Step(("disk", "read_cpu"), "cpu taken by small disk reads", "s", small.read_cpu),
        _Step(("disk", "read_inline"), "small disk reads made inline", "s", small.read_inline),
        _Step(
            ("disk", "compute_slowdown"), "cpu matmul while reading the disk", "x", probe.slowdown
        ),
    ]
    return bench, steps, None


def _run(step: _Step) -> Figure:
    try:
        return step.run()
    except (RuntimeError, TypeError, OSError, OffloadError) as exc:
        # A device or dtype that cannot do this is a finding to report, not a crash.
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        return Figure(value=None, unit=step.unit, method=step.label, note=f"failed: {first}")


def _flag_slow(matmul: dict[str, Figure], device: str) -> dict[str, Figure]:
    """Note each dtype that runs under a tenth of float32's rate."""
    fp32 = matmul["float32"].value
    out = {}
    for dtype, fig in matmul.items():
        if fp32 and fig.value is not None and fig.value < fp32 / 10 and not fig.note:
            share = 100 * fig.value / fp32
            fig = dataclasses.replace(fig, note=f"very slow: {share:.1f}% of float32 on {device}")
        out[dtype] = fig
    return out


def _device_figures(
    name: str,
    results: dict[tuple[str, ...], Figure],
    probe: OpProbe,
    budget: Budget,
) -> DeviceFigures:
    if name == "cpu":
        description = f"{cpu_model()}, {psutil.cpu_count(logical=True)} logical cores"
        memory = Figure(float(psutil.virtual_memory().total), "B", "psutil.virtual_memory().total")
    else:
        description, total = cuda_properties(name)
        method = f"torch.cuda.get_device_properties({name.split(':')[1]}).total_memory"
        memory = Figure(float(total), "B", method)
    matmul = {
        dtype_name(dt): results.get(
            ("matmul", name, dtype_name(dt)), Figure.absent("FLOP/s", SHORT_NOTE)
        )
        for dt in DTYPES
    }
    return DeviceFigures(
        name=name,
        kind="cpu" if name == "cpu" else "cuda",
        description=description,
        memory=memory,
        matmul=_flag_slow(matmul, name),
        memory_bandwidth=results[("bandwidth", name)],
        op_latency=results[("latency", name)],
        matmul_rows=_rows_results(name, results),
        matmul_rows_n=square_n(name, budget),
        matmul_rows_wide=_rows_results(name, results, "matmul_rows_wide"),
        op_latencies=probe.per_op,
        op_cold_latency=probe.cold,
        attention=results.get(("attention", name)),
        attention_tokens={
            int(key[2]): fig
            for key, fig in results.items()
            if key[0] == "attention_tokens" and key[1] == name
        },
    )


def _rows_results(
    name: str, results: dict[tuple[str, ...], Figure], kind: str = "matmul_rows"
) -> dict[str, dict[int, Figure]]:
    """The few-row matmul figures of device ``name`` among ``results`` (``kind``: the square
    size's, or ``"matmul_rows_wide"``), by dtype and rows."""
    out: dict[str, dict[int, Figure]] = {}
    for key, fig in results.items():
        if key[0] == kind and key[1] == name:
            out.setdefault(key[2], {})[int(key[3])] = fig
    return out


def _load_figure() -> Figure:
    busy = psutil.cpu_percent(interval=0.2)
    note = ""
    if busy > 25:
        note = "the machine was busy: figures may be low; measure again when it is idle"
    method = (
        "psutil.cpu_percent(interval=0.2) over all cores just before measuring, "
        "while this process slept: what other work was using"
    )
    return Figure(busy, "%", method, note)


def measure_host(
    mode: Mode, offload_dir: Path | None = None, progress: Progress | None = None
) -> Measurements:
    """Measure this machine in ``mode`` (``"short"``, ``"quick"`` or ``"full"``).

    ``offload_dir`` is where the disk tier is measured; none, or an unwritable one, leaves
    the disk section absent with the reason. ``progress`` sees each step.
    """
    if mode == "nominal":
        raise ValueError("mode 'nominal' measures nothing")
    budget = BUDGETS[mode]
    started = time.perf_counter()
    created = time.time()
    load = _load_figure()
    cuda = detect_cuda_devices()
    steps: list[_Step] = []
    probes: dict[str, OpProbe] = {}
    for dev in ["cpu", *cuda]:
        for dt in budget.dtypes:
            run = functools.partial(matmul_flops, dev, dt, budget)
            key = ("matmul", dev, dtype_name(dt))
            steps.append(_Step(key, f"{dev} matmul {dtype_name(dt)}", "FLOP/s", run))
            for rows in matmul_rows_sizes(dev, budget):
                run = functools.partial(matmul_rows_flops, dev, dt, rows, budget)
                label = f"{dev} matmul {dtype_name(dt)} at {rows} rows"
                rows_key = ("matmul_rows", dev, dtype_name(dt), str(rows))
                steps.append(_Step(rows_key, label, "FLOP/s", run))
        if dev == "cpu" and budget.cpu_matmul_n < WIDE_ROWS_N:
            # float32's at a large model's width (the other dtypes scale by their own rates)
            for rows in (r for r in budget.matmul_rows if r < WIDE_ROWS_N):
                run = functools.partial(
                    matmul_rows_flops, dev, torch.float32, rows, budget, WIDE_ROWS_N
                )
                label = f"{dev} matmul float32 at {rows} rows, {WIDE_ROWS_N} wide"
                wide_key = ("matmul_rows_wide", dev, "float32", str(rows))
                steps.append(_Step(wide_key, label, "FLOP/s", run))
        run = functools.partial(attention_flops, dev, budget)
        steps.append(_Step(("attention", dev), f"{dev} attention float32", "FLOP/s", run))
        for tokens in ATTENTION_TOKENS:
            run = functools.partial(attention_flops, dev, budget, tokens)
            key = ("attention_tokens", dev, str(tokens))
            label = f"{dev} attention float32 at {tokens} tokens"
            steps.append(_Step(key, label, "FLOP/s", run))
        run = functools.partial(memory_bandwidth, dev, budget)
        steps.append(_Step(("bandwidth", dev), f"{dev} memory bandwidth", "B/s", run))
        probes[dev] = OpProbe(dev, budget)
        steps.append(_Step(("latency", dev), f"{dev} op latency", "s", probes[dev].latency))
    work = RuntimeProbe(_small_segment())
    steps += [
        _Step(("runtime", "segment_call"), "runtime: a segment's call", "s", work.segment_call),
        _Step(("runtime", "resident"), "runtime: a resident weight", "s", work.resident),
        _Step(("runtime", "stream"), "runtime: a streamed weight", "s", work.stream),
    ]
    link_steps, absent_links = _plan_links(cuda, mode)
    bench, disk_steps, absent_disk = _plan_disk(offload_dir, mode)
    # The disk goes first: measured after the CPU steps, its reads came out up to twice as
    # fast as an independent reader's on a virtual machine.
    steps = disk_steps + steps + link_steps
    results: dict[tuple[str, ...], Figure] = {}
    # Measured as a model's calls run, not as the compile that asks runs: a first compile
    # measures inside AOTAutograd's compiler, which routes every op through the Python
    # dispatcher (the per-op cost came out 5.9-6.4 us there, 2.4 us outside it).
    try:
        with no_python_dispatcher():
            for i, step in enumerate(steps):
                if progress:
                    progress(i, len(steps), step.label)
                results[step.key] = _run(step)
    finally:
        if bench:
            bench.close()
    if progress:
        progress(len(steps), len(steps), "done")
    links = [LinkFigure(s.key[1], s.key[2], s.key[3], results[s.key]) for s in link_steps]
    if bench:
        disk = DiskFigures(
            path=str(offload_dir),
            free=bench.free_figure(),
            read=results[("disk", "read")],
            write=results[("disk", "write")],
            latency=results[("disk", "latency")],
            compute_slowdown=results[("disk", "compute_slowdown")],
            stream=results[("disk", "stream")],
            stream_small=results[("disk", "stream_small")],
            read_cpu=results[("disk", "read_cpu")],
            read_inline=results[("disk", "read_inline")],
        )
    else:
        assert absent_disk is not None
        disk = absent_disk
    return Measurements(
        mode=mode,
        created_at=created,
        duration=Figure(time.perf_counter() - started, "s", "wall time of the whole measurement"),
        load=load,
        fingerprint=current_fingerprint(),
        devices=tuple(_device_figures(dev, results, probes[dev], budget) for dev in ["cpu", *cuda]),
        links=tuple(links + absent_links),
        disk=disk,
        runtime=RuntimeFigures(
            segment_call=results[("runtime", "segment_call")],
            resident=results[("runtime", "resident")],
            stream=results[("runtime", "stream")],
        ),
    )
