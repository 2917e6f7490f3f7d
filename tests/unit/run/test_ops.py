"""``run.ops``: which rewritten graphs are called as their one segment (``direct_segment``)."""

from __future__ import annotations

import torch
import torch.fx

import tensortorrent as tt
from tensortorrent_dynamo.run.ops import DirectCall, Segment, direct_segment
from tensortorrent_dynamo.run.record import Recorder
from tests.models import mlp


def test_a_plan_of_one_host_segment_is_called_as_that_segment() -> None:
    model = mlp(16, 3).eval()
    x = torch.randn(4, 16)
    compiled = tt.compile(model, example_inputs=(x,), compiler="eager")
    (graph,) = compiled.graphs
    assert graph.direct is not None, graph.module.code
    segment = graph.direct.segment
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


def _parent(order: tuple[int, ...], wrap: bool) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    inputs = graph.placeholder("a"), graph.placeholder("b"), graph.placeholder("c")
    call = graph.call_module("submod_0", tuple(inputs[i] for i in order))
    graph.output((call,) if wrap else call)
    root = torch.nn.Module()
    root.submod_0 = Segment(lambda *xs: xs, "submod_0", "cpu", None, "eager", Recorder())
    return torch.fx.GraphModule(root, graph)


def test_a_graph_that_passes_its_inputs_straight_on_is_called_as_its_segment() -> None:
    straight = _parent((0, 1, 2), wrap=False)
    assert direct_segment(straight) == DirectCall(straight.submod_0, None, wrapped=False)
    wrapped = _parent((0, 1, 2), wrap=True)
    assert direct_segment(wrapped) == DirectCall(wrapped.submod_0, None, wrapped=True)
    # inputs in another order, or not all of them: the segment gets them as the graph would
    for order in ((2, 0, 1), (1,), (2, 2)):
        for wrap in (False, True):
            parent = _parent(order, wrap)
            direct = direct_segment(parent)
            assert direct == DirectCall(parent.submod_0, order, wrapped=wrap)
            args = ("a", "b", "c")
            assert direct(args) == parent(*args)


def test_a_graph_doing_more_than_calling_its_segment_is_not_direct() -> None:
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    doubled = graph.call_function(torch.mul, (a, 2))
    graph.output(graph.call_module("submod_0", (doubled,)))
    root = torch.nn.Module()
    root.submod_0 = Segment(lambda x: x, "submod_0", "cpu", None, "eager", Recorder())
    assert direct_segment(torch.fx.GraphModule(root, graph)) is None


def test_a_real_model_of_one_host_segment_is_called_as_that_segment() -> None:
    from tests.integration.corpus.models import BY_NAME

    entry = BY_NAME["llama"]
    model = entry.build().eval()
    inputs = entry.inputs(0)
    compiled = tt.compile(model, compiler="eager")
    with torch.no_grad():
        out = compiled(**inputs)
        expected = model(**inputs)
    torch.testing.assert_close(out.logits, expected.logits)
    (graph,) = compiled.graphs
    assert graph.direct is not None, graph.module.code
    # its segment took the graph's inputs in another order in a process that compiled it
    # first, and in order after another compile: it is called directly either way
