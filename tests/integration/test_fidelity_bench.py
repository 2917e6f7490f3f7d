"""``bench.fidelity`` runs on its quick cases and writes valid JSON (no figure is asserted:
benchmarks are not tests)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import fidelity


@pytest.mark.slow
def test_fidelity_bench_compares_every_case(tmp_path: Path) -> None:
    quick = ["--quick", "--repeats", "1", "--rounds", "2", "--profile", "start", "--no-drop"]
    fidelity.main([*quick, "--results", str(tmp_path)])
    data = json.loads((tmp_path / "fidelity.json").read_text())
    cases = data["cases"]
    assert {
        "host/mlp_512x8",
        "disk/ram_offload_quick",
        "disk/ram_offload_quick_b256",
        "virtual/llama",
    } <= set(cases)
    for name, case in cases.items():
        assert "error" not in case, f"{name}: {case.get('error')}"
        assert len(case["rounds"]) == 2, name
        figures = case["figures"]
        assert "time" in figures, name
        for what, figure in figures.items():
            assert len(figure["predicted"]) == len(figure["measured"]) == 2, (name, what)
            assert min(figure["predicted"]) >= 0 and min(figure["measured"]) >= 0, (name, what)
            assert figure["error"] is None or math.isfinite(figure["error"]), (name, what)
    assert "busy disk->cpu" in cases["disk/ram_offload_quick"]["figures"]
    assert "peak virtual:0" in cases["virtual/llama"]["figures"]
    summary = data["summary"]
    assert summary["host_and_disk"]["time"]["count"] == 4
    assert set(summary["virtual"]) == {"peak"}
