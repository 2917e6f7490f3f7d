"""How close a graph's plan came to its last call: the time of the call, each resource's
busy time, and each virtual device's peak memory, predicted against measured.

The simulator's timeline names a resource as the planner does (``cpu``, ``virtual:0``,
``cpu->virtual:0``, ``virtual:0->cpu``, ``disk->cpu``); the runtime's spans name the same
resources as they are measured (``compute cpu``, ``h2d virtual:0``, ``copy cpu->virtual:0``,
...): :func:`resource_of` maps the second onto the first. A resource's busy time is the
union of its spans (reads overlap one another). A virtual device's measured peak is its
ledger's, since compiling; the host's is not compared (the process's RSS holds far more
than the plan: Python, torch, the graphs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..session import CompiledGraph

__all__ = ["Comparison", "compare", "resource_of", "union_s"]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One predicted figure of a plan and what its call measured."""

    what: str  # "time", "busy <resource>" or "peak <device>"
    predicted: float
    measured: float
    unit: str  # "s" or "B"

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: negative when the plan was optimistic."""
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else float("inf")
        return (self.predicted - self.measured) / self.measured


def resource_of(measured: str) -> str:
    """The simulator's name of the resource a measured span ran on."""
    kind, _, rest = measured.partition(" ")
    if kind == "compute":
        return rest
    if kind == "h2d":
        return f"cpu->{rest}"
    if kind == "d2h":
        return f"{rest}->cpu"
    if kind == "copy":
        return rest
    return measured


def union_s(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one of ``spans``."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _busy(spans: Iterable[tuple[str, float, float]]) -> dict[str, float]:
    by_resource: dict[str, list[tuple[float, float]]] = {}
    for resource, start, stop in spans:
        by_resource.setdefault(resource, []).append((start, stop))
    return {resource: union_s(s) for resource, s in by_resource.items()}


def compare(graph: CompiledGraph) -> list[Comparison]:
    """The plan of ``graph`` against its last call: the call's time, each resource busy in
    either (compute of segments, copies, disk reads), and each virtual device's peak.
    Empty before the first call."""
    if not graph.calls or graph.last_call_s is None:
        return []
    native = graph.plan.native
    predicted = _busy((r, start, stop) for r, _, _, start, stop in native.timeline)
    measured = _busy(
        (resource_of(e.resource), e.start_s, e.end_s) for e in graph.runtime.recorder.events
    )
    out = [Comparison("time", graph.plan.predicted_time_s, graph.last_call_s, "s")]
    for resource in sorted(predicted.keys() | measured.keys()):
        out.append(
            Comparison(
                f"busy {resource}",
                predicted.get(resource, 0.0),
                measured.get(resource, 0.0),
                "s",
            )
        )
    for name, device in sorted(graph.runtime.virtual.items()):
        out.append(
            Comparison(f"peak {name}", graph.plan.predicted_peak(name), device.ledger.peak, "B")
        )
    return out


def summary(errors: Sequence[float]) -> dict[str, float | int]:
    """Mean and worst absolute relative error of ``errors`` (and how many)."""
    magnitudes = [abs(e) for e in errors]
    if not magnitudes:
        return {"count": 0}
    return {
        "count": len(magnitudes),
        "mean_abs_error": sum(magnitudes) / len(magnitudes),
        "worst_abs_error": max(magnitudes),
    }
