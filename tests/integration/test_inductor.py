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
    (name,) = graph.compilers
    segment = getattr(graph.module, name)
    assert segment.fn is not segment.eager_fn, "Inductor compiled the host segment"
    # both versions were timed and the faster one kept, as explain() says
    assert graph.compiler_note is not None and " kept: " in graph.compiler_note
    assert graph.compilers[name] == ("eager" if segment.use_eager else "inductor")
    assert f"compiler: {graph.compiler_note}" in compiled.explain()
    for use_eager in (False, True):
        segment.use_eager = use_eager
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
