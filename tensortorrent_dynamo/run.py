"""The runtime: devices, memory ledgers, and the ops the rewritten graph calls.

The rewritten parent graph calls :func:`transfer`, :func:`resident`,
:func:`prefetch`, :func:`wait` and :func:`evict` on a :class:`Runtime` it holds
as ``self.tt_runtime``; ``print(gm.code)`` therefore reads as the schedule.

A virtual accelerator (``virtual:N``) executes on the CPU, but every tensor it
holds is a real copy registered in its own :class:`MemoryLedger`; the ledger
follows the tensors' real lifetimes (weak references on their storages), so its
peak is measured, not predicted, and an allocation past the capacity fails like
an out-of-memory error on a real device.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .errors import VirtualDeviceOutOfMemory
from .units import format_bytes


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


class VirtualDevice:
    """A CPU-backed accelerator with its own ledger and a copy engine thread."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.ledger = MemoryLedger(name, capacity)
        # storage data_ptr -> [nbytes, number of live tensors using it]
        self._storages: dict[int, list[int]] = {}
        self._tensors: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._copy_engine = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tt-{name}-h2d"
        )

    def owns(self, tensor: torch.Tensor) -> bool:
        with self._lock:
            return tensor.untyped_storage().data_ptr() in self._storages

    def adopt(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Account ``tensor`` on this device until it is garbage collected."""
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return tensor
        with self._lock:
            if id(tensor) in self._tensors:
                return tensor
            entry = self._storages.get(ptr)
            if entry is None:
                self.ledger.allocate(nbytes, what)
                self._storages[ptr] = [nbytes, 1]
            else:
                entry[1] += 1
            self._tensors[id(tensor)] = weakref.finalize(tensor, self._release, id(tensor), ptr)
        return tensor

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
        buffer = torch.empty_like(tensor, device="cpu", memory_format=torch.preserve_format)
        self.adopt(buffer, what)
        return buffer.copy_(tensor)

    def copy_in_async(self, tensor: torch.Tensor, what: str, recorder: Recorder) -> PrefetchHandle:
        buffer = torch.empty_like(tensor, device="cpu", memory_format=torch.preserve_format)
        self.adopt(buffer, what)

        def copy() -> None:
            start = recorder.now()
            buffer.copy_(tensor)
            recorder.add(f"h2d {self.name}", "prefetch", what, start)

        future = self._copy_engine.submit(copy)
        return PrefetchHandle(buffer=buffer, done=future.result)

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


@dataclasses.dataclass
class PrefetchHandle:
    """A copy in flight: ``done()`` blocks until it landed in ``buffer``."""

    buffer: torch.Tensor | None
    done: Callable[[], object]


class Runtime(torch.nn.Module):
    """Devices, resident copies and the copy engines one rewritten graph runs with."""

    def __init__(self, virtual: dict[str, VirtualDevice]) -> None:
        super().__init__()
        self.virtual = virtual
        # key -> (device copy, the source tensor, its version when copied)
        self._resident: dict[str, tuple[torch.Tensor, weakref.ref[torch.Tensor], int]] = {}
        self._cuda_copy_streams: dict[str, torch.cuda.Stream] = {}
        self.recorder = Recorder()

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
        if self.owner(tensor) in self.virtual:
            return tensor.to(device, copy=True)
        return tensor.to(device, non_blocking=device != "cpu")

    def make_resident(self, key: str, param: torch.Tensor, device: str) -> torch.Tensor:
        copy = self.move(param.detach(), device, f"resident {key}")
        self._resident[key] = (copy, weakref.ref(param), param._version)
        return copy

    def resident_copy(self, key: str, param: torch.Tensor, device: str) -> torch.Tensor:
        entry = self._resident.get(key)
        if entry is None or entry[1]() is not param or entry[2] != param._version:
            # Another tensor, or the same one changed in place since it was copied: copy again.
            self._resident.pop(key, None)
            return self.make_resident(key, param, device)
        return entry[0]

    def resident_bytes(self, device: str) -> int:
        return sum(
            t.untyped_storage().nbytes()
            for t, _, _ in self._resident.values()
            if self.owner(t) == device
        )

    def prefetch(self, param: torch.Tensor, device: str, what: str) -> PrefetchHandle:
        if device in self.virtual:
            return self.virtual[device].copy_in_async(param.detach(), what, self.recorder)
        stream = self._cuda_copy_streams.get(device)
        if stream is None:
            stream = self._cuda_copy_streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream):
            buffer = param.detach().to(device, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)

        def done() -> None:
            torch.cuda.current_stream(device).wait_event(event)
            buffer.record_stream(torch.cuda.current_stream(device))

        return PrefetchHandle(buffer=buffer, done=done)


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
    return rt.prefetch(param, device, f"streamed {key}")


def wait(handle: PrefetchHandle) -> torch.Tensor:
    """The prefetched parameter, once its copy has landed."""
    handle.done()
    assert handle.buffer is not None, "wait() after evict(): the schedule is out of order"
    return handle.buffer


def evict(handle: PrefetchHandle) -> None:
    """Drop the runtime's hold on a streamed parameter after its last use."""
    handle.buffer = None


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

    def forward(self, *args: Any) -> Any:
        start = self.recorder.now()
        if self.virtual is None:
            out = self.fn(*args)
        else:
            with self.virtual.executing():
                out = self.fn(*args)
        self.recorder.add(f"compute {self.device}", "segment", self.name, start)
        return out
