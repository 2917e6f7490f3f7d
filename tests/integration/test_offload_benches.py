"""The offload benches run on a tiny size and write valid JSON with matching outputs.

No timing is asserted (benchmarks are not tests). Each competitor runs in its own fresh
process as in a real run, which is what makes these tests slow: every process imports torch
and its competitor's library (Accelerate's hooks import torch._dynamo, ~3 s on 2 cores;
transformers ~5 s more), about 20 s for ram_offload and 30 s for hf_offload here.
``tensortorrent_in_memory`` is left out for time. ``--no-drop`` keeps the machine's page
cache alone during the test suite (the JSON says so); the drop itself is checked below
without root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import hf_offload, ram_offload
from bench.offload_common import drop_page_cache, fp32_quality, logits_quality, worst_quality

TINY_RAM = ["--layers", "8", "--width", "256", "--batches", "4"]
TINY_HF = [
    *("--hidden", "64", "--layers", "2", "--intermediate", "128", "--heads", "4"),
    *("--kv-heads", "2", "--head-dim", "16", "--vocab", "256", "--seq", "8"),
]
RUN = ["--repeats", "1", "--warmup", "1", "--no-drop", "--disk-mib", "8", "--timeout", "300"]


def run(main: Any, name: str, args: list[str], tmp_path: Path) -> dict[str, Any]:
    main([*args, *RUN, "--out-dir", str(tmp_path / "work"), "--results", str(tmp_path)])
    data: dict[str, Any] = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["bench"] == name
    assert {"torch_version", "fingerprint"} <= set(data["machine"])
    assert data["page_cache"] == "page cache not dropped: --no-drop was given"
    assert data["disk"]["read_bytes_per_s"] > 0
    assert 0 < data["budget_bytes"] < data["param_bytes"]
    return data


def check_common(row: dict[str, Any]) -> None:
    assert row["ok"], row
    assert row["quality"]["ok"] and row["quality"]["calls_checked"] == 3
    assert row["median_ms_cold"] > 0 and row["median_ms_warm"] > 0
    assert row["warmup_calls"] == 1 and len(row["times_ms_cold"]) == 1
    assert row["peak_rss_bytes"] >= row["rss_baseline_bytes"] > 0
    assert row["setup_s"] >= 0 and row["compile_s"] >= 0


def check_offloaded(data: dict[str, Any], regime: str) -> None:
    rows = data["regimes"][regime]["competitors"]
    check_common(rows["eager"])
    accelerate = rows["accelerate"]
    check_common(accelerate)
    split = accelerate["device_map_split"]
    assert set(split) == {"cpu", "disk"}
    assert split["cpu"]["param_bytes"] + split["disk"]["param_bytes"] == data["param_bytes"]
    assert accelerate["streamed_bytes"] == split["disk"]["param_bytes"]
    assert data["regimes"][regime]["lower_bound"]["accelerate_ms"] > 0


def check_tensortorrent(data: dict[str, Any], regime: str) -> None:
    name = "tensortorrent"
    row = data["regimes"][regime]["competitors"][name]
    assert "error" not in row, row["error"]
    check_common(row)
    assert "Devices" in row["explain"]
    assert row["streamed_bytes"] > 0
    ratios = data["regimes"][regime]["ratios"][name]
    assert ratios["over_accelerate_cold"] > 0 and ratios["over_lower_bound_cold"] > 0


@pytest.mark.slow
def test_ram_offload_bench(tmp_path: Path) -> None:
    competitors = ["--competitors", "eager", "accelerate", "tensortorrent"]
    data = run(ram_offload.main, "ram_offload", [*TINY_RAM, *competitors], tmp_path)
    (regime,) = data["regimes"]
    assert regime == "batch4"
    check_offloaded(data, regime)
    assert data["regimes"][regime]["competitors"]["eager"]["quality"]["max_abs_diff"] == 0
    check_tensortorrent(data, regime)
    assert set(data["figure"]["batch4"]) == {
        "over_accelerate_cold",
        "over_accelerate_warm",
        "over_lower_bound_cold",
    }


@pytest.mark.slow
def test_hf_offload_bench(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    data = run(hf_offload.main, "hf_offload", TINY_HF, tmp_path)
    (regime,) = data["regimes"]
    assert regime == "batch1_seq8"
    check_offloaded(data, regime)
    quality = data["regimes"][regime]["competitors"]["accelerate"]["quality"]
    assert quality["cosine"] >= 0.99 and quality["argmax_agreement"] >= 0.9
    check_tensortorrent(data, regime)


def test_page_cache_drop_says_why_it_could_not(tmp_path: Path) -> None:
    problem = drop_page_cache(tmp_path / "missing" / "drop_caches")
    assert problem is not None and problem.startswith("page cache not dropped: cannot write")


def test_quality_checks() -> None:
    x = torch.zeros(4, 8)
    assert fp32_quality(x + 1e-6, x) == {"ok": True, "max_abs_diff": pytest.approx(1e-6)}
    off = fp32_quality(x + 1e-3, x)
    assert not off["ok"] and off["mismatch"][0] == "Tensor-likes are not close!"

    expected = torch.randn(1, 1000, 1000).bfloat16()
    same = logits_quality(expected.clone(), expected)
    assert same["ok"] and same["cosine"] == pytest.approx(1.0, abs=1e-12)
    flipped = logits_quality(-expected, expected)
    assert not flipped["ok"] and flipped["cosine"] < 0
    worst = worst_quality([logits_quality(expected, expected), flipped])
    assert not worst["ok"] and worst["calls_checked"] == 2
