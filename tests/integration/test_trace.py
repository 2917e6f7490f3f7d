"""compiled.trace(path) writes valid Chrome trace JSON with simulated and measured events."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import tensortorrent as tt
from tests.models import TwoBreaks

OPTIONS = {
    "budgets": {"virtual:0": "48KiB", "cpu": "1GiB"},
    "virtual_devices": {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}},
    "compiler": "eager",
}


def _check_chrome_trace(data: dict[str, object]) -> list[dict[str, object]]:
    """The parts of the Chrome trace event format a viewer needs (complete and metadata)."""
    assert set(data) >= {"traceEvents"}
    events = data["traceEvents"]
    assert isinstance(events, list) and events
    for event in events:
        assert event["ph"] in {"X", "M"}
        assert isinstance(event["pid"], int)
        if event["ph"] == "X":
            assert isinstance(event["name"], str) and event["name"]
            assert isinstance(event["tid"], int)
            assert isinstance(event["ts"], float | int) and event["ts"] >= 0
            assert isinstance(event["dur"], float | int) and event["dur"] >= 0
        else:
            assert event["name"] in {"process_name", "thread_name"}
            assert isinstance(event["args"]["name"], str)
    return events


def test_trace_holds_simulated_and_measured_events(tmp_path: Path) -> None:
    model, x = TwoBreaks(64, depth=4), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **OPTIONS)
    with torch.no_grad():
        compiled(x)
    path = tmp_path / "trace.json"
    compiled.trace(path)
    events = _check_chrome_trace(json.loads(path.read_text()))
    spans = [e for e in events if e["ph"] == "X"]
    simulated = [e for e in spans if e["pid"] == 1]
    measured = [e for e in spans if e["pid"] == 2]
    assert simulated and measured
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert "virtual:0" in threads  # simulated compute queue
    assert "compute virtual:0" in threads  # measured segments
    assert any(t.startswith("h2d virtual:0") for t in threads)  # measured prefetch copies
    assert {e["args"]["graph"] for e in spans} == {0, 1, 2}
