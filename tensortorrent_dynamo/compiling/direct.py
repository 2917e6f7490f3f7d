"""Eager segments that call each ATen op straight through the dispatcher.

A segment of the functional graph runs eager as the code FX generates for it, one call
per node: ``torch.ops.aten.view.default(x, [16, 64])``. That call is
``OpOverload.__call__``, a Python function that then calls the operator's C++ entry point
(``OpOverload._op``). On the 2-core development machine the Python frame costs 0.3-3 us
an op (``aten.add``: 2.15 us through ``OpOverload``, 1.88 us through ``_op``;
``aten.view``: 3.73 against 2.04 us), where a small Llama's graph pays 5-6 us an op in all:
its eager graph ran 20-25% faster calling ``_op`` (2.40 -> 1.88 ms, 3.69 -> 2.95 ms, side
by side). :func:`direct_calls` gives a segment's graph that calls ``_op`` where that is
what ``OpOverload.__call__`` would do (an op with no Python kernel of its own).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.fx


class _Direct(functools.partial):  # type: ignore[type-arg]
    """An ATen op's C++ entry point, named so that FX's generated code can refer to it (a
    ``partial`` is called without a Python frame of its own)."""

    __name__: str


def _direct(op: torch._ops.OpOverload) -> Any | None:
    """``op``'s C++ entry point, or ``None`` where calling ``op`` may do more (a Python
    kernel registered for it)."""
    if getattr(op, "_pyobj_dispatcher", None) is not None:
        return None
    entry = getattr(op, "_op", None)
    if entry is None:
        return None
    direct = _Direct(entry)
    direct.__name__ = f"{op.namespace}_{op._opname}_{op._overloadname}"
    return direct


def direct_calls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` (``gm`` itself is unchanged) whose ATen calls go straight to
    their C++ entry points; the nodes keep their names and metadata."""
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            direct = _direct(node.target)
            if direct is not None:
                node.target = direct
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
