"""A plan's decisions as a value: the one form the plan cache and saved plans store."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensortorrent as tt
from tensortorrent_dynamo.plan.decisions import Decisions
from tensortorrent_dynamo.plan.planner import native_device_list, replay_decisions
from tests.models import mlp

DECISIONS = Decisions(
    chosen="knapsack/window-64KiB",
    node_device=(0, 1, 1),
    param_streamed=(True, False),
    value_spilled=(False, False, True),
    prefetch_depth=1,
    prefetch_window_bytes=65536,
    param_home=("disk", "host"),
    split=True,
    plan_hash="0123456789abcdef",
    chunk_bytes=4 * 2**20,
)


def test_decisions_survive_json() -> None:
    data = json.loads(json.dumps(DECISIONS.to_json()))
    assert Decisions.from_json(data) == DECISIONS


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"node_device": [0, "1"]}, "node_device"),
        ({"node_device": [-1]}, "node_device"),
        ({"param_streamed": [1, 0]}, "param_streamed"),
        ({"param_home": "disk"}, "param_home"),
        ({"prefetch_depth": -1}, "prefetch_depth"),
        ({"prefetch_depth": 2**32}, "prefetch_depth"),
        ({"prefetch_window_bytes": 2**64}, "prefetch_window_bytes"),
        ({"prefetch_window_bytes": 1.5}, "prefetch_window_bytes"),
        ({"split": 1}, "split"),
        ({"chosen": None}, "chosen"),
        ({"chunk_bytes": -1}, "chunk_bytes"),
        ({"chunk_bytes": True}, "chunk_bytes"),
    ],
)
def test_a_bad_field_is_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Decisions.from_json({**DECISIONS.to_json(), **change})


def test_decisions_saved_before_the_chunk_size_was_recorded_read_as_unrecorded() -> None:
    data = DECISIONS.to_json()
    del data["chunk_bytes"]
    assert Decisions.from_json(data) == dataclasses.replace(DECISIONS, chunk_bytes=0)


def test_a_missing_field_is_named() -> None:
    data = DECISIONS.to_json()
    del data["param_home"]
    with pytest.raises(ValueError, match="lack param_home"):
        Decisions.from_json(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


# the first draw of a recursive strategy took 3.7 s once on a loaded 2-core machine
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([*DECISIONS.to_json(), "other"]), json_values, max_size=12))
def test_damaged_decisions_raise_only_value_error(data: dict[str, Any]) -> None:
    with contextlib.suppress(ValueError):
        Decisions.from_json({**DECISIONS.to_json(), **data})


def test_each_candidates_decisions_replay_to_its_plan(tmp_path: Path) -> None:
    model, x = mlp(256, 8), torch.randn(16, 256)
    options = {"budgets": {"cpu": 1_200_000}, "offload_dir": str(tmp_path), "plan_cache": False}
    compiled = tt.compile(model, example_inputs=(x,), compiler="eager", **options)
    (graph,) = compiled.graphs
    plan = graph.plan
    native = plan.native
    assert Decisions.of_candidate(native, native.chosen, plan.split) == Decisions.of(
        native, plan.split
    )
    devices = native_device_list(plan.devices, graph.profile, plan.cost)
    others = [c for c in native.candidates if c.feasible and c.name != native.chosen]
    assert others, [c.name for c in native.candidates]
    for candidate in others:
        decisions = Decisions.of_candidate(native, candidate.name, plan.split)
        again = replay_decisions(plan.cost, devices, graph.settings, True, decisions)
        assert again.plan_hash == candidate.plan_hash == decisions.plan_hash, candidate.name
        assert again.predicted_time_s == pytest.approx(candidate.predicted_time_s)
    with pytest.raises(KeyError, match="no candidate 'nothing'"):
        Decisions.of_candidate(native, "nothing", plan.split)
