"""Chrome traces of a plan: the simulated timeline's tracks and spans, the measured spans
of the latest call, and the file written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.pipeline import plan_and_compile
from tensortorrent_dynamo.report.trace import (
    MEASURED_PID,
    SIMULATED_PID,
    chrome_trace,
    write_trace,
)
from tensortorrent_dynamo.session import Session
from tensortorrent_dynamo.settings import parse_options
from tests.models import TwoBreaks, mlp

OPTIONS: dict[str, Any] = {
    "budgets": {"virtual:0": "10KiB", "cpu": "1GiB"},
    "virtual_devices": {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}},
    "compiler": "eager",
}


def _compiled(model: torch.nn.Module | None = None) -> tt.CompiledModule:
    x = torch.randn(4, 32)
    return tt.compile(model or mlp(32, 3), example_inputs=(x,), **OPTIONS)


def _shape_checked(trace: dict[str, Any]) -> list[dict[str, Any]]:
    assert isinstance(trace["traceEvents"], list)
    events: list[dict[str, Any]] = trace["traceEvents"]
    for event in events:
        assert event["ph"] in ("X", "M")
        assert isinstance(event["pid"], int) and isinstance(event["name"], str)
        if event["ph"] == "X":
            assert isinstance(event["tid"], int) and event["name"]
            assert event["ts"] >= 0 and event["dur"] >= 0
    return events


def _threads(events: list[dict[str, Any]], pid: int) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }


def _spans(events: list[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and e["pid"] == pid]


def test_one_simulated_track_per_resource_of_the_timeline() -> None:
    (graph,) = _compiled().graphs
    timeline = graph.plan.native.timeline
    events = _shape_checked(chrome_trace([graph]))
    threads = _threads(events, SIMULATED_PID)
    assert sorted(threads.values()) == sorted({resource for resource, *_ in timeline})
    assert {"cpu", "virtual:0", "cpu->virtual:0"} <= set(threads.values())
    spans = _spans(events, SIMULATED_PID)
    assert len(spans) == len(timeline)
    # span by span: on its resource's track, at its times
    for span, (resource, kind, _index, start, end) in zip(spans, timeline, strict=True):
        assert threads[span["tid"]] == resource
        assert span["cat"] == kind
        assert span["ts"] == pytest.approx(start * 1e6)
        assert span["dur"] == pytest.approx((end - start) * 1e6)
    params = {p.fqn for p in graph.plan.cost.params}
    assert {s["name"] for s in spans if s["cat"] == "param"} <= params
    # every track id is unique across the two processes
    measured = _threads(events, MEASURED_PID)
    assert not set(threads) & set(measured)


def test_measured_spans_come_from_a_call() -> None:
    settings = parse_options(**OPTIONS)
    model, x = mlp(32, 3), torch.randn(4, 32)
    ((gm, inputs),) = capture(model, x)
    graph = plan_and_compile(Session.of(settings), gm, inputs, None)
    assert graph.calls == 0

    before = _spans(_shape_checked(chrome_trace([graph])), MEASURED_PID)
    assert before == []  # nothing measured before a call

    graph(*inputs.values)
    events = _shape_checked(chrome_trace([graph]))
    measured = _spans(events, MEASURED_PID)
    threads = _threads(events, MEASURED_PID)
    segments = [s for s in measured if s["cat"] == "segment"]
    assert sorted(s["name"] for s in segments) == sorted(graph.compilers)
    assert {threads[s["tid"]] for s in segments} == {
        f"compute {device}" for _, device in graph.compilers_by_device()
    }
    assert {threads[s["tid"]] for s in measured} == {
        e.resource for e in graph.runtime.recorder.events
    }
    # only the latest call's: a second call replaces the first one's spans
    graph(*inputs.values)
    again = _spans(chrome_trace([graph])["traceEvents"], MEASURED_PID)
    assert len([s for s in again if s["cat"] == "segment"]) == len(segments)


def test_graphs_are_laid_one_after_another() -> None:
    compiled = tt.compile(TwoBreaks(32, depth=2), example_inputs=(torch.randn(4, 32),), **OPTIONS)
    graphs = compiled.graphs
    assert len(graphs) == 3
    spans = _spans(chrome_trace(graphs)["traceEvents"], SIMULATED_PID)
    offset = 0.0
    for graph in graphs:
        mine = [s for s in spans if s["args"]["graph"] == graph.plan.graph_index]
        assert len(mine) == len(graph.plan.native.timeline)
        assert min(s["ts"] for s in mine) >= offset * 1e6 - 1e-6
        offset += graph.plan.predicted_time_s
        assert max(s["ts"] + s["dur"] for s in mine) <= offset * 1e6 + 1e-6


def test_no_graphs_is_a_trace_of_the_two_processes_only() -> None:
    events = chrome_trace([])["traceEvents"]
    assert [(e["ph"], e["name"], e["pid"]) for e in events] == [
        ("M", "process_name", SIMULATED_PID),
        ("M", "process_name", MEASURED_PID),
    ]


def test_write_trace_writes_the_trace_as_json(tmp_path: Path) -> None:
    graphs = _compiled().graphs
    path = tmp_path / "trace.json"
    path.write_text("not a trace")
    write_trace(path, graphs)
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(chrome_trace(graphs)))
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # nothing left beside it


def test_write_trace_replaces_the_file_atomically(tmp_path: Path) -> None:
    graphs = _compiled().graphs
    path = tmp_path / "trace.json"
    path.write_text('{"old": true}')
    with open(path) as reader:  # a viewer that opened the previous trace
        write_trace(path, graphs)
        # replaced by a rename, the file it opened is the old one, whole
        assert json.loads(reader.read()) == {"old": True}
    assert "traceEvents" in json.loads(path.read_text())
