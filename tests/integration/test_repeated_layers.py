"""A graph break inside a repeated layer: Dynamo compiles the layer's frame once and every
layer calls its graphs with its own weights. Each layer's weights are planned as a graph of
their own, so every layer computes with its own weights, within the budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tensortorrent as tt
from tests.models import param_bytes

WIDTH = 256
LAYERS = 4
FAST_VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


class BrokenLayer(nn.Module):
    """Three linears, a graph break, one more: two graphs per layer, each called by every
    layer with its own weights."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c(self.b(self.a(x).relu()).relu()).relu()
        torch._dynamo.graph_break()
        return self.d(x).relu()


class OtherLayer(nn.Module):
    """Another class whose weights have the same names and shapes as ``BrokenLayer``'s
    first graph's: its frame's graph names them alike."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x).tanh()
        torch._dynamo.graph_break()
        return self.c(self.b(x).tanh()).tanh()


def _model(other: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [BrokenLayer() for _ in range(LAYERS)]
    if other:
        layers.append(OtherLayer())
    return nn.Sequential(*layers).eval()


def _options(budget: str, model: nn.Module, tmp_path: Path) -> dict[str, Any]:
    if budget == "disk":
        # an eighth: less than one graph's weights, so that each layer reads some from disk
        eighth = param_bytes(model) // 8
        return {"budgets": {"cpu": eighth}, "offload_dir": str(tmp_path), "compiler": "eager"}
    return {
        "budgets": {"virtual:0": param_bytes(model) // 3},
        "virtual_devices": FAST_VIRTUAL,
        "devices": ["virtual:0"],
        "compiler": "eager",
    }


@pytest.mark.parametrize("budget", ["third", "disk"])
@pytest.mark.parametrize("other", [False, True], ids=["repeated", "same-names"])
def test_every_layer_computes_with_its_own_weights(
    budget: str, other: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = _model(other)
    x = torch.randn(8, WIDTH)
    with torch.no_grad():
        expected = model(x)
    opts = _options(budget, model, tmp_path)
    compiled = torch.compile(model, backend="tensortorrent", options=opts)
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), expected)
    graphs = tt.tensortorrent_backend.graphs
    # two graphs per layer, each of its own weights, all named apart
    assert len(graphs) == 2 * len(model)
    names = [p.fqn for g in graphs for p in g.plan.cost.params]
    assert len(names) == len(set(names)) == len(list(model.parameters())), names
    assert "a.weight@1" in names
    # each frame's second module is told once: what the graph break costs, and where to look
    told = [r.getMessage() for r in caplog.records if "run for more than one module" in r.message]
    assert len(told) == 2, told  # the layer's two frames (before and after its break)
    assert "a.weight@1" in told[0] + told[1] and "TORCH_LOGS=graph_breaks" in told[0]
    if budget == "disk":
        limit = opts["budgets"]["cpu"]
        assert any(r.reads_from_disk for g in graphs for r in g.plan.residency)
        peaks = {g.plan.graph_index: g.plan.predicted_peak("cpu") for g in graphs}
        assert all(p <= limit for p in peaks.values()), f"host peaks over {limit} B: {peaks}"
    else:
        peaks = {g.plan.graph_index: g.runtime.virtual["virtual:0"].ledger.peak for g in graphs}
        limit = opts["budgets"]["virtual:0"]
        assert all(0 < p <= limit for p in peaks.values()), f"peaks over {limit} B: {peaks}"


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.a(x).relu())


@pytest.mark.parametrize("budget", ["third", "disk"])
def test_layers_compiled_one_by_one_compute_with_their_own_weights(
    budget: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regional compilation (each layer compiled on its own, as diffusers'
    ``compile_repeated_blocks`` does): the layers share one Dynamo frame and its graph;
    each layer's weights are planned apart, named apart, within the budgets shared by all,
    and the warning says what it costs and what to do instead."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), *(Layer() for _ in range(LAYERS))).eval()
    x = torch.randn(8, WIDTH)
    with torch.no_grad():
        expected = model(x)
    opts = _options(budget, model, tmp_path)
    if budget == "disk":  # a third: a layer reads both its weights at once
        opts["budgets"]["cpu"] = param_bytes(model) // 3
    for layer in model[1:]:
        layer.compile(backend="tensortorrent", options=opts)
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(model(x), expected)
    graphs = tt.tensortorrent_backend.graphs
    assert len(graphs) == LAYERS
    names = [p.fqn for g in graphs for p in g.plan.cost.params]
    assert len(names) == len(set(names)) == 4 * LAYERS, names
    told = [r.getMessage() for r in caplog.records if "run for more than one module" in r.message]
    assert len(told) == 1 and "compile the whole model instead" in told[0], told
    if budget == "disk":
        limit = opts["budgets"]["cpu"]
        assert any(r.reads_from_disk for g in graphs for r in g.plan.residency)
        peaks = {g.plan.graph_index: g.plan.predicted_peak("cpu") for g in graphs}
    else:
        limit = opts["budgets"]["virtual:0"]
        assert any(r.streams for g in graphs for r in g.plan.residency)
        peaks = {g.plan.graph_index: g.runtime.virtual["virtual:0"].ledger.peak for g in graphs}
    assert all(0 < p <= limit for p in peaks.values()), f"peaks over {limit} B: {peaks}"
