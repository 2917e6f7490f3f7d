"""``passes.rewrite``: the plan becomes the schedule the graph runs, one runtime op per move
the plan makes."""

from __future__ import annotations

import operator
import re
from typing import Any

import pytest
import torch
from torch.fx.passes.split_module import split_module

import tensortorrent as tt
from tensortorrent_dynamo.cost_graph import build_cost_graph
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.passes.rewrite import order_by_segment, rewrite
from tensortorrent_dynamo.plan.planner import GraphPlan, plan_graph
from tensortorrent_dynamo.profile import host_profile
from tensortorrent_dynamo.run import ops
from tensortorrent_dynamo.run.residents import ResidentCopies
from tensortorrent_dynamo.run.runtime import Runtime
from tensortorrent_dynamo.run.virtual import VirtualDevice
from tensortorrent_dynamo.settings import parse_options
from tests.models import mlp

VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _rewritten(budget: str) -> tuple[Any, GraphPlan, Any, torch.nn.Module, torch.Tensor]:
    model, x = mlp(64, 4), torch.randn(4, 64)
    ((gm, inputs),) = capture(model, x)
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    settings = parse_options(
        compiler="eager", budgets={"virtual:0": budget}, virtual_devices=VIRTUAL
    )
    plan = plan_graph(0, cost, host_profile(settings), settings, {})
    virtual = {"virtual:0": VirtualDevice("virtual:0", 1 << 30)}
    runtime = Runtime(virtual, None, ResidentCopies())
    return rewrite(gm, plan, runtime), plan, inputs, model, x


def _calls(module: torch.fx.GraphModule, target: Any) -> list[torch.fx.Node]:
    return [n for n in module.graph.nodes if n.op == "call_function" and n.target is target]


def test_streamed_parameters_are_prefetched_waited_for_and_evicted_once() -> None:
    rewritten, plan, inputs, model, x = _rewritten("40KiB")
    streamed = {
        p.placeholder for p, r in zip(plan.cost.params, plan.residency, strict=True) if r.streams
    }
    resident = {
        p.placeholder
        for p, r in zip(plan.cost.params, plan.residency, strict=True)
        if not r.streams and r.device != "cpu"
    }
    assert streamed, "the budget must force streaming"
    module = rewritten.module
    prefetched = {n.args[1].name for n in _calls(module, ops.prefetch)}
    kept = {n.args[1].name for n in _calls(module, ops.resident)}
    assert prefetched == streamed and kept == resident
    # each prefetch is waited for once and evicted once, after the wait
    order = list(module.graph.nodes)
    for prefetch in _calls(module, ops.prefetch):
        (wait,) = [u for u in prefetch.users if u.target is ops.wait]
        (evict,) = [u for u in prefetch.users if u.target is ops.evict]
        assert order.index(prefetch) < order.index(wait) < order.index(evict)
    # the schedule computes what the model does
    with torch.no_grad():
        (got,) = module(*inputs.values)
        torch.testing.assert_close(got, model(x))


def test_every_segment_runs_on_its_planned_device_and_outputs_come_back() -> None:
    rewritten, plan, _, _, _ = _rewritten("1MiB")
    assert set(rewritten.segments.values()) <= {d.name for d in plan.devices}
    assert not _calls(rewritten.module, ops.prefetch)  # roomy: nothing streams
    output = next(n for n in rewritten.module.graph.nodes if n.op == "output")
    (results,) = output.args
    (value,) = results
    if "virtual:0" in rewritten.segments.values():
        # the last segment ran on the accelerator: its output is transferred back
        assert value.target is ops.transfer and value.args[2] == "cpu"
    else:
        assert value.target in (operator.getitem,) or value.op == "call_module"


class _MakesTensors(torch.nn.Module):
    """Makes tensors of its own, as a decoder does (positions, a mask's fill values)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[-1], dtype=x.dtype)
        masked = torch.where(x > 0, x, float("-inf")).clamp(min=-1.0)
        return self.proj(x + positions) + masked + torch.zeros(8)


def test_a_segment_on_cuda_makes_its_tensors_there() -> None:
    # no GPU needed: each CUDA segment runs on fake tensors, which check devices
    from tests.fake_cuda import CUDA, cuda_segments, plan_on_cuda, run_on_fake_cuda

    model, x = _MakesTensors(), torch.randn(4, 8)
    ((gm, inputs),) = capture(model, x)
    made = [n for n in gm.graph.nodes if isinstance(n.kwargs.get("device"), torch.device)]
    assert made, "the traced graph makes tensors on the host"
    rewritten = plan_on_cuda(0, gm, inputs)
    on_cuda = cuda_segments(rewritten)
    assert on_cuda, f"nothing planned on {CUDA}: {rewritten.segments}"
    for name in on_cuda:
        sub = getattr(rewritten.module, name)
        devices = {
            v for n in sub.graph.nodes for v in n.kwargs.values() if isinstance(v, torch.device)
        }
        assert devices <= {torch.device(CUDA)}, f"{name} makes tensors on {devices}"
        for out in run_on_fake_cuda(rewritten, name):
            if isinstance(out, torch.Tensor):
                assert out.device == torch.device(CUDA)


def _two_branches() -> tuple[torch.fx.GraphModule, dict[str, int]]:
    """``z = relu(a) + sin(b)`` traced with ``relu`` first, and the segments a plan that
    runs ``sin`` first gives: segment 1's first node comes before segment 0's."""

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = torch.relu(a)
        y = torch.sin(b)
        return x + y

    gm = torch.fx.symbolic_trace(f)
    return gm, {"relu": 1, "sin": 0, "add": 1}


def test_segments_are_called_in_plan_order_whatever_order_the_trace_had() -> None:
    gm, segments = _two_branches()
    a, b = torch.randn(3), torch.randn(3)

    def segment_of(node: torch.fx.Node) -> int:
        return segments[node.name]

    order_by_segment(gm, segment_of)
    assert [n.name for n in gm.graph.nodes if n.op == "call_function"] == ["sin", "relu", "add"]
    parent = split_module(gm, gm, segment_of, keep_original_order=True)
    calls = [n.target for n in parent.graph.nodes if n.op == "call_module"]
    assert calls == ["submod_0", "submod_1"]
    torch.testing.assert_close(parent(a, b), torch.relu(a) + torch.sin(b))


def test_a_plan_that_runs_an_input_after_its_user_is_refused() -> None:
    gm, segments = _two_branches()
    segments["sin"] = 2  # after ``add``, which uses it
    with pytest.raises(AssertionError, match=re.escape("runs sin (segment 2) after its user add")):
        order_by_segment(gm, lambda node: segments[node.name])


def test_a_graph_with_no_inputs_runs_on_the_accelerator() -> None:
    """A graph of constants only (gemma3 with ``output_attentions`` breaks out one) has no
    input to put the runtime's handle after: it goes first, before its users (it went
    last, and FX refused the graph)."""

    def no_inputs() -> torch.Tensor:
        return (torch.tensor([1.0, 2.0]) @ torch.ones(2, 64)).exp()

    options = {
        "compiler": "eager",
        "devices": ["virtual:0"],
        "virtual_devices": VIRTUAL,
        "budgets": {"virtual:0": "1MiB"},
    }
    compiled = torch.compile(no_inputs, backend="tensortorrent", options=options)
    with torch.no_grad():
        torch.testing.assert_close(compiled(), no_inputs())
    (graph,) = tt.tensortorrent_backend.graphs
    assert ("submod_0", "virtual:0") in graph.compilers_by_device()
