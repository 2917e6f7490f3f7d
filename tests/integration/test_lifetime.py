"""A compiled model deleted frees its weights, and a model loaded again in its place (as a
notebook or a server swapping models does) is planned as the first was, with no trace of
the first in the session."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import tensortorrent as tt
from tests.integration.test_repeated_layers import WIDTH, _model, _options

# three calls of other batch sizes: Dynamo makes the batch size symbolic at the second, so
# the graphs are planned per range of sizes (``shapes.SizeRanges``) as well as per layer
# (``instances.Instances``)
BATCHES = (8, 12, 24)


def _run(model: torch.nn.Module, budget: str, tmp_path: Path) -> tuple[Any, list[Any]]:
    """``model`` with ``forward`` compiled through the backend, called at each batch size
    and compared with eager; its plans' (residency, streams) per graph."""
    inputs = [torch.randn(b, WIDTH, generator=torch.Generator().manual_seed(b)) for b in BATCHES]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    model.forward = torch.compile(  # type: ignore[method-assign]
        model.forward, backend="tensortorrent", options=_options(budget, model, tmp_path)
    )
    with torch.no_grad():
        for x, want in zip(inputs, expected, strict=True):
            torch.testing.assert_close(model(x), want)
    plans = [
        [(r.device, r.streams, r.tier) for r in g.plan.residency]
        for g in tt.tensortorrent_backend.graphs
    ]
    return weakref.ref(model), plans


@pytest.mark.parametrize("budget", ["third", "disk"])
def test_a_deleted_compiled_model_frees_its_weights(budget: str, tmp_path: Path) -> None:
    """The callables Dynamo keeps held the weights the graphs were traced with (and the
    graphs of symbolic sizes the whole traced call), so every weight of a deleted model
    stayed in memory for as long as the process ran."""
    model = _model()
    weights = [weakref.ref(p) for p in model.parameters()]
    _run(model, budget, tmp_path)
    graphs = len(tt.tensortorrent_backend.graphs)
    assert graphs >= 2 * len(model), "a graph per layer and side of its break"
    del model
    gc.collect()
    alive = sum(ref() is not None for ref in weights)
    assert alive == 0, f"{alive} of {len(weights)} weights outlive their model"


@pytest.mark.parametrize("budget", ["third", "disk"])
def test_a_model_loaded_again_is_planned_as_the_first_was(budget: str, tmp_path: Path) -> None:
    """Three times: build the model, compile its forward with the same options, call it,
    delete it. Each time the graphs are planned as the first time, and the session holds
    only the live model's graphs (a deleted model's graphs were planned beside, their
    copies and room counted against the budget), and no plan is taken for another's
    because a new weight has a dead one's id."""
    first_plans = None
    for round_ in range(3):
        model = _model()
        ref, plans = _run(model, budget, tmp_path / str(round_))
        if first_plans is None:
            first_plans = plans
        assert plans == first_plans, f"round {round_}"
        assert len(tt.tensortorrent_backend.graphs) == len(first_plans)
        del model
        gc.collect()
        assert ref() is None
