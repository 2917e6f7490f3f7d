"""The pass over the functional graph before it is costed: each view of a parameter that
several nodes read is copied, one copy per reader, so that a view can be taken where it is
read (a view is free where its parameter is; passed from a device to another it would
copy the parameter's bytes; see ``CostGraph.runs_with``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch.fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from ..cost_graph import param_view_nodes
from .logged import dump


class OneReaderPerParamView(PassBase):
    """The pass; ``params`` are the positions and fqns of the graph's parameter inputs."""

    def __init__(self, params: Mapping[int, str]) -> None:
        self.params = params

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        views = param_view_nodes(graph_module, self.params)
        copied = [n for n in views if len(n.users) > 1]
        if not copied:
            return PassResult(graph_module, False)
        dump("param_views", "before", graph_module)
        graph = graph_module.graph
        for node in reversed(list(graph.nodes)):
            if node not in views or len(node.users) < 2:
                continue
            for user in list(node.users)[1:]:
                with graph.inserting_before(user):
                    copy = graph.node_copy(node)
                user.replace_input_with(node, copy)
        graph.lint()
        graph_module.recompile()
        dump("param_views", "after", graph_module)
        return PassResult(graph_module, True)
