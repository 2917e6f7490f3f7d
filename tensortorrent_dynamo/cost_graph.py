"""From an FX graph to the cost graph the planner reads.

Nodes are the graph's non-parameter placeholders and its operations, in
topological order. Parameters and buffers (Dynamo's static inputs) are listed
apart with their bytes and users: where they live is the planner's decision.
FLOPs are counted with torch's formulas (:class:`~.flops.FlopCount`, what
``FlopCounterMode`` counts) on the graph's own fake tensors, so no real compute
happens here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import operator
import os
import re
import sys
import typing
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten

from ._native import native_planner
from .errors import CostGraphFormatError
from .flops import FlopCount
from .io.files import digest, read_json, write_json

if TYPE_CHECKING:
    from . import _planner

log = logging.getLogger(__name__)


COST_GRAPH_FORMAT = "tensortorrent-cost-graph"
COST_GRAPH_FORMAT_VERSION = 1


class RateKey(typing.NamedTuple):
    """What a node is costed by besides its FLOPs and bytes (:meth:`CostGraph.rate_keys`),
    its rate class for the native planner (``plan.planner.rate_keys``)."""

    dtype: str  # of its FLOPs
    rows: int | None  # of a matmul's result, an attention's query tokens; else ``None``
    width: int | None  # of a matmul's weight (the square root of its elements)
    ops: tuple[str, ...]  # the ops it calls, whose fixed costs it pays


def kinds_of(calls: Iterable[Sequence[str]]) -> list[list[int]]:
    """The kinds of op each node of ``calls`` calls (the ops it calls, an item taken from a
    tuple left out), numbered from 0 in order of first call: a segment runs each kind the
    first time with cold caches (``Device.cold_latency_s``)."""
    ids: dict[str, int] = {}
    return [
        sorted({ids.setdefault(op, len(ids)) for op in ops if op != "getitem"}) for ops in calls
    ]


@dataclasses.dataclass(frozen=True)
class CostNode:
    """One node of the cost graph.

    Attributes:
        flops: what ``FlopCount`` (as ``FlopCounterMode``) counts for the op (matmuls, convolutions,
            attention). Ops it does not count (elementwise, norms, reductions, views)
            have 0 here and are costed by ``bytes_accessed`` instead: they are
            memory-bound, so the bytes they read and write set their time.
        out_bytes: bytes of every tensor the node returns (views included); for an operation
            that makes a new storage, that storage's bytes where they are more (``alloc_bytes``:
            a functional ``copy`` into a strided slice keeps the slice's layout, in a clone of
            the slice's whole storage, as eager runs it). A view, and a graph input (held by
            the caller, perhaps a slice of a larger tensor), count their tensors' bytes only.
        alloc_bytes: bytes of new storage the node allocates (0 for a view).
        bytes_accessed: bytes of tensors read plus ``alloc_bytes`` written.
        last_use: index of the last node that reads the value; ``len(nodes)`` when
            the value is a graph output or a graph input (the caller holds both).
        fallback: why the node could not be costed or placed (it then runs on the host).
        dtype: the dtype its FLOPs run in (its first floating-point input's, as
            ``"bfloat16"``), ``None`` for a node with no FLOPs: which of a device's compute
            rates it is costed at (``to_native``'s ``rate_classes``).
        rows: for a matmul (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``linear``,
            ``matmul``), the rows of its result (its elements over its last dimension:
            the batch times the tokens of a linear layer); for attention
            (:func:`is_attention`), the tokens of its query (its next to last dimension);
            ``None`` for other nodes. A matmul of few rows reads its weight for few FLOPs
            and runs far below a device's square rate, and so does attention over few
            tokens: the planner costs each at the rate measured at that many.
        ops: the ops the node calls, each paying its device's fixed cost per op: 0 for a
            graph input or an item taken from a tuple (``getitem``), 1 for an op, a view
            included (it moves no bytes but is still dispatched); a view of parameters
            taken where its reader runs (``CostGraph.runs_with``) counts with its reader.
            ``None`` (a cost graph saved before ops were counted): 1 for a node that
            computes or moves bytes.
        alias: for a view of an activation (every tensor it returns shares the one
            storage of its input ``alias``: ``view``, ``transpose``, ``slice``, the items
            of a ``split``), that input: it allocates nothing where it runs and keeps its
            base's storage alive as long as itself. ``None`` for a node with storage of
            its own, and for an item of a tuple of several storages.
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
    alloc_bytes: int = 0
    bytes_accessed: int = 0
    last_use: int = 0
    dtype: str | None = None
    rows: int | None = None
    ops: int | None = None
    alias: int | None = None

    @property
    def op_count(self) -> int:
        """The ops the node calls (``ops``, or the rule for a graph saved without them)."""
        if self.ops is not None:
            return self.ops
        return int(self.flops > 0 or self.bytes_accessed > 0)


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """A parameter or buffer the graph reads.

    ``home`` is the device holding it now (``cpu``, ``cuda:0``, or ``meta`` for a
    model built empty).
    """

    placeholder: str
    arg_index: int
    fqn: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    users: tuple[int, ...]
    home: str = "cpu"


@dataclasses.dataclass(frozen=True)
class StorageSpan:
    """One activation storage: allocated by node ``first``, freed after node ``last``."""

    first: int
    last: int
    nbytes: int


# the node.meta key of a state's update written into the state itself
# (``passes.state_in_place``): the placeholder it writes into
IN_PLACE_OF = "tensortorrent_in_place_of"


@dataclasses.dataclass(frozen=True)
class StateRef:
    """A graph input the graph writes in place (a static KV cache's buffer): node
    ``input`` (its placeholder) and node ``output`` (its new value, a graph output that
    AOTAutograd copies back into the tensor after the call)."""

    input: int
    output: int
    placeholder: str
    # what the caller calls it (``L['past_key_values'].layers[0].keys``)
    source: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    # whether the new value is written into the input itself (``passes.state_in_place``)
    in_place: bool = False


@dataclasses.dataclass(frozen=True)
class CostGraph:
    """Nodes in topological order, parameters, outputs, and activation lifetimes.

    ``assumed_sizes`` maps each symbolic size of a dynamic-shape graph to the value
    the costs were computed with (Dynamo's hint).

    ``runs_with`` gives, per node, the node whose segment it runs in, whatever device the
    plan gives it (empty: each runs where the plan puts it). A view of a parameter
    (``t(weight)``) runs with the node that reads it: there it is free (its bytes are the
    parameter's, counted as the parameter), anywhere else it would be a copy of them. It
    is costed as free, and its reader is the parameter's user.
    """

    nodes: tuple[CostNode, ...]
    params: tuple[ParamRef, ...]
    output_ids: tuple[int, ...]
    storages: tuple[StorageSpan, ...] = ()
    assumed_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    runs_with: tuple[int, ...] = ()
    # the inputs written in place, each with its new value: where they live is planned
    state: tuple[StateRef, ...] = ()
    # per node, the module that made it (:func:`module_path`), for messages: not planned
    # on, so neither saved nor in the digest (empty for a graph read from a file)
    scopes: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def rate_keys(self) -> list[RateKey]:
        """What each node is costed by besides its FLOPs and bytes (:class:`RateKey`): the
        dtype its FLOPs run in (float32 for a node with none), the rows of a matmul's result
        and the width of its weight (the square root of its FLOPs over twice its rows: of
        the product of the weight's two sizes), and the ops it calls (by ``target``; a view
        of parameters taken where its reader runs is called by the reader), whose fixed
        costs it pays."""
        return [
            RateKey(
                node.dtype or "float32",
                node.rows,
                round(math.sqrt(node.flops / (2 * node.rows))) or None if node.rows else None,
                ops,
            )
            for node, ops in zip(self.nodes, self.node_calls(), strict=True)
        ]

    def node_calls(self) -> list[tuple[str, ...]]:
        """The ops each node calls (by ``target``): its own, and the views of parameters
        taken where it runs (``runs_with``)."""
        views: dict[int, list[str]] = {}
        for nid, reader in enumerate(self.runs_with):
            if reader != nid:
                views.setdefault(reader, []).append(self.nodes[nid].target)
        calls = []
        for nid, node in enumerate(self.nodes):
            taken = views.get(nid, [])
            own = (node.target,) if node.op_count > len(taken) else ()
            calls.append((*own, *taken))
        return calls

    @property
    def state_bytes(self) -> int:
        return sum(s.nbytes for s in self.state)

    @property
    def total_flops(self) -> float:
        return sum(n.flops for n in self.nodes)

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def fallbacks(self) -> list[CostNode]:
        return [n for n in self.nodes if n.fallback is not None]

    def live_bytes(self) -> list[int]:
        """Activation bytes alive while each node runs (parameters not included)."""
        delta = [0] * (len(self.nodes) + 1)
        for span in self.storages:
            delta[span.first] += span.nbytes
            delta[min(span.last, len(self.nodes) - 1) + 1] -= span.nbytes
        live, running = [], 0
        for step in range(len(self.nodes)):
            running += delta[step]
            live.append(running)
        return live

    @property
    def peak_live_bytes(self) -> int:
        return max(self.live_bytes(), default=0)

    def to_json(self) -> dict[str, Any]:
        """A versioned, self-contained form: plan it offline, attach it to a bug report."""
        return {
            "format": COST_GRAPH_FORMAT,
            "format_version": COST_GRAPH_FORMAT_VERSION,
            "torch_version": torch.__version__,
            "nodes": [_node_json(n) for n in self.nodes],
            "params": [dataclasses.asdict(p) for p in self.params],
            "output_ids": list(self.output_ids),
            "storages": [dataclasses.asdict(s) for s in self.storages],
            "assumed_sizes": dict(self.assumed_sizes),
            "runs_with": list(self.runs_with),
            # only where there is state: the other graphs' digests stay as they were
            **({"state": [dataclasses.asdict(r) for r in self.state]} if self.state else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "cost graph") -> CostGraph:
        """Read :meth:`to_json`'s form; refuses other formats and versions, and damaged data.

        Raises :class:`CostGraphFormatError`, its message starting with ``source``.
        """
        if not isinstance(data, Mapping) or data.get("format") != COST_GRAPH_FORMAT:
            raise CostGraphFormatError(
                f"{source}: not a TensorTorrent cost graph (no 'format' field)"
            )
        version = data.get("format_version")
        if version != COST_GRAPH_FORMAT_VERSION:
            raise CostGraphFormatError(
                f"{source}: cost graph format version {version!r} is not supported "
                f"(this TensorTorrent reads version {COST_GRAPH_FORMAT_VERSION})"
            )
        try:
            graph = cls(
                nodes=tuple(_parse(CostNode, n, f"nodes[{i}]") for i, n in _items(data, "nodes")),
                params=tuple(
                    _parse(ParamRef, p, f"params[{i}]") for i, p in _items(data, "params")
                ),
                output_ids=_check(tuple[int, ...], data["output_ids"], "output_ids"),
                storages=tuple(
                    _parse(StorageSpan, s, f"storages[{i}]") for i, s in _items(data, "storages")
                ),
                assumed_sizes=_check(dict[str, int], data["assumed_sizes"], "assumed_sizes"),
                runs_with=_check(tuple[int, ...], data.get("runs_with", []), "runs_with"),
                state=tuple(
                    _parse(StateRef, r, f"state[{i}]")
                    for i, r in (_items(data, "state") if "state" in data else ())
                ),
            )
            graph._check_indices()
        except (KeyError, TypeError, ValueError) as exc:
            raise CostGraphFormatError(
                f"{source}: malformed cost graph ({exc!r}); export it again "
                "(tt.export_cost_graphs, then CostGraph.save)"
            ) from exc
        return graph

    def _check_indices(self) -> None:
        """Raise ``ValueError`` unless every node index the graph holds names one of its nodes
        (``len(nodes)``, past the last node, where it stands for the end of the graph)."""
        n = len(self.nodes)
        named = [(f"nodes[{i}].inputs", node.inputs) for i, node in enumerate(self.nodes)]
        named += [(f"nodes[{i}].last_use", (node.last_use,)) for i, node in enumerate(self.nodes)]
        named += [(f"params[{i}].users", param.users) for i, param in enumerate(self.params)]
        named += [("output_ids", self.output_ids), ("runs_with", self.runs_with)]
        named += [(f"state[{i}]", (r.input, r.output)) for i, r in enumerate(self.state)]
        named += [(f"storages[{i}]", (s.first, s.last)) for i, s in enumerate(self.storages)]
        for where, ids in named:
            if any(i > n for i in ids):
                raise ValueError(f"{where} names node {max(ids)}; the graph has {n} nodes")
        if self.runs_with and len(self.runs_with) != n:
            raise ValueError(f"runs_with has {len(self.runs_with)} entries for {n} nodes")
        for i, span in enumerate(self.storages):
            if not span.first <= span.last or span.first >= n:
                raise ValueError(f"storages[{i}] spans nodes {span.first}..{span.last} of {n}")

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_json(), indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostGraph:
        """Read a file :meth:`save` wrote; raises :class:`CostGraphFormatError`."""
        again = "export it again (tt.export_cost_graphs, then CostGraph.save)"
        data = read_json(path, CostGraphFormatError, "a cost graph", again)
        return cls.from_json(data, source=str(path))

    def digest(self) -> str:
        """A hash of what the planner sees of the graph (not of the torch version that
        traced it): the plan cache's and saved plans' key. Computed once per graph (a
        frozen one): the JSON form of a graph of 45,000 nodes takes seconds."""
        known: str | None = self.__dict__.get("_digest")
        if known is None:
            data = self.to_json()
            data.pop("torch_version")
            known = digest(data)
            object.__setattr__(self, "_digest", known)
        return known

    def structure_digest(self) -> str:
        """A hash of the graph with its sizes left out (each node's FLOPs, bytes and rows,
        each storage's and state's bytes and shape, the sizes assumed for symbols): the
        same graph traced at other shapes (another batch, another prompt length) has the
        same one, so a saved plan's decisions can be replayed on it."""
        known: str | None = self.__dict__.get("_structure_digest")
        if known is None:
            sized = ("flops", "out_bytes", "alloc_bytes", "bytes_accessed", "rows")
            known = digest(
                {
                    "format_version": COST_GRAPH_FORMAT_VERSION,
                    "nodes": [
                        {k: v for k, v in _node_json(n).items() if k not in sized}
                        for n in self.nodes
                    ],
                    "params": [dataclasses.asdict(p) for p in self.params],
                    "output_ids": list(self.output_ids),
                    "storages": [(s.first, s.last) for s in self.storages],
                    "assumed_sizes": sorted(self.assumed_sizes),
                    "runs_with": list(self.runs_with),
                    "state": [
                        {
                            k: v
                            for k, v in dataclasses.asdict(r).items()
                            if k not in ("nbytes", "shape")
                        }
                        for r in self.state
                    ],
                }
            )
            object.__setattr__(self, "_structure_digest", known)
        return known

    def to_native(
        self,
        param_home: Sequence[str] | None = None,
        disk_allowed: Sequence[bool] | None = None,
        state_movable: bool = False,
        rate_classes: Sequence[RateKey] = (),
    ) -> _planner.CostGraph:
        """Flatten into the arrays the native planner takes; ``param_home`` gives each
        parameter's tier now (``"host"`` or ``"disk"``; all ``"host"`` when omitted) and
        ``disk_allowed`` which host-RAM ones the planner may move to disk (none when
        omitted). With ``state_movable``, the planner may keep the inputs written in place
        (``state``) on an accelerator between calls; else they stay in host memory, as
        every other graph input does. A node whose ``rate_keys()`` is ``rate_classes[k]`` is of
        rate class ``k + 1`` (costed at each device's rate and fixed cost for it, see
        ``plan.planner.rate_keys``), any other of class 0 (the float32 rate, the device's
        fixed cost per op). Each node's kinds of op (:func:`kinds_of`) go too."""
        classes = {key: k + 1 for k, key in enumerate(rate_classes)}
        keys = self.rate_keys()
        movable = {r.input for r in self.state} if state_movable else set()
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
            node_host_only=[n.host_only and i not in movable for i, n in enumerate(self.nodes)],
            input_offsets=input_offsets,
            input_ids=input_ids,
            param_bytes=[p.nbytes for p in self.params],
            param_offsets=param_offsets,
            param_users=param_users,
            output_ids=list(self.output_ids),
            node_bytes_accessed=[n.bytes_accessed for n in self.nodes],
            param_home=list(param_home) if param_home is not None else None,
            param_disk_allowed=list(disk_allowed) if disk_allowed is not None else None,
            state=[(r.input, r.output, r.in_place) for r in self.state],
            node_rate_class=[classes.get(key, 0) for key in keys],
            node_ops=[n.op_count for n in self.nodes],
            node_alias=[n.alias for n in self.nodes],
            node_kinds=kinds_of(key.ops for key in keys),
        )


def _node_json(node: CostNode) -> dict[str, Any]:
    """A node's JSON form; ``dtype``, ``rows``, ``ops`` and ``alias`` only where it has
    them."""
    data = dataclasses.asdict(node)
    for optional in ("dtype", "rows", "ops", "alias"):
        if data[optional] is None:
            del data[optional]
    return data


_Parsed = TypeVar("_Parsed")


def _items(data: Mapping[str, Any], key: str) -> Iterator[tuple[int, object]]:
    """The numbered items of the list ``data[key]``."""
    value = data[key]
    if not isinstance(value, list):
        raise TypeError(f"{key} is {type(value).__name__}, not a list")
    return enumerate(value)


def _parse(cls: type[_Parsed], raw: object, where: str) -> _Parsed:
    """A ``cls`` (a dataclass) from its JSON object, each field checked against its type."""
    if not isinstance(raw, dict):
        raise TypeError(f"{where} is {type(raw).__name__}, not an object")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    unknown = sorted(set(raw) - {f.name for f in fields})
    if unknown:
        raise TypeError(f"{where} has unknown field(s) {unknown}")
    required = {f.name for f in fields if dataclasses.MISSING is f.default is f.default_factory}
    values = {
        f.name: _check(hints[f.name], raw[f.name], f"{where}.{f.name}")  # KeyError if required
        for f in fields
        if f.name in raw or f.name in required
    }
    return cls(**values)


def _check(kind: Any, value: object, where: str) -> Any:
    """``value`` if it is of type ``kind`` (as read from JSON: a list for a tuple), else a
    ``TypeError``. Every number of a cost graph is a count, a size or FLOPs: not negative,
    an int below 2**63 (what the planner holds in 64 bits), a float finite."""
    if kind is bool or kind is str:
        if not isinstance(value, kind):
            raise TypeError(f"{where} is {type(value).__name__}, not {kind.__name__}")
        return value
    if kind is int or kind is float:
        allowed = (int, float) if kind is float else int
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise TypeError(f"{where} is {type(value).__name__}, not {kind.__name__}")
        limit = sys.float_info.max if kind is float else 2**63 - 1
        if not 0 <= value <= limit:  # False for nan as for inf
            raise ValueError(f"{where} is {value!r}, not a {kind.__name__} in [0, {limit!r}]")
        return value
    if kind == str | None:
        return None if value is None else _check(str, value, where)
    if kind == int | None:
        return None if value is None else _check(int, value, where)
    if kind == tuple[int, ...]:
        if not isinstance(value, list):
            raise TypeError(f"{where} is {type(value).__name__}, not a list")
        return tuple(_check(int, v, f"{where}[{i}]") for i, v in enumerate(value))
    if kind in (dict[str, int], Mapping[str, int]):
        if not isinstance(value, dict):
            raise TypeError(f"{where} is {type(value).__name__}, not an object")
        return {k: _check(int, v, f"{where}[{k!r}]") for k, v in value.items()}
    raise AssertionError(f"{where}: no JSON reader for {kind}")


def size_hint(value: int | torch.SymInt, sizes: Mapping[str, int] | None = None) -> int:
    """A concrete size for a possibly symbolic one: its value with the symbols named in
    ``sizes`` set to theirs and the others to the values Dynamo traced with."""
    if isinstance(value, torch.SymInt):
        node = value.node
        if sizes:
            expr = node.expr
            env: Any = node.shape_env
            # renamed in newer torch; the old name warns there
            hints = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val
            values = {s: sizes.get(str(s), hints.get(s, 1)) for s in expr.free_symbols}
            try:
                return int(expr.xreplace(values))
            except TypeError:  # not a number once substituted: fall back to the hint
                pass
        hint = node.hint
        return int(hint) if hint is not None else 1
    return int(value)


def tensor_bytes(value: object, sizes: Mapping[str, int] | None = None) -> int:
    """Bytes of every tensor in ``value`` (a tensor, or a nested tuple/list of them), with
    symbolic sizes as :func:`size_hint` gives them."""
    leaves, _ = tree_flatten(value)
    total = 0
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            total += size_hint(leaf.numel(), sizes) * leaf.element_size()
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


def dynamo_params(gm: torch.fx.GraphModule) -> dict[int, str]:
    """Position -> fqn of each placeholder of a Dynamo graph that is a parameter or buffer
    (a static input); positions count placeholders only."""
    original_fqns: dict[str, str] = dict(gm.meta.get("dynamo_flat_name_to_original_fqn", {}))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {
        i: fqn_of(str(node.target), original_fqns)
        for i, node in enumerate(placeholders)
        if is_static_input(node)
    }


def _example(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _count_flops(node: torch.fx.Node, sizes: Mapping[str, int] | None = None) -> float:
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
    leaves = tree_flatten((args, kwargs))[0]
    fake_mode = next(
        (leaf.fake_mode for leaf in leaves if isinstance(leaf, torch._subclasses.FakeTensor)),
        None,
    )
    if fake_mode is None:
        return 0.0  # no tensor inputs: nothing to count
    # Symbolic sizes (a dynamic-shape graph's: ``constant_pad_nd``'s padding, the shapes
    # ``linalg_solve_triangular`` is given) need the Python dispatcher, whose meta kernels
    # take symbols where a C++ one wants ints; it costs about a tenth more compile time,
    # so only there.
    symbolic = any(
        isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool))
        or (isinstance(leaf, torch.Tensor) and not all(isinstance(d, int) for d in leaf.shape))
        for leaf in leaves
    )
    dispatcher = enable_python_dispatcher() if symbolic else contextlib.nullcontext()
    with fake_mode, dispatcher, FlopCount() as counter:
        if node.op == "call_function":
            node.target(*args, **kwargs)  # type: ignore[operator]
        elif node.op == "call_method":
            getattr(args[0], str(node.target))(*args[1:], **kwargs)
        else:
            raise ValueError(f"cannot cost a {node.op} node")
    return float(size_hint(counter.total, sizes))


def _op_signature(node: torch.fx.Node) -> Hashable | None:
    """What an op's FLOPs depend on: its target and arguments, each tensor by its dtype,
    device, shape and strides. ``None`` where a size is symbolic or an argument cannot be
    hashed: such an op is counted on its own. Ops of equal signatures (every repeated
    layer's, every tile of a tiled decode) have equal FLOPs, counted once."""

    def described(value: Any) -> Hashable:
        if isinstance(value, torch.fx.Node):  # its op too: a get_attr may have no value
            return ("node", value.op == "get_attr", described(_example(value)))
        if isinstance(value, torch.Tensor):
            if not all(isinstance(d, int) for d in (*value.shape, *value.stride())):
                raise TypeError("symbolic")
            return ("tensor", value.dtype, value.device, tuple(value.shape), value.stride())
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, *(described(v) for v in value))
        if isinstance(value, dict):
            return ("dict", *((k, described(v)) for k, v in value.items()))
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise TypeError("symbolic")
        hash(value)  # an unhashable argument raises TypeError
        return (type(value), value)

    try:
        return (node.op, node.target, described(node.args), described(node.kwargs))
    except TypeError:
        return None


def _flops_dtype(node: torch.fx.Node) -> str | None:
    """The dtype a node's FLOPs run in: that of its first floating-point tensor input."""
    for arg in node.all_input_nodes:
        for leaf in _leaves(_example(arg)):
            if leaf.dtype.is_floating_point:
                return str(leaf.dtype).removeprefix("torch.")
    return None


_MATMULS = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.baddbmm.default,
        torch.ops.aten.linear.default,
        torch.ops.aten.matmul.default,
        torch._C._nn.linear,
        torch.nn.functional.linear,
        torch.matmul,
        operator.matmul,
    }
)
"""The ops whose FLOPs are a matmul's, costed by the rows of their result (``CostNode.rows``)."""


ATTENTION_OPS = ("scaled_dot_product", "_flash_attention", "_efficient_attention")
"""What the names of attention's ATen ops contain (``aten._scaled_dot_product_flash_attention
_for_cpu``, ``aten._efficient_attention_forward``, ...)."""


def is_attention(op: str) -> bool:
    """Whether the op named ``op`` (a cost node's ``target``) computes attention."""
    return any(part in op for part in ATTENTION_OPS)


def _matmul_rows(node: torch.fx.Node, sizes: Mapping[str, int] | None) -> int | None:
    """The rows of a matmul node's result (its elements over its last dimension), the
    tokens of an attention node's query (its next to last dimension), ``None`` for another
    node or a value of unknown shape."""
    if node.op == "call_function" and is_attention(op_name(node)) and node.args:
        query = node.args[0]
        value = _example(query) if isinstance(query, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            return None
        tokens = size_hint(value.shape[-2], sizes)
        return tokens if tokens > 0 else None
    if node.op != "call_function" or node.target not in _MATMULS:
        return None
    value = _example(node)
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    last = size_hint(value.shape[-1], sizes)
    rows = size_hint(value.numel(), sizes) // last if last else 0
    return rows if rows > 0 else None


# ops that return a view of their input but are not marked as views (``is_view``): the
# reshape of a fresh tensor
_UNMARKED_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


def _call_kind(node: torch.fx.Node) -> str:
    """``"item"`` for an item taken from a tuple (no op is dispatched), ``"view"`` for an
    op whose result aliases its input (dispatched, but reading and writing nothing),
    ``"op"`` for any other."""
    target = node.target
    if target is operator.getitem:
        return "item"
    if isinstance(target, torch._ops.OpOverload) and (
        target in _UNMARKED_VIEWS
        or (
            target.is_view
            # a composite such as ``reshape`` or ``contiguous`` may copy
            and not torch._C._dispatch_has_kernel_for_dispatch_key(
                target.name(),  # type: ignore[no-untyped-call]
                "CompositeImplicitAutograd",
            )
        )
    ):
        return "view"
    return "op"


def op_name(node: torch.fx.Node) -> str:
    """The name a cost node gives ``node``'s target (``CostNode.target``): an ATen op's
    ``"addmm.default"``, a function's ``"getitem"``, a submodule's path; the profile's
    per-op fixed costs are keyed by it (``DeviceFigures.op_latencies``)."""
    if node.op == "call_function":
        return str(getattr(node.target, "__name__", node.target))
    return str(node.target)


def _leaves(value: object) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


def _storage_key(tensor: torch.Tensor) -> int:
    return int(StorageWeakRef(tensor.untyped_storage()).cdata)  # type: ignore[no-untyped-call]


def _storage_bytes(tensor: torch.Tensor, sizes: Mapping[str, int] | None = None) -> int:
    return size_hint(tensor.untyped_storage().nbytes(), sizes)


def _made_storage_bytes(
    node: torch.fx.Node, leaf: torch.Tensor, sizes: Mapping[str, int] | None = None
) -> int:
    """Bytes of the storage ``leaf`` (a value ``node`` makes) has when ``node`` runs eagerly:
    its fake tensor's, except for a functional ``copy``. Eager ``copy`` clones its
    destination's whole storage (``clone_preserve_strides``), where the fake kernel allocates
    only the extent of the destination's strides: DeepSeek-V3's decode step copies into a
    slice of half a 3,584-byte storage, and ran in 3,584 bytes where 3,552 were planned."""
    nbytes = _storage_bytes(leaf, sizes)
    if node.target is torch.ops.aten.copy.default and isinstance(node.args[0], torch.fx.Node):
        destination = _example(node.args[0])
        if isinstance(destination, torch.Tensor):
            nbytes = max(nbytes, _storage_bytes(destination, sizes))
    return nbytes


def param_view_nodes(gm: torch.fx.GraphModule, params: Mapping[int, str]) -> set[torch.fx.Node]:
    """The operations of ``gm`` whose value is a view of parameters (``t(weight)``): every
    tensor they return shares the storage of one of the inputs at the positions in
    ``params``."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    storages = {
        _storage_key(value)
        for value in (_example(placeholders[i]) for i in params)
        if isinstance(value, torch.Tensor)
    }
    views = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        keys = [_storage_key(leaf) for leaf in _leaves(_example(node))]
        if keys and all(key in storages for key in keys):
            views.add(node)
    return views


def _assumed_sizes(
    gm: torch.fx.GraphModule, sizes: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Each symbol of a dynamic-shape graph and the value it was costed at: its value in
    ``sizes``, else the one it was traced with."""
    assumed: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = _example(node)
        dims = value.shape if isinstance(value, torch.Tensor) else [value]
        for dim in dims:
            if not isinstance(dim, torch.SymInt):
                continue
            expr = dim.node.expr
            if getattr(expr, "is_Symbol", False):
                assumed[str(expr)] = size_hint(dim, sizes)
    return assumed


def module_path(node: torch.fx.Node) -> str:
    """The path of the innermost module whose call made ``node``, from the compiled one
    (``model.layers.3.mlp``), as Dynamo recorded it; ``""`` for the compiled module itself
    or where none is recorded."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    # Dynamo's paths start at the frame's local: ``L['self'].layers[3]``,
    # ``L['args'][0].lm_head``, ``L['self']._modules['model']``,
    # ``L['self'].__dict__['_modules']['blocks']['0']``
    path = re.sub(r"^L\['[^']*'\](?:\[\d+\])*", "", str(list(stack.values())[-1][0]))
    path = re.sub(r"\['([^']*)'\]|\[(\d+)\]", lambda m: "." + (m[1] or m[2]), path)
    return ".".join(p for p in path.split(".") if p and p not in ("_modules", "__dict__"))


class _Builder:
    """Walks the FX graph once, in order, collecting nodes, parameters and storages."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[object],
        param_fqns: Mapping[int, str],
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.gm = gm
        self.example_inputs = example_inputs
        self.param_fqns = param_fqns
        self.sizes = sizes
        self.param_views = param_view_nodes(gm, param_fqns)
        self.index: dict[torch.fx.Node, int] = {}
        self.param_of: dict[torch.fx.Node, int] = {}
        self.nodes: list[dict[str, Any]] = []
        self.params: list[dict[str, Any]] = []
        self.output_ids: list[int] = []
        # storage key of each parameter -> the parameter's index
        self.param_storages: dict[int, int] = {}
        # node -> the parameters its value is a view of (``t(weight)`` in a functional
        # graph): a reader of the view reads the parameter, so it is a user of it too
        self.views_of: dict[torch.fx.Node, set[int]] = {}
        # node id of such a view -> the node reading it
        self.runs_with: dict[int, torch.fx.Node] = {}
        # storage key -> [first node, bytes, nodes whose value refers to it]
        self.storages: dict[int, list[Any]] = {}
        # node id -> the activation storages its value refers to
        self.node_keys: dict[int, frozenset[int]] = {}
        # the FLOPs of each op signature counted so far (``_op_signature``)
        self.flops_of: dict[Hashable, float] = {}

    def placeholder(self, node: torch.fx.Node, position: int) -> None:
        real = self.example_inputs[position]
        value = real if isinstance(real, torch.Tensor) else _example(node)
        if position in self.param_fqns and isinstance(value, torch.Tensor):
            self.param_of[node] = len(self.params)
            fake = _example(node)
            if isinstance(fake, torch.Tensor):
                self.param_storages[_storage_key(fake)] = len(self.params)
            self.params.append(
                {
                    "placeholder": node.name,
                    "arg_index": position,
                    "fqn": self.param_fqns[position],
                    "nbytes": tensor_bytes(value),
                    "dtype": str(value.dtype).removeprefix("torch."),
                    "shape": tuple(size_hint(s) for s in value.shape),
                    "users": [],
                    "home": str(value.device),
                }
            )
            return
        self.add(
            node,
            op="placeholder",
            target=str(node.target),
            flops=0.0,
            inputs=[],
            fallback=None,
            is_graph_input=True,
        )

    def _views_a_param(self, node: torch.fx.Node) -> set[int]:
        """The parameters ``node``'s value is a view of, when it is a view of parameters
        alone read by one node (so it can be taken where that node runs); else empty."""
        users = list(node.users)
        if node not in self.param_views or len(users) != 1 or users[0].op == "output":
            return set()
        return {self.param_storages[_storage_key(leaf)] for leaf in _leaves(_example(node))}

    def operation(self, node: torch.fx.Node) -> None:
        my_id = len(self.nodes)
        inputs: list[int] = []
        views = self._views_a_param(node)
        for arg in node.all_input_nodes:
            if arg in self.index and self.index[arg] not in inputs:
                inputs.append(self.index[arg])
            if views:
                continue  # its reader is the parameters' user
            reads = {self.param_of[arg]} if arg in self.param_of else self.views_of.get(arg)
            for pid in reads or ():
                users = self.params[pid]["users"]
                if my_id not in users:
                    users.append(my_id)
        if views:
            # free where its parameters are (it runs with its reader: ``runs_with``)
            self.views_of[node] = views
            self.runs_with[my_id] = next(iter(node.users))
            self.add(
                node, op=node.op, target=op_name(node), flops=0.0, inputs=inputs, fallback=None
            )
            return
        fallback: str | None = None
        try:
            signature = _op_signature(node)
            flops = self.flops_of.get(signature) if signature is not None else None
            if flops is None:
                flops = _count_flops(node, self.sizes)
                if signature is not None:
                    self.flops_of[signature] = flops
        except Exception as exc:  # any failure to cost means: run it on the host, say why
            flops = 0.0
            fallback = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if node.op == "call_module":
            fallback = fallback or "submodule calls are run where they were"
        kind = _call_kind(node)
        read = (
            sum(tensor_bytes(_example(a), self.sizes) for a in node.all_input_nodes)
            if kind == "op"
            else 0  # a view or a tuple's item reads nothing
        )
        self.add(
            node,
            op=node.op,
            target=op_name(node),
            flops=flops,
            inputs=sorted(inputs),
            fallback=fallback,
            read_bytes=read,
            dtype=_flops_dtype(node) if flops > 0 else None,
            rows=_matmul_rows(node, self.sizes) if flops > 0 else None,
            ops=0 if kind == "item" else 1,
        )

    def add(
        self,
        node: torch.fx.Node,
        *,
        op: str,
        target: str,
        flops: float,
        inputs: list[int],
        fallback: str | None,
        is_graph_input: bool = False,
        read_bytes: int = 0,
        dtype: str | None = None,
        rows: int | None = None,
        ops: int = 1,
    ) -> None:
        my_id = len(self.nodes)
        value = _example(node)
        alloc = 0
        keys: set[int] = set()
        for leaf in _leaves(value):
            key = _storage_key(leaf)
            if key in self.param_storages:
                self.views_of.setdefault(node, set()).add(self.param_storages[key])
                continue
            keys.add(key)
            if key not in self.storages:
                made = _made_storage_bytes(node, leaf, self.sizes)
                self.storages[key] = [my_id, made, []]
                alloc += made
            self.storages[key][2].append(my_id)
        alias = self._alias(node, keys, inputs) if alloc == 0 and not is_graph_input else None
        out_bytes = 0 if my_id in self.runs_with else tensor_bytes(value, self.sizes)
        if not is_graph_input:
            # what it holds where it runs: the storages it makes, all of them (``alloc`` is 0
            # for a view, which shares the storage of its input and makes none). In
            # ``out_bytes`` itself, so that what rescales a node's bytes (``KvCache.shortened``)
            # rescales these too
            out_bytes = max(out_bytes, alloc)
        self.node_keys[my_id] = frozenset(keys)
        self.index[node] = my_id
        self.nodes.append(
            {
                "name": node.name,
                "op": op,
                "target": target,
                "flops": flops,
                "out_bytes": out_bytes,
                "inputs": tuple(inputs),
                "host_only": is_graph_input or fallback is not None,
                "is_graph_input": is_graph_input,
                "fallback": fallback,
                "alloc_bytes": alloc,
                "bytes_accessed": read_bytes + alloc,
                "last_use": my_id,
                **({"dtype": dtype} if dtype is not None else {}),
                **({"rows": rows} if rows is not None else {}),
                "ops": 0 if is_graph_input else ops,
                **({"alias": alias} if alias is not None else {}),
            }
        )

    def _alias(self, node: torch.fx.Node, keys: set[int], inputs: list[int]) -> int | None:
        """The input ``node``'s value is a view of: the one whose value is the one storage
        every tensor ``node`` returns shares (a state written in place is planned as a
        state, not as a view)."""
        if len(keys) != 1 or IN_PLACE_OF in node.meta:
            return None
        shared = frozenset(keys)
        for i in inputs:
            if self.node_keys.get(i) == shared:
                return i
        return None

    def finish(self) -> CostGraph:
        end = len(self.nodes)
        for nid, node in enumerate(self.nodes):
            for i in node["inputs"]:
                self.nodes[i]["last_use"] = max(self.nodes[i]["last_use"], nid)
            if node["is_graph_input"]:
                node["last_use"] = end
        for nid in self.output_ids:
            self.nodes[nid]["last_use"] = end
        runs_with = self._runs_with()
        for nid in self.runs_with:
            # a view of parameters is called where its reader runs: its op is the reader's
            # (costed on the reader's device, wherever the plan would put the view itself)
            self.nodes[runs_with[nid]]["ops"] += self.nodes[nid]["ops"]
            self.nodes[nid]["ops"] = 0
        spans = tuple(
            StorageSpan(
                first=first, last=max(self.nodes[u]["last_use"] for u in users), nbytes=nbytes
            )
            for first, nbytes, users in self.storages.values()
        )
        scopes = {n.name: module_path(n) for n in self.gm.graph.nodes}
        return CostGraph(
            nodes=tuple(CostNode(**n) for n in self.nodes),
            params=tuple(ParamRef(**{**p, "users": tuple(p["users"])}) for p in self.params),
            output_ids=tuple(self.output_ids),
            storages=tuple(sorted(spans, key=lambda s: (s.first, s.last, s.nbytes))),
            assumed_sizes=_assumed_sizes(self.gm, self.sizes),
            runs_with=runs_with,
            scopes=tuple(scopes.get(n["name"], "") for n in self.nodes),
        )

    def _runs_with(self) -> tuple[int, ...]:
        """Per node, the node in whose segment it runs: itself, or for a view of parameters,
        the first node on from it that is not such a view."""
        if not self.runs_with:
            return ()
        target = list(range(len(self.nodes)))
        for nid in sorted(self.runs_with, reverse=True):  # a reader comes after its view
            target[nid] = target[self.index[self.runs_with[nid]]]
        return tuple(target)


def build_cost_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    param_fqns: Mapping[int, str] | None = None,
    sizes: Mapping[str, int] | None = None,
    state: Sequence[tuple[str, int, str]] = (),
) -> CostGraph:
    """Cost every node of ``gm``; nodes that cannot be costed are marked as host fallbacks.

    ``param_fqns`` names the inputs that are parameters or buffers, by position (as
    :class:`functional.GraphInputs` does); for a Dynamo graph they can be read from its
    placeholders (:func:`dynamo_params`, the default). A dynamic-shape graph is costed
    with its symbols at the values in ``sizes`` (the sizes it was traced with for those
    not named): ``assumed_sizes`` records them. ``state`` names the inputs the graph
    writes in place, each with the index of the output that is its new value and its
    source (:class:`functional.GraphInputs`)."""
    params = dynamo_params(gm) if param_fqns is None else param_fqns
    builder = _Builder(gm, example_inputs, params, sizes)
    position = 0
    results: Sequence[object] = ()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            builder.placeholder(node, position)
            position += 1
        elif node.op == "output":
            (out,) = node.args
            results = out if isinstance(out, (tuple, list)) else (out,)
            for arg in node.all_input_nodes:
                nid = builder.index.get(arg)
                if nid is not None and nid not in builder.output_ids:
                    builder.output_ids.append(nid)
        else:
            builder.operation(node)
    graph = builder.finish()
    refs = []
    by_name = {n.name: i for i, n in enumerate(graph.nodes)}
    for placeholder, k, source in state:
        new = results[k] if k < len(results) else None
        if placeholder not in by_name or not isinstance(new, torch.fx.Node):
            continue  # a parameter's or a size, or not a tensor: nothing to place
        if new not in builder.index:
            continue
        node = graph.nodes[by_name[placeholder]]
        value = _example(next(n for n in gm.graph.nodes if n.name == placeholder))
        if not isinstance(value, torch.Tensor):
            continue
        refs.append(
            StateRef(
                input=by_name[placeholder],
                output=builder.index[new],
                placeholder=placeholder,
                source=source,
                nbytes=node.out_bytes,
                dtype=str(value.dtype).removeprefix("torch."),
                shape=tuple(size_hint(x, sizes) for x in value.shape),
                in_place=new.meta.get(IN_PLACE_OF) == placeholder,
            )
        )
    return dataclasses.replace(graph, state=tuple(refs)) if refs else graph
