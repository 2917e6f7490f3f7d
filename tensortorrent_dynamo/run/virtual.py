"""The virtual accelerator (``virtual:N``): a device that executes on the CPU, but every
tensor it holds is a real copy registered in its own :class:`MemoryLedger`; the ledger
follows the tensors' real lifetimes (weak references on their storages), so its peak is
measured, not predicted, and an allocation past the capacity fails like an
out-of-memory error on a real device. :class:`VirtualEngine` is its copy engine: every
copy it makes is accounted on the device.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import VirtualDeviceOutOfMemory
from ..io.locations import TensorLocation
from ..threads import WorkerPool
from ..units import format_bytes
from .copies import CopyEngine, landing
from .handles import DEFAULT_IO_TIMEOUT_S, PrefetchHandle, wait_for
from .record import Recorder


class MemoryLedger:
    """Bytes of one device, thread-safe: ``live`` (every storage it holds, which the
    capacity bounds), ``idle`` (of those, the pooled buffers kept for reuse, which go
    before an allocation fails, as a caching allocator's cache does) and ``peak`` (the
    most bytes in use, ``live - idle``: what a plan's peak predicts)."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.live = 0
        self.idle = 0
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
            self.peak = max(self.peak, self.live - self.idle)

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.live -= nbytes

    def pool(self, nbytes: int, idle: bool) -> None:
        """``nbytes`` held go idle (into the pool) or, with ``idle`` false, back in use."""
        with self._lock:
            self.idle += nbytes if idle else -nbytes
            self.peak = max(self.peak, self.live - self.idle)

    def drop_idle(self, nbytes: int) -> None:
        """``nbytes`` of idle buffers are being freed (their ``free`` follows)."""
        with self._lock:
            self.idle -= nbytes

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.live - self.idle


class VirtualDevice:
    """A CPU-backed accelerator with its own ledger and its copy threads (host-to-device
    and device-to-host, each copying in issue order), shared by the graphs of a session."""

    def __init__(self, name: str, capacity: int, timeout_s: float = DEFAULT_IO_TIMEOUT_S) -> None:
        self.name = name
        self.ledger = MemoryLedger(name, capacity)
        self.timeout_s = timeout_s
        # storage data_ptr -> [nbytes, number of live tensors using it, what it holds]
        self._storages: dict[int, list[Any]] = {}
        self._tensors: dict[int, Any] = {}
        # nbytes -> idle flat uint8 buffers of streamed parameters, reused across calls
        self._idle: dict[int, list[torch.Tensor]] = {}
        # id -> the tensors held here between calls (``hold``): a graph's state
        self._held: dict[int, weakref.ref[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.h2d = WorkerPool(1, f"tt-{name}-h2d")
        self.d2h = WorkerPool(1, f"tt-{name}-d2h")

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
            self.trim()
            try:
                self._account(tensor, what)
            except VirtualDeviceOutOfMemory as exc:
                raise VirtualDeviceOutOfMemory(f"{exc} In use: {self.in_use()}") from None
        return tensor

    def in_use(self, largest: int = 8) -> str:
        """The ``largest`` storages this device holds, by size: what an out-of-memory error
        names, so that an estimate that was too low shows what it missed."""
        with self._lock:
            entries = sorted(self._storages.values(), key=lambda e: -e[0])
        shown = [f"{format_bytes(nbytes)} {what}" for nbytes, _, what in entries[:largest]]
        if len(entries) > largest:
            rest = sum(e[0] for e in entries[largest:])
            shown.append(f"{format_bytes(rest)} in {len(entries) - largest} more")
        return "; ".join(shown) or "nothing"

    def hold(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Account ``tensor`` (the caller's, written in place by a graph) here from now on,
        until it is freed or :meth:`release_held`."""
        self.adopt(tensor, what)
        with self._lock:
            self._held[id(tensor)] = weakref.ref(tensor)
        return tensor

    def release_held(self) -> None:
        """Stop accounting every tensor :meth:`hold` holds: at the start of a call, whose
        plan counts only the state its own graph holds."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for ref in held:
            tensor = ref()
            if tensor is not None:
                self.disown(tensor)

    def disown(self, tensor: torch.Tensor) -> None:
        """Stop accounting ``tensor`` here (a no-op when it is not): it now lives elsewhere."""
        with self._lock:
            finalizer = self._tensors.get(id(tensor))
        if finalizer is not None:
            finalizer()  # outside the lock: ``_release`` takes it

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
                self._storages[ptr] = [nbytes, 1, what]
            else:
                entry[1] += 1
            self._tensors[id(tensor)] = weakref.finalize(tensor, self._release, id(tensor), ptr)

    # The pool's buffers, and the views over them it lends, are normal tensors even when
    # the call that made them runs under ``torch.inference_mode()`` (where a view of a
    # normal tensor is an inference tensor too): the copy threads, outside inference mode,
    # and later calls under ``torch.no_grad()`` write into them in place.
    @torch.inference_mode(False)
    def take(self, like: torch.Tensor | TensorLocation, what: str) -> torch.Tensor:
        """A buffer shaped like ``like`` (a tensor or a disk location): an idle one of the
        same size from the pool when there is one, else a new one on this device."""
        dtype, shape = like.dtype, tuple(like.shape)
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            idle = self._idle.get(nbytes)
            flat = idle.pop() if idle else None
            if flat is not None:
                self._storages[flat.untyped_storage().data_ptr()][2] = what
                self.ledger.pool(nbytes, idle=False)
        if flat is None:
            flat = self.adopt(torch.empty(nbytes, dtype=torch.uint8), what)
        # every tensor object over the buffer is adopted: the ledger frees the storage
        # only when the last of them is gone
        if isinstance(like, torch.Tensor):  # the layout every copy lands in
            strides = landing(like, device="meta").stride()
            return self.adopt(flat.view(dtype).as_strided(shape, strides), what)
        return self.adopt(flat.view(dtype).view(shape), what)

    @torch.inference_mode(False)  # see ``take``
    def give(self, buffer: torch.Tensor) -> None:
        """Return a buffer from :meth:`take` to the pool, for the next call to reuse."""
        # the whole buffer as bytes, whatever layout ``take`` gave it (a transposed one
        # cannot be viewed flat)
        storage = buffer.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
        flat = self.adopt(flat, "idle buffer")
        # From now on the pool alone holds the buffer: the caller's tensor over it lets go
        # of it, so a reference to that tensor that outlives the call (in garbage a cyclic
        # collection has not reached yet) cannot keep it from being freed by ``trim``.
        self.disown(buffer)
        buffer.set_(torch.empty(0, dtype=torch.uint8).untyped_storage())
        with self._lock:
            entry = self._storages[storage.data_ptr()]
            entry[2] = f"idle buffer, last {entry[2]}"
            self._idle.setdefault(flat.numel(), []).append(flat)
            self.ledger.pool(flat.numel(), idle=True)

    def trim(self) -> int:
        """Drop every idle pooled buffer; returns how many were dropped."""
        with self._lock:
            idle, self._idle = self._idle, {}
            self.ledger.drop_idle(sum(n * len(b) for n, b in idle.items()))
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


class VirtualEngine(CopyEngine):
    """The copy engine of ``virtual``: copies are real CPU copies, made on the device's
    copy threads and accounted in its ledger; streamed parameters land in its pooled
    buffers."""

    def __init__(self, virtual: VirtualDevice, recorder: Recorder) -> None:
        super().__init__(virtual.name, recorder)
        self.virtual = virtual

    def copy_in(self, tensor: torch.Tensor, what: str, source: CopyEngine) -> torch.Tensor:
        host = tensor if tensor.device.type == "cpu" else tensor.to("cpu")
        return self.virtual.copy_in(host, what)

    def hand_to(self, tensor: torch.Tensor, device: str) -> torch.Tensor:
        # the device's tensors are CPU tensors: without ``copy``, ``to("cpu")`` would hand
        # over the device's own, still accounted here
        return tensor.to(device, copy=True)

    def prefetch(
        self,
        source: Callable[[], torch.Tensor],
        like: torch.Tensor | TensorLocation,
        what: str,
        after: Callable[[], None] | None = None,
    ) -> PrefetchHandle:
        """Copy ``source()`` (run on the device's copy thread, in issue order) into a pooled
        buffer, given back when the handle is released; ``after`` runs on the thread once
        the copy is done."""
        virtual, recorder = self.virtual, self.recorder
        buffer = virtual.take(like, what)

        def copy() -> None:
            try:
                data = source()
                start = recorder.now()
                buffer.copy_(data)
                recorder.add(f"h2d {virtual.name}", "prefetch", what, start)
            finally:
                if after is not None:
                    after()

        future = virtual.h2d.submit(copy)
        wait = f"the copy of {what} to {virtual.name}"
        return PrefetchHandle(
            finish=lambda: (wait_for(future, virtual.timeout_s, wait), buffer)[1],
            release=lambda: virtual.give(buffer),
        )

    def spill(self, tensor: torch.Tensor, what: str) -> PrefetchHandle:
        """Copy ``tensor`` to host memory on the device's device-to-host thread; by the
        time the copy is seen to have landed, the thread holds no reference to it (the
        device's memory is free once the graph lets go of it too)."""
        virtual, recorder = self.virtual, self.recorder
        held = [tensor]

        def copy() -> torch.Tensor:
            source = held.pop()
            start = recorder.now()
            host = landing(source).copy_(source)  # on the engine's thread: not accounted here
            del source
            recorder.add(f"d2h {virtual.name}", "spill", what, start)
            return host

        future = virtual.d2h.submit(copy)
        wait = f"the spill of {what} from {virtual.name}"
        return PrefetchHandle(finish=lambda: wait_for(future, virtual.timeout_s, wait), once=True)

    def reload(self, spilled: PrefetchHandle, what: str) -> PrefetchHandle:
        """Copy the spilled host copy into a new buffer of the device on its copy thread, in
        issue order (not pooled)."""
        virtual, recorder = self.virtual, self.recorder
        source = spilled.result

        def copy() -> torch.Tensor:
            data = source()
            start = recorder.now()
            buffer = virtual.copy_in(data, what)
            recorder.add(f"h2d {virtual.name}", "reload", what, start)
            return buffer

        future = virtual.h2d.submit(copy)
        wait = f"the reload of {what} to {virtual.name}"
        return PrefetchHandle(finish=lambda: wait_for(future, virtual.timeout_s, wait), once=True)
