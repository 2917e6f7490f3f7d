"""One graph, the weights of many modules: each module's weights are a graph of their own.

Dynamo compiles a module's frame once for all the modules of its class, their parameters
passed in as inputs. So where a model's repeated layer breaks the graph (its code asks
for something Dynamo cannot trace: ``output_attentions``, a print, a data-dependent
branch), every layer calls the same graphs with its own weights. A plan is made for the
weights it was planned with: which stay resident on a device, which are read from disk
and from where, how much of each budget they hold. Run with another layer's weights, it
would keep a second set of copies over the budget, or read the first layer's weights
from disk in place of the ones passed.

So each set of weights a graph is called with is an *instance* of it (:class:`Instances`),
planned the first time a call passes it, with those weights, as a graph of its own: its
frame is its own (``Session.instance_frame``), so it is planned beside what the other
instances keep, as the graphs of a graph break are (where it does not fit beside them,
they are planned again keeping nothing: ``Session.make_lean_beside``). Its weights are
named apart, as every weight of a session whose name another tensor has
(``Session.weight_name``: ``mlp.up_proj.weight@2``).
"""

from __future__ import annotations

import dataclasses
import operator
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from .functional import GraphInputs

V = TypeVar("V")


class ByIdentity(Generic[V]):
    """Values found by a tuple of objects (a graph's weights) and a plain key: by the
    objects' identities, held weakly, so that a deleted model's weights are freed. An entry
    is found only while each object is the one it was made for: a new tensor may have a
    dead one's id."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[list[weakref.ref[Any]], V]] = {}

    def get(self, objects: Sequence[Any], key: Hashable = ()) -> V | None:
        found = self._entries.get((key, tuple(map(id, objects))))
        if found is None:
            return None
        refs, value = found
        return value if all(r() is o for r, o in zip(refs, objects, strict=True)) else None

    def put(self, objects: Sequence[Any], value: V, key: Hashable = ()) -> None:
        self._entries[(key, tuple(map(id, objects)))] = ([weakref.ref(o) for o in objects], value)

    def prune(self) -> None:
        """Drop the entries an object of which died."""
        self._entries = {
            k: (refs, v)
            for k, (refs, v) in self._entries.items()
            if all(r() is not None for r in refs)
        }


def instance_inputs(
    inputs: GraphInputs, args: Sequence[Any] | None, name: Callable[[str, Any], str]
) -> GraphInputs:
    """What ``inputs`` describe, with the values of ``args`` (a call's arguments, its
    weights among them; where ``None``, the traced values ``inputs`` hold), each weight
    named ``name(fqn, tensor)``."""
    values = inputs.values if args is None else tuple(args)
    return dataclasses.replace(
        inputs, values=values, params={i: name(fqn, values[i]) for i, fqn in inputs.params.items()}
    )


class Instances:
    """A graph's instances: each call runs the one planned for the weights it passes,
    planned (by ``build``, given those weights' positions' tensors and the call's arguments)
    the first time a call passes them. The weights the graph was traced with are planned at
    once (``build`` is given no arguments)."""

    def __init__(
        self,
        positions: Sequence[int],
        values: Sequence[Any],
        build: Callable[[tuple[Any, ...], Sequence[Any] | None], Callable[..., Any]],
    ) -> None:
        self._params: Callable[[Sequence[Any]], tuple[Any, ...]] = (
            operator.itemgetter(*positions)
            if len(positions) > 1
            else (lambda args: tuple(args[i] for i in positions))
        )
        self.build = build
        first = self._params(values)
        self.first = build(first, None)
        # the first weights by id, held weakly: a model deleted frees its weights. An id is
        # reused only after its tensor died, and then its weak reference has forgotten them.
        self._first_ids: tuple[int, ...] | None = tuple(map(id, first))
        self._first_refs = [weakref.ref(p, self._forget_first) for p in first]
        # the graph planned for each other set of weights
        self._others: ByIdentity[Any] = ByIdentity()
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        params = self._params(args)
        if tuple(map(id, params)) == self._first_ids:
            return self.first(*args)
        return self._other(params, args)(*args)

    def _forget_first(self, _: weakref.ref[Any]) -> None:
        self._first_ids = None

    def _other(self, params: tuple[Any, ...], args: Sequence[Any]) -> Any:
        graph = self._others.get(params)
        if graph is not None:
            return graph
        with self._lock:
            graph = self._others.get(params)
            if graph is None:
                graph = self.build(params, args)
                self._others.put(params, graph)
            return graph
