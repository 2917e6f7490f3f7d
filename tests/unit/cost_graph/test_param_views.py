"""Views of parameters in the functional graph (``t(weight)`` before a matmul) are taken
where they are read: free there, never passed between segments."""

from __future__ import annotations

import json

import torch
from torch import nn

from tensortorrent_dynamo.cost_graph import build_cost_graph
from tensortorrent_dynamo.functional import capture


class _Shared(nn.Module):
    """One linear layer applied twice: its ``t(weight)`` has two readers."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.proj(x)))


def test_a_view_of_a_parameter_runs_with_its_one_reader_and_costs_nothing() -> None:
    ((gm, inputs),) = capture(_Shared(), torch.randn(4, 16))
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    names = [n.name for n in cost.nodes]
    views = [i for i, n in enumerate(cost.nodes) if n.target.startswith("t.")]
    assert len(views) == 2, f"one t(weight) per reader: {names}"
    weight = next(p for p in cost.params if p.fqn == "proj.weight")
    for v in views:
        reader = cost.runs_with[v]
        assert reader != v and cost.nodes[reader].target.startswith("addmm")
        assert cost.nodes[v].out_bytes == 0 and cost.nodes[v].bytes_accessed == 0
        assert reader in weight.users and v not in weight.users
    # every other node runs where the plan puts it
    assert all(cost.runs_with[i] == i for i in range(len(cost.nodes)) if i not in views)
    # the form saved to a file keeps it
    saved = json.loads(json.dumps(cost.to_json()))
    assert type(cost).from_json(saved).runs_with == cost.runs_with
