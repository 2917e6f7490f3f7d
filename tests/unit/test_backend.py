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
