"""The pass that writes state in place again: in the functional graph, a static KV cache's
update is ``index_copy(cache, dim, positions, new)``, a whole new cache each call, that
AOTAutograd's wrapper then copies back into the cache. Where the cache's only reader is
that update, the update is made ``index_copy_`` on the cache itself: no second cache in
memory, no copy of it per call (the wrapper's copy of a tensor onto itself is a no-op).
Inductor does the same (its reinplacing pass); the graphs the backend runs eager need it
too.

Run after costing's view pass and before costing: the cost graph marks each such update
(``StateRef.in_place``), and the planner then counts no memory for it where the state is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from ..cost_graph import IN_PLACE_OF
from .logged import dump


def _in_place_variant(target: object) -> torch._ops.OpOverload | None:
    """``aten.foo_.overload`` for ``aten.foo.overload``, when it exists."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    packet = getattr(torch.ops.aten, target._opname + "_", None)
    variant = getattr(packet, target._overloadname, None) if packet is not None else None
    return variant if isinstance(variant, torch._ops.OpOverload) else None


def _same_layout(a: object, b: object) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.stride() == b.stride()
        and a.device == b.device
    )


class StateInPlace(PassBase):
    """The pass; ``state`` is :attr:`functional.GraphInputs.state` (placeholder, index of
    the output that is its new value, source)."""

    def __init__(self, state: Sequence[tuple[str, int, str]]) -> None:
        self.state = state

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        output = next(n for n in graph.nodes if n.op == "output")
        (results,) = output.args
        values = results if isinstance(results, (tuple, list)) else (results,)
        updates: list[tuple[torch.fx.Node, torch._ops.OpOverload, str]] = []
        for name, k, _ in self.state:
            state = placeholders.get(name)
            new = values[k] if k < len(values) else None
            if state is None or not isinstance(new, torch.fx.Node) or new.op != "call_function":
                continue
            in_place = _in_place_variant(new.target)
            before, readers = state.meta.get("val"), list(state.users)
            if (
                in_place is None
                or not new.args
                or new.args[0] is not state
                or readers != [new]
                or not _same_layout(before, new.meta.get("val"))
            ):
                continue
            updates.append((new, in_place, name))
        if not updates:
            return PassResult(graph_module, False)
        dump("state_in_place", "before", graph_module)
        for node, in_place, name in updates:
            node.target = in_place
            node.meta[IN_PLACE_OF] = name
        graph.lint()
        graph_module.recompile()
        dump("state_in_place", "after", graph_module)
        return PassResult(graph_module, True)


def copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with a graph of its own (the nodes' meta shared), for a pass to
    change while the original is kept."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)
