"""``report.fidelity``: a plan's predictions against its last call."""

from __future__ import annotations

import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.report.fidelity import Comparison, compare, resource_of, union_s
from tests.models import mlp

VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def test_measured_resources_are_named_as_the_simulator_names_them() -> None:
    assert resource_of("compute cpu") == "cpu"
    assert resource_of("compute virtual:0") == "virtual:0"
    assert resource_of("h2d virtual:0") == "cpu->virtual:0"
    assert resource_of("d2h cuda:0") == "cuda:0->cpu"
    assert resource_of("copy cpu->virtual:0") == "cpu->virtual:0"
    assert resource_of("disk->cpu") == "disk->cpu"


def test_busy_time_is_the_union_of_spans() -> None:
    assert union_s([]) == 0.0
    assert union_s([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.2, 3.5)]) == pytest.approx(3.0)


def test_the_error_is_relative_to_what_was_measured() -> None:
    assert Comparison("time", 1.5, 2.0, "s").error == pytest.approx(-0.25)
    assert Comparison("time", 0.0, 0.0, "s").error == 0.0


def test_a_streaming_plan_is_compared_on_time_busy_resources_and_peak() -> None:
    model = mlp(64, 4).eval()
    x = torch.randn(4, 64)
    compiled = tt.compile(
        model,
        example_inputs=(x,),
        compiler="eager",
        virtual_devices=VIRTUAL,
        budgets={"virtual:0": "40KiB"},
    )
    (graph,) = compiled.graphs
    with torch.no_grad():
        compiled(x)
    figures = {c.what: c for c in compare(graph)}
    assert figures["time"].predicted == graph.plan.predicted_time_s
    assert figures["time"].measured == graph.last_call_s
    # the weights were copied to the device: the link was busy in the plan and in the call
    link = figures["busy cpu->virtual:0"]
    assert link.predicted > 0 and link.measured > 0
    assert figures["busy virtual:0"].measured > 0
    peak = figures["peak virtual:0"]
    assert peak.unit == "B"
    assert peak.predicted == graph.plan.predicted_peak("virtual:0")
    assert 0 < peak.measured <= 40 * 1024
