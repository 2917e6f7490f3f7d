"""The `profile` option: "auto", "nominal", a profile file, or $TENSORTORRENT_PROFILE."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensortorrent_dynamo.errors import OptionsError
from tensortorrent_dynamo.profile import HostProfile, host_profile, nominal_profile
from tensortorrent_dynamo.profile.resolve import nominal_measurements
from tensortorrent_dynamo.settings import PROFILE_ENV, Settings, parse_options


def test_default_is_auto_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert parse_options(None).profile == "auto" and Settings().profile == "auto"
    monkeypatch.setenv(PROFILE_ENV, "nominal")
    assert parse_options(None).profile == "nominal" and Settings().profile == "nominal"
    assert parse_options({"profile": "auto"}).profile == "auto", "an option beats the env"


def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROFILE_ENV, "nomnal")
    with pytest.raises(OptionsError, match=f"environment variable {PROFILE_ENV}.*'nomnal'"):
        parse_options(None)


def test_missing_file_is_an_options_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(OptionsError) as info:
        parse_options({"profile": str(missing)})
    text = str(info.value)
    assert "option 'profile'" in text and str(missing) in text and "'auto' or 'nominal'" in text
    with pytest.raises(OptionsError, match="expected a string"):
        parse_options({"profile": 3})


def test_file_is_loaded_and_named_as_the_source(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(nominal_profile().to_json())
    settings = parse_options({"profile": path, "budgets": {"virtual:0": "1MiB"}})
    assert settings.profile == str(path)
    profile = host_profile(settings)
    assert profile.source == str(path)
    assert next(d.kind for d in profile.devices) == "cpu"
    assert profile.devices[-1].name == "virtual:0"


def test_file_that_is_not_a_profile_is_an_options_error(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text('{"format_version": 1, "mode": "quick"}')
    settings = parse_options({"profile": str(path)})
    with pytest.raises(OptionsError, match=r"is not a TensorTorrent host profile.*created_at"):
        host_profile(settings)


def test_json_round_trip_keeps_every_figure() -> None:
    m = nominal_measurements()
    profile = HostProfile.from_json(HostProfile.from_measurements(m, "x").to_json(), "y")
    assert profile.measurements is not None
    assert profile.measurements.to_dict() == m.to_dict()
    assert profile.to_dict()["format_version"] == 1
    assert profile.device("cpu").flops_per_s == nominal_profile().device("cpu").flops_per_s


def test_a_profile_written_before_the_runtime_s_work_was_timed_leaves_it_unmodelled() -> None:
    raw = HostProfile.from_measurements(nominal_measurements(), "x").to_dict()
    assert raw["runtime"]["stream"]["value"] is None
    del raw["runtime"]
    profile = HostProfile.from_dict(raw, "older")
    assert profile.measurements is not None
    assert "written before" in profile.measurements.runtime.segment_call.note
    assert profile.runtime_work_s == (0.0, 0.0, 0.0)


def test_a_profile_written_before_the_small_stream_was_timed_loads_without_it() -> None:
    raw = HostProfile.from_measurements(nominal_measurements(), "x").to_dict()
    del raw["disk"]["stream_small"]
    profile = HostProfile.from_dict(raw, "older")
    assert profile.measurements is not None
    assert "written before" in profile.measurements.disk.stream_small.note
    assert profile.disk_stream_small_bytes_per_s is None


def test_attention_by_tokens_round_trips_and_a_profile_written_before_loads_without_it() -> None:
    raw = HostProfile.from_measurements(nominal_measurements(), "x").to_dict()
    cpu = next(d for d in raw["devices"] if d["name"] == "cpu")
    figure = {"value": 2e10, "unit": "FLOP/s", "method": "timed", "note": ""}
    cpu["attention"] = {**figure, "value": 8e10}
    cpu["attention_tokens"] = {"16": figure}
    profile = HostProfile.from_dict(raw, "measured")
    assert profile.device("cpu").attention_by_tokens == {16: 2e10, 256: 8e10}
    assert HostProfile.from_json(profile.to_json(), "again").to_dict() == profile.to_dict()
    del cpu["attention_tokens"]
    assert HostProfile.from_dict(raw, "older").device("cpu").attention_by_tokens == {}
    cpu["attention_tokens"] = {"many": figure}
    with pytest.raises(ValueError, match="'many' is not a number of tokens"):
        HostProfile.from_dict(raw, "bad")
