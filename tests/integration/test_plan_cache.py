"""A second process compiling the same model on the same machine skips the search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, torch
    import tensortorrent as tt
    from tests.models import mlp
    model, x = mlp(64, 4), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), budgets={"virtual:0": "40KiB"},
                          virtual_devices={"virtual:0": {"latency": 1e-6}}, compiler="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    native = compiled.graphs[0].plan.native
    print(json.dumps({"hash": native.plan_hash, "report": native.report}))
    """
)


def _run(cache: Path) -> tuple[dict[str, str], str]:
    env = {
        **os.environ,
        "TENSORTORRENT_PLAN_CACHE": "1",
        "TENSORTORRENT_CACHE_DIR": str(cache),
        "TORCH_LOGS": "tensortorrent",
    }
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_second_process_replays_the_cached_plan(tmp_path: Path) -> None:
    first, first_log = _run(tmp_path)
    second, second_log = _run(tmp_path)
    assert "plan cache" not in first_log
    assert "taken from the plan cache, search skipped" in second_log
    assert second["hash"] == first["hash"]
    assert "no search" in second["report"] and "no search" not in first["report"]
    assert len(list((tmp_path / "plans").glob("*.json"))) == 1


def test_a_damaged_entry_is_ignored(tmp_path: Path) -> None:
    first, _ = _run(tmp_path)
    (entry,) = (tmp_path / "plans").glob("*.json")
    entry.write_text("{broken")
    again, log = _run(tmp_path)
    assert "ignoring the damaged plan cache entry" in log
    assert again["hash"] == first["hash"]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000,
        '{"chosen": 5, "node_device": [], "param_streamed": []}',
        '{"chosen": "x", "node_device": "abc", "param_streamed": []}',
        '{"chosen": "x", "node_device": [0], "param_streamed": [1]}',
        "\x80 not text",
        '{"chosen": "x", "node_device": [100000000000000000000], "param_streamed": []}',
    ],
)
def test_a_damaged_entry_is_a_miss(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensortorrent_dynamo.plan import cache as plan_cache

    monkeypatch.setenv("TENSORTORRENT_CACHE_DIR", str(tmp_path))
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "entry.json").write_text(text, errors="surrogateescape")
    assert plan_cache.lookup("entry") is None
