"""`tensortorrent doctor`: devices, memory tiers, offload dir, cached profile, what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensortorrent_dynamo.cli import doctor
from tensortorrent_dynamo.profile import cache
from tensortorrent_dynamo.profile.resolve import nominal_measurements


def test_doctor_says_what_is_missing_then_what_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path))
    doctor()
    out = capsys.readouterr().out
    for line in ("torch ", "ram ", "planner sees  cpu", f"offload dir   {tmp_path}/offload"):
        assert line in out
    assert "cached        none" in out
    assert "to do         no cached profile" in out and "tensortorrent validate-hardware" in out

    path = cache.save(nominal_measurements())
    doctor()
    out = capsys.readouterr().out
    assert f"cached        {path}, nominal, " in out and " s old" in out
    assert "no cached profile" not in out
