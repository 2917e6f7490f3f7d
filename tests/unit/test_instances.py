"""Each set of weights a graph is called with runs the graph planned for it."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from tensortorrent_dynamo.functional import GraphInputs
from tensortorrent_dynamo.instances import ByIdentity, Instances, instance_inputs


def test_each_set_of_weights_runs_its_own_graph_built_once() -> None:
    built: list[tuple[tuple[Any, ...], Sequence[Any] | None]] = []

    def build(weights: tuple[Any, ...], args: Sequence[Any] | None) -> Any:
        built.append((weights, args))
        number = len(built) - 1
        return lambda *call: (number, call)

    traced = (torch.zeros(2), "x", torch.zeros(3))
    instances = Instances([0, 2], traced, build)
    assert len(built) == 1 and built[0][1] is None
    assert built[0][0][0] is traced[0] and built[0][0][1] is traced[2]

    other = (torch.zeros(2), "y", torch.zeros(3))
    assert instances(*traced)[0] == 0
    assert instances(traced[0], "z", traced[2])[0] == 0  # another activation, same weights
    assert instances(*other)[0] == 1
    assert instances(*other)[0] == 1
    assert [args for _, args in built] == [None, other]
    # one weight of another module is another instance
    assert instances(traced[0], "x", other[2])[0] == 2
    assert len(built) == 3


def test_an_instances_inputs_are_the_calls_values_its_weights_named() -> None:
    traced = GraphInputs(values=(torch.zeros(2), torch.ones(3)), params={0: "w"})
    call = (torch.full((2,), 5.0), torch.zeros(3))
    inputs = instance_inputs(traced, call, lambda fqn, tensor: f"{fqn}!")
    assert inputs.values == call and inputs.params == {0: "w!"}
    assert instance_inputs(traced, None, lambda fqn, t: fqn).values == traced.values


def test_an_entry_is_found_again_only_for_the_live_objects_it_was_made_with() -> None:
    """Weights are known by id while they live: a tensor made after another died may have
    its id, and must not be given the dead one's graph (on the disk tier it read the dead
    weight's location, refused as another tensor's)."""
    found: ByIdentity[str] = ByIdentity()
    weight = torch.zeros(4)
    found.put([weight], "graph", ("code", "costs"))
    assert found.get([weight], ("code", "costs")) == "graph"
    assert found.get([weight], ("code", "other costs")) is None
    assert found.get([torch.zeros(4)], ("code", "costs")) is None
    # the entry of a dead tensor whose id a new tensor has
    newer = torch.zeros(4)
    dead = weakref.ref(torch.zeros(4))
    assert dead() is None
    found._entries[(("code", "costs"), (id(newer),))] = ([dead], "graph")
    assert found.get([newer], ("code", "costs")) is None
    found.prune()
    assert found.get([weight], ("code", "costs")) == "graph" and len(found._entries) == 1
