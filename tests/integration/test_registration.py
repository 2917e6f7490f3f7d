"""The backend and the log names are found by torch in fresh interpreters."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    # torch loaded our log registration, and nothing else of ours
    assert "tensortorrent_dynamo._logs" in sys.modules
    assert "tensortorrent_dynamo.backend" not in sys.modules
    layers = [m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(2, 64)
    compiled = torch.compile(model, backend="tensortorrent",
                             options={"budgets": {"virtual:0": "48KiB"}, "compiler": "eager",
                                      "devices": ["virtual:0"]})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    from tensortorrent_dynamo import tensortorrent_backend
    assert len(tensortorrent_backend.graphs) == 1
    print("BACKEND OK", "tensortorrent" in torch._dynamo.list_backends())
    """
)


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )


def test_backend_found_by_name_without_prior_import() -> None:
    result = _run({})
    assert result.returncode == 0, result.stderr
    assert "BACKEND OK True" in result.stdout


def test_torch_logs_debug_shows_the_planner() -> None:
    result = _run({"TORCH_LOGS": "+tensortorrent"})
    assert result.returncode == 0, result.stderr
    assert "planning graph 0" in result.stderr
    assert "candidate all-on-virtual:0" in result.stderr
    assert "prefetch" in result.stderr  # the schedule's generated code


def test_torch_logs_plan_artifact_alone() -> None:
    result = _run({"TORCH_LOGS": "tensortorrent_plan"})
    assert result.returncode == 0, result.stderr
    assert "Graph 0:" in result.stderr
    assert "streamed parameters" in result.stderr
    assert "planning graph 0" not in result.stderr  # the DEBUG log stays off


def test_torch_logs_passes_artifact_shows_each_pass_before_and_after() -> None:
    result = _run({"TORCH_LOGS": "tensortorrent_passes"})
    assert result.returncode == 0, result.stderr
    for when in ("before", "after"):
        assert f"{when} pass rewrite" in result.stderr
    assert "tensortorrent_dynamo_run_ops_prefetch" in result.stderr  # the rewritten schedule
    assert "planning graph 0" not in result.stderr


def test_import_torch_survives_a_broken_registration(monkeypatch: object) -> None:
    code = (
        "import torch._logging._internal as i\n"
        "i.register_log = None\n"
        "from tensortorrent_dynamo._logs import register\n"
        "register(); register(); print('still fine')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "still fine" in result.stdout
