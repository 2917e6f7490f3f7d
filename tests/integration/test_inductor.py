"""Host segments compiled by Inductor (cold compiles take tens of seconds on 2 cores)."""

from __future__ import annotations

import pytest
import torch

import tensortorrent as tt
from tests.models import mlp


@pytest.mark.inductor
def test_cpu_segments_compile_with_inductor() -> None:
    model, x = mlp(64, 2), torch.randn(8, 64)
    compiled = tt.compile(model, example_inputs=(x,), compiler="inductor", devices=["cpu"])
    (graph,) = compiled.graphs
    assert set(graph.compilers.values()) == {"inductor"}
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
