"""Graphs that write their inputs: each write lands once, on the model's own tensor,
whatever device the plan runs the writing op on (the functional graph returns the new
values and they are copied back after the call)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from tests.models import param_bytes


class _Writes(nn.Module):
    """A train-mode BatchNorm (running statistics and a counter), a cache written one row
    per call at a position it keeps, and a counter: the writes of a KV cache and of
    BatchNorm, in one graph."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(width, 128)
        self.mid = nn.Sequential(*(nn.Linear(128, 128) for _ in range(3)))
        self.norm = nn.BatchNorm1d(128)
        self.register_buffer("cache", torch.zeros(8, 128))
        self.register_buffer("pos", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(self.mid(torch.relu(self.inp(x))))
        self.cache.index_copy_(0, (self.pos % 8).reshape(1), y[:1])
        self.pos.add_(1)
        return y, self.cache.sum(0)


def _options(budget: int | None) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "devices": ["virtual:0"],
        "virtual_devices": {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}},
        "compiler": "eager",
    }
    if budget is None:
        opts["virtual_devices"]["virtual:0"]["capacity"] = "1GiB"
    else:
        opts["budgets"] = {"virtual:0": budget}
    return opts


@pytest.mark.parametrize("budget", ["none", "streamed"])
def test_buffers_written_by_the_graph_equal_eagers_after_every_call(budget: str) -> None:
    torch.manual_seed(0)
    model = _Writes().train()
    reference = copy.deepcopy(model)
    limit = None if budget == "none" else int(param_bytes(model) * 0.65)  # streams some
    compiled = torch.compile(model, backend="tensortorrent", options=_options(limit))
    with torch.no_grad():
        for i, batch in enumerate((4, 4, 6, 6, 4)):
            x = torch.randn(batch, 64)
            got, expected = compiled(x), reference(x)
            torch.testing.assert_close(got, expected)
            # compile plus the first call wrote each buffer exactly once
            assert int(model.pos) == i + 1 == int(model.norm.num_batches_tracked)
            for (name, mine), (_, theirs) in zip(
                model.named_buffers(), reference.named_buffers(), strict=True
            ):
                torch.testing.assert_close(mine, theirs, msg=name)
    from tensortorrent_dynamo import tensortorrent_backend

    graphs = tensortorrent_backend.graphs
    if budget == "streamed":
        assert any(any(g.plan.native.param_streamed) for g in graphs)
    for g in graphs:  # a written buffer is an input the plan moves, not a resident copy
        fqns = {p.fqn for p in g.plan.cost.params}
        assert not fqns & {"cache", "pos", "norm.running_mean", "norm.num_batches_tracked"}
