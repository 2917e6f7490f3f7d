"""The benches' memory limit: a command run in a memory cgroup of its own, and a process
over its limit reported as such, not as a crash of the bench."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.offload.cgroup import CgroupUnavailable, MemoryCgroup, limited_run

MIB = 2**20
# touches every page of ``MiB`` MiB, then exits 0
ALLOCATE = "import sys; b = bytearray(int(sys.argv[1]) * 2**20); b[::4096] = b'x' * len(b[::4096])"


def _cgroup_or_skip(limit: int) -> None:
    try:
        MemoryCgroup.create(limit).remove()
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup here: {exc}")


def test_a_process_within_its_limit_runs_and_its_peak_is_measured() -> None:
    _cgroup_or_skip(256 * MIB)
    run = limited_run([sys.executable, "-c", ALLOCATE, "64"], 256 * MIB, timeout=120)
    assert run.returncode == 0 and not run.over_limit
    assert run.peak_bytes is not None and 64 * MIB <= run.peak_bytes <= 256 * MIB


def test_a_process_over_its_limit_is_reported_as_over_its_limit() -> None:
    _cgroup_or_skip(96 * MIB)
    run = limited_run([sys.executable, "-c", ALLOCATE, "512"], 96 * MIB, timeout=120)
    assert run.over_limit and run.returncode < 0
    assert "killed by its memory limit of 100663296 bytes" in run.describe()


def test_a_crash_of_its_own_is_not_the_limit() -> None:
    _cgroup_or_skip(256 * MIB)
    run = limited_run([sys.executable, "-c", "raise SystemExit(3)"], 256 * MIB, timeout=120)
    assert run.returncode == 3 and not run.over_limit
    assert run.describe().startswith("exit status 3")


def test_no_controller_is_a_clear_reason(tmp_path: Path) -> None:
    with pytest.raises(CgroupUnavailable, match="no memory cgroup controller is mounted"):
        limited_run([sys.executable, "-c", "pass"], 64 * MIB, root=tmp_path)
