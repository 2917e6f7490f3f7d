"""Every corpus entry through the backend at no budget and at a third of its parameters'
bytes, called twice with different inputs, compared with eager; afterwards the original
module still gives eager's result and its tensors are unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

import tensortorrent as tt

from .harness import (
    assert_same,
    assert_tensors_equal,
    budget_bytes,
    check_plans,
    entry_cases,
    options,
    peak,
)
from .models import BUDGETS, BY_NAME, ENTRIES, Entry


@pytest.mark.parametrize(("entry", "budget"), entry_cases(ENTRIES, BUDGETS))
def test_entry_matches_eager(entry: Entry, budget: str) -> None:
    model = entry.build()
    reference = copy.deepcopy(model)
    calls = [entry.inputs(0), entry.inputs(1)]
    with torch.no_grad():
        expected = [reference(**kwargs) for kwargs in calls]

    compiled = tt.compile(model, **options(budget, model))
    with torch.no_grad():
        for i, kwargs in enumerate(calls):
            assert_same(compiled(**kwargs), expected[i], f"call {i + 1}")
    check_plans(compiled.graphs, budget)
    assert 0 < peak(compiled) <= budget_bytes(budget, model)

    # the original module, called without the backend, is as it was
    with torch.no_grad():
        assert_same(model(**entry.inputs(0)), expected[0], "the original module afterwards")
    assert_tensors_equal(model, reference)


@pytest.mark.inductor
def test_inductor_compiles_a_third_party_models_functional_graph() -> None:
    """The host segment of a real model compiles with Inductor, not falling back to eager
    (a fallback warns, and warnings fail the tests): the functional graph's outputs are
    flat, where Dynamo's nested tuples (a KV cache) made Inductor refuse them."""
    entry = BY_NAME["gpt2"]
    model = entry.build()
    reference = copy.deepcopy(model)
    compiled = tt.compile(model, devices=["cpu"], compiler="inductor")
    with torch.no_grad():
        for i in range(2):
            assert_same(compiled(**entry.inputs(i)), reference(**entry.inputs(i)), f"call {i}")
    assert compiled.graphs
    for graph in compiled.graphs:
        for name in graph.compilers:
            segment = getattr(graph.module, name)
            assert segment.fn is not segment.eager_fn, f"{name} was not compiled by Inductor"
