"""The planner bench runs on a tiny size and writes valid JSON (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import common
from bench import planner as bench


def test_planner_bench_writes_its_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    bench.main(["--sizes", "101", "301", "--repeats", "1", "--cases", "4", "--max-nodes", "6"])
    data = json.loads((tmp_path / "planner.json").read_text())
    assert data["bench"] == "planner"
    assert {"torch_version", "fingerprint"} <= set(data["machine"])
    sizes = data["timing"]["sizes"]
    assert [row["nodes"] for row in sizes] == [101, 301]
    for row in sizes:
        for label in ("default", "constructive"):
            assert row[label]["median_ms"] > 0
            assert row[label]["lower_bound_ratio"] >= 1.0
    assert set(data["timing"]["growth_exponent"]) == {"default", "constructive"}
    quality = data["quality"]
    assert quality["cases"] == 4 and quality["feasibility_disagreements"] == []
    assert quality["worst_ratio"] >= 1.0 - 1e-9


def test_synthetic_graphs_have_the_asked_size() -> None:
    graph, weights = bench.synthetic_graph(1001)
    assert graph.num_nodes == 1001 and graph.num_params == 400
    assert weights == 100 * 12 * bench.WIDTH * bench.WIDTH * 4
    assert bench.growth_exponent([10, 100], [1.0, 10.0]) == pytest.approx(1.0)
