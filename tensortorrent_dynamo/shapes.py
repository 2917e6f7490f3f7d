"""Dynamic shapes: which sizes a plan was made for, and when to plan again.

A graph Dynamo compiled with symbolic sizes runs at many sizes, and the memory a plan
needs grows with them. A plan is made for a range of sizes: each symbol up to the next
power of two of its value (``s0 = 5`` plans for ``s0 <= 8``), costed at that bound, so
the budgets hold for every size in the range. A call with a size beyond the range plans
again, for the range holding it (``4 < s0 <= 8`` is one range, ``8 < s0 <= 16`` the
next); each range's plan is kept, so sizes that come back reuse it. A range the budgets
cannot hold at its bound ends at the sizes of the call that asked for it instead.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from .errors import PlanInfeasible

log = logging.getLogger(__name__)


def bound(value: int) -> int:
    """The largest size of the range holding ``value``: the next power of two."""
    return 1 << max(0, int(value) - 1).bit_length()


def format_range(bounds: Mapping[str, int]) -> str:
    """``s0 <= 8, s1 <= 16``."""
    return ", ".join(f"{name} <= {value}" for name, value in sorted(bounds.items())) or "-"


@dataclasses.dataclass(frozen=True)
class SymbolicSizes:
    """Where each free symbol of a graph's input sizes is read from its inputs: the
    position of an input and the dimension (``None`` for a size passed as an int)."""

    where: Mapping[str, tuple[int, int | None]]
    # symbol name -> the value it was traced with
    hints: Mapping[str, int]

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> SymbolicSizes:
        where: dict[str, tuple[int, int | None]] = {}
        hints: dict[str, int] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for position, node in enumerate(placeholders):
            value = node.meta.get("val", node.meta.get("example_value"))
            dims: list[tuple[int | None, Any]]
            if isinstance(value, torch.Tensor):
                dims = list(enumerate(value.shape))
            else:
                dims = [(None, value)]
            for dim, size in dims:
                if not isinstance(size, torch.SymInt):
                    continue
                expr = size.node.expr
                if getattr(expr, "is_Symbol", False) and str(expr) not in where:
                    where[str(expr)] = (position, dim)
                    hint = size.node.hint
                    hints[str(expr)] = int(hint) if hint is not None else 1
        return cls(where=where, hints=hints)

    def __bool__(self) -> bool:
        return bool(self.where)

    def values(self, args: Sequence[Any]) -> dict[str, int]:
        """Each symbol's value in a call with ``args``."""
        values = {}
        for name, (position, dim) in self.where.items():
            arg = args[position]
            values[name] = int(arg.shape[dim] if dim is not None else arg)
        return values

    def bounds(self, values: Mapping[str, int]) -> dict[str, int]:
        """The range holding ``values``: each symbol's upper bound."""
        return {name: bound(value) for name, value in values.items()}


class SizeRanges:
    """A dynamic-shape graph: each call runs with the plan made for the range its sizes
    fall in, planned (by ``build``, given the range's bounds and the call's arguments) the
    first time a call falls in it. The range of the sizes of ``args`` (where ``None``, of
    those the graph was traced with) is planned at once.

    When the budgets cannot hold a range at its bounds, the range is narrowed to end at the
    sizes of the call (the plan is made for them exactly); a later call beyond them plans
    again."""

    def __init__(
        self,
        sizes: SymbolicSizes,
        build: Callable[[dict[str, int], Sequence[Any] | None], Any],
        args: Sequence[Any] | None = None,
    ) -> None:
        self.sizes = sizes
        self.build = build
        # (lower bounds, exclusive; upper bounds; the graph planned for them)
        self.ranges: list[tuple[dict[str, int], dict[str, int], Any]] = []
        self._lock = threading.Lock()
        self.graph_for(sizes.hints if args is None else sizes.values(args), args)

    def _find(self, values: Mapping[str, int]) -> Any:
        for low, high, graph in self.ranges:
            if all(low[k] < v <= high[k] for k, v in values.items()):
                return graph
        return None

    def graph_for(self, values: Mapping[str, int], args: Sequence[Any] | None) -> Any:
        """The compiled graph for a call whose symbols have ``values``: ``build`` is given
        the range's bounds and the call's arguments ``args`` (``None``: the traced ones)."""
        graph = self._find(values)
        if graph is not None:
            return graph
        with self._lock:
            graph = self._find(values)
            if graph is not None:
                return graph
            high = self.sizes.bounds(values)
            low = {k: v // 2 for k, v in high.items()}
            if self.ranges:
                log.info(
                    "sizes %s are beyond the ranges planned for (%s): planning for %s",
                    ", ".join(f"{k}={v}" for k, v in sorted(values.items())),
                    "; ".join(format_range(h) for _, h, _ in self.ranges),
                    format_range(high),
                )
            try:
                graph = self.build(high, args)
            except PlanInfeasible as exc:
                if dict(values) == high:
                    raise
                high = dict(values)
                log.info("%s; planning for the sizes of this call instead: %s", exc, high)
                graph = self.build(high, args)
            self.ranges.append((low, high, graph))
            return graph

    def __call__(self, *args: Any) -> Any:
        return self.graph_for(self.sizes.values(args), args)(*args)
