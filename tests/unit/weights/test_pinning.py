"""Host-RAM weights streamed to a CUDA device are pinned, and only those."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from tensortorrent_dynamo.cost_graph import CostGraph, build_cost_graph
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.plan.residency import Residency, Tier
from tensortorrent_dynamo.weights.pinning import pin_streamed_weights
from tests.models import mlp


def _captured() -> tuple[CostGraph, list[Any]]:
    model, x = mlp(16, 3), torch.randn(2, 16)
    ((gm, inputs),) = capture(model, x)
    return build_cost_graph(gm, inputs.values, inputs.params), list(inputs.values)


def _plan(cost: CostGraph, residency: dict[str, Residency]) -> Any:
    default = Residency("cpu", streams=False, tier=Tier.HOST)
    return types.SimpleNamespace(
        graph_index=0,
        cost=cost,
        residency=tuple(residency.get(p.fqn, default) for p in cost.params),
    )


def test_nothing_is_pinned_without_a_cuda_residency() -> None:
    cost, inputs = _captured()
    plan = _plan(
        cost,
        {
            "0.weight": Residency("virtual:0", streams=True, tier=Tier.HOST),
            "0.bias": Residency("cpu", streams=True, tier=Tier.DISK),
            "2.weight": Residency("virtual:0", streams=False, tier=Tier.HOST),
        },
    )
    assert not any(r.pinned for r in plan.residency)
    ptrs = [t.data_ptr() for t in inputs]
    assert pin_streamed_weights(plan, inputs) == 0
    assert [t.data_ptr() for t in inputs] == ptrs
    if torch.cuda.is_available():
        assert not any(t.is_pinned() for t in inputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_only_host_weights_streamed_to_cuda_are_pinned_once() -> None:
    cost, inputs = _captured()
    residency = {
        "0.weight": Residency("cuda:0", streams=True, tier=Tier.HOST),  # pinned
        "2.weight": Residency("cuda:0", streams=True, tier=Tier.HOST),  # pinned
        "0.bias": Residency("cuda:0", streams=False, tier=Tier.HOST),  # resident there
        "2.bias": Residency("cuda:0", streams=True, tier=Tier.DISK),  # read from disk
        "4.weight": Residency("virtual:0", streams=True, tier=Tier.HOST),  # not CUDA
    }
    plan = _plan(cost, residency)
    tensors = {p.fqn: inputs[p.arg_index] for p in cost.params}
    values = {k: t.detach().clone() for k, t in tensors.items()}
    ids = {k: id(t) for k, t in tensors.items()}

    assert pin_streamed_weights(plan, inputs) == 2

    for fqn, tensor in tensors.items():
        assert id(tensor) == ids[fqn]  # the same object: Dynamo's guards still hold
        assert tensor.device.type == "cpu"
        assert tensor.is_pinned() is (fqn in ("0.weight", "2.weight")), fqn
        assert torch.equal(tensor.detach(), values[fqn]), fqn
    assert pin_streamed_weights(plan, inputs) == 0  # already pinned
