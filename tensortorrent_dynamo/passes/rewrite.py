"""Turn a plan into an FX graph: per-segment submodules joined by runtime ops.

The parent graph calls each segment's submodule in order and, between them,
``transfer`` (activations changing device), ``resident`` (parameters kept on a
device), ``prefetch``/``wait``/``evict`` (streamed parameters, double-buffered:
each streamed parameter is prefetched when the segment the plan names starts) and
``spill``/``landed``/``reload``/``wait`` (activations the plan sends to host memory
between their producing segment and their next use; the device goes past their last use
before the gap only once the copy out has landed) and ``state`` (an input the graph writes in
place, such as a KV cache buffer, held on the device the plan keeps it on; its new value
goes back there, not to the host).

A segment makes its own tensors (``arange``, ``full``, ``scalar_tensor``, a ``_to_copy``)
on the device it runs on (:func:`make_on`): the graph was traced where the model's tensors
were, so a position index or a mask fill value traced on the host would otherwise be made
there, next to inputs on an accelerator.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from ..plan.planner import GraphPlan, Stay
from ..run import ops
from ..run.runtime import Runtime, torch_device
from .logged import dump

log = logging.getLogger(__name__)

# node.meta key: the node's name in the graph as planned (segments name their nodes afresh)
SOURCE_NAME = "tensortorrent_source_name"


@dataclasses.dataclass(frozen=True)
class Rewritten:
    """The parent module and, per segment, its submodule name and device."""

    module: torch.fx.GraphModule
    segments: dict[str, str]


def _segment_of(name: str) -> int:
    return int(name.removeprefix("submod_"))


def order_by_segment(gm: torch.fx.GraphModule, segment_of: Callable[[torch.fx.Node], int]) -> None:
    """Reorder ``gm``'s computing nodes as the plan runs them: segment by segment, each
    segment's nodes in their traced order.

    ``split_module`` calls the segments in the order their first nodes come in the graph.
    The planner may order independent branches otherwise than the trace did (CLIP's text
    and vision towers), so that a later segment's node comes before an earlier segment's;
    the later segment would then be called before the one that makes its inputs. The
    order stays topological: no node's segment comes before a segment of its inputs.
    """
    graph = gm.graph
    (output,) = graph.find_nodes(op="output")
    computing = [n for n in graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    for node in computing:
        for source in node.all_input_nodes:
            if source.op not in ("placeholder", "get_attr") and (
                segment_of(source) > segment_of(node)
            ):
                raise AssertionError(
                    f"the plan runs {source.name} (segment {segment_of(source)}) after its "
                    f"user {node.name} (segment {segment_of(node)})"
                )
    for node in sorted(computing, key=segment_of):  # stable: traced order within a segment
        output.prepend(node)
    graph.lint()
    gm.recompile()


def _reorder(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> None:
    """Put ``gm``'s nodes, all of ``nodes`` (in a topological order), in that order."""
    (output,) = gm.graph.find_nodes(op="output")
    for node in nodes:
        if node is not output:
            output.prepend(node)
    gm.graph.lint()
    gm.recompile()


def rewrite(gm: torch.fx.GraphModule, plan: GraphPlan, runtime: Runtime) -> Rewritten:
    """Split ``gm`` by the plan's segments and insert the data movement the plan needs."""
    dump("rewrite", "before", gm)
    cost = plan.cost
    node_id = {n.name: i for i, n in enumerate(cost.nodes)}
    for node in gm.graph.nodes:
        node.meta[SOURCE_NAME] = node.name

    def segment_of(node: torch.fx.Node) -> int:
        return plan.node_segment(node_id[node.name])

    traced = list(gm.graph.nodes)
    order_by_segment(gm, segment_of)
    parent = split_module(gm, gm, segment_of, keep_original_order=True)
    # ``gm`` is planned again as traced (``pipeline.Replanner``): a saved plan names a graph by
    # the hash of its cost graph, of its nodes in order
    _reorder(gm, traced)
    parent.add_submodule("tt_runtime", runtime)
    graph = parent.graph
    params = {p.placeholder: (i, p) for i, p in enumerate(cost.params)}
    calls: list[torch.fx.Node] = [
        n for n in graph.nodes if n.op == "call_module" and n.target.startswith("submod_")
    ]
    segments = {str(n.target): plan.segment_device(_segment_of(str(n.target))) for n in calls}
    for name, device in segments.items():
        make_on(getattr(parent, name), torch_device(device))

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    # after the inputs; first of all in a graph of none (``inserting_after(None)`` would
    # put it at the end, after its users)
    start = graph.inserting_after(placeholders[-1]) if placeholders else graph.inserting_before()
    with start:
        rt = graph.get_attr("tt_runtime")

    device_of: dict[torch.fx.Node, str] = {node: _home_device(node) for node in placeholders}
    by_name = {node.name: node for node in placeholders}
    for ref in cost.state:  # each input written in place, held where the plan keeps it
        node, device = by_name[ref.placeholder], plan.node_device(ref.input)
        with graph.inserting_after(rt):
            held = graph.call_function(ops.state, (rt, node, ref.placeholder, device))
        node.replace_all_uses_with(held, delete_user_cb=lambda user, held=held: user is not held)
        device_of[held] = device

    moved: dict[tuple[torch.fx.Node, str], torch.fx.Node] = {}
    waited: dict[Stay, torch.fx.Node] = {}
    stays: dict[tuple[int, str], list[Stay]] = {}
    for stay in plan.stays():
        stays.setdefault((stay.param, stay.device), []).append(stay)
    call_of_segment = {_segment_of(str(n.target)): n for n in calls}

    def issue_point(segment: int) -> torch.fx.Node:
        """Where a copy issued when ``segment`` starts goes: before that segment's call (or
        the first call after it, when that segment holds only graph inputs), and ahead of
        the waits and copies for that call's own inputs, so that the copy engines never
        idle between one copy and the next."""
        later = [s for s in call_of_segment if s >= segment]
        issue_at = call_of_segment[min(later)] if later else calls[-1]
        before = (ops.wait, ops.resident, ops.transfer)
        while issue_at.prev.op == "call_function" and issue_at.prev.target in before:
            issue_at = issue_at.prev
        return issue_at

    for call in calls:
        device = segments[str(call.target)]
        new_args: list[Any] = []
        for arg in call.args:
            assert isinstance(arg, torch.fx.Node)
            if arg.name in params and (
                device != "cpu" or plan.residency[params[arg.name][0]].on_disk
            ):
                new_args.append(
                    _param_on_device(
                        graph,
                        rt,
                        arg,
                        params[arg.name],
                        plan,
                        call,
                        issue_point,
                        stays,
                        waited,
                        moved,
                        device,
                    )
                )
            elif arg.name in params or device_of.get(arg, "cpu") == device:
                new_args.append(arg)
            else:
                key = (arg, device)
                if key not in moved:
                    with graph.inserting_before(call):
                        moved[key] = graph.call_function(ops.transfer, (rt, arg, device))
                new_args.append(moved[key])
        call.args = tuple(new_args)
        device_of[call] = device
        for user in call.users:
            if user.op == "call_function":
                device_of[user] = device  # getitem on a segment's tuple output

    for stay, got in waited.items():
        with graph.inserting_after(call_of_segment[stay.last_segment]):
            graph.call_function(ops.evict, (got.args[0],))

    _spill(parent, plan, rt, calls, issue_point)

    output = next(n for n in graph.nodes if n.op == "output")
    state_home = {cost.nodes[r.output].name: plan.node_device(r.input) for r in cost.state}
    home = _output_devices(gm, state_home)

    def back(value: Any, index: int) -> Any:
        if isinstance(value, torch.fx.Node) and device_of.get(value, "cpu") != home[index]:
            with graph.inserting_before(output):
                return graph.call_function(ops.transfer, (rt, value, home[index]))
        return value

    (results,) = output.args
    if isinstance(results, (tuple, list)):
        output.args = (type(results)(back(v, i) for i, v in enumerate(results)),)
    else:
        output.args = (back(results, 0),)
    graph.lint()
    parent.recompile()
    dump("rewrite", "after", parent)
    return Rewritten(module=parent, segments=segments)


def make_on(sub: torch.fx.GraphModule, device: torch.device) -> None:
    """Point every ``device`` argument of ``sub``'s ops at ``device``, where ``sub`` runs
    (and drop ``pin_memory`` off the host, where it does not apply)."""
    changed = False
    for node in sub.graph.nodes:
        values = (*node.args, *node.kwargs.values())
        if node.op != "call_function" or not any(_other_device(v, device) for v in values):
            continue
        node.args = tuple(device if _other_device(a, device) else a for a in node.args)
        kwargs = {k: device if _other_device(v, device) else v for k, v in node.kwargs.items()}
        if device.type != "cpu" and kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        node.kwargs = kwargs
        log.debug("%s makes its tensor on %s, where its segment runs", node.name, device)
        changed = True
    if changed:
        sub.recompile()


def _other_device(value: Any, device: torch.device) -> bool:
    return isinstance(value, torch.device) and value != device


def _param_on_device(
    graph: torch.fx.Graph,
    rt: torch.fx.Node,
    arg: torch.fx.Node,
    param: tuple[int, Any],
    plan: GraphPlan,
    call: torch.fx.Node,
    issue_point: Any,
    stays: dict[tuple[int, str], list[Stay]],
    waited: dict[Stay, torch.fx.Node],
    moved: dict[tuple[torch.fx.Node, str], torch.fx.Node],
    device: str,
) -> torch.fx.Node:
    """``param`` as ``call`` reads it on ``device``: its resident copy there, or the
    streamed copy of the stay that serves ``call``'s segment (prefetched where the plan
    issues it, waited for before the stay's first call)."""
    pid, ref = param
    if not plan.residency[pid].streams:
        key = (arg, device)
        if key not in moved:
            with graph.inserting_before(call):
                moved[key] = graph.call_function(ops.resident, (rt, arg, ref.fqn, device))
        return moved[key]
    segment = _segment_of(str(call.target))
    stay = next(
        (s for s in stays.get((pid, device), ()) if s.first_segment <= segment <= s.last_segment),
        None,
    )
    if stay is None:
        raise AssertionError(
            f"the plan streams {ref.fqn} to {device} but no stay of it there serves "
            f"segment {segment}"
        )
    if stay not in waited:
        # -1 (the start of the run) also lands on the first call
        with graph.inserting_before(issue_point(stay.issue_segment)):
            handle = graph.call_function(ops.prefetch, (rt, arg, ref.fqn, device))
        with graph.inserting_before(call):
            waited[stay] = graph.call_function(ops.wait, (handle,))
    return waited[stay]


def _spill(
    parent: torch.fx.GraphModule,
    plan: GraphPlan,
    rt: torch.fx.Node,
    calls: list[torch.fx.Node],
    issue_point: Callable[[int], torch.fx.Node],
) -> None:
    """Send each value the plan spills to host memory once its segment made it, and have
    it copied back when its reload segment starts, for the segments from there on that use
    it (those before keep reading it as made)."""
    spilled = plan.spilled_nodes()
    if not spilled:
        return
    graph = parent.graph
    passed = _values_passed(parent, calls)
    order = {node: k for k, node in enumerate(graph.nodes)}
    for nid in spilled:
        name = plan.cost.nodes[nid].name
        value = passed.get(name)
        if value is None:
            log.warning("%s: no value in the split graph to spill; it stays on its device", name)
            continue
        reload_segment = plan.native.value_reload_segment[nid]
        later = sorted(
            (
                user
                for user in value.users
                if user.op == "call_module" and _segment_of(str(user.target)) >= reload_segment
            ),
            key=order.__getitem__,
        )
        if not later:
            continue
        near = [
            user
            for user in value.users
            if user.op == "call_module" and _segment_of(str(user.target)) < reload_segment
        ]
        with graph.inserting_after(value):
            handle = graph.call_function(ops.spill, (rt, value, name))
        # the device goes past the value's last use as made only once the copy has landed
        # and the value is gone from it, as the plan counts it
        with graph.inserting_after(max(near, key=order.__getitem__, default=handle)):
            graph.call_function(ops.landed, (handle,))
        with graph.inserting_before(issue_point(reload_segment)):
            reloading = graph.call_function(ops.reload, (rt, handle, name, plan.node_device(nid)))
        with graph.inserting_before(later[0]):
            back = graph.call_function(ops.wait, (reloading,))
        for user in later:
            user.replace_input_with(value, back)


def _values_passed(
    parent: torch.fx.GraphModule, calls: list[torch.fx.Node]
) -> dict[str, torch.fx.Node]:
    """The parent graph's node for each value passed from one segment to another, by its
    name in the traced graph (a segment's placeholders keep the names of the values they
    receive; the nodes inside a segment may be renamed)."""
    passed: dict[str, torch.fx.Node] = {}
    for call in calls:
        sub = parent.get_submodule(str(call.target))
        assert isinstance(sub, torch.fx.GraphModule)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for placeholder, arg in zip(placeholders, call.args, strict=True):
            if isinstance(arg, torch.fx.Node):
                passed.setdefault(str(placeholder.target), arg)
    return passed


def _output_devices(gm: torch.fx.GraphModule, state: dict[str, str]) -> list[str]:
    """Where each output goes: for the new value of an input written in place, the device
    the plan keeps that input on (``state``, by the name of the value); else the device
    eager execution returns it on."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    (results,) = output.args
    values = results if isinstance(results, (tuple, list)) else (results,)
    return [
        (state.get(v.name) or _home_device(v)) if isinstance(v, torch.fx.Node) else "cpu"
        for v in values
    ]


def _home_device(node: torch.fx.Node) -> str:
    """Where eager execution holds this value: its CUDA device, else the host."""
    example = node.meta.get("example_value")
    if isinstance(example, torch.Tensor) and example.device.type == "cuda":
        return str(example.device)
    return "cpu"
