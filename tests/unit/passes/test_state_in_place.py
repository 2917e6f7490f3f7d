"""The state pass: a KV cache's functional update written into the cache again, where the
update is the cache's only reader (and not where the old value is read too)."""

from __future__ import annotations

import torch
from torch import nn

from tensortorrent_dynamo.cost_graph import build_cost_graph
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.passes.state_in_place import StateInPlace, copy_module

aten = torch.ops.aten


class Cache(nn.Module):
    """A static cache written at ``positions`` each call; with ``reads_old``, the value
    before the write is read too."""

    def __init__(self, reads_old: bool = False) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, 8, 4))
        self.reads_old = reads_old

    def forward(self, positions: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        old = self.keys.sum() if self.reads_old else 0.0
        self.keys.index_copy_(2, positions, new)
        return self.keys.sum(-1) + old


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([1, 2]), torch.ones(1, 2, 2, 4)


def _updates(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if "index_copy" in str(n.target)]


def test_the_only_reader_of_a_cache_writes_into_it_and_the_cost_graph_says_so() -> None:
    ((gm, inputs),) = capture(Cache(), *_args())
    (state,) = inputs.state
    assert "keys" in state[2], "the buffer's name, as the caller knows it"
    assert _updates(gm) == [aten.index_copy.default]
    original = copy_module(gm)
    assert StateInPlace(inputs.state)(gm).modified
    assert _updates(gm) == [aten.index_copy_.default]
    assert _updates(original) == [aten.index_copy.default], "the copy kept the functional op"

    cost = build_cost_graph(gm, inputs.values, inputs.params, state=inputs.state)
    (ref,) = cost.state
    assert ref.in_place and "keys" in ref.source and ref.nbytes == 1 * 2 * 8 * 4 * 4
    assert cost.nodes[ref.input].is_graph_input and ref.output in cost.output_ids

    # run on real tensors: the cache itself is written, and is the value returned for it
    cache = torch.zeros(1, 2, 8, 4)
    values = [cache if i == 0 else v for i, v in enumerate(inputs.values)]
    out = gm(*values)
    assert out[0] is cache and cache[0, :, 1:3].eq(1).all() and cache[0, :, 0].eq(0).all()


def test_a_cache_whose_old_value_is_read_keeps_its_functional_update() -> None:
    ((gm, inputs),) = capture(Cache(reads_old=True), *_args())
    assert inputs.state
    assert not StateInPlace(inputs.state)(gm).modified
    assert _updates(gm) == [aten.index_copy.default]
    cost = build_cost_graph(gm, inputs.values, inputs.params, state=inputs.state)
    assert [r.in_place for r in cost.state] == [False]
