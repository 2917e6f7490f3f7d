"""The disk figures keep the page cache out, and say how."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tensortorrent_dynamo.profile.disk import BLOCK_BYTES, DiskBench, writable_problem
from tensortorrent_dynamo.profile.measure import measure_host


@pytest.mark.parametrize("direct", [None, False], ids=["auto", "buffered"])
def test_bench_measures_and_cleans_up(tmp_path: Path, direct: bool | None) -> None:
    bench = DiskBench(tmp_path, 4 * BLOCK_BYTES, samples=2, reads=20, budget_s=2.0, direct=direct)
    try:
        write, read, latency = bench.write(), bench.read(), bench.latency()
    finally:
        bench.close()
    assert list(tmp_path.iterdir()) == [], "the scratch file was left behind"
    assert write.value and read.value and latency.value
    assert write.unit == read.unit == "B/s" and latency.unit == "s"
    if direct is False:
        assert "posix_fadvise(POSIX_FADV_DONTNEED)" in read.method
        assert "O_DIRECT" not in read.method
    else:
        assert ("O_DIRECT" in read.method) == bench.direct


def test_unwritable_dir_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    problem = writable_problem(blocker / "offload")
    assert problem is not None and str(blocker / "offload") in problem
    assert writable_problem(tmp_path / "fresh") is None


def test_measure_host_reports_an_unwritable_dir_instead_of_failing(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    m = measure_host("quick", blocker / "offload")
    assert m.disk.read.value is None and m.disk.write.value is None
    assert "not writable" in m.disk.read.note and m.disk.path == str(blocker / "offload")
    assert m.device("cpu") is not None


def test_measure_host_times_ops_as_calls_run_them_even_inside_a_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A first compile measures the profile inside AOTAutograd's compiler, whose Python
    # dispatcher made every op cost 2.4x what the calls it predicts pay.
    from torch._dispatch.python import enable_python_dispatcher

    from tensortorrent_dynamo.profile import measure

    seen: list[bool] = []
    run = measure._run

    def spy(step: measure._Step) -> measure.Figure:
        seen.append(
            torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)
        )
        return run(step)

    monkeypatch.setattr(measure, "_run", spy)
    with enable_python_dispatcher():
        measure_host("quick", None)
    assert seen and not any(seen)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry for each check of a guarded read's blocks made from now on."""
    from tensortorrent_dynamo.io.locations import FileGuard

    checked: list[int] = []
    verify = FileGuard.verify

    def spy(self: FileGuard, *args: object) -> list[int]:
        checked.append(1)
        return verify(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(FileGuard, "verify", spy)
    return checked


def test_the_stream_probe_reads_are_verified_as_the_runtimes_are(
    tmp_path: Path, checks: list[int]
) -> None:
    # The runtime checks every block it reads from disk on a thread of its own, CPU time
    # that compute shares the cores with: the stream is measured with that work in it.
    from tensortorrent_dynamo.profile import measure

    bench = DiskBench(tmp_path, 4 * BLOCK_BYTES, samples=2, reads=20, budget_s=2.0)
    try:
        probe = measure.StreamProbe(bench, measure.BUDGETS["quick"])
        rate, slowdown = probe.rate(), probe.slowdown()
    finally:
        bench.close()
    # untimed turn, then the timed ones: every read of each verified
    assert len(checks) >= (measure.SLOWDOWN_TURNS + 1) * measure.STREAM_READS
    assert slowdown.value is not None and slowdown.value > 0 and "verified" in slowdown.method
    # both figures from the one stream: the rate is its reads' bytes over its time
    assert rate.unit == "B/s" and rate.value is not None and rate.value > 0
    assert rate.method.endswith("the median of its turns")
    assert slowdown.method.split(": ", 1)[1] in rate.method


def test_the_small_read_probe_times_a_segment_with_each_verified_read_in_flight(
    tmp_path: Path, checks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensortorrent_dynamo.profile import measure

    monkeypatch.setattr(measure, "SMALL_READS", 10)
    bench = DiskBench(tmp_path, 4 * BLOCK_BYTES, samples=2, reads=20, budget_s=2.0)
    try:
        figure = measure.SmallReadProbe(bench).read_cpu()
    finally:
        bench.close()
    assert len(checks) >= measure.SLOWDOWN_TURNS * 10
    assert figure.unit == "s" and figure.value is not None and 0 <= figure.value < 0.1
    assert "128.00 KiB" in figure.method and "verified" in figure.method


def test_the_small_read_probe_times_verified_reads_the_calling_thread_makes(
    tmp_path: Path, checks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from tensortorrent_dynamo.io.reader import DiskReader
    from tensortorrent_dynamo.profile import measure

    monkeypatch.setattr(measure, "SMALL_READS", 10)
    readers: set[str] = set()
    read_into = DiskReader._read_into

    def spy(self: DiskReader, *args: Any) -> None:
        readers.add(threading.current_thread().name)
        read_into(self, *args)

    monkeypatch.setattr(DiskReader, "_read_into", spy)
    bench = DiskBench(tmp_path, 4 * BLOCK_BYTES, samples=2, reads=20, budget_s=2.0)
    try:
        figure = measure.SmallReadProbe(bench).read_inline()
    finally:
        bench.close()
    assert readers == {threading.current_thread().name}
    assert len(checks) >= measure.SLOWDOWN_TURNS * 10
    assert figure.unit == "s" and figure.value is not None and 0 < figure.value < 0.1
    assert "32.00 KiB" in figure.method and "calling thread" in figure.method
    # each read comes after the caches were evicted, as a streamed plan's reads come after
    # segments (methods revision 15)
    assert "32.00 MiB written" in figure.method
