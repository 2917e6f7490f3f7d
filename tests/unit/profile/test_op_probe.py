"""The host's fixed cost by op (``measure.OpProbe._each_op``): each op timed alone, scaled
to the graph's time."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tensortorrent_dynamo.compiling.direct import direct_calls
from tensortorrent_dynamo.cost_graph import op_name
from tensortorrent_dynamo.profile import measure


def _graph() -> tuple[torch.fx.GraphModule, dict[str, str], list[torch.Tensor]]:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).view(-1)

    args = [torch.randn(256, 256), torch.randn(256, 256)]
    gm = make_fx(f)(*args)
    names = {n.name: op_name(n) for n in gm.graph.nodes if n.op == "call_function"}
    return direct_calls(gm), names, args


def test_each_op_is_scaled_so_that_the_graph_adds_up_to_its_time() -> None:
    """One op a kind: the figures add up to the time per call given (whatever it is), in
    the proportions of the ops alone (a 256-wide matmul costs more than a view), and the
    method says the factor."""
    graph, names, args = _graph()
    probe = measure.OpProbe("cpu", measure.BUDGETS["quick"])
    figures = probe._each_op(graph, args, names, per_call=1e-3)
    assert set(figures) == {"mm.default", "relu.default", "view.default"}
    total = sum(f.value for f in figures.values() if f.value is not None)
    assert abs(total - 1e-3) < 1e-9, figures
    values = {k: f.value for k, f in figures.items()}
    assert values["mm.default"] > values["view.default"], values
    assert "timed in a loop of its own" in figures["mm.default"].method
    assert "scaled so that the graph's ops add up to its time per call (x" in (
        figures["view.default"].method
    )
