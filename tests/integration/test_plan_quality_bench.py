"""``bench.plan_quality`` compiles each of a case's best candidates from a plan file of its
decisions, runs it and writes valid JSON (no figure is asserted: benchmarks are not tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import plan_quality


@pytest.mark.slow
def test_plan_quality_bench_runs_each_candidate_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_quality, "CASES", {"tiny": (256, 6, 8, 0.5)})
    monkeypatch.setattr(plan_quality, "drop_page_cache", lambda: None)
    plan_quality.main(
        ["--candidates", "3", "--repeats", "1", "--rounds", "2", "--results", str(tmp_path)]
    )
    data = json.loads((tmp_path / "plan_quality.json").read_text())
    case = data["cases"]["tiny"]
    assert "error" not in case, case.get("error")
    names = [c["name"] for c in case["candidates"]]
    assert case["chosen"] in names and len(names) == 3
    assert len({c["plan_hash"] for c in case["candidates"]}) == 3, "distinct plans"
    for candidate in case["candidates"]:
        assert len(candidate["measured_calls_ms"]) == 2, "one call a round"
        assert candidate["measured_ms"] > 0 and candidate["predicted_ms"] > 0
    assert case["fastest_measured"] in names
    assert case["chosen_over_fastest"] >= 1.0
    assert data["summary"]["cases"] == 1
