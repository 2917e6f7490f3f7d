"""``run.ops``: which rewritten graphs are called as their one segment (``direct_segment``)."""

from __future__ import annotations

import torch
import torch.fx

import tensortorrent as tt
from tensortorrent_dynamo.run.ops import Segment, direct_segment
from tensortorrent_dynamo.run.record import Recorder
from tests.models import mlp


def test_a_plan_of_one_host_segment_is_called_as_that_segment() -> None:
    model = mlp(16, 3).eval()
    x = torch.randn(4, 16)
    compiled = tt.compile(model, example_inputs=(x,), compiler="eager")
    (graph,) = compiled.graphs
    assert graph.direct is not None, graph.module.code
    segment, _ = graph.direct
    assert isinstance(segment, Segment)
    calls = []
    real = segment.forward
    segment.forward = lambda *args: calls.append(len(args)) or real(*args)  # type: ignore[method-assign]
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert calls, "the call went around the segment"
    # the measured span of the direct call is still recorded (explain's measured column)
    assert [e.label for e in graph.runtime.recorder.events] == [segment.name]
    # a hook on the segment (verify records outputs with them) still runs
    seen = []
    hook = segment.register_forward_hook(lambda *_: seen.append(True))
    with torch.no_grad():
        compiled(x)
    hook.remove()
    assert seen == [True]


def test_a_plan_that_streams_is_not_called_directly() -> None:
    model = mlp(64, 4).eval()
    x = torch.randn(4, 64)
    compiled = tt.compile(
        model,
        example_inputs=(x,),
        compiler="eager",
        virtual_devices={"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}},
        budgets={"virtual:0": "40KiB"},
    )
    (graph,) = compiled.graphs
    assert direct_segment(graph.module) is None
    assert graph.direct is None
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def _parent(order: tuple[int, int], wrap: bool) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    inputs = graph.placeholder("a"), graph.placeholder("b")
    call = graph.call_module("submod_0", tuple(inputs[i] for i in order))
    graph.output((call,) if wrap else call)
    root = torch.nn.Module()
    root.submod_0 = Segment(lambda x, y: x, "submod_0", "cpu", None, "eager", Recorder())
    return torch.fx.GraphModule(root, graph)


def test_only_a_graph_that_passes_its_inputs_straight_on_is_direct() -> None:
    assert direct_segment(_parent((1, 0), wrap=True)) is None
    straight = _parent((0, 1), wrap=False)
    assert direct_segment(straight) == (straight.submod_0, False)
    wrapped = _parent((0, 1), wrap=True)
    assert direct_segment(wrapped) == (wrapped.submod_0, True)
