"""What a session keeps for its graphs: the parameters whose home is disk and the reader
that fetches them (:class:`DiskTier`), and the copies of parameters kept on a device for
the whole run (:class:`ResidentCopies`)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..io.locations import FileGuard, TensorLocation
from ..io.pool import HostBufferPool
from ..io.reader import DiskReader, ReadResult
from ..weights.released import HeldBytes
from .handles import DEFAULT_IO_TIMEOUT_S, wait_for


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
        """Know where ``locations`` are too (where a parameter was stored anew, its new
        place only: the file of its old one may be gone)."""
        self.locations.update(locations)
        self.guards = []
        for location in self.locations.values():
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
        return wait_for(read, self.timeout_s, f"reading {key!r} from {location.path}")

    def read_now(self, key: str) -> torch.Tensor:
        """The parameter ``key`` read into a host tensor of its own, of its exact size (the
        pooled read buffer, aligned and padded for ``O_DIRECT``, goes back to the pool)."""
        read = self.landed(key, self.read(key))
        tensor = read.tensor.clone()
        self.pool.give(read.buffer)
        return tensor


@dataclasses.dataclass(frozen=True, eq=False)
class _Copy:
    """A parameter's copy on a device, and what the parameter held when it was made."""

    fqn: str
    copy: torch.Tensor
    held: HeldBytes


class ResidentCopies:
    """The copies of parameters kept on a device for the whole run, by parameter and device.

    A copy is valid while its parameter is unchanged: neither written in place (its
    ``_version``), nor given other bytes (``.data = ...``, ``module.to(dtype)``, an adapter
    merged with ``safe_merge``), nor written through ``.data`` (``p.data += delta``, an
    adapter merged in place: no version counter moves, and the parameter's bytes are
    sampled for it, see :class:`~..weights.released.HeldBytes`); it is dropped when its
    parameter is. A write through ``.data`` to a few elements away from the sampled bytes
    goes unseen.
    """

    def __init__(self) -> None:
        # parameter -> device -> its copy there
        self._copies: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def _of(self, param: torch.Tensor) -> dict[str, _Copy]:
        by_device: dict[str, _Copy] = self._copies.setdefault(param, {})  # type: ignore[no-untyped-call]
        return by_device

    def get(self, param: torch.Tensor, device: str) -> torch.Tensor | None:
        """The copy of ``param`` on ``device``; ``None`` when there is none, or when the one
        there is of what the parameter was before it changed (then dropped, so that its
        memory is free before a new copy is made)."""
        by_device = self._of(param)
        entry = by_device.get(device)
        if entry is None:
            return None
        if not entry.held.unchanged(param):
            del by_device[device]
            return None
        return entry.copy

    def put(self, fqn: str, param: torch.Tensor, device: str, copy: torch.Tensor) -> None:
        self._of(param)[device] = _Copy(fqn, copy, HeldBytes.of(param, sampled=True))

    def _entries(self) -> list[tuple[dict[str, _Copy], str]]:
        values = self._copies.values()  # type: ignore[no-untyped-call]
        return [(by_device, d) for by_device in values for d in list(by_device)]

    def copies(self) -> list[tuple[str, torch.Tensor]]:
        """(fqn, copy) of every copy (their parameters are alive)."""
        return [(by_device[d].fqn, by_device[d].copy) for by_device, d in self._entries()]

    def evict(self, keep: Callable[[str, str], bool]) -> list[str]:
        """Drop the copies for which ``keep(fqn, device)`` is false (their memory is freed
        once nothing else uses them); returns their fqns."""
        dropped = []
        for by_device, device in self._entries():
            if not keep(by_device[device].fqn, device):
                dropped.append(by_device.pop(device).fqn)
        return dropped
