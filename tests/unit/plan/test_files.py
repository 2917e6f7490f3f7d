"""``plan.files``: a saved plan holds each graph's decisions in the plan cache's form, keyed by
the hash of the graph as traced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tensortorrent_dynamo.cost_graph import build_cost_graph
from tensortorrent_dynamo.errors import PlanFormatError, StalePlanError
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.passes.chunk_weights import chunk_weights
from tensortorrent_dynamo.plan import files
from tensortorrent_dynamo.plan.decisions import Decisions
from tensortorrent_dynamo.plan.planner import GraphPlan, Split, plan_graph
from tensortorrent_dynamo.profile import HostProfile, host_profile
from tensortorrent_dynamo.settings import Settings, parse_options


def _split_plan() -> tuple[GraphPlan, HostProfile, Settings]:
    """A plan the host budget forced onto disk, in row chunks."""
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    ((gm, inputs),) = capture(model, torch.randn(2, 256))
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    chunked = chunk_weights(gm, inputs.values, cost, 64 * 1024, inputs.params)
    assert chunked is not None and chunked.cost is not None
    settings = parse_options(compiler="eager", budgets={"cpu": "320KiB"})
    profile = host_profile(settings)
    plan = plan_graph(
        0, cost, profile, settings, {}, split=Split(chunked.cost, chunked.rows(), 64 * 1024)
    )
    assert plan.split
    return plan, profile, settings


def test_a_saved_plan_is_keyed_by_the_traced_graph_and_holds_its_decisions(
    tmp_path: Path,
) -> None:
    plan, profile, settings = _split_plan()
    path = tmp_path / "plan.json"
    files.save(path, [plan], profile, settings.to_options(), "explained")
    data = json.loads(path.read_text())
    assert data["format_version"] == files.PLAN_FORMAT_VERSION == 2
    (record,) = data["graphs"]
    assert record["graph_hash"] == plan.traced.digest() != plan.cost.digest()
    assert record["residency"][plan.cost.params[0].fqn]["tier"] == "disk"
    saved = files.load(path)
    assert saved.explain == "explained"
    decisions = saved.check(plan.traced, profile)
    assert decisions == Decisions.of(plan.native, split=True, chunk_bytes=64 * 1024)
    assert decisions.chunk_bytes == plan.chunk_bytes == 64 * 1024  # replayed in that size
    with pytest.raises(StalePlanError, match="no plan for this graph"):
        saved.check(plan.cost, profile)


def test_nothing_to_save_and_damaged_decisions_are_refused(tmp_path: Path) -> None:
    plan, profile, settings = _split_plan()
    with pytest.raises(PlanFormatError, match="nothing to save"):
        files.save(tmp_path / "none.json", [], profile, {}, "")
    path = tmp_path / "plan.json"
    files.save(path, [plan], profile, settings.to_options(), "")
    data = json.loads(path.read_text())
    data["graphs"][0]["decisions"]["prefetch_depth"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFormatError, match="prefetch_depth"):
        files.load(path)
    # no temporary file is left beside the plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
