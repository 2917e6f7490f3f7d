"""The demo's job, at its real size: parameters larger than the budget, result equal to eager."""

from __future__ import annotations

from tensortorrent_dynamo.demo import run_demo, run_disk_demo


def test_demo_streams_a_model_larger_than_its_budget() -> None:
    result = run_demo()
    assert result.param_bytes > result.budget_bytes
    assert 0 < result.measured_peak_bytes <= result.budget_bytes
    assert result.max_abs_diff <= result.tolerance
    assert "streamed parameters (" in result.explain
    assert result.ok


def test_demo_runs_the_model_from_disk_under_a_ram_budget() -> None:
    result = run_disk_demo()
    assert result.disk_bytes_read > 0
    assert result.predicted_host_peak_bytes <= result.budget_bytes
    assert "disk tier:" in result.explain
    assert result.ok
