"""The one error hierarchy of TensorTorrent.

Every error the project raises on purpose is a :class:`TensorTorrentError`; the
native planner maps each of its error variants onto one class here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any


class TensorTorrentError(Exception):
    """Base class of every error TensorTorrent raises on purpose."""


class OptionsError(TensorTorrentError, ValueError):
    """An option passed to the backend is unknown or has a bad value."""


class BudgetParseError(OptionsError):
    """A memory budget or bandwidth could not be parsed."""


@dataclasses.dataclass(frozen=True)
class PeakUse:
    """What a device holds at its peak in a plan (``GraphPlan.peaks``; for a refusal, the
    plan closest to fitting): ``bytes`` in all, of which the weights it holds for the whole run
    (``resident``: kept on an accelerator, or in host memory), the buffers of streamed
    weights (``streamed``), host buffers that weights read from disk land in before they
    are copied on (``reading``), and activations (``activations``: each named by its node
    and the module that made it), each ``(name, bytes)``, largest first.
    ``reached_by`` names what was allocated when it reached its peak."""

    device: str
    bytes: int
    resident: tuple[tuple[str, int], ...] = ()
    streamed: tuple[tuple[str, int], ...] = ()
    reading: tuple[tuple[str, int], ...] = ()
    activations: tuple[tuple[str, int], ...] = ()
    reached_by: str | None = None


class PlanInfeasible(TensorTorrentError):
    """No placement fits the budgets.

    ``min_budgets`` maps each device whose budget is too small to the smallest
    budget in bytes with which a plan would exist; ``peaks`` says what each of those
    devices holds at its peak (:class:`PeakUse`). ``native_peaks`` is the planner's own
    form of the peaks, by index (``plan.peaks`` names them).
    """

    def __init__(
        self,
        message: str,
        min_budgets: Mapping[str, int] | None = None,
        peaks: Iterable[PeakUse] = (),
        native_peaks: Any = None,
    ) -> None:
        super().__init__(message)
        self.min_budgets: dict[str, int] = dict(min_budgets or {})
        self.peaks: tuple[PeakUse, ...] = tuple(peaks)
        self.native_peaks = native_peaks


class KvCacheTooLarge(PlanInfeasible):
    """A static KV cache the budgets cannot hold beside the model: ``cache_bytes`` for
    ``length`` positions; ``largest_length`` is the longest cache with which a plan exists
    (0: none does). It is found when first asked for (the message asks for it), by
    planning again: a caller that catches the error and plans otherwise pays nothing."""

    def __init__(
        self,
        error: PlanInfeasible,
        cache_bytes: int,
        length: int,
        largest: Callable[[], int],
        describe: Callable[[int], str],
    ) -> None:
        super().__init__(str(error), error.min_budgets, error.peaks)
        self.cache_bytes = cache_bytes
        self.length = length
        self._largest: Callable[[], int] | None = largest
        self._describe = describe
        self._found: int | None = None

    @property
    def largest_length(self) -> int:
        if self._found is None:
            assert self._largest is not None
            self._found, self._largest = self._largest(), None  # the planner is not kept
        return self._found

    def __str__(self) -> str:
        return self._describe(self.largest_length)


class InvalidCostGraph(TensorTorrentError):
    """The cost graph handed to the planner is malformed (a bug in TensorTorrent)."""


class CostGraphFormatError(TensorTorrentError):
    """A saved cost graph is not in a format this version reads."""


class PlanFormatError(TensorTorrentError):
    """A plan file cannot be read: another format, an unknown version, or damaged."""


class StalePlanError(TensorTorrentError):
    """A saved plan no longer applies (the graph, the hardware or the profile changed), or
    a graph's plan was made stale by another's and cannot be made again."""


class UnsavedGraphError(StalePlanError):
    """A saved plan has no plan for a graph of the model it was saved for: the session that
    saved it did not trace that graph (Dynamo traces one for each new set of shapes, and one
    for any shapes once a model was called with two). ``replan="new"`` (the default) plans
    it when it is traced."""


class InvalidPlacement(TensorTorrentError, ValueError):
    """A placement given to the simulator does not fit the graph or the devices."""


class InvalidDevices(TensorTorrentError):
    """The device list handed to the planner is malformed."""


class InvalidObjective(OptionsError):
    """The planning objective is not one the planner knows."""


class UnsupportedNodeError(TensorTorrentError):
    """A node could not be costed or placed and ``strict=True`` forbids the CPU fallback."""


class NativePlannerUnavailable(TensorTorrentError):
    """The compiled planner extension could not be imported."""


class VirtualDeviceOutOfMemory(TensorTorrentError, MemoryError):
    """A virtual accelerator was asked to hold more bytes than its capacity."""


class OffloadError(TensorTorrentError):
    """Weights cannot be written to, or read from, the disk tier."""


class ReplacedWeightError(OffloadError):
    """A weight a plan reads from disk holds other bytes than those stored there: it was
    given them since (``.data = ...``, ``module.to(dtype)``). A graph that can be planned
    again is, at once; a saved plan's graph raises this."""


class OffloadCorruptError(OffloadError):
    """Offloaded weights fail their checksum, or their shard is missing or truncated.

    ``keys`` names the damaged tensors; ``repair`` can rewrite those whose source is at hand.
    """

    def __init__(self, message: str, keys: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.keys: list[str] = list(keys)


class CopyTimeout(TensorTorrentError, TimeoutError):
    """A read from disk or a copy between devices did not finish within ``io_timeout_s``."""


class VerifyMismatch(TensorTorrentError, AssertionError):
    """``verify=True``: a segment's outputs differ from eager's; ``segment`` and ``node``
    name the first segment that differs and its first differing output."""

    def __init__(self, message: str, segment: str, node: str) -> None:
        super().__init__(message)
        self.segment = segment
        self.node = node


class CheckpointError(TensorTorrentError):
    """A checkpoint file is missing, truncated or malformed, or holds a dtype we cannot read."""


class TensorTorrentWarning(UserWarning):
    """Warnings TensorTorrent emits (CPU fallbacks, inference-only execution)."""
