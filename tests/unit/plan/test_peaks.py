"""What a device holds at its peak, by name: a refusal says it for each device it needs more
of (the weights kept and streamed, the values live, and the one piece no plan can make
smaller), and a plan for each of its devices."""

from __future__ import annotations

from typing import Any

import expecttest
import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.plan.peaks import named_peaks
from tensortorrent_dynamo.units import format_bytes
from tests.models import mlp

VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _options(budget: str) -> dict[str, Any]:
    return {
        "budgets": {"virtual:0": budget, "cpu": "16GiB"},
        "virtual_devices": VIRTUAL,
        "devices": ["virtual:0"],
        "compiler": "eager",
    }


def _refusal(batch: int, budget: str) -> tt.PlanInfeasible:
    torch._dynamo.reset()
    model = mlp(64, 3)
    with pytest.raises(tt.PlanInfeasible) as caught:
        tt.compile(model, example_inputs=(torch.randn(batch, 64),), **_options(budget))
    return caught.value


def _param_bytes() -> dict[str, int]:
    return {n: p.numel() * p.element_size() for n, p in mlp(64, 3).named_parameters()}


class TestRefusal(expecttest.TestCase):
    def test_weights_streamed_whole_say_so(self) -> None:
        error = _refusal(4, "1KiB")
        self.assertExpectedInline(
            str(error),
            """no candidate plan fits the memory budgets (closest: all-on-virtual:0/streamed): virtual:0 needs at least 35.50 KiB (budget is 1.00 KiB). To fix it, raise the budget of virtual:0, allow host compute, or add a device. virtual:0's peak of 35.50 KiB comes when relu (1) allocates its output; it then holds 32.50 KiB of streamed weights (0.weight 16.00 KiB, 2.weight 16.00 KiB, 0.bias 256 B, 1 more 256 B); 3.00 KiB of activations (input arg2_1 1.00 KiB, addmm (0) 1.00 KiB, relu (1) 1.00 KiB). 0.weight alone (16.00 KiB) is more than the budget of virtual:0 (1.00 KiB): a weight is copied to a device whole.""",  # noqa: E501
        )

    def test_a_large_batch_says_its_values(self) -> None:
        error = _refusal(512, "60KiB")
        (peak,) = error.peaks
        assert [name for name, _ in peak.activations] == ["input arg2_1", "addmm (0)", "relu (1)"]
        assert all(size == 512 * 64 * 4 for _, size in peak.activations)
        assert str(error).endswith(
            "input arg2_1 alone (128.00 KiB) is more than the budget of virtual:0 (60.00 KiB): "
            "a value is made whole (a smaller batch or input makes it smaller)."
        )


def test_the_peak_is_the_need_and_its_pieces_add_up_to_it() -> None:
    error = _refusal(4, "1KiB")
    (peak,) = error.peaks
    assert peak.device == "virtual:0"
    assert peak.bytes == error.min_budgets["virtual:0"]
    pieces = [*peak.resident, *peak.streamed, *peak.reading, *peak.activations]
    assert sum(size for _, size in pieces) == peak.bytes
    weights = _param_bytes()
    assert not peak.resident, "nothing fits: every weight streams"
    assert all(weights[name] == size for name, size in peak.streamed)
    assert peak.reached_by == "relu (1) allocates its output"


def test_a_budget_between_no_piece_is_too_large_alone() -> None:
    # larger than every weight and value, smaller than what two layers need at once
    error = _refusal(4, "20KiB")
    assert error.peaks and "alone" not in str(error)


def test_a_plan_says_what_its_peaks_hold() -> None:
    torch._dynamo.reset()
    model, x = mlp(64, 3), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **_options("40KiB"))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    (graph,) = compiled.graphs
    plan = graph.plan
    weights = _param_bytes()
    for peak, predicted in zip(plan.peaks, plan.native.peak_bytes, strict=True):
        assert peak.bytes == predicted
        pieces = [*peak.resident, *peak.streamed, *peak.reading, *peak.activations]
        assert sum(size for _, size in pieces) == peak.bytes
        assert all(weights[name] == size for name, size in [*peak.resident, *peak.streamed])
    (virtual,) = [p for p in plan.peaks if p.device == "virtual:0"]
    assert virtual.streamed, "40 KiB holds two of the three layers: some weight streams"
    assert f"virtual:0's peak of {format_bytes(virtual.bytes)}" in compiled.explain()


def test_a_peak_reached_by_a_copy_says_it_arrives() -> None:
    """A peak the arrival of a value's copy makes (from another device: to be used there, or
    as an output) names the copy, not the node, which runs elsewhere."""
    torch._dynamo.reset()
    model, x = mlp(64, 3), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **_options("40KiB"))
    (graph,) = compiled.graphs
    cost = graph.plan.cost
    relu = next(i for i, n in enumerate(cost.nodes) if n.name == "relu")
    raw = (0, 1024, [], [("value", relu, 1024)], ("copy", relu))
    (peak,) = named_peaks(cost, ["virtual:0"], [raw])
    assert peak.reached_by == "a copy of relu (1) arrives from another device"
    assert peak.activations == (("relu (1)", 1024),)
