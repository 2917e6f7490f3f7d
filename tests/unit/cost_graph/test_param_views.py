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
        # its op is called where its reader runs: the reader's, costed on its device
        assert (cost.nodes[v].ops, cost.nodes[reader].ops) == (0, 2)
    # every other node runs where the plan puts it
    assert all(cost.runs_with[i] == i for i in range(len(cost.nodes)) if i not in views)
    # the form saved to a file keeps it
    saved = json.loads(json.dumps(cost.to_json()))
    assert type(cost).from_json(saved).runs_with == cost.runs_with


def test_views_and_tuple_items_move_no_bytes_and_items_call_no_op() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a, b = (x * 2).split(4, dim=1)  # split: a view op; a, b: items of its tuple
        return (a.transpose(0, 1) + b.t()).exp()

    ((gm, inputs),) = capture(f, torch.randn(8, 8))
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    by_target: dict[str, list[int]] = {}
    for i, n in enumerate(cost.nodes):
        by_target.setdefault(n.target.split(".")[0], []).append(i)
    for name in ("split", "transpose", "t"):
        for i in by_target[name]:
            node = cost.nodes[i]
            assert (node.bytes_accessed, node.ops) == (0, 1), (name, node)
    for i in by_target["getitem"]:
        assert (cost.nodes[i].bytes_accessed, cost.nodes[i].ops) == (0, 0)
    (mul,) = by_target["mul"]
    assert cost.nodes[mul].bytes_accessed == 2 * 8 * 8 * 4 and cost.nodes[mul].ops == 1
    assert all(n.ops == 0 for n in cost.nodes if n.is_graph_input)
    # a cost graph saved before ops were counted reads with the rule it was planned with
    saved = json.loads(json.dumps(cost.to_json()))
    for node in saved["nodes"]:
        del node["ops"]
    old = type(cost).from_json(saved)
    assert [n.op_count for n in old.nodes] == [
        int(n.flops > 0 or n.bytes_accessed > 0) for n in cost.nodes
    ]
