"""Dynamo's inputs matched to the functional graph's: tensor subclasses taken apart."""

from __future__ import annotations

import torch
from torch.testing._internal.two_tensor import TwoTensor

from tensortorrent_dynamo.functional import _flattened


def test_a_subclass_weight_is_taken_apart_into_parameters_named_by_attribute() -> None:
    """As AOTAutograd takes them apart (``__tensor_flatten__``, depth first): each part of
    a parameter is a parameter of its own; an activation's parts are not."""
    weight = TwoTensor(torch.ones(2, 2), torch.zeros(2, 2))
    nested = TwoTensor(TwoTensor(torch.ones(3), torch.ones(3)), torch.zeros(3))
    x, cache = TwoTensor(torch.ones(1), torch.ones(1)), torch.zeros(4)
    values = [weight, torch.ones(5), nested, x, cache, 7]
    flat = _flattened(values, {0: "w", 1: "b", 2: "n", 4: "cache"})
    assert flat.values[0] is weight.a and flat.values[1] is weight.b
    assert len(flat.values) == 2 + 1 + 3 + 2 + 1 + 1
    assert flat.params == {0: "w.a", 1: "w.b", 2: "b", 3: "n.a.a", 4: "n.a.b", 5: "n.b", 8: "cache"}
    assert list(flat.owners) == [0, 0, 1, 2, 2, 2, 3, 3, 4, 5]
    assert flat.parts == {0, 1, 3, 4, 5, 6, 7}


def test_without_subclasses_the_inputs_are_the_values_themselves() -> None:
    values = [torch.ones(2), torch.zeros(3), 4]
    flat = _flattened(values, {0: "w", 1: "cache"})
    assert flat.values is values and flat.params == {0: "w", 1: "cache"} and not flat.parts
    assert list(flat.owners) == [0, 1, 2]
