"""The module a node was traced in, from Dynamo's record of it, as the model names it."""

from __future__ import annotations

import pytest
import torch
import torch.fx

from tensortorrent_dynamo.cost_graph import module_path


def _node(path: str | None) -> torch.fx.Node:
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    if path is not None:
        node.meta["nn_module_stack"] = {"outer": ("L['self']", object), "inner": (path, object)}
    return node


@pytest.mark.parametrize(
    ("recorded", "named"),
    [
        ("L['self'].layers[3].mlp", "layers.3.mlp"),
        ("L['args'][0].lm_head", "lm_head"),
        ("L['self']._modules['model']._modules['layers']._modules['0']", "model.layers.0"),
        ("L['self'].__dict__['_modules']['blocks']['0'].attn", "blocks.0.attn"),
        ("L['mod'].experts['a'].w1", "experts.a.w1"),
        ("L['self']", ""),
        (None, ""),
    ],
)
def test_a_recorded_module_is_named_as_the_model_names_it(recorded: str | None, named: str) -> None:
    assert module_path(_node(recorded)) == named
