"""Copy engines: how tensors get onto and off one device.

:class:`CopyEngine` is what the :class:`~.runtime.Runtime` asks for every copy: one made
now (:meth:`~CopyEngine.copy_in`, an activation changing device or a resident copy), a
streamed parameter issued ahead of its use (:meth:`~CopyEngine.prefetch`), an
activation sent to host memory (:meth:`~CopyEngine.spill`) and copied back
(:meth:`~CopyEngine.reload`); the asynchronous ones return a
:class:`~.handles.PrefetchHandle` whose result waits for the copy. The host
(:class:`HostEngine`) copies nothing it need not, a CUDA device (:class:`CudaEngine`)
copies on its own streams, and a virtual device has its ledger-accounted engine
(:class:`~.virtual.VirtualEngine`).

Every copy lands in the layout of :func:`landing`.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable

import torch

from ..io.locations import TensorLocation
from ..threads import WorkerPool
from .handles import DEFAULT_IO_TIMEOUT_S, PrefetchHandle, wait_for
from .record import Recorder


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


class CopyEngine(abc.ABC):
    """The copies to and from one device, the measured spans of which go to ``recorder``."""

    def __init__(self, device: str, recorder: Recorder) -> None:
        self.device = device
        self.recorder = recorder

    def copy_in(self, tensor: torch.Tensor, what: str, source: CopyEngine) -> torch.Tensor:
        """A copy of ``tensor``, held by ``source``'s device, on this device, made now."""
        return source.hand_to(tensor, self.device)

    def hand_to(self, tensor: torch.Tensor, device: str) -> torch.Tensor:
        """``tensor``, held by this device, on the torch device ``device``: ``to``, which
        lands in the layout of :func:`landing`, as every copy here."""
        return tensor.to(device, non_blocking=device != "cpu")

    @abc.abstractmethod
    def prefetch(
        self,
        source: Callable[[], torch.Tensor],
        like: torch.Tensor | TensorLocation,
        what: str,
        after: Callable[[], None] | None = None,
    ) -> PrefetchHandle:
        """Start copying ``source()`` (a host tensor shaped like ``like``, made ready on the
        engine, in issue order) to this device; returns at once. ``after`` runs once the
        device no longer needs ``source()``'s memory (it can go back to its pool)."""

    @abc.abstractmethod
    def spill(self, tensor: torch.Tensor, what: str) -> PrefetchHandle:
        """Start copying ``tensor``, held by this device, to host memory; returns at once.
        The handle's result is the host copy."""

    @abc.abstractmethod
    def reload(self, spilled: PrefetchHandle, what: str) -> PrefetchHandle:
        """Start copying the host copy ``spilled`` will hold back to this device, once it
        landed, into a fresh buffer (whoever reads it may keep views of it); returns at
        once."""


class HostEngine(CopyEngine):
    """Host memory (and any device without an engine of its own): nothing is copied that
    is in host memory already; ``to`` moves the rest."""

    def prefetch(
        self,
        source: Callable[[], torch.Tensor],
        like: torch.Tensor | TensorLocation,
        what: str,
        after: Callable[[], None] | None = None,
    ) -> PrefetchHandle:
        """``source()`` used in place: ``after`` runs when the handle is released."""
        return PrefetchHandle(finish=source, release=after)

    def spill(self, tensor: torch.Tensor, what: str) -> PrefetchHandle:
        return PrefetchHandle.at_hand(tensor)  # already in host memory

    def reload(self, spilled: PrefetchHandle, what: str) -> PrefetchHandle:
        return spilled


class CudaEngine(CopyEngine):
    """A CUDA device: host-to-device copies are issued by a copy engine thread on a copy
    stream, device-to-host copies on a stream of their own into pinned host memory; each
    records an event that compute (or the host, for a spill) waits on. Streams and the
    thread are made on first use."""

    def __init__(
        self, device: str, recorder: Recorder, timeout_s: float = DEFAULT_IO_TIMEOUT_S
    ) -> None:
        super().__init__(device, recorder)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._h2d: tuple[torch.cuda.Stream, WorkerPool] | None = None
        self._d2h: torch.cuda.Stream | None = None

    def _h2d_engine(self) -> tuple[torch.cuda.Stream, WorkerPool]:
        with self._lock:
            if self._h2d is None:
                self._h2d = (
                    torch.cuda.Stream(self.device),  # type: ignore[no-untyped-call]
                    WorkerPool(1, f"tt-{self.device}-h2d"),
                )
            return self._h2d

    def _d2h_stream(self) -> torch.cuda.Stream:
        with self._lock:
            if self._d2h is None:
                self._d2h = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            return self._d2h

    def prefetch(
        self,
        source: Callable[[], torch.Tensor],
        like: torch.Tensor | TensorLocation,
        what: str,
        after: Callable[[], None] | None = None,
    ) -> PrefetchHandle:
        return self._copy_in_async(source, what, after)

    def reload(self, spilled: PrefetchHandle, what: str) -> PrefetchHandle:
        return self._copy_in_async(spilled.result, what, once=True)

    def _copy_in_async(
        self,
        source: Callable[[], torch.Tensor],
        what: str,
        after: Callable[[], None] | None = None,
        once: bool = False,
    ) -> PrefetchHandle:
        """A non-blocking copy on the copy stream, issued by the copy engine thread once
        ``source()`` is ready; compute waits on the copy's event, not on the host. With
        ``once``, the handle's result is read once (see :class:`PrefetchHandle`)."""
        device, recorder = self.device, self.recorder
        stream, engine = self._h2d_engine()

        def copy() -> tuple[torch.Tensor, torch.cuda.Event]:
            try:
                data = source()
                start = recorder.now()
                with torch.cuda.stream(stream):
                    buffer = data.to(device, non_blocking=True)
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(stream)
                if after is not None:
                    event.synchronize()  # the host buffer goes back to its pool: copy first
                    recorder.add(f"h2d {device}", "prefetch", what, start)
            finally:
                if after is not None:
                    after()
            return buffer, event

        future = engine.submit(copy)

        def finish() -> torch.Tensor:
            buffer, event = wait_for(future, self.timeout_s, f"the copy of {what} to {device}")
            current = torch.cuda.current_stream(device)
            current.wait_event(event)
            buffer.record_stream(current)
            return buffer

        return PrefetchHandle(finish=finish, once=once)

    def spill(self, tensor: torch.Tensor, what: str) -> PrefetchHandle:
        """A non-blocking copy into pinned host memory on the device-to-host stream, after
        the work that made ``tensor``."""
        device, recorder = self.device, self.recorder
        stream = self._d2h_stream()
        start = recorder.now()
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            host = landing(tensor, pin=True)
            host.copy_(tensor, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        # the caching allocator may reuse the memory only once the copy has read it
        tensor.record_stream(stream)

        def finish() -> torch.Tensor:
            event.synchronize()
            recorder.add(f"d2h {device}", "spill", what, start)
            return host

        return PrefetchHandle(finish=finish, once=True)
