"""``plan.planner.plan_graph``: one native call decides every parameter's device, streaming
and tier; the split graph is planned when the host cannot hold the weights; recorded
decisions replay to the same plan."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tensortorrent_dynamo.cost_graph import CostGraph, build_cost_graph
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.passes.chunk_weights import chunk_weights
from tensortorrent_dynamo.plan.decisions import Decisions
from tensortorrent_dynamo.plan.planner import GraphPlan, Split, plan_graph
from tensortorrent_dynamo.plan.residency import Tier
from tensortorrent_dynamo.profile import host_profile
from tensortorrent_dynamo.settings import parse_options
from tests.models import mlp

VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _graph(model: nn.Module, x: torch.Tensor) -> tuple[Any, Any, CostGraph]:
    ((gm, inputs),) = capture(model, x)
    return gm, inputs, build_cost_graph(gm, inputs.values, inputs.params)


def _plan(cost: CostGraph, split: Split | None = None, **options: Any) -> GraphPlan:
    settings = parse_options(compiler="eager", **options)
    return plan_graph(0, cost, host_profile(settings), settings, {}, split=split)


def test_each_parameter_gets_one_residency_from_the_native_plan() -> None:
    _, _, cost = _graph(mlp(64, 4), torch.randn(4, 64))
    plan = _plan(cost, budgets={"virtual:0": "40KiB"}, virtual_devices=VIRTUAL)
    native = plan.native
    assert len(plan.residency) == len(cost.params)
    for i, r in enumerate(plan.residency):
        assert r.device == plan.devices[native.param_device[i]].name
        assert r.streams is native.param_streamed[i]
        assert r.tier is Tier.HOST and r.rows is None
    # a budget below the weights: some stream, and only those evict
    assert any(r.streams for r in plan.residency) and not plan.split


def test_the_split_graph_is_planned_only_when_the_host_cannot_hold_the_weights() -> None:
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    gm, inputs, cost = _graph(model, torch.randn(2, 256))
    chunked = chunk_weights(gm, inputs.values, cost, 64 * 1024, inputs.params)
    assert chunked is not None and chunked.cost is not None
    split = Split(chunked.cost, chunked.rows(), 64 * 1024)

    roomy = _plan(cost, split, budgets={"cpu": "1GiB"})
    assert not roomy.split and roomy.cost is cost and roomy.traced is cost
    assert all(r.tier is Tier.HOST for r in roomy.residency)

    # 512 KiB of weights, a host budget of 320 KiB: some weights live on disk
    tight = _plan(cost, split, budgets={"cpu": "320KiB"})
    assert tight.split and tight.cost is chunked.cost and tight.traced is cost
    assert all(r.tier is Tier.DISK for r in tight.residency)
    rows = [r.rows for r in tight.residency]
    assert (0, 64) in rows and None in rows  # weights in chunks of 64 rows; biases whole
    assert any(r.streams for r in tight.residency)


def test_recorded_decisions_replay_to_the_same_plan_without_searching() -> None:
    _, _, cost = _graph(mlp(64, 4), torch.randn(4, 64))
    options: dict[str, Any] = {"budgets": {"virtual:0": "40KiB"}, "virtual_devices": VIRTUAL}
    searched = _plan(cost, **options)
    decisions = Decisions.of(searched.native, searched.split)
    settings = parse_options(compiler="eager", **options)
    replayed = plan_graph(0, cost, host_profile(settings), settings, {}, decisions=decisions)
    assert replayed.plan_hash == searched.plan_hash
    assert replayed.residency == searched.residency
    assert replayed.native.stop_reason.startswith("replayed")


def test_decisions_of_another_plan_are_searched_again(caplog: pytest.LogCaptureFixture) -> None:
    _, _, cost = _graph(mlp(64, 4), torch.randn(4, 64))
    options: dict[str, Any] = {"budgets": {"virtual:0": "40KiB"}, "virtual_devices": VIRTUAL}
    searched = _plan(cost, **options)
    wrong = Decisions.of(searched.native, searched.split)
    wrong = Decisions(**{**wrong.__dict__, "plan_hash": "f" * 16})
    settings = parse_options(compiler="eager", **options)
    with caplog.at_level("WARNING"):
        again = plan_graph(0, cost, host_profile(settings), settings, {}, decisions=wrong)
    assert "replay to plan" in caplog.text and "searching" in caplog.text
    assert again.plan_hash == searched.plan_hash
    assert not again.native.stop_reason.startswith("replayed")


def test_the_plan_cache_replays_what_it_stored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TENSORTORRENT_CACHE_DIR", str(tmp_path))
    _, _, cost = _graph(mlp(64, 4), torch.randn(4, 64))
    options: dict[str, Any] = {
        "budgets": {"virtual:0": "40KiB"},
        "virtual_devices": VIRTUAL,
        "plan_cache": True,
    }
    first = _plan(cost, **options)
    with caplog.at_level("INFO", logger="tensortorrent_dynamo"):
        second = _plan(cost, **options)
    assert "taken from the plan cache, search skipped" in caplog.text
    assert second.plan_hash == first.plan_hash
    # another search option is another entry: searched, not replayed
    caplog.clear()
    with caplog.at_level("INFO", logger="tensortorrent_dynamo"):
        _plan(cost, **options, memory_slack=0.2)
    assert "plan cache" not in caplog.text
