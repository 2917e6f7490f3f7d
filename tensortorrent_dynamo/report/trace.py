"""Chrome / Perfetto trace of a plan: the simulated timeline next to the measured one.

Open the file in https://ui.perfetto.dev or chrome://tracing: one process holds the
simulated timeline (compute per device, copies per link, disk reads), another the
spans measured during the latest call, one track per resource, so overlap of
copies and compute is visible at a glance.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..io.files import write_text

if TYPE_CHECKING:
    from ..session import CompiledGraph

SIMULATED_PID = 1
MEASURED_PID = 2


def _label(graph: CompiledGraph, kind: str, index: int) -> str:
    cost = graph.plan.cost
    if kind == "param" and 0 <= index < len(cost.params):
        return cost.params[index].fqn
    if 0 <= index < len(cost.nodes):
        return cost.nodes[index].name
    return f"{kind} {index}"


class _Tracks:
    """Chrome trace events with one thread id per (process, resource)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._tids: dict[tuple[int, str], int] = {}

    def tid(self, pid: int, resource: str) -> int:
        key = (pid, resource)
        if key not in self._tids:
            self._tids[key] = len(self._tids) + 1
            self.events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": self._tids[key],
                    "args": {"name": resource},
                }
            )
        return self._tids[key]

    def span(
        self,
        pid: int,
        resource: str,
        name: str,
        cat: str,
        start_s: float,
        end_s: float,
        args: dict[str, Any],
    ) -> None:
        self.events.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": self.tid(pid, resource),
                "name": name,
                "cat": cat,
                "ts": start_s * 1e6,
                "dur": max(end_s - start_s, 0.0) * 1e6,
                "args": args,
            }
        )


def chrome_trace(graphs: Sequence[CompiledGraph]) -> dict[str, Any]:
    """The trace of every graph, graphs laid one after another as in a forward pass."""
    tracks = _Tracks()
    for pid, name in ((SIMULATED_PID, "simulated"), (MEASURED_PID, "measured (latest call)")):
        tracks.events.append(
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}
        )
    simulated_at = measured_at = 0.0
    for graph in graphs:
        gi = graph.plan.graph_index
        for resource, kind, index, start, end in graph.plan.native.timeline:
            tracks.span(
                SIMULATED_PID,
                resource,
                _label(graph, kind, index),
                kind,
                simulated_at + start,
                simulated_at + end,
                {"graph": gi},
            )
        simulated_at += graph.plan.predicted_time_s
        # what was recorded while compiling (the resident copies made then) is no call's
        events = graph.runtime.recorder.events if graph.calls else []
        for event in events:
            tracks.span(
                MEASURED_PID,
                event.resource,
                event.label,
                event.kind,
                measured_at + event.start_s,
                measured_at + event.end_s,
                {"graph": gi},
            )
        measured_at += graph.last_call_s or max((e.end_s for e in events), default=0.0)
    return {"traceEvents": tracks.events, "displayTimeUnit": "ms"}


def write_trace(path: str | os.PathLike[str], graphs: Sequence[CompiledGraph]) -> None:
    write_text(path, json.dumps(chrome_trace(graphs)))
