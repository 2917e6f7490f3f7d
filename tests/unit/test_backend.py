"""The registered backend stays thin: options become settings, settings pick a session, and
each functional graph goes through the pipeline."""

from __future__ import annotations

import pytest
import torch

from tensortorrent_dynamo import OptionsError
from tensortorrent_dynamo.backend import TensorTorrentBackend
from tests.models import mlp


def test_mode_and_unknown_options_are_refused_before_anything_runs() -> None:
    backend = TensorTorrentBackend()
    gm = torch.fx.symbolic_trace(mlp(8, 1))
    with pytest.raises(OptionsError, match="does not use mode='max-autotune'"):
        backend(gm, [torch.randn(2, 8)], mode="max-autotune")
    with pytest.raises(OptionsError, match=r"unknown option\(s\) \['budget'\]"):
        backend(gm, [torch.randn(2, 8)], options={"budget": "1GiB"})
    assert backend.sessions == {}


def test_graphs_share_a_session_per_settings_and_reset_drops_them() -> None:
    backend = TensorTorrentBackend({"compiler": "eager"})
    model, x = mlp(16, 2), torch.randn(2, 16)
    same = torch.compile(model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(same(x), model(x))
    # the same code compiled again with other options (torch._dynamo.reset() would reset
    # the backend itself: it is what drops its sessions)
    other = torch.compile(
        model, backend=lambda gm, inputs: backend(gm, inputs, options={"budgets": {"cpu": "1GiB"}})
    )
    with torch.no_grad():
        torch.testing.assert_close(other(x), model(x))
    assert len(backend.sessions) == 2 and len(backend.graphs) == 2
    assert {s.settings.compiler for s in backend.sessions.values()} == {"eager"}
    backend.reset()
    assert backend.sessions == {} and backend.graphs == []


def test_a_model_dynamo_runs_all_eagerly_is_said_to_have_nothing_planned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Code Dynamo skips (here a forward it is told not to compile; a quantized op it cannot
    trace, in practice) leaves no graph: the budgets never applied, and a WARNING says so
    once, rather than the call passing as planned."""
    import tensortorrent as tt

    class Skipped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = mlp(16, 2)

        @torch._dynamo.disable
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    torch._dynamo.reset()
    compiled = tt.compile(Skipped(), compiler="eager", budgets={"cpu": 1 << 10})
    with caplog.at_level("WARNING", logger="tensortorrent_dynamo"), torch.no_grad():
        for _ in range(2):
            compiled(torch.randn(2, 16))
    said = [r for r in caplog.records if "no graph to plan" in r.getMessage()]
    assert len(said) == 1 and "Skipped" in said[0].getMessage()
    assert compiled.graphs == []
