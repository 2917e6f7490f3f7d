"""The batch sweep of objective='throughput': the plan's decode step at larger batches."""

from __future__ import annotations

import torch
from torch import nn

import tensortorrent as tt
from tensortorrent_dynamo.cost_graph import build_cost_graph
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.plan.throughput import BatchPoint, batch_sweep, compute_bound_from, scaled


class Decode(nn.Module):
    """A linear layer over a token, with a static cache of batch 2 written each call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)
        self.register_buffer("keys", torch.zeros(2, 16, 64))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.keys.index_copy_(1, position, self.proj(x).unsqueeze(1))
        return self.keys.sum(1)


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 64), torch.tensor([3])


def test_scaling_grows_values_and_flops_not_parameters() -> None:
    ((gm, inputs),) = capture(Decode(), *_args())
    cost = build_cost_graph(gm, inputs.values, inputs.params, state=inputs.state)
    four = scaled(cost, 4)
    assert four.params == cost.params
    assert [n.out_bytes for n in four.nodes] == [4 * n.out_bytes for n in cost.nodes]
    assert [n.flops for n in four.nodes] == [4 * n.flops for n in cost.nodes]
    weight_reads = {
        u: sum(p.nbytes for p in cost.params if u in p.users) for u in range(len(cost.nodes))
    }
    for i, (before, after) in enumerate(zip(cost.nodes, four.nodes, strict=True)):
        grown = 4 * (before.bytes_accessed - weight_reads[i])
        assert after.bytes_accessed == weight_reads[i] + grown
    assert [r.nbytes for r in four.state] == [4 * r.nbytes for r in cost.state]


def test_the_sweep_starts_at_the_traced_batch_and_shares_the_streamed_weights() -> None:
    model = Decode()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    compiled = tt.compile(
        model,
        example_inputs=_args(),
        budgets={"virtual:0": weights // 2 + 64 * 2**10},
        virtual_devices={"virtual:0": {"flops": "1T", "bandwidth": "1GB", "latency": 1e-6}},
        devices=["virtual:0"],
        compiler="eager",
        objective="throughput",
    )
    (graph,) = compiled.graphs
    points = batch_sweep(graph.plan, graph.profile, graph.settings, factors=(1, 2, 4))
    assert [p.batch for p in points] == [2, 4, 8]
    fits = [p for p in points if p.step_s is not None]
    assert fits and fits[0].step_s == graph.plan.predicted_time_s
    # the weight is read over the link once a step whatever the batch: tokens/s grow
    rates = [p.tokens_per_s or 0.0 for p in fits]
    assert rates == sorted(rates) and (len(rates) < 2 or rates[-1] > rates[0])
    assert "throughput (this plan's decode step" in compiled.explain()


def test_compute_becomes_the_bottleneck_at_the_first_batch_a_device_is_busiest() -> None:
    points = [
        BatchPoint(1, 1.0, "disk->cpu", 0.9),
        BatchPoint(2, 1.0, "disk->cpu", 0.8),
        BatchPoint(4, 1.2, "cpu", 0.7),
        BatchPoint(8, None),
    ]
    assert compute_bound_from(points, ["cpu"]) == 4
    assert compute_bound_from(points[:2], ["cpu"]) is None
