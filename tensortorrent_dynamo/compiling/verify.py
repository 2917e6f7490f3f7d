"""``options={"verify": True}``: the first call, checked segment by segment against eager.

The captured graph is run once as it is, node by node in eager (``torch.fx.Interpreter``),
on copies of every input but the parameters, so the user's buffers are written only by the
real call; weights released to disk are read back for it. Then the real call runs with each
segment's outputs recorded. Walking the segments in execution order, the first one whose
outputs differ from the eager values of the same nodes is named, with its node range and the
modules those nodes come from, in :class:`VerifyMismatch`, as torch's accuracy minifier
names the first bad subgraph of a backend. Everything is held until the comparison: a debug
mode, for models that fit in memory twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from ..cost_graph import module_path
from ..errors import VerifyMismatch
from ..io.pool import HostBufferPool
from ..io.reader import DiskReader
from ..passes.rewrite import SOURCE_NAME
from ..weights.released import released_location
from .segments import copy_of

log = logging.getLogger(__name__)


def _snapshot(value: Any) -> list[Any]:
    """The tensors of ``value`` as they are now (a later in-place write must not change
    what was recorded), on the CPU."""
    return [
        leaf.detach().to("cpu", copy=True) if isinstance(leaf, torch.Tensor) else leaf
        for leaf in tree_flatten(value)[0]
    ]


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, list[Any]] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n.name] = _snapshot(out)
        return out


def _eager_inputs(args: Sequence[Any]) -> list[Any]:
    """What the eager run gets: parameters as they are (read back when released to disk),
    copies of every other tensor."""
    out: list[Any] = []
    with DiskReader(HostBufferPool()) as reader:
        for arg in args:
            if not isinstance(arg, torch.Tensor):
                out.append(arg)
            elif (location := released_location(arg)) is not None:
                read = reader.submit(location).result()
                out.append(read.tensor.clone())
                reader.pool.give(read.buffer)
            elif isinstance(arg, torch.nn.Parameter):
                out.append(arg)
            else:
                out.append(copy_of(arg))
    return out


def eager_values(original: torch.fx.GraphModule, args: Sequence[Any]) -> dict[str, list[Any]]:
    """The value of every node of ``original`` run eagerly on ``args`` (see the module)."""
    recorder = _Recorder(original)
    with torch.no_grad():
        recorder.run(*_eager_inputs(args))
    return recorder.values


def _output_names(segment: torch.nn.Module) -> list[str]:
    """The names of the nodes a segment's submodule returns, in order."""
    sub = segment.eager_fn
    assert isinstance(sub, torch.fx.GraphModule)
    output = next(n for n in sub.graph.nodes if n.op == "output")
    returned = output.args[0]
    nodes = returned if isinstance(returned, (tuple, list)) else [returned]
    return [_source_name(n) for n in nodes if isinstance(n, torch.fx.Node)]


def _source_name(node: torch.fx.Node) -> str:
    """The name ``node`` had in the captured graph (submodules name their nodes afresh)."""
    return str(node.meta.get(SOURCE_NAME, node.name))


def _node_range(segment: torch.nn.Module) -> tuple[list[str], list[str]]:
    """The first and last computing node of a segment, and the modules its nodes come from."""
    sub = segment.eager_fn
    assert isinstance(sub, torch.fx.GraphModule)
    nodes = [n for n in sub.graph.nodes if n.op not in ("placeholder", "output")]
    modules = []
    for n in nodes:
        if n.meta.get("nn_module_stack"):
            path = module_path(n) or "."
            if path not in modules:
                modules.append(path)
    names = [_source_name(nodes[0]), _source_name(nodes[-1])] if nodes else []
    return names, modules


def _differs(got: list[Any], want: list[Any]) -> str | None:
    """How ``got`` differs from ``want`` (tensors by assert_close), or ``None``."""
    if len(got) != len(want):
        return f"{len(got)} values against {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor):
            try:
                torch.testing.assert_close(g, w)
            except AssertionError as exc:
                return f"value {i}: {str(exc).splitlines()[0]} {_detail(exc)}"
        elif g != w:
            return f"value {i}: {g!r} against {w!r}"
    return None


def _detail(exc: AssertionError) -> str:
    lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
    return "(" + "; ".join(lines[:3]) + ")" if lines else ""


def verified_call(
    segments: Sequence[torch.nn.Module],
    expected: dict[str, list[Any]],
    call: Callable[[], Any],
    graph_index: int,
) -> Any:
    """Run ``call`` (the real call of a compiled graph) with the outputs of ``segments``
    recorded, compare them in order with ``expected`` (:func:`eager_values`), and return
    the call's result or raise :class:`VerifyMismatch` naming the first segment that
    differs."""
    names = {str(segment.name): _output_names(segment) for segment in segments}
    recorded: dict[str, list[list[Any]]] = {}

    def record(module: torch.nn.Module, _inputs: Any, out: Any) -> None:
        # one returned node: its value; several: a tuple of theirs
        name = str(module.name)
        many = len(names[name]) != 1
        recorded[name] = [_snapshot(v) for v in out] if many else [_snapshot(out)]

    hooks = [segment.register_forward_hook(record) for segment in segments]
    try:
        result = call()
    finally:
        for hook in hooks:
            hook.remove()
    for segment in segments:
        key = str(segment.name)
        for name, value in zip(names[key], recorded[key], strict=True):
            if name not in expected:  # a node the plan added (row chunks): no eager value
                continue
            problem = _differs(value, expected[name])
            if problem is not None:
                span, modules = _node_range(segment)
                raise VerifyMismatch(
                    f"graph {graph_index}: segment {segment.name} on {segment.device} "
                    f"(nodes {' .. '.join(span)}"
                    + (f", from {', '.join(modules[:4])}" if modules else "")
                    + f") differs from eager at node {name}: {problem}",
                    segment=str(segment.name),
                    node=name,
                )
    log.info("graph %d: verify: %d segments match eager", graph_index, len(segments))
    return result
