from __future__ import annotations

import subprocess
import sys


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
