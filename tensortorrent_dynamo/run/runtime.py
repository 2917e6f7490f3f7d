"""The :class:`Runtime` one rewritten graph runs with: its devices, the session's resident
copies and disk tier, a copy engine per device, and the spans its calls measure.

Every copy goes through the copy engine of the device it lands on (or leaves, for a
spill), picked once per device (:mod:`.copies`, :mod:`.virtual`). Streamed parameters
land in pooled buffers, handed back by ``evict`` and reused by the next call; those whose
home is disk are read by the session's :class:`~.residents.DiskTier` first (reader
threads, page cache bypassed) and then copied on by the device's copy engine, or used in
place by host segments. A spilled activation is copied to host memory by the device's
device-to-host engine as soon as it is made (the device's copy is freed once nothing else
holds it) and copied back by the host-to-device engine when the plan says, into a fresh
buffer (a later segment may keep a view of it).
"""

from __future__ import annotations

import threading

import torch

from ..errors import CopyTimeout
from ..io.locations import TensorLocation
from ..weights.released import check_released, released_location
from .copies import CopyEngine, CudaEngine, HostEngine
from .handles import DEFAULT_IO_TIMEOUT_S, PrefetchHandle
from .record import Recorder
from .residents import DiskTier, ResidentCopies
from .virtual import VirtualDevice, VirtualEngine


def torch_device(device: str) -> torch.device:
    """The torch device the tensors of a planned device (``cpu``, ``cuda:N``,
    ``virtual:N``) are on: a virtual accelerator's are host tensors."""
    return torch.device("cpu" if device.startswith("virtual:") else device)


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
        self.recorder = Recorder()
        # device -> its copy engine, made on the device's first copy
        self._engines: dict[str, CopyEngine] = {}
        self._engines_lock = threading.Lock()

    def engine(self, device: str) -> CopyEngine:
        """The copy engine of ``device``: that of a virtual device, a CUDA device's own
        streams, else the host's."""
        engine = self._engines.get(device)
        if engine is not None:
            return engine
        with self._engines_lock:
            engine = self._engines.get(device)
            if engine is None:
                engine = self._engines[device] = self._make_engine(device)
            return engine

    def _make_engine(self, device: str) -> CopyEngine:
        if device in self.virtual:
            return VirtualEngine(self.virtual[device], self.recorder)
        if device.partition(":")[0] == "cuda":
            return CudaEngine(device, self.recorder, self.timeout_s)
        return HostEngine(device, self.recorder)

    def begin_call(self) -> None:
        """Start a call: check that the files weights are read from are as planned, and
        restart the measured spans."""
        if self.disk is not None:
            self.disk.check_unchanged()
        for virtual in self.virtual.values():  # this call's graph holds its own state
            virtual.release_held()
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
        """A copy of ``tensor`` on ``device``, made now by ``device``'s engine."""
        start = self.recorder.now()
        source = self.owner(tensor)
        moved = self.engine(device).copy_in(tensor, what, self.engine(source))
        self.recorder.add(f"copy {source}->{device}", "transfer", what, start)
        return moved

    def _disk_location(self, key: str) -> TensorLocation | None:
        return self.disk.locations.get(key) if self.disk is not None else None

    def make_resident(self, key: str, param: torch.Tensor, device: str) -> torch.Tensor:
        """The copy of ``param`` kept on ``device``; a parameter whose weights were released
        to disk is read from there first. On the host, a live parameter is itself."""
        source = param.detach()
        location = self._disk_location(key)
        if location is not None and released_location(param) is not None:
            assert self.disk is not None
            check_released(param, location)
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

    def hold_state(self, tensor: torch.Tensor, name: str, device: str) -> torch.Tensor:
        """Keep ``tensor``, an input the graph writes in place, on ``device`` (between calls
        too). A virtual device accounts the tensor itself until it is freed or the next call
        starts (whose graph holds its own state), so it is not copied per call; in host
        memory it is itself. The plan keeps state on virtual devices and the host only
        (``plan.planner.state_movable``)."""
        if device in self.virtual:
            return self.virtual[device].hold(tensor, f"{name} (held between calls)")
        return tensor

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
            return PrefetchHandle.at_hand(held)
        what = f"streamed {key}"
        engine = self.engine(device)
        location = self._disk_location(key)
        if location is None:
            host = param.detach()
            return engine.prefetch(lambda: host, host, what)
        assert self.disk is not None
        check_released(param, location)
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

        return engine.prefetch(landed, location, what, after=give_back)

    def spill(self, value: torch.Tensor, what: str) -> PrefetchHandle:
        """Start copying an activation to host memory; returns at once. The handle's
        result is the host copy."""
        return self._track_copy(self.engine(self.owner(value)).spill(value, what))

    def reload(self, spilled: PrefetchHandle, device: str, what: str) -> PrefetchHandle:
        """Start copying a spilled activation back to ``device`` once its spill landed;
        returns at once."""
        handle = self.engine(device).reload(spilled, what)
        return handle if handle is spilled else self._track_copy(handle)

    def _track_copy(self, handle: PrefetchHandle) -> PrefetchHandle:
        """``handle``, tracked when a copy stands behind it."""
        return self._track(handle) if handle.copies else handle
