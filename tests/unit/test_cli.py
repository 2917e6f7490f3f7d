from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_doctor_reports_planner_and_backend() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tensortorrent_dynamo.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "planner       native, version" in result.stdout
    assert "'tensortorrent' registered" in result.stdout
    assert "torch " in result.stdout


def test_doctor_counts_the_offload_stores(tmp_path: Path) -> None:
    import torch

    from tensortorrent_dynamo.io.store import OffloadStore

    OffloadStore(tmp_path / "offload" / "loose").write({"w": torch.ones(1024)})
    # this process released weights to it: in use while it runs
    OffloadStore(tmp_path / "offload" / "held").write({"w": torch.zeros(1024)}, hold=True)
    result = subprocess.run(
        [sys.executable, "-m", "tensortorrent_dynamo.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TENSORTORRENT_CACHE_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 offload store(s) holding" in result.stdout
    assert "1 in use by a running process" in result.stdout


def test_unknown_command_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tensortorrent_dynamo.cli", "explode"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_public_names_all_resolve() -> None:
    import tensortorrent as tt
    import tensortorrent_dynamo

    assert set(tt.__all__) == set(tensortorrent_dynamo._HOME) | {"__version__"}
    for name in tt.__all__:
        assert getattr(tt, name) is getattr(tensortorrent_dynamo, name)


def test_cost_graph_plans_offline(tmp_path: object) -> None:
    import pathlib

    import torch

    import tensortorrent as tt
    from tests.models import mlp

    path = pathlib.Path(str(tmp_path)) / "graph.json"
    tt.export_cost_graphs(mlp(64, 4), (torch.randn(2, 64),))[0].save(path)
    args = [sys.executable, "-m", "tensortorrent_dynamo.cli", "cost-graph", str(path)]
    ok = subprocess.run(
        [*args, "--budget", "virtual:0=40KiB", "--budget", "cpu=1GiB"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert "13 nodes, 8 parameters" in ok.stdout  # the functional graph: t, addmm, relu
    assert "virtual:0" in ok.stdout and "predicted" in ok.stdout
    assert "cpu's peak of" in ok.stdout, ok.stdout  # and what makes it (cpu is budgeted)
    bad = subprocess.run([*args, "--budget", "virtual:0=lots"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "cannot parse 'lots'" in bad.stderr
