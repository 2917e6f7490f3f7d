"""Reads through the runtime's reader, timed one at a time and queued, and what the planner
takes from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tensortorrent_dynamo.io.locations import FileGuard
from tensortorrent_dynamo.io.reader import READ_HANDOFF_S, DiskReader
from tensortorrent_dynamo.profile import HostProfile
from tensortorrent_dynamo.profile.disk import BLOCK_BYTES, DiskBench
from tensortorrent_dynamo.profile.reads import FIGURES, LARGE_READS, READ_TURNS, ReadProbe
from tensortorrent_dynamo.profile.resolve import nominal_measurements
from tensortorrent_dynamo.profile.schema import (
    COMPUTE_SLOWDOWN_NOTE,
    DiskFigures,
    Figure,
    Measurements,
)


def test_reads_are_timed_through_the_reader_verified_alone_and_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[int] = []
    verify = FileGuard.verify

    def spy(self: FileGuard, *args: object) -> list[int]:
        checked.append(1)
        return verify(self, *args)  # type: ignore[arg-type]

    submitted: list[int] = []
    submit = DiskReader.submit

    def count(self: DiskReader, loc: object) -> object:
        submitted.append(loc.nbytes)  # type: ignore[attr-defined]
        return submit(self, loc)  # type: ignore[arg-type]

    monkeypatch.setattr(FileGuard, "verify", spy)
    monkeypatch.setattr(DiskReader, "submit", count)
    bench = DiskBench(tmp_path, 8 * BLOCK_BYTES, samples=2, reads=20, budget_s=2.0)
    try:
        probe = ReadProbe(bench)
        step = probe.read()
        figures = probe.figures(step)
    finally:
        bench.close()
    assert list(tmp_path.iterdir()) == [], "the scratch file was left behind"
    assert checked, "the reads were not verified"
    # the large reads are half the file here (16 MiB, the reader's chunk, on a larger one)
    assert submitted.count(4 * BLOCK_BYTES) == 2 * READ_TURNS * LARGE_READS
    assert set(figures) == set(FIGURES) and figures["reader_read"] is step
    for key in FIGURES:
        assert figures[key].unit == "B/s" and (figures[key].value or 0) > 1e6, figures[key]
        assert "verified" in figures[key].method and "slope" in figures[key].method
    assert "while no other is in flight" in figures["reader_idle_read"].method
    assert "while another is in flight" in figures["reader_read"].method


def test_a_failed_measurement_leaves_every_figure_absent_with_why(tmp_path: Path) -> None:
    bench = DiskBench(tmp_path, BLOCK_BYTES, samples=2, reads=20, budget_s=2.0)
    try:
        probe = ReadProbe(bench)
        failed = Figure(None, "B/s", "disk reads", note="failed: the disk went away")
        figures = probe.figures(failed)
    finally:
        bench.close()
    assert set(figures) == set(FIGURES)
    assert all(f.value is None and f.note == failed.note for f in figures.values())


def _profile(disk: DiskFigures) -> HostProfile:
    return HostProfile.from_measurements(
        dataclasses.replace(nominal_measurements(), disk=disk), "test"
    )


def _disk(**figures: Figure) -> DiskFigures:
    return DiskFigures(
        path="/offload",
        free=Figure(1e12, "B", "fake"),
        read=Figure(1e9, "B/s", "fake"),
        write=Figure(1e9, "B/s", "fake"),
        latency=Figure(5e-5, "s", "fake"),
        **figures,
    )


def test_the_planner_costs_reads_at_the_reader_s_rates_where_measured() -> None:
    measured = _profile(
        _disk(
            reader_read=Figure(2e9, "B/s", "fake"),
            reader_idle_read=Figure(1.8e9, "B/s", "fake"),
        )
    )
    assert measured.planned_disk_read_bytes_per_s == 2e9
    assert measured.planned_disk_idle_read_bytes_per_s == 1.8e9
    # the fixed cost is the disk's latency and the reader's hand-offs either way
    assert measured.planned_disk_latency_s == 5e-5 + READ_HANDOFF_S
    # without them: the disk's own sequential rate for every read
    older = _profile(_disk())
    assert older.planned_disk_read_bytes_per_s == 1e9
    assert older.planned_disk_idle_read_bytes_per_s == 1e9
    assert older.planned_disk_latency_s == 5e-5 + READ_HANDOFF_S


def test_a_profile_written_before_the_reader_figures_reads_them_as_absent() -> None:
    m = dataclasses.replace(nominal_measurements(), disk=_disk())
    data = m.to_dict()
    for key in FIGURES:
        del data["disk"][key]
    disk = Measurements.from_dict(data).disk
    for key in FIGURES:
        figure = getattr(disk, key)
        assert figure.value is None and figure.note == COMPUTE_SLOWDOWN_NOTE
