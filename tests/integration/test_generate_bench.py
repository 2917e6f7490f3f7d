"""bench.generate runs on a tiny Qwen3 and writes valid JSON; TensorTorrent's greedy tokens
equal eager's.

As the offload benches' tests (``test_offload_benches.py``), no timing is asserted and each
competitor runs in its own fresh process (setup, eager, Accelerate, TensorTorrent: ~45 s
here, nearly all of it interpreter start-up and imports); one regime, one round, the page
cache kept (``--no-drop``), float32 so that the tokens must be equal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import generate
from bench.offload.workload import generation_quality, worst_quality

TINY = [
    *("--hidden", "64", "--layers", "2", "--intermediate", "128", "--heads", "4"),
    *("--kv-heads", "2", "--head-dim", "16", "--vocab", "256", "--prompt", "8"),
    *("--new-tokens", "4", "--batches", "2", "--dtype", "float32"),
]
RUN = [
    *("--quick", "--repeats", "1", "--rounds", "1", "--warmup", "1", "--no-drop"),
    *("--disk-mib", "8", "--timeout", "300"),
]


def check_generation(row: dict[str, Any]) -> dict[str, Any]:
    assert row["ok"], row
    quality = row["quality"]
    assert quality["ok"] and quality["calls_checked"] == 3
    assert quality["tokens_equal"] and quality["first_difference"] is None
    gen: dict[str, Any] = row["generate"]
    assert gen["batch"] == 2 and gen["new_tokens"] == 4
    for phase in ("cold", "warm"):
        assert gen[f"prefill_ms_{phase}"] > 0 and gen[f"decode_tokens_per_s_{phase}"] > 0
        assert gen[f"decode_ms_per_step_{phase}"] > 0
    (only,) = row["rounds"]
    assert only["decode_tokens_per_s_cold"] == gen["decode_tokens_per_s_cold"]
    assert row["peak_rss_cold_calls_bytes"] >= row["rss_baseline_bytes"] > 0
    return gen


@pytest.mark.slow
def test_generate_bench(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    generate.main([*TINY, *RUN, "--out-dir", str(tmp_path / "work"), "--results", str(tmp_path)])
    data = json.loads((tmp_path / "generate.json").read_text())
    assert data["bench"] == "generate" and data["quick"]
    precision = data["precision"]
    assert precision["dtype"] == "float32" and precision["chosen_by"] == "--dtype"
    assert set(precision["matmul_gflops"]) == {"float32", "bfloat16"}
    assert data["params"]["layers"] == 2 and data["params"]["new_tokens"] == 4
    assert 0 < data["budget_bytes"] < data["param_bytes"]
    limit = data["mem_limit"]
    assert "skipped" in limit or (
        limit["limit_bytes"] == data["budget_bytes"] + 2**30 and "eager" in limit["unlimited"]
    )
    assert data["accelerate_checkpoint"].startswith("shards/model.safetensors.index.json")
    (regime,) = data["regimes"]
    assert regime == "batch2" and data["errors"] == {}
    rows = data["regimes"][regime]["competitors"]
    assert set(rows) == {"eager", "accelerate", "tensortorrent"}
    for row in rows.values():
        check_generation(row)
    assert rows["accelerate"]["device_map_split"].keys() == {"cpu", "disk"}
    tt = check_generation(rows["tensortorrent"])
    assert tt["disk_bytes_read_per_step_cold"] > 0, "the plan streams weights from disk"
    assert 0 < rows["tensortorrent"]["disk_busy_share_cold"] <= 1
    # the static cache: one prefill graph and one decode graph
    assert "2 graph(s)" in rows["tensortorrent"]["explain"]
    bound = data["regimes"][regime]["lower_bound"]
    assert bound["step_ms"] > 0 and bound["decode_tokens_per_s"] > 0
    assert bound["streamed_bytes_per_step"] == data["param_bytes"] - data["budget_bytes"]
    figure = data["figure"][regime]
    assert figure["decode_tokens_per_s_cold_over_accelerate"] > 0
    assert figure["decode_step_over_bound_cold"] > 0
    targets = data["regimes"][regime]["targets"]
    assert targets["decode_step_over_bound"]["target"] == generate.TARGET_STEP_OVER_BOUND


def test_generation_quality() -> None:
    tokens = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
    logits = torch.randn(2, 50)
    expected = {"tokens": tokens, "first_logits": logits}
    same = generation_quality({"tokens": tokens.clone(), "first_logits": logits}, expected, True)
    assert same["ok"] and same["tokens_equal"] and same["first_difference"] is None
    other = tokens.clone()
    other[1, 2] = 9
    differs = {"tokens": other, "first_logits": logits}
    exact = generation_quality(differs, expected, exact=True)
    assert not exact["ok"] and exact["first_difference"] == 2
    # bf16: the first step's logits decide
    assert generation_quality(differs, expected, exact=False)["ok"]
    worst = worst_quality([same, exact])
    assert not worst["ok"] and not worst["tokens_equal"] and worst["first_difference"] == 2
