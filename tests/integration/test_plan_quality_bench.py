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
    out = tmp_path / "trial.json"
    plan_quality.main(
        ["--candidates", "3", "--repeats", "1", "--rounds", "2", "--trial-json", str(out)]
    )
    case = json.loads(out.read_text())["tiny"]
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
    # each timed call is cold: the directory of the case's checkpoint evicted before it
    assert len(evicted) == 3 * 2
    assert all("tiny.safetensors" in names for names in evicted), evicted


def _trial(chosen_over_fastest: float, fastest: str, p: float | None) -> dict[str, object]:
    return {
        "chosen": "a",
        "chosen_over_fastest": chosen_over_fastest,
        "fastest_measured": fastest,
        "chosen_slower_p_value": p,
    }


def test_a_case_over_trials_is_the_median_and_says_whether_the_trials_agreed() -> None:
    agreed = plan_quality.combine(
        [
            {"x": _trial(1.2, "b", 0.001)},
            {"x": _trial(1.1, "b", 0.01)},
            {"x": _trial(1.0, "a", None)},
        ]
    )["x"]
    assert agreed["chosen_over_fastest"] == 1.1 and not agreed["chosen_within_5_percent"]
    assert agreed["fastest_by_trial"] == ["b", "b", "a"]
    assert not agreed["same_fastest_every_trial"]
    # slower beyond the noise in two trials, the fastest in the third: not in every trial
    assert not agreed["chosen_slower_beyond_noise_every_trial"]
    both = plan_quality.combine([{"x": _trial(1.2, "b", 0.001)}, {"x": _trial(1.3, "b", 0.02)}])
    assert both["x"]["same_fastest_every_trial"]
    assert both["x"]["chosen_slower_beyond_noise_every_trial"]
    assert len(both["x"]["trials"]) == 2
    failed = plan_quality.combine([{"x": {"error": "boom"}}, {"x": {"error": "boom"}}])
    assert failed["x"]["error"] == "boom"


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
