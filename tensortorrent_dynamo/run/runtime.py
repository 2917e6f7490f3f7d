"""The runtime: devices, memory ledgers, and the ops the rewritten graph calls.

The rewritten parent graph calls :func:`transfer`, :func:`resident`,
:func:`prefetch`, :func:`wait`, :func:`evict`, :func:`spill` and :func:`reload` on a
:class:`Runtime` it holds as ``self.tt_runtime``; ``print(gm.code)`` therefore reads
as the schedule.

A virtual accelerator (``virtual:N``) executes on the CPU, but every tensor it
holds is a real copy registered in its own :class:`MemoryLedger`; the ledger
follows the tensors' real lifetimes (weak references on their storages), so its
peak is measured, not predicted, and an allocation past the capacity fails like
an out-of-memory error on a real device.

Streamed parameters land in pooled buffers, handed back by ``evict`` and reused by
the next call; those whose home is disk are read by the session's :class:`DiskTier`
first (reader threads, page cache bypassed) and then copied on by the device's copy
engine, or used in place by host segments. A spilled activation is copied to host
memory by the device's device-to-host engine as soon as it is made (the device's copy
is freed once nothing else holds it) and copied back by the host-to-device engine
when the plan says, into a fresh buffer (a later segment may keep a view of it).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psutil
import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import CopyTimeout, VirtualDeviceOutOfMemory
from ..io.locations import FileGuard, TensorLocation
from ..io.pool import HostBufferPool
from ..io.reader import DiskReader, ReadResult
from ..settings import Settings
from ..units import format_bytes

T = TypeVar("T")

# How long a wait for a read or a copy may take before the call is abandoned with an error
# naming it, unless the session's settings say otherwise.
DEFAULT_IO_TIMEOUT_S = Settings.io_timeout_s


def _result(future: concurrent.futures.Future[T], timeout_s: float, what: str) -> T:
    """``future``'s result; :class:`CopyTimeout` naming ``what`` when it takes too long."""
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise CopyTimeout(
            f"{what} has not finished after {timeout_s:g} s: the disk, its file system or the "
            "copy engine stopped answering (a failing disk, a hung network mount). The call "
            "was abandoned; if the disk is only slow, raise the option io_timeout_s"
        ) from None


def landing(
    tensor: torch.Tensor, device: str | torch.device = "cpu", pin: bool = False
) -> torch.Tensor:
    """An empty tensor a copy of ``tensor`` lands in. Every copy the runtime makes (an
    activation changing device, a resident copy, a spill, a reload, a streamed parameter's
    buffer) has this layout, and segments are compiled for it (``compiler``): that of
    ``empty_like``, where a dense tensor keeps its strides (a transposed one stays
    transposed) and any other (a slice, a stride-0 expanded mask) becomes contiguous."""
    return torch.empty_like(
        tensor, device=device, memory_format=torch.preserve_format, pin_memory=pin
    )


class MemoryLedger:
    """Live and peak bytes of one device, thread-safe."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.live = 0
        self.peak = 0
        self._lock = threading.Lock()

    def allocate(self, nbytes: int, what: str) -> None:
        with self._lock:
            if self.live + nbytes > self.capacity:
                raise VirtualDeviceOutOfMemory(
                    f"{self.name}: cannot allocate {format_bytes(nbytes)} for {what}; "
                    f"{format_bytes(self.live)} of {format_bytes(self.capacity)} in use. "
                    "The plan's memory estimate was too low: raise the budget or report a bug."
                )
            self.live += nbytes
            self.peak = max(self.peak, self.live)

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.live -= nbytes

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.live


@dataclasses.dataclass(frozen=True)
class MeasuredEvent:
    """One span of the last run: which resource did what, in seconds from the call start."""

    resource: str
    kind: str
    label: str
    start_s: float
    end_s: float


class Recorder:
    """Measured spans of the latest call (compute per device, copies per link)."""

    def __init__(self) -> None:
        self.events: list[MeasuredEvent] = []
        self._origin = time.perf_counter()
        self._lock = threading.Lock()

    def restart(self) -> None:
        with self._lock:
            self.events = []
            self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def add(self, resource: str, kind: str, label: str, start_s: float) -> None:
        event = MeasuredEvent(resource, kind, label, start_s, self.now())
        with self._lock:
            self.events.append(event)


def rss_bytes() -> int:
    """This process's resident set size now (``/proc/self/statm``; psutil elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except OSError:
        return int(psutil.Process().memory_info().rss)


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class RssSampler:
    """The peak resident set size of this process while the block runs, sampled every
    ``interval_s`` by a background thread (a peak shorter than that can be missed)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> RssSampler:
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._sample, name="tt-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


class VirtualDevice:
    """A CPU-backed accelerator with its own ledger and a copy engine thread."""

    def __init__(self, name: str, capacity: int, timeout_s: float = DEFAULT_IO_TIMEOUT_S) -> None:
        self.name = name
        self.ledger = MemoryLedger(name, capacity)
        self.timeout_s = timeout_s
        # storage data_ptr -> [nbytes, number of live tensors using it]
        self._storages: dict[int, list[int]] = {}
        self._tensors: dict[int, Any] = {}
        # nbytes -> idle flat uint8 buffers of streamed parameters, reused across calls
        self._idle: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._copy_engine = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tt-{name}-h2d"
        )
        self._copy_out_engine = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tt-{name}-d2h"
        )

    def owns(self, tensor: torch.Tensor) -> bool:
        with self._lock:
            return tensor.untyped_storage().data_ptr() in self._storages

    def adopt(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Account ``tensor`` on this device until it is garbage collected.

        When the device is full, idle pooled buffers are dropped first (as a caching
        allocator frees its cache before reporting out of memory).
        """
        try:
            self._account(tensor, what)
        except VirtualDeviceOutOfMemory:
            if not self.trim():
                raise
            self._account(tensor, what)
        return tensor

    def _account(self, tensor: torch.Tensor, what: str) -> None:
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return
        with self._lock:
            if id(tensor) in self._tensors:
                return
            entry = self._storages.get(ptr)
            if entry is None:
                self.ledger.allocate(nbytes, what)
                self._storages[ptr] = [nbytes, 1]
            else:
                entry[1] += 1
            self._tensors[id(tensor)] = weakref.finalize(tensor, self._release, id(tensor), ptr)

    def take(self, like: torch.Tensor | TensorLocation, what: str) -> torch.Tensor:
        """A buffer shaped like ``like`` (a tensor or a disk location): an idle one of the
        same size from the pool when there is one, else a new one on this device."""
        dtype, shape = like.dtype, tuple(like.shape)
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            idle = self._idle.get(nbytes)
            flat = idle.pop() if idle else None
        if flat is None:
            flat = self.adopt(torch.empty(nbytes, dtype=torch.uint8), what)
        # every tensor object over the buffer is adopted: the ledger frees the storage
        # only when the last of them is gone
        if isinstance(like, torch.Tensor):  # the layout every copy lands in
            strides = landing(like, device="meta").stride()
            return self.adopt(flat.view(dtype).as_strided(shape, strides), what)
        return self.adopt(flat.view(dtype).view(shape), what)

    def give(self, buffer: torch.Tensor) -> None:
        """Return a buffer from :meth:`take` to the pool, for the next call to reuse."""
        flat = self.adopt(buffer.view(-1).view(torch.uint8), "idle buffer")
        with self._lock:
            self._idle.setdefault(flat.numel(), []).append(flat)

    def trim(self) -> int:
        """Drop every idle pooled buffer; returns how many were dropped."""
        with self._lock:
            idle, self._idle = self._idle, {}
        dropped = sum(len(buffers) for buffers in idle.values())
        idle.clear()  # outside the lock: the ledger's finalizers take it
        return dropped

    def _release(self, tensor_id: int, ptr: int) -> None:
        with self._lock:
            self._tensors.pop(tensor_id, None)
            entry = self._storages[ptr]
            entry[1] -= 1
            if entry[1] == 0:
                del self._storages[ptr]
                self.ledger.free(entry[0])

    def copy_in(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """A real copy of ``tensor`` held by this device."""
        buffer = landing(tensor)
        self.adopt(buffer, what)
        return buffer.copy_(tensor)

    def copy_in_async(
        self,
        source: Callable[[], torch.Tensor],
        like: torch.Tensor | TensorLocation,
        what: str,
        recorder: Recorder,
        after: Callable[[], None] | None = None,
    ) -> PrefetchHandle:
        """Copy ``source()`` (run on this device's copy engine, in issue order) into a pooled
        buffer; ``after`` runs on the engine once the copy is done."""
        buffer = self.take(like, what)

        def copy() -> None:
            try:
                data = source()
                start = recorder.now()
                buffer.copy_(data)
                recorder.add(f"h2d {self.name}", "prefetch", what, start)
            finally:
                if after is not None:
                    after()

        future = self._copy_engine.submit(copy)
        wait = f"the copy of {what} to {self.name}"
        return PrefetchHandle(
            finish=lambda: (_result(future, self.timeout_s, wait), buffer)[1],
            release=lambda: self.give(buffer),
        )

    def copy_out_async(self, tensor: torch.Tensor, what: str, recorder: Recorder) -> PrefetchHandle:
        """Copy ``tensor`` to host memory on this device's device-to-host engine; once
        copied, the engine holds no reference to it."""

        def copy() -> torch.Tensor:
            start = recorder.now()
            host = landing(tensor).copy_(tensor)  # on the engine's thread: not accounted here
            recorder.add(f"d2h {self.name}", "spill", what, start)
            return host

        future = self._copy_out_engine.submit(copy)
        wait = f"the spill of {what} from {self.name}"
        return PrefetchHandle(finish=lambda: _result(future, self.timeout_s, wait))

    def copy_in_later(
        self, source: Callable[[], torch.Tensor], what: str, recorder: Recorder
    ) -> PrefetchHandle:
        """Copy ``source()`` into a new buffer of this device on its copy engine, in
        issue order (not pooled: whoever reads it may keep views of it)."""

        def copy() -> torch.Tensor:
            data = source()
            start = recorder.now()
            buffer = self.copy_in(data, what)
            recorder.add(f"h2d {self.name}", "reload", what, start)
            return buffer

        future = self._copy_engine.submit(copy)
        wait = f"the reload of {what} to {self.name}"
        return PrefetchHandle(finish=lambda: _result(future, self.timeout_s, wait))

    @contextmanager
    def executing(self) -> Iterator[None]:
        """Account every tensor produced while the block runs on this device."""
        with _AdoptOutputs(self):
            yield


class _AdoptOutputs(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, device: VirtualDevice) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.device = device

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self.device.adopt(leaf, f"output of {func}")
        return out


class PrefetchHandle:
    """A parameter on its way to a device: :meth:`result` blocks until it landed,
    :meth:`release` hands its buffer back for reuse."""

    def __init__(
        self,
        finish: Callable[[], torch.Tensor],
        release: Callable[[], None] | None = None,
    ) -> None:
        self._finish: Callable[[], torch.Tensor] | None = finish
        self._release = release
        self._tensor: torch.Tensor | None = None

    def result(self) -> torch.Tensor:
        if self._tensor is None:
            assert self._finish is not None, "wait() after evict(): the schedule is out of order"
            self._tensor = self._finish()
        return self._tensor

    def release(self) -> None:
        if self._finish is not None and self._tensor is None:
            self.result()  # never hand back a buffer a copy is still writing
        self._tensor = None
        self._finish = None
        if self._release is not None:
            self._release()
            self._release = None

    def abandon(self, wait: bool) -> None:
        """After a failed call: with ``wait``, wait for the copy and hand its buffer back. A
        copy that failed as well keeps its error to itself (the call's error is the one
        raised); a buffer whose copy did not finish (or was not waited for) is not handed
        back, and is freed once the copy lets go of it."""
        try:
            if wait:
                self.release()
        except Exception:
            pass
        self._finish = None
        self._release = None


@dataclasses.dataclass
class DiskTier:
    """Parameters whose home is disk: where each one is, and the reader that fetches them
    into pooled host buffers (page cache bypassed)."""

    locations: dict[str, TensorLocation]
    reader: DiskReader
    pool: HostBufferPool
    timeout_s: float = DEFAULT_IO_TIMEOUT_S
    # the guards of the files ``locations`` are in, each once
    guards: list[FileGuard] = dataclasses.field(default_factory=list)

    def add(self, locations: Mapping[str, TensorLocation]) -> None:
        """Know where ``locations`` are too."""
        self.locations.update(locations)
        for location in locations.values():
            guard = location.guard
            if guard is not None and all(guard is not g for g in self.guards):
                self.guards.append(guard)

    def check_unchanged(self) -> None:
        """Raise :class:`OffloadCorruptError` when a file the weights are read from was
        deleted, replaced or written since it was planned with (one ``stat`` per file)."""
        for guard in self.guards:
            guard.check_unchanged()

    def read(self, key: str) -> concurrent.futures.Future[ReadResult]:
        """Start reading the parameter ``key`` into a pooled host buffer."""
        return self.reader.submit(self.locations[key])

    def landed(self, key: str, read: concurrent.futures.Future[ReadResult]) -> ReadResult:
        """The finished read ``read`` of ``key``; :class:`CopyTimeout` when it is stuck."""
        location = self.locations[key]
        return _result(read, self.timeout_s, f"reading {key!r} from {location.path}")

    def read_now(self, key: str) -> torch.Tensor:
        """The parameter ``key`` read into a host tensor of its own, of its exact size (the
        pooled read buffer, aligned and padded for ``O_DIRECT``, goes back to the pool)."""
        read = self.landed(key, self.read(key))
        tensor = read.tensor.clone()
        self.pool.give(read.buffer)
        return tensor


class ResidentCopies:
    """The copies of parameters kept on a device for the whole run, by parameter and device.

    A copy is valid while its parameter is alive and unchanged (same ``_version``).
    """

    def __init__(self) -> None:
        # (id(param), device) -> (fqn, copy, the parameter, its version when copied)
        self._copies: dict[
            tuple[int, str], tuple[str, torch.Tensor, weakref.ref[torch.Tensor], int]
        ] = {}

    def get(self, param: torch.Tensor, device: str) -> torch.Tensor | None:
        entry = self._copies.get((id(param), device))
        if entry is None or entry[2]() is not param or entry[3] != param._version:
            return None
        return entry[1]

    def put(self, fqn: str, param: torch.Tensor, device: str, copy: torch.Tensor) -> None:
        self._copies[(id(param), device)] = (fqn, copy, weakref.ref(param), param._version)

    def copies(self) -> list[tuple[str, torch.Tensor]]:
        """(fqn, copy) of every copy whose parameter is still alive."""
        return [(fqn, copy) for fqn, copy, ref, _ in self._copies.values() if ref() is not None]

    def evict(self, keep: Callable[[str, str], bool]) -> list[str]:
        """Drop the copies for which ``keep(fqn, device)`` is false (their memory is freed
        once nothing else uses them); returns their fqns."""
        dropped = [key for key, entry in self._copies.items() if not keep(entry[0], key[1])]
        return [self._copies.pop(key)[0] for key in dropped]


class Runtime(torch.nn.Module):
    """Devices, resident copies and the copy engines one rewritten graph runs with."""

    def __init__(
        self,
        virtual: dict[str, VirtualDevice],
        disk: DiskTier | None = None,
        resident: ResidentCopies | None = None,
        timeout_s: float = DEFAULT_IO_TIMEOUT_S,
    ) -> None:
        super().__init__()
        self.virtual = virtual
        self.disk = disk
        self.timeout_s = timeout_s
        # the handles of the call in progress, so that a failed call hands their buffers back
        self._handles: list[PrefetchHandle] = []
        # shared by the graphs of one session: a weight two graphs use is held once
        self.resident = resident if resident is not None else ResidentCopies()
        self._cuda_copy_streams: dict[str, torch.cuda.Stream] = {}
        self._cuda_copy_engines: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._cuda_copy_out_streams: dict[str, torch.cuda.Stream] = {}
        self.recorder = Recorder()

    def begin_call(self) -> None:
        """Start a call: check that the files weights are read from are as planned, and
        restart the measured spans."""
        if self.disk is not None:
            self.disk.check_unchanged()
        self._handles.clear()
        self.recorder.restart()

    def abandon(self, error: BaseException) -> None:
        """After ``error`` in a call: wait for every copy the call started and hand its
        buffer back, so the next call starts from a clean state; after a wait that timed
        out, drop them instead (waiting again could hang the caller on the stuck copy)."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.abandon(wait=not isinstance(error, CopyTimeout))

    def _track(self, handle: PrefetchHandle) -> PrefetchHandle:
        self._handles.append(handle)
        return handle

    def owner(self, tensor: torch.Tensor) -> str:
        """The device ``tensor`` is held by (a virtual device, or its torch device)."""
        for name, dev in self.virtual.items():
            if dev.owns(tensor):
                return name
        return "cpu" if tensor.device.type == "cpu" else str(tensor.device)

    def move(self, tensor: torch.Tensor, device: str, what: str) -> torch.Tensor:
        start = self.recorder.now()
        source = self.owner(tensor)
        moved = self._move(tensor, device, what)
        self.recorder.add(f"copy {source}->{device}", "transfer", what, start)
        return moved

    def _move(self, tensor: torch.Tensor, device: str, what: str) -> torch.Tensor:
        if device in self.virtual:
            source = tensor if tensor.device.type == "cpu" else tensor.to("cpu")
            return self.virtual[device].copy_in(source, what)
        # ``to`` lands in the layout of :func:`landing`, as every copy here
        if self.owner(tensor) in self.virtual:
            return tensor.to(device, copy=True)
        return tensor.to(device, non_blocking=device != "cpu")

    def _disk_location(self, key: str) -> TensorLocation | None:
        return self.disk.locations.get(key) if self.disk is not None else None

    def make_resident(self, key: str, param: torch.Tensor, device: str) -> torch.Tensor:
        """The copy of ``param`` kept on ``device``; a parameter whose weights were released
        to disk is read from there first. On the host, a live parameter is itself."""
        source = param.detach()
        if self._disk_location(key) is not None and source.untyped_storage().nbytes() == 0:
            assert self.disk is not None
            start = self.recorder.now()
            source = self.disk.read_now(key)
            self.recorder.add("disk->cpu", "read", f"resident {key}", start)
        elif device == "cpu":
            return param
        copy = source if device == "cpu" else self.move(source, device, f"resident {key}")
        self.resident.put(key, param, device, copy)
        return copy

    def resident_copy(self, key: str, param: torch.Tensor, device: str) -> torch.Tensor:
        copy = self.resident.get(param, device)
        # none yet, or the parameter changed in place since it was copied: copy again
        return copy if copy is not None else self.make_resident(key, param, device)

    def resident_bytes(self, device: str, exclude: frozenset[str] = frozenset()) -> int:
        """Bytes of resident copies on ``device``, less those of the parameters named in
        ``exclude``."""
        return sum(
            copy.untyped_storage().nbytes()
            for fqn, copy in self.resident.copies()
            if fqn not in exclude and self.owner(copy) == device
        )

    def prefetch(self, param: torch.Tensor, key: str, device: str) -> PrefetchHandle:
        """Start bringing a streamed parameter to ``device``: from disk when its home is
        disk, else from host RAM; returns at once."""
        return self._track(self._prefetch(param, key, device))

    def _prefetch(self, param: torch.Tensor, key: str, device: str) -> PrefetchHandle:
        held = self.resident.get(param, device)
        if held is not None:  # another graph keeps it on this device: no copy needed
            return PrefetchHandle(finish=lambda: held)
        what = f"streamed {key}"
        location = self._disk_location(key)
        if location is None:
            return self._prefetch_from_host(param.detach(), device, what)
        assert self.disk is not None
        disk = self.disk
        start = self.recorder.now()
        read = disk.read(key)
        read.add_done_callback(lambda _: self.recorder.add("disk->cpu", "read", what, start))

        def landed() -> torch.Tensor:
            return disk.landed(key, read).tensor

        def give_back() -> None:
            # a failed read gave its buffer back itself; a stuck one keeps it
            if read.done() and read.exception() is None:
                disk.pool.give(read.result().buffer)

        if device == "cpu":
            return PrefetchHandle(finish=landed, release=give_back)
        if device in self.virtual:
            return self.virtual[device].copy_in_async(
                landed, location, what, self.recorder, after=give_back
            )
        return self._prefetch_cuda(landed, device, what, after=give_back)

    def _prefetch_from_host(self, param: torch.Tensor, device: str, what: str) -> PrefetchHandle:
        if device in self.virtual:
            return self.virtual[device].copy_in_async(lambda: param, param, what, self.recorder)
        return self._prefetch_cuda(lambda: param, device, what)

    def _prefetch_cuda(
        self,
        source: Callable[[], torch.Tensor],
        device: str,
        what: str,
        after: Callable[[], None] | None = None,
    ) -> PrefetchHandle:
        """A non-blocking copy on ``device``'s copy stream, issued by its copy engine thread
        once ``source()`` is ready; compute waits on the copy's event, not on the host."""
        stream = self._cuda_copy_streams.get(device)
        if stream is None:
            stream = self._cuda_copy_streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            self._cuda_copy_engines[device] = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"tt-{device}-h2d"
            )

        def copy() -> tuple[torch.Tensor, torch.cuda.Event]:
            try:
                data = source()
                start = self.recorder.now()
                with torch.cuda.stream(stream):
                    buffer = data.to(device, non_blocking=True)
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(stream)
                if after is not None:
                    event.synchronize()  # the host buffer goes back to its pool: copy first
                    self.recorder.add(f"h2d {device}", "prefetch", what, start)
            finally:
                if after is not None:
                    after()
            return buffer, event

        future = self._cuda_copy_engines[device].submit(copy)

        def finish() -> torch.Tensor:
            buffer, event = _result(future, self.timeout_s, f"the copy of {what} to {device}")
            current = torch.cuda.current_stream(device)
            current.wait_event(event)
            buffer.record_stream(current)
            return buffer

        return PrefetchHandle(finish=finish)

    def spill(self, value: torch.Tensor, what: str) -> PrefetchHandle:
        """Start copying an activation to host memory; returns at once. The handle's
        result is the host copy."""
        device = self.owner(value)
        if device in self.virtual:
            return self._track(self.virtual[device].copy_out_async(value, what, self.recorder))
        if value.device.type == "cuda":
            return self._track(self._spill_cuda(value, what))
        return PrefetchHandle(finish=lambda: value)  # already in host memory

    def _spill_cuda(self, value: torch.Tensor, what: str) -> PrefetchHandle:
        """A non-blocking copy into pinned host memory on the device's device-to-host
        stream, after the work that made ``value``."""
        device = str(value.device)
        stream = self._cuda_copy_out_streams.get(device)
        if stream is None:
            stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            self._cuda_copy_out_streams[device] = stream
        start = self.recorder.now()
        stream.wait_stream(torch.cuda.current_stream(value.device))
        with torch.cuda.stream(stream):
            host = landing(value, pin=True)
            host.copy_(value, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        # the caching allocator may reuse the memory only once the copy has read it
        value.record_stream(stream)

        def finish() -> torch.Tensor:
            event.synchronize()
            self.recorder.add(f"d2h {device}", "spill", what, start)
            return host

        return PrefetchHandle(finish=finish)

    def reload(self, spilled: PrefetchHandle, device: str, what: str) -> PrefetchHandle:
        """Start copying a spilled activation back to ``device`` once its spill landed;
        returns at once."""
        if device in self.virtual:
            return self._track(
                self.virtual[device].copy_in_later(spilled.result, what, self.recorder)
            )
        if device.startswith("cuda"):
            return self._track(self._prefetch_cuda(spilled.result, device, what))
        return spilled


def transfer(rt: Runtime, value: Any, device: str) -> Any:
    """Copy every tensor in ``value`` to ``device`` (a no-op for tensors already there)."""

    def one(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and rt.owner(leaf) != device:
            return rt.move(leaf, device, "activation")
        return leaf

    return tree_map(one, value)


def resident(rt: Runtime, param: torch.Tensor, key: str, device: str) -> torch.Tensor:
    """The copy of ``param`` kept on ``device`` for the whole run."""
    return rt.resident_copy(key, param, device)


def prefetch(rt: Runtime, param: torch.Tensor, key: str, device: str) -> PrefetchHandle:
    """Start copying a streamed parameter to ``device``; returns at once."""
    return rt.prefetch(param, key, device)


def wait(handle: Any) -> Any:
    """The prefetched parameter (or reloaded activation), once its copy has landed; for
    a tuple or list of handles (an activation made of several tensors), each one's."""
    if isinstance(handle, PrefetchHandle):
        return handle.result()
    return tree_map(lambda h: h.result() if isinstance(h, PrefetchHandle) else h, handle)


def evict(handle: PrefetchHandle) -> None:
    """Hand a streamed parameter's buffer back for reuse after its last use."""
    handle.release()


def spill(rt: Runtime, value: Any, what: str) -> Any:
    """Start copying an activation (each tensor of it) to host memory, so its device can
    drop it."""
    return tree_map(lambda t: rt.spill(t, what) if isinstance(t, torch.Tensor) else t, value)


def reload(rt: Runtime, spilled: Any, what: str, device: str) -> Any:
    """Start copying a spilled activation (each tensor of it) back to ``device`` for its
    next use."""

    def one(h: Any) -> Any:
        return rt.reload(h, device, what) if isinstance(h, PrefetchHandle) else h

    return tree_map(one, spilled)


for _op in (prefetch, evict):
    torch.fx.node.has_side_effect(_op)


class Segment(torch.nn.Module):
    """One device's compiled subgraph, run inside that device's accounting."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        device: str,
        virtual: VirtualDevice | None,
        compiler: str,
        recorder: Recorder,
    ) -> None:
        super().__init__()
        self.fn = fn
        self.name = name
        self.device = device
        self.virtual = virtual
        self.compiler = compiler
        self.recorder = recorder
        # the uncompiled subgraph, and whether to run it instead of ``fn`` (when it was
        # measured faster)
        self.eager_fn: Callable[..., Any] = fn
        self.use_eager = False

    def forward(self, *args: Any) -> Any:
        start = self.recorder.now()
        fn = self.eager_fn if self.use_eager else self.fn
        try:
            if self.virtual is None:
                out = fn(*args)
            else:
                with self.virtual.executing():
                    out = fn(*args)
        except Exception as exc:
            if sys.version_info >= (3, 11):
                exc.add_note(f"in TensorTorrent segment {self.name} on {self.device}")
            raise
        self.recorder.add(f"compute {self.device}", "segment", self.name, start)
        return out
