"""Row-chunked streaming of large weights read from disk (FlexGen-style).

A weight read from disk whole costs the host a whole copy of it per read buffer (two for a
double buffer), and its read overlaps nothing of its own layer. So when a weight's home is
disk, it is larger than ``stream_chunk_bytes`` and every use of it is as the weight of a
linear layer (in the functional graph: ``mm(x, t(W))`` or ``addmm(b, x, t(W))``), this
pass splits it into row chunks: the graph takes one input per row range in its place, and
each ``addmm(b, x, t(W))`` becomes ``cat([addmm(b[r0:r1], x, t(W[r0:r1])), ...], -1)``.
To the planner each chunk is a parameter of its own, keyed ``fqn[r0:r1]``: it keeps as
many chunks in RAM as fit, staging costs two chunks, and each chunk's read overlaps the
compute of the chunk before it.

At call time the whole weight Dynamo passes is expanded into its chunks
(:meth:`ChunkedGraph.expand`): views of its rows while it holds its bytes, empty
placeholders of each chunk's shape once it was released to disk (``released_rows``: only
the compiled graphs use them). The runtime reads a chunk from its byte range of the stored tensor
(the rows of a row-major tensor are contiguous: ``TensorLocation.rows``). A chunk is the
same tensor object from call to call, so its resident copy is found again.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils.weak import WeakIdKeyDictionary

from ..cost_graph import CostGraph, ParamRef, build_cost_graph
from ..weights.disk import Weight
from ..weights.released import released_rows
from .logged import dump

aten = torch.ops.aten
# what a linear layer becomes in the functional graph: a matmul with the transposed
# weight, and the position of that transpose among the matmul's arguments
MATMUL_WEIGHT: dict[Any, int] = {aten.mm.default: 1, aten.addmm.default: 2}


def chunk_key(fqn: str, start: int, stop: int) -> str:
    """The name of rows ``start:stop`` of parameter ``fqn``: ``layers.3.weight[0:1024]``."""
    return f"{fqn}[{start}:{stop}]"


def row_ranges(rows: int, row_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``rows`` rows in ranges of at most ``chunk_bytes`` (at least one row each), as even
    as possible, so that the chunks share read buffers of one size."""
    per = max(1, chunk_bytes // max(1, row_bytes))
    count = -(-rows // per)
    size, extra = divmod(rows, count)
    ranges, start = [], 0
    for i in range(count):
        stop = start + size + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


@dataclasses.dataclass(frozen=True)
class RowChunk:
    """Rows ``start:stop`` of the parameter ``parent`` (its fqn)."""

    parent: str
    start: int
    stop: int

    @property
    def key(self) -> str:
        return chunk_key(self.parent, self.start, self.stop)


# weight -> (start, stop) -> (the weight's storage when cut, the chunk), while it lives
_chunks: WeakIdKeyDictionary = WeakIdKeyDictionary()


def rows_of(weight: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of ``weight``, the same tensor object for as long as the weight
    keeps its storage: a view of them, or, once the weight was released to disk, an empty
    placeholder of their shape (the runtime reads their bytes from disk)."""
    storage = weight.untyped_storage()
    cut: dict[tuple[int, int], tuple[int, torch.Tensor]] = _chunks.setdefault(weight, {})  # type: ignore[no-untyped-call]
    entry = cut.get((start, stop))
    if entry is not None and entry[0] == storage._cdata:
        return entry[1]
    released = released_rows(weight, start, stop)
    chunk = weight.detach().narrow(0, start, stop - start) if released is None else released
    cut[(start, stop)] = (storage._cdata, chunk)
    return chunk


@dataclasses.dataclass
class ChunkedInputs:
    """How to feed a graph whose large weights were split into row chunks: ``inputs[j]``
    says where its ``j``-th input comes from, the position of the graph's input (what the
    caller passes) and, for a row chunk, which rows of it. What a compiled graph keeps of
    a :class:`ChunkedGraph` to be called: not the graph itself (thousands of nodes and
    their metadata, over 100 MiB for a 5000-node graph)."""

    inputs: tuple[tuple[int, RowChunk | None], ...]

    def expand(self, args: Sequence[Any]) -> list[Any]:
        """The inputs of the chunked graph from the inputs Dynamo passes (whole weights)."""
        return [
            args[i] if chunk is None else rows_of(args[i], chunk.start, chunk.stop)
            for i, chunk in self.inputs
        ]

    def parent(self, param: ParamRef) -> str:
        """The fqn of the whole parameter ``param`` is (rows of)."""
        chunk = self.inputs[param.arg_index][1]
        return chunk.parent if chunk is not None else param.fqn


@dataclasses.dataclass
class ChunkedGraph(ChunkedInputs):
    """A graph whose large weights were split into row chunks (``module``), how to feed it
    (:class:`ChunkedInputs`) and, once costed, its cost graph."""

    module: torch.fx.GraphModule = dataclasses.field(kw_only=True)
    cost: CostGraph | None = dataclasses.field(default=None, kw_only=True)

    def feed(self) -> ChunkedInputs:
        """How to call it, without the graph."""
        return ChunkedInputs(self.inputs)

    def weights(self, cost: CostGraph, args: Sequence[Any]) -> list[Weight]:
        """Where each parameter of ``cost`` (this graph's) comes from among ``args``."""
        weights = []
        for param in cost.params:
            i, chunk = self.inputs[param.arg_index]
            if chunk is None:
                weights.append(Weight(param.fqn, args[i]))
            else:
                weights.append(Weight(chunk.parent, args[i], (chunk.start, chunk.stop)))
        return weights

    def fqns(self, param_fqns: Mapping[int, str]) -> dict[int, str]:
        """Position -> fqn of each parameter input of ``module`` (a chunk's is its key),
        from those of the graph it was cut from."""
        fqns = {}
        for j, (i, chunk) in enumerate(self.inputs):
            if chunk is not None:
                fqns[j] = chunk.key
            elif i in param_fqns:
                fqns[j] = param_fqns[i]
        return fqns

    def rows(self) -> tuple[tuple[int, int] | None, ...]:
        """The rows of its weight each parameter of :attr:`cost` stands for (``None`` for
        a parameter not cut)."""
        assert self.cost is not None
        return tuple(
            (c.start, c.stop) if (c := self.inputs[p.arg_index][1]) is not None else None
            for p in self.cost.params
        )


def chunk_weights(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    cost: CostGraph,
    chunk_bytes: int,
    param_fqns: Mapping[int, str],
    state: Sequence[tuple[str, int, str]] = (),
) -> ChunkedGraph | None:
    """The chunking pass: ``gm`` with every weight that can be split (:func:`splits`) in row
    chunks of at most ``chunk_bytes``, with its cost graph; ``None`` when none can. The
    planner plans it instead of ``gm`` when it puts weights on disk (``plan.Split``).
    ``state`` is as for :func:`cost_graph.build_cost_graph` (placeholder names are kept)."""
    nodes = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    ranges: dict[str, tuple[str, list[tuple[int, int]]]] = {}
    for param in cost.params:
        if splits(param, nodes[param.placeholder], chunk_bytes):
            rows = row_ranges(param.shape[0], param.nbytes // param.shape[0], chunk_bytes)
            ranges[param.placeholder] = (param.fqn, rows)
    if not ranges:
        return None
    dump("chunk_weights", "before", gm)
    chunked = split_weights(gm, ranges)
    dump("chunk_weights", "after", chunked.module)
    # the weights as they are now (views of live ones); not kept: a view would keep the
    # RAM of a weight released later alive
    chunked.cost = build_cost_graph(
        chunked.module, chunked.expand(example_inputs), chunked.fqns(param_fqns), state=state
    )
    return chunked


def splits(param: ParamRef, node: torch.fx.Node, chunk_bytes: int) -> bool:
    """Whether ``param`` is split: a contiguous 2-D tensor of several rows larger than a
    chunk (its rows are then contiguous, in RAM as on disk), used only as the weight of
    linear layers."""
    if param.nbytes <= chunk_bytes or len(param.shape) != 2 or param.shape[0] < 2:
        return False
    if not node.meta["example_value"].is_contiguous():
        return False
    return bool(node.users) and all(_transposed_for_matmuls(user) for user in node.users)


def _transposed_for_matmuls(user: torch.fx.Node) -> bool:
    """Whether ``user`` is ``t(weight)`` used only as the weight of matmuls."""
    if user.op != "call_function" or user.target is not aten.t.default:
        return False
    return bool(user.users) and all(_matmul_weight(m, user) for m in user.users)


def _matmul_weight(user: torch.fx.Node, transposed: torch.fx.Node) -> bool:
    """Whether ``user`` is ``mm(x, transposed)`` or ``addmm(bias, x, transposed)`` with a
    1-D bias and ``transposed`` nowhere else (what a linear layer becomes)."""
    if user.op != "call_function" or user.target not in MATMUL_WEIGHT or user.kwargs:
        return False
    at = MATMUL_WEIGHT[user.target]
    if len(user.args) != at + 1 or user.args[at] is not transposed:
        return False
    if any(arg is transposed for arg in user.args[:at]):
        return False
    if user.target is aten.addmm.default:
        bias = user.args[0]
        fake = bias.meta.get("example_value") if isinstance(bias, torch.fx.Node) else None
        return isinstance(fake, torch.Tensor) and fake.dim() == 1
    return True


def split_weights(
    gm: torch.fx.GraphModule, ranges: dict[str, tuple[str, list[tuple[int, int]]]]
) -> ChunkedGraph:
    """A copy of ``gm`` where each placeholder named in ``ranges`` (its fqn and row ranges)
    is replaced by one placeholder per row range, and each matmul using it by the
    concatenation of one matmul per range. ``gm`` is not changed."""
    graph = copy.deepcopy(gm.graph)  # nodes copied, their meta shallowly
    module = torch.fx.GraphModule(gm, graph)
    module.meta = dict(gm.meta)
    inputs: list[tuple[int, RowChunk | None]] = []
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for position, node in enumerate(placeholders):
        if node.name not in ranges:
            inputs.append((position, None))
            continue
        fqn, rows = ranges[node.name]
        fake = node.meta["example_value"]
        parts = []
        for start, stop in rows:
            chunk = RowChunk(fqn, start, stop)
            with graph.inserting_before(node):
                part = graph.placeholder(f"{node.target}_rows_{start}_{stop}")
            part.meta = {k: v for k, v in node.meta.items() if k not in ("val", "example_value")}
            with fake.fake_mode:
                value = torch.empty(
                    (stop - start, *fake.shape[1:]), dtype=fake.dtype, device=fake.device
                )
            part.meta["val"] = part.meta["example_value"] = value
            parts.append((part, start, stop))
            inputs.append((position, chunk))
        for transposed in list(node.users):
            for user in list(transposed.users):
                _split_matmul(graph, user, parts)
            graph.erase_node(transposed)
        graph.erase_node(node)
    graph.lint()
    module.recompile()
    return ChunkedGraph(module=module, inputs=tuple(inputs))


def _split_matmul(
    graph: torch.fx.Graph, matmul: torch.fx.Node, parts: list[tuple[torch.fx.Node, int, int]]
) -> None:
    """Replace ``mm(x, t(W))`` by ``cat([mm(x, t(W_i)) ...], -1)``, and
    ``addmm(b, x, t(W))`` by ``cat([addmm(b[r0:r1], x, t(W_i)) ...], -1)``."""
    bias = matmul.args[0] if matmul.target is aten.addmm.default else None
    x = matmul.args[-2]
    with graph.inserting_before(matmul):
        outs = []
        for part, start, stop in parts:
            transposed = _call(graph, aten.t.default, (part,), matmul)
            if bias is None:
                outs.append(_call(graph, aten.mm.default, (x, transposed), matmul))
            else:
                part_bias = _call(graph, aten.slice.Tensor, (bias, 0, start, stop), matmul)
                outs.append(_call(graph, aten.addmm.default, (part_bias, x, transposed), matmul))
        cat = _call(graph, aten.cat.default, (outs, -1), matmul)
    matmul.replace_all_uses_with(cat)
    graph.erase_node(matmul)


def _call(graph: torch.fx.Graph, target: Any, args: tuple[Any, ...], like: torch.fx.Node) -> Any:
    """A new ``call_function`` node, with ``like``'s provenance and its own example value
    (computed on fake tensors, in the fake mode of ``like``'s)."""
    node = graph.call_function(target, args)
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack"):
        if key in like.meta:
            node.meta[key] = like.meta[key]
    fakes = torch.fx.node.map_arg(args, lambda n: n.meta["example_value"])
    with like.meta["example_value"].fake_mode:
        node.meta["val"] = node.meta["example_value"] = target(*fakes)
    return node
