"""profile="auto": measured once per hardware fingerprint, cached, re-measured when it must be."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tensortorrent_dynamo.profile import NOMINAL_CPU_FLOPS, cache, measure, resolve
from tensortorrent_dynamo.profile.detect import current_fingerprint, detect_cuda_devices
from tensortorrent_dynamo.profile.schema import METHODS_REVISION, Figure, Fingerprint, Measurements
from tensortorrent_dynamo.settings import parse_options

AUTO = parse_options({"profile": "auto"})
LOGGER = "tensortorrent_dynamo.profile.resolve"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(path))
    return path


@pytest.fixture
def measure_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the short measurement by a fast fake that records each call."""
    calls: list[str] = []

    def fake(mode: str, *args: object, **kwargs: object) -> Measurements:
        calls.append(mode)
        m = resolve.nominal_measurements()
        cpu = dataclasses.replace(
            m.devices[0],
            matmul={
                **m.devices[0].matmul,
                "float32": dataclasses.replace(
                    m.devices[0].matmul["float32"], value=1.5e11, method="fake"
                ),
            },
            matmul_rows={"float32": {1: Figure(2e10, "FLOP/s", "fake")}},
        )
        return dataclasses.replace(m, mode="short", devices=(cpu, *m.devices[1:]))

    monkeypatch.setattr(resolve, "measure_host", fake)
    return calls


def _other(fp: Fingerprint) -> Callable[[], Fingerprint]:
    changed = dataclasses.replace(fp, torch_version=fp.torch_version + "+other")
    return lambda: changed


def _rewrite_cached(edit: Callable[[dict[str, Any]], None]) -> tuple[Path, dict[str, Any]]:
    """Measure and cache a profile, then rewrite the cached file as ``edit`` changes its JSON;
    the file and the JSON written."""
    resolve.host_profile(AUTO)
    path = cache.profile_path(current_fingerprint())
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path, data


def test_first_use_measures_a_short_profile_and_caches_it(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert profile.source == "measured now"
    cpu = profile.device("cpu")
    assert profile.measurements is not None and profile.measurements.mode == "short"
    assert cpu.flops_per_s == profile.measurements.devices[0].matmul["float32"].value
    assert cpu.flops_per_s > 1e8 and cpu.memory_bandwidth_bytes_per_s
    assert list(cache_dir.glob("host-profile-*.json")), "the profile was not cached"
    disk = profile.measurements.disk
    assert disk.path == str(cache_dir / "offload"), "the disk is measured where weights go"
    assert profile.disk_read_bytes_per_s and profile.disk_read_bytes_per_s > 1e6
    assert not list((cache_dir / "offload").iterdir()), "the bench's file is removed"
    text = caplog.text
    assert "measuring a short host profile" in text and "measured the host profile in" in text
    assert "disk read" in text


def test_second_use_reads_the_cache(measure_calls: list[str]) -> None:
    first = resolve.host_profile(AUTO)
    second = resolve.host_profile(AUTO)
    assert measure_calls == ["short"]
    assert second.source.startswith("measured (cached ")
    assert second.device("cpu").flops_per_s == first.device("cpu").flops_per_s == 1.5e11


def test_other_hardware_is_measured_again(
    measure_calls: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    resolve.host_profile(AUTO)
    monkeypatch.setattr(resolve, "current_fingerprint", _other(current_fingerprint()))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert profile.source == "measured now"
    assert "other hardware" in caplog.text and "torch_version" in caplog.text


def test_cache_file_with_a_foreign_fingerprint_is_not_used(
    measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def foreign(data: dict[str, Any]) -> None:
        data["fingerprint"]["cpu_cores"] += 64

    _rewrite_cached(foreign)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert "other hardware" in caplog.text and "cpu_cores" in caplog.text


@pytest.mark.parametrize(
    "garbage",
    ['{"format_version": 1, "mode": "short"', '{"format_version": 99}', "[]", ""],
    ids=["truncated", "other-version", "not-an-object", "empty"],
)
def test_corrupt_cache_is_measured_again(
    garbage: str, measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = cache.profile_path(current_fingerprint())
    path.parent.mkdir(parents=True)
    path.write_text(garbage)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short"]
    assert profile.source == "measured now"
    assert "unreadable" in caplog.text and str(path) in caplog.text
    assert Measurements.from_json(path.read_text()).mode == "short", "the cache was repaired"


def test_a_short_profile_cached_before_it_measured_bfloat16_is_measured_again(
    measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def without_bfloat16(old: dict[str, Any]) -> None:  # as an older short profile wrote it
        old["devices"][0]["matmul"]["bfloat16"] = {
            "value": None,
            "unit": "FLOP/s",
            "method": "not measured",
            "note": measure.SHORT_NOTE,
        }

    path, _ = _rewrite_cached(without_bfloat16)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert profile.source == "measured now"
    assert "no CPU bfloat16 matmul rate" in caplog.text
    assert "bfloat16" in Measurements.from_json(path.read_text()).devices[0].matmul


def test_a_short_profile_cached_before_it_measured_rates_by_rows_is_measured_again(
    measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def without_rows(old: dict[str, Any]) -> None:
        assert old["devices"][0]["matmul_rows"] == {
            "float32": {"1": {"value": 2e10, "unit": "FLOP/s", "method": "fake"}}
        }
        del old["devices"][0]["matmul_rows"]  # as an older short profile wrote it

    _rewrite_cached(without_rows)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert profile.source == "measured now"
    assert "no CPU matmul rates by rows" in caplog.text
    assert profile.devices[0].flops_by_rows == {"float32": {1: 2e10}}


def test_a_short_profile_cached_before_it_measured_the_disk_is_measured_again(
    measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def without_disk(old: dict[str, Any]) -> None:
        for figure in ("free", "read", "write", "latency"):  # as an older short profile wrote it
            old["disk"][figure]["note"] = measure.SHORT_NOTE

    _rewrite_cached(without_disk)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert profile.source == "measured now"
    assert "no disk figures" in caplog.text


def test_a_short_profile_cached_before_it_measured_compute_while_reading_is_measured_again(
    measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def without_slowdown(old: dict[str, Any]) -> None:
        old["disk"]["read"] = {"value": 1.5e9, "unit": "B/s", "method": "fake"}
        del old["disk"]["compute_slowdown"]  # as an older short profile wrote it

    path, _ = _rewrite_cached(without_slowdown)
    assert Measurements.from_json(path.read_text()).disk.compute_slowdown.value is None
    with caplog.at_level(logging.INFO, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert profile.source == "measured now"
    assert "none of how compute slows while the disk reads" in caplog.text


def test_a_short_profile_measured_while_the_machine_was_busy_is_measured_again(
    measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def busy_load(data: dict[str, Any]) -> None:
        data["load"] = {
            "value": 80.0,
            "unit": "%",
            "method": "fake",
            "note": "the machine was busy",
        }

    path, busy = _rewrite_cached(busy_load)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert profile.source == "measured now"
    assert "measured while other work used 80% of the CPUs" in caplog.text
    # A full profile the user measured is kept however busy the machine was.
    busy["mode"] = "quick"
    path.write_text(json.dumps(busy))
    assert resolve.host_profile(AUTO).source.startswith("measured (cached ")
    assert measure_calls == ["short", "short"]


def test_a_process_measures_a_busy_machine_once(
    monkeypatch: pytest.MonkeyPatch, measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # measured while other work ran: a later process measures again, but this one plans each
    # new graph with what it measured (measuring at each took ~20 s on a machine no less busy)
    fake = resolve.measure_host

    def busy(mode: str, *args: object, **kwargs: object) -> Measurements:
        measured = fake(mode, *args, **kwargs)
        return dataclasses.replace(measured, load=Figure(70.0, "%", "fake", "the machine was busy"))

    monkeypatch.setattr(resolve, "measure_host", busy)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        first = resolve.host_profile(AUTO)
        again = resolve.host_profile(AUTO)
    assert measure_calls == ["short"]
    assert first.source == again.source == "measured now"
    assert "cached the host profile" in caplog.text
    monkeypatch.setattr(resolve, "_measured_here", {})  # a new process: measured again
    resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]


def test_unwritable_cache_measures_once_per_process(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    measure_calls: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resolve.host_profile(AUTO)
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short"]
    assert profile.source == "measured now"
    assert "could not cache the host profile" in caplog.text


def test_nominal_never_measures(measure_calls: list[str]) -> None:
    profile = resolve.host_profile(parse_options({"profile": "nominal"}))
    assert measure_calls == []
    assert profile.source == "nominal"
    assert profile.device("cpu").flops_per_s == NOMINAL_CPU_FLOPS


def test_virtual_devices_follow_host_and_cuda_in_index_order(measure_calls: list[str]) -> None:
    settings = parse_options(
        {"profile": "auto", "budgets": {"virtual:10": "1MiB", "virtual:2": "2MiB"}}
    )
    names = [d.name for d in resolve.host_profile(settings).devices]
    cuda = detect_cuda_devices()
    assert names == ["cpu", *cuda, "virtual:2", "virtual:10"]
    assert resolve.host_profile(settings).device("virtual:2").memory_bytes == 2 * 1024**2


def test_a_short_profile_measured_by_older_methods_is_measured_again(
    measure_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def older(old: dict[str, Any]) -> None:
        assert old["methods_revision"] == METHODS_REVISION
        del old["methods_revision"]  # as a profile of revision 1 was written

    _rewrite_cached(older)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        profile = resolve.host_profile(AUTO)
    assert measure_calls == ["short", "short"]
    assert profile.source == "measured now"
    assert f"older methods (revision 1, now {METHODS_REVISION})" in caplog.text
    # the profile measured again is of this revision, and is read from the cache from now on
    assert profile.measurements is not None
    assert profile.measurements.revision == METHODS_REVISION
    assert resolve.host_profile(AUTO).source.startswith("measured (cached")
    assert measure_calls == ["short", "short"]


def test_machines_of_one_kind_differ_only_in_some_mib_of_ram() -> None:
    here = Fingerprint("AMD EPYC", 2, 24 << 30, (("H100", 80 << 30),), "2.9.0")
    assert here.other_kind(here) == []
    assert (
        here.other_kind(dataclasses.replace(here, ram_total_bytes=(24 << 30) - (200 << 20))) == []
    )
    assert here.other_kind(dataclasses.replace(here, ram_total_bytes=16 << 30)) == [
        "ram_total_bytes"
    ]
    other = dataclasses.replace(here, gpus=(("H100", 96 << 30),), cpu_cores=4)
    assert here.other_kind(other) == ["cpu_cores", "gpus"]
