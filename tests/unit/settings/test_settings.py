from __future__ import annotations

import dataclasses
import math

import pytest

from tensortorrent_dynamo import BudgetParseError, OptionsError, parse_bytes, parse_options
from tensortorrent_dynamo.settings import OPTION_HELP, Settings
from tensortorrent_dynamo.units import parse_rate


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (123, 123),
        ("123", 123),
        ("10B", 10),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("64MiB", 64 * 1024**2),
        ("64MB", 64 * 1000**2),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("2 GB", 2 * 1000**3),
        ("8gib", 8 * 1024**3),
    ],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["64MiBs", "lots", "", "-1GB", -5, True, None, [1], "1.2.3GB"])
def test_parse_bytes_rejects(bad: object) -> None:
    with pytest.raises(BudgetParseError, match="KiB" if isinstance(bad, str) else None):
        parse_bytes(bad)


def test_parse_rate() -> None:
    assert parse_rate("2T") == 2e12
    assert parse_rate("16GB") == 16e9
    assert parse_rate("16GB/s") == 16e9
    assert parse_rate(5) == 5.0
    with pytest.raises(BudgetParseError, match="positive"):
        parse_rate(0)


def test_defaults() -> None:
    s = parse_options(None)
    assert s.objective == "latency"
    assert s.compiler == "inductor"
    assert s.devices is None
    assert not s.strict
    assert dict(s.budgets) == {}


def test_budgets_declare_virtual_devices() -> None:
    s = parse_options({"budgets": {"virtual:0": "64MiB", "cpu": 8 * 1024**3}})
    assert s.budgets == {"virtual:0": 64 * 1024**2, "cpu": 8 * 1024**3}
    assert s.virtual_devices["virtual:0"].capacity_bytes == 64 * 1024**2


def test_virtual_device_spec() -> None:
    s = parse_options(
        {"virtual_devices": {"virtual:1": {"capacity": "1GiB", "flops": "5T", "bandwidth": "8GB"}}}
    )
    spec = s.virtual_devices["virtual:1"]
    assert (spec.capacity_bytes, spec.flops_per_s, spec.link_bytes_per_s) == (1024**3, 5e12, 8e9)


def test_unknown_option_lists_valid_ones() -> None:
    with pytest.raises(OptionsError) as info:
        parse_options({"bugdets": {}})
    text = str(info.value)
    assert "'bugdets'" in text
    for key in ("budgets", "objective", "compiler", "devices", "strict", "virtual_devices"):
        assert key in text


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"objective": "fast"}, "'latency', 'memory', 'throughput'"),
        ({"compiler": "tvm"}, "'inductor', 'eager'"),
        ({"budgets": {"gpu0": "1GB"}}, "valid forms"),
        ({"budgets": ["cpu"]}, "expected a dict"),
        ({"budgets": {"cpu": "many"}}, "cannot parse"),
        ({"devices": "cpu"}, "expected a list"),
        ({"devices": []}, "empty"),
        ({"devices": ["virtual:3"]}, "not declared"),
        ({"strict": "yes"}, "True or False"),
        ({"virtual_devices": {"virtual:0": {"speed": 1}}}, "unknown key"),
        ({"virtual_devices": {"virtual:0": {"flops": 1}}}, "capacity"),
        ({"virtual_devices": {"cpu": {"capacity": 1}}}, "not a 'virtual:N'"),
    ],
)
def test_bad_values(options: dict[str, object], needle: str) -> None:
    with pytest.raises(OptionsError) as info:
        parse_options(options)
    assert needle in str(info.value)


def test_cuda_alias_and_fingerprint_is_stable() -> None:
    a = parse_options({"budgets": {"cuda": "1GiB"}})
    b = parse_options({"budgets": {"cuda:0": 1024**3}})
    assert a.budgets == {"cuda:0": 1024**3}
    assert a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "1e400GiB", "inf"])
def test_sizes_beyond_any_float_are_refused(value: object) -> None:
    with pytest.raises(BudgetParseError):
        parse_bytes(value, "size")


@pytest.mark.parametrize("value", [math.inf, math.nan, 10**400, "1e400G", "inf"])
def test_rates_beyond_any_float_are_refused(value: object) -> None:
    with pytest.raises(BudgetParseError):
        parse_rate(value, "rate")


def test_every_option_has_its_help_and_its_default_in_the_settings_fields() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert set(OPTION_HELP) == fields and all(OPTION_HELP.values())
    # no options: the fields' defaults, nothing written a second time in the parser
    assert parse_options() == Settings()


def test_planner_and_reader_knobs_are_settings() -> None:
    settings = parse_options(
        prefetch_depth=2,
        memory_slack=0.25,
        planner_node_limit=1000,
        planner_time_limit_s=0.5,
        read_threads=2,
        plan_cache=False,
    )
    assert (settings.prefetch_depth, settings.memory_slack, settings.read_threads) == (2, 0.25, 2)
    assert (settings.planner_node_limit, settings.planner_time_limit_s) == (1000, 0.5)
    assert settings.plan_cache is False
    for key, bad in [
        ("prefetch_depth", 0),
        ("prefetch_depth", 2**32),
        ("read_threads", True),
        ("memory_slack", -0.1),
        ("planner_time_limit_s", "1s"),
        ("plan_cache", "yes"),
        # an int no float holds (a plan file's options are JSON: any int parses)
        ("io_timeout_s", 2**1024),
        ("memory_slack", 2**1024),
    ]:
        with pytest.raises(OptionsError, match=key):
            parse_options({key: bad})


def test_the_plan_cache_default_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TENSORTORRENT_PLAN_CACHE", "0")
    assert parse_options().plan_cache is False
    monkeypatch.setenv("TENSORTORRENT_PLAN_CACHE", "1")
    assert parse_options().plan_cache is True
