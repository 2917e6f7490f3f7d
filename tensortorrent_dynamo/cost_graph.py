"""From an FX graph to the cost graph the planner reads.

Nodes are the graph's non-parameter placeholders and its operations, in
topological order. Parameters and buffers (Dynamo's static inputs) are listed
apart with their bytes and users: where they live is the planner's decision.
FLOPs come from ``FlopCounterMode`` run on the graph's own fake tensors, so no
real compute happens here.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from ._native import native_planner

if TYPE_CHECKING:
    from . import _planner

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CostNode:
    """One node of the cost graph.

    ``fallback`` is why the node could not be costed or placed (it then runs on the host).
    """

    name: str
    op: str
    target: str
    flops: float
    out_bytes: int
    inputs: tuple[int, ...]
    host_only: bool
    is_graph_input: bool = False
    fallback: str | None = None


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """A parameter or buffer the graph reads: placeholder position, FQN, size and users."""

    placeholder: str
    arg_index: int
    fqn: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    users: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class CostGraph:
    """Nodes in topological order, parameters, and which nodes are the graph's outputs."""

    nodes: tuple[CostNode, ...]
    params: tuple[ParamRef, ...]
    output_ids: tuple[int, ...]

    @property
    def total_flops(self) -> float:
        return sum(n.flops for n in self.nodes)

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def fallbacks(self) -> list[CostNode]:
        return [n for n in self.nodes if n.fallback is not None]

    def to_native(self) -> _planner.CostGraph:
        """Flatten into the arrays the native planner takes."""
        input_offsets = [0]
        input_ids: list[int] = []
        for node in self.nodes:
            input_ids.extend(node.inputs)
            input_offsets.append(len(input_ids))
        param_offsets = [0]
        param_users: list[int] = []
        for param in self.params:
            param_users.extend(param.users)
            param_offsets.append(len(param_users))
        return native_planner().CostGraph(  # type: ignore[no-any-return]
            node_flops=[n.flops for n in self.nodes],
            node_out_bytes=[n.out_bytes for n in self.nodes],
            node_host_only=[n.host_only for n in self.nodes],
            input_offsets=input_offsets,
            input_ids=input_ids,
            param_bytes=[p.nbytes for p in self.params],
            param_offsets=param_offsets,
            param_users=param_users,
            output_ids=list(self.output_ids),
        )


def _hint(value: int | torch.SymInt) -> int:
    """A concrete size for a possibly symbolic one (the size Dynamo traced with)."""
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else 1
    return int(value)


def tensor_bytes(value: object) -> int:
    """Bytes of every tensor in ``value`` (a tensor, or a nested tuple/list of them)."""
    leaves, _ = tree_flatten(value)
    total = 0
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            total += _hint(leaf.numel()) * leaf.element_size()
    return total


def is_static_input(node: torch.fx.Node) -> bool:
    """Whether a placeholder is a parameter or buffer (Dynamo marks these static)."""
    tensor_dict = node.meta.get("tensor_dict") or {}
    return "_dynamo_static_input_type" in tensor_dict


def fqn_of(placeholder: str, original_fqns: dict[str, str]) -> str:
    """The parameter's dotted name, read from Dynamo's placeholder name.

    ``L_fn_modules_0_parameters_weight_`` → ``0.weight``. Falls back to the placeholder
    name when it does not follow Dynamo's pattern.
    """
    if placeholder in original_fqns:
        return original_fqns[placeholder]
    body = placeholder[2:] if placeholder.startswith(("L_", "G_")) else placeholder
    start = min(
        (i for i in (body.find(t) for t in ("modules_", "parameters_", "buffers_")) if i >= 0),
        default=-1,
    )
    if start < 0:
        return placeholder
    parts = re.split(r"(?:^|_)(?:modules|parameters|buffers)_", body[start:].rstrip("_"))
    return ".".join(p for p in parts if p)


def _example(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _count_flops(node: torch.fx.Node) -> float:
    """FLOPs of one op under the graph's fake mode; raises when it cannot be run on fakes."""
    if node.op == "get_attr":
        return 0.0

    def fake(arg: torch.fx.Node) -> Any:
        value = _example(arg)
        if value is None and arg.op != "get_attr":
            raise ValueError(f"input {arg.name!r} has no example value")
        return value

    args = torch.fx.node.map_arg(node.args, fake)
    kwargs = torch.fx.node.map_arg(node.kwargs, fake)
    fake_mode = next(
        (
            leaf.fake_mode
            for leaf in tree_flatten((args, kwargs))[0]
            if isinstance(leaf, torch._subclasses.FakeTensor)
        ),
        None,
    )
    if fake_mode is None:
        return 0.0  # no tensor inputs: nothing to count
    with fake_mode, FlopCounterMode(display=False) as counter:
        if node.op == "call_function":
            node.target(*args, **kwargs)  # type: ignore[operator]
        elif node.op == "call_method":
            getattr(args[0], str(node.target))(*args[1:], **kwargs)
        else:
            raise ValueError(f"cannot cost a {node.op} node")
    return float(counter.get_total_flops())


def _target_name(node: torch.fx.Node) -> str:
    if node.op == "call_function":
        return str(getattr(node.target, "__name__", node.target))
    return str(node.target)


def build_cost_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> CostGraph:
    """Cost every node of ``gm``; nodes that cannot be costed are marked as host fallbacks."""
    original_fqns: dict[str, str] = dict(gm.meta.get("dynamo_flat_name_to_original_fqn", {}))
    index: dict[torch.fx.Node, int] = {}
    param_of: dict[torch.fx.Node, int] = {}
    nodes: list[CostNode] = []
    params: list[dict[str, Any]] = []
    output_ids: list[int] = []
    placeholder_pos = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            real = example_inputs[placeholder_pos]
            value = real if isinstance(real, torch.Tensor) else _example(node)
            if is_static_input(node) and isinstance(value, torch.Tensor):
                param_of[node] = len(params)
                params.append(
                    {
                        "placeholder": node.name,
                        "arg_index": placeholder_pos,
                        "fqn": fqn_of(str(node.target), original_fqns),
                        "nbytes": tensor_bytes(value),
                        "dtype": str(value.dtype).removeprefix("torch."),
                        "shape": tuple(_hint(s) for s in value.shape),
                        "users": [],
                    }
                )
            else:
                index[node] = len(nodes)
                nodes.append(
                    CostNode(
                        name=node.name,
                        op="placeholder",
                        target=str(node.target),
                        flops=0.0,
                        out_bytes=tensor_bytes(value),
                        inputs=(),
                        host_only=True,
                        is_graph_input=True,
                    )
                )
            placeholder_pos += 1
            continue
        if node.op == "output":
            for arg in node.all_input_nodes:
                if arg in index and index[arg] not in output_ids:
                    output_ids.append(index[arg])
            continue
        my_id = len(nodes)
        inputs: list[int] = []
        for arg in node.all_input_nodes:
            if arg in param_of:
                users = params[param_of[arg]]["users"]
                if my_id not in users:
                    users.append(my_id)
            elif arg in index and index[arg] not in inputs:
                inputs.append(index[arg])
        fallback: str | None = None
        try:
            flops = _count_flops(node)
        except Exception as exc:  # any failure to cost means: run it on the host, say why
            flops = 0.0
            fallback = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if node.op == "call_module":
            fallback = fallback or "submodule calls are run where they were"
        index[node] = my_id
        nodes.append(
            CostNode(
                name=node.name,
                op=node.op,
                target=_target_name(node),
                flops=flops,
                out_bytes=tensor_bytes(_example(node)),
                inputs=tuple(sorted(inputs)),
                host_only=fallback is not None,
                fallback=fallback,
            )
        )
    return CostGraph(
        nodes=tuple(nodes),
        params=tuple(
            ParamRef(
                placeholder=p["placeholder"],
                arg_index=p["arg_index"],
                fqn=p["fqn"],
                nbytes=p["nbytes"],
                dtype=p["dtype"],
                shape=p["shape"],
                users=tuple(p["users"]),
            )
            for p in params
        ),
        output_ids=tuple(output_ids),
    )
