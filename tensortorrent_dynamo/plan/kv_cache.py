"""A static KV cache too large for the budgets: its size, and the largest length that fits.

A static cache (``cache_implementation="static"`` in ``generate()``) is a set of buffers
written at positions along one dimension with ``index_copy``: made in the prefill graph
(``zeros`` of the cache's whole length), inputs written in place in the decode graph.
When no plan fits, :meth:`KvCache.find` finds those buffers and the error
(:class:`KvCacheTooLarge`) has the graph planned again as if the cache were shorter
(every value with a dimension of the cache's length scaled to the shorter one: the
buffers, and the attention scores and masks over them) to find the largest length that
fits, by bisection. The error then names the cache's size
and that length, before any token is produced.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.fx

from ..cost_graph import CostGraph, size_hint
from ..errors import KvCacheTooLarge, PlanInfeasible
from ..units import format_bytes

aten = torch.ops.aten

# what a cache buffer written in place starts as, in the graph that makes it
_FACTORIES = {aten.zeros.default, aten.full.default, aten.empty.memory_format}


@dataclasses.dataclass(frozen=True)
class KvCache:
    """The cache buffers of one graph: their node names, shapes, dtype and bytes, and the
    length of the dimension positions are written along."""

    buffers: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    length: int

    @classmethod
    def find(cls, gm: torch.fx.GraphModule, cost: CostGraph) -> KvCache | None:
        """The buffers ``gm`` writes with ``index_copy`` (or ``index_copy_``) along one
        dimension, of one length, that it makes (``zeros``) or takes as inputs written in
        place; ``None`` without."""
        state = {r.placeholder for r in cost.state}
        found: dict[str, torch.Tensor] = {}
        lengths = set()
        for node in gm.graph.nodes:
            if node.target not in (aten.index_copy.default, aten.index_copy_.default):
                continue
            base, dim = node.args[0], node.args[1]
            if not isinstance(base, torch.fx.Node) or not isinstance(dim, int):
                continue
            made = base.op == "call_function" and base.target in _FACTORIES
            if not (made or base.name in state):
                continue
            value = base.meta.get("val")
            if not isinstance(value, torch.Tensor) or not value.dim():
                continue
            found[base.name] = value
            lengths.add(size_hint(value.shape[dim]))
        if not found or len(lengths) != 1:
            return None
        shapes = {name: tuple(size_hint(s) for s in v.shape) for name, v in found.items()}
        largest = max(found, key=lambda name: math.prod(shapes[name]))
        return cls(
            buffers=tuple(found),
            shape=shapes[largest],
            dtype=found[largest].dtype,
            nbytes=sum(math.prod(shapes[n]) * v.element_size() for n, v in found.items()),
            length=lengths.pop(),
        )

    def shortened(self, gm: torch.fx.GraphModule, cost: CostGraph, length: int) -> CostGraph:
        """``cost`` as if the cache held ``length`` positions: every value with a dimension of
        the cache's length is that much smaller (parameters are left as they are)."""
        shapes = {
            n.name: tuple(size_hint(s) for s in n.meta["val"].shape)
            for n in gm.graph.nodes
            if isinstance(n.meta.get("val"), torch.Tensor)
        }

        def scaled(name: str, nbytes: int) -> int:
            shape = shapes.get(name, ())
            factor = (length / self.length) ** sum(1 for s in shape if s == self.length)
            return math.ceil(nbytes * factor)

        nodes = tuple(
            dataclasses.replace(n, out_bytes=scaled(n.name, n.out_bytes)) for n in cost.nodes
        )
        return dataclasses.replace(cost, nodes=nodes)


def explain_infeasible(
    error: PlanInfeasible, cache: KvCache | None, fits: Callable[[int], bool]
) -> PlanInfeasible:
    """``error`` as a :class:`KvCacheTooLarge` when the graph holds a static KV cache
    (``cache``; else ``error`` itself); ``fits(length)`` says whether a plan of the graph
    with a cache that long exists: the largest such length is found by bisection."""
    if cache is None:
        return error

    def largest() -> int:
        low, high = 0, cache.length  # `low` positions fit (0: trivially), `high` do not
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        return low

    def describe(length: int) -> str:
        per_position = cache.nbytes / cache.length
        shape = "x".join(str(s) for s in cache.shape)
        dtype = str(cache.dtype).removeprefix("torch.")
        what = (
            f"the KV cache ({len(cache.buffers)} buffers of up to {shape} {dtype}, "
            f"{format_bytes(cache.nbytes)} for {cache.length} positions, "
            f"{format_bytes(round(per_position))} per position) does not fit beside the model"
        )
        if length == 0:
            return f"{what}, and no cache length does: {error}"
        return (
            f"{what}: the largest cache length that fits is {length} positions (about the "
            "prompt's length plus max_new_tokens); ask for fewer new tokens, a shorter "
            f"prompt or a smaller batch, or raise the budget ({error})"
        )

    return KvCacheTooLarge(error, cache.nbytes, cache.length, largest, describe)
