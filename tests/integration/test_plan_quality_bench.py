"""``bench.plan_quality`` compiles each of a case's best candidates from a plan file of its
decisions, runs it and writes valid JSON (no figure is asserted: benchmarks are not tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bench import plan_quality


@pytest.mark.slow
def test_plan_quality_bench_runs_each_candidate_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_quality, "CASES", {"tiny": (256, 6, 8, 0.5)})
    evicted: list[list[str]] = []  # what the directory evicted held, at each timed call
    monkeypatch.setattr(
        plan_quality, "evict_files", lambda work: evicted.append(sorted(os.listdir(work)))
    )
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
    p = case["chosen_slower_p_value"]
    assert (p is None) == (case["chosen"] == case["fastest_measured"])
    assert p is None or 0 < p <= 1
    assert data["summary"]["cases"] == 1
    # each timed call is cold: the directory of the case's checkpoint evicted before it
    assert len(evicted) == 3 * 2
    assert all("tiny.safetensors" in names for names in evicted), evicted
    assert data["summary"]["chosen_slower_beyond_noise"] in (0, 1)


def test_the_permutation_test_tells_a_real_gap_from_noise() -> None:
    rng = np.random.default_rng(1)
    noise = list(10 + rng.normal(0, 1, 12))
    same = list(10 + rng.normal(0, 1, 12))
    slower = [x + 3 for x in same]
    assert plan_quality.slower_p_value(slower, noise) < 0.01
    # the same calls in another order: no gap, which any relabelling matches or beats
    assert plan_quality.slower_p_value(same[::-1], same) > 0.5
    # a gap of a tenth of the noise: common among relabellings of equal plans
    assert plan_quality.slower_p_value([x + 0.1 for x in same], same) > 0.05
    # the observed labelling counts: never 0
    assert plan_quality.slower_p_value([100.0] * 3, [1.0] * 3) > 0
