"""Lifetimes and the live-memory curve, dynamic shapes, the JSON form, a HF model."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tensortorrent_dynamo import _planner
from tensortorrent_dynamo.cost_graph import CostGraph, build_cost_graph
from tensortorrent_dynamo.errors import CostGraphFormatError
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.run.virtual import VirtualDevice
from tests.models import TransformerBlock, mlp


def capture_and_measure(
    model: torch.nn.Module, x: torch.Tensor, **compile_kwargs: Any
) -> list[tuple[CostGraph, int]]:
    """Each graph's cost graph and the activation peak measured running it eagerly."""
    results: list[tuple[CostGraph, int]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        cost = build_cost_graph(gm, example_inputs)
        meter = VirtualDevice("meter", capacity=1 << 40)
        params = {p.arg_index for p in cost.params}
        # parameters are accounted so that views of them are not counted as activations
        for i in params:
            meter.adopt(example_inputs[i], "parameter")  # type: ignore[arg-type]
        held = meter.ledger.live
        args = [
            meter.copy_in(a, "input") if isinstance(a, torch.Tensor) and i not in params else a
            for i, a in enumerate(example_inputs)
        ]
        with meter.executing():
            out = gm(*args)
        del out, args
        results.append((cost, meter.ledger.peak - held))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=backend, **compile_kwargs)(x)
    return results


@pytest.mark.parametrize(
    ("model", "x"),
    [
        (mlp(256, 4), torch.randn(64, 256)),
        (TransformerBlock(64, 4), torch.randn(4, 32, 64)),
    ],
    ids=["mlp", "transformer_block"],
)
def test_live_memory_curve_matches_a_measured_run(model: torch.nn.Module, x: torch.Tensor) -> None:
    ((cost, measured),) = capture_and_measure(model, x)
    predicted = cost.peak_live_bytes
    assert measured > 0
    assert abs(predicted - measured) <= 0.2 * measured, (predicted, measured)


def test_views_allocate_nothing_and_keep_their_base_alive() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2  # allocates
        z = y.t()  # a view of y: y's storage must live until z's last reader
        return z.exp() + 1

    ((cost, _),) = _capture_fn(f, torch.randn(8, 8))
    ids = {n.target: i for i, n in enumerate(cost.nodes)}
    assert cost.nodes[ids["mul"]].alloc_bytes == 256
    assert cost.nodes[ids["t"]].alloc_bytes == 0
    mul_storage = next(s for s in cost.storages if s.first == ids["mul"])
    assert mul_storage.last == ids["exp"]


class _SlicedProjection(torch.nn.Module):
    """A fused projection split in three (views of one storage), the last third read
    after a large temporary: the split's base must stay alive until then."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)
        scores = (q @ k.transpose(-1, -2)).softmax(-1)  # large, made while v waits
        # x read last: the simulation frees a graph input after its last reader, where
        # the caller (as the measurement) holds it to the end
        return scores.sum(-1, keepdim=True) * v + x.mean()


def test_the_simulated_peak_of_views_matches_a_measured_run() -> None:
    ((cost, measured),) = capture_and_measure(_SlicedProjection(64), torch.randn(256, 64))
    split = next(i for i, n in enumerate(cost.nodes) if n.target == "split")
    items = [i for i, n in enumerate(cost.nodes) if split in n.inputs]
    assert [cost.nodes[i].alias for i in items] == [split] * 3
    assert cost.nodes[split].alias == cost.nodes[split].inputs[0]  # a view of the matmul

    host = _planner.Device("cpu", True, 1e9, 1 << 40, 0.0, 0.0, 0.0)

    def simulated(graph: CostGraph) -> int:
        sim = _planner.simulate(
            graph.to_native(), [host], [0] * len(graph.nodes), [False] * len(graph.params)
        )
        return int(sim.peak_bytes[0])

    # the parameter is not an activation: the measured peak leaves it out
    weights = sum(p.nbytes for p in cost.params)
    assert simulated(cost) - weights == measured
    # as independent values, the split's items would free its base too soon
    as_values = dataclasses.replace(
        cost, nodes=tuple(dataclasses.replace(n, alias=None) for n in cost.nodes)
    )
    assert simulated(as_values) - weights < measured


def _copy_into_a_strided_slice(x: torch.Tensor) -> torch.Tensor:
    """Writes half the columns of a fresh tensor: functionalized, a ``copy`` into its strided
    slice (the slice's layout kept, in a clone of the fresh tensor's storage, as in
    DeepSeek-V3's attention), read from slices of the input, a buffer far larger than them."""
    y = x[:64] * 2
    y[:, :8].copy_(x[64:128, 8:] + 1)
    return y + x[:64].mean()


def test_a_copy_is_costed_at_its_storage_and_a_view_at_its_tensor() -> None:
    x = torch.randn(256, 16)  # 16 KiB: the large buffer
    ((gm, inputs),) = capture(_copy_into_a_strided_slice, x)
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    fakes = {n.name: n.meta["val"] for n in gm.graph.nodes if "val" in n.meta}
    by_name = {n.name: n for n in cost.nodes}

    (copy,) = (n for n in cost.nodes if n.target == "copy.default")
    tensor = fakes[copy.name].numel() * 4
    storage = fakes[copy.name].untyped_storage().nbytes()
    assert (tensor, storage) == (2048, 4064)  # 64 rows of 8 floats, 16 floats apart
    # eager clones the destination's whole storage (64 rows of 16 floats), where the fake
    # kernel spans the slice's strides only
    destination = fakes[
        gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy.default)[0].args[0].name
    ]
    whole = destination.untyped_storage().nbytes()
    assert whole == 4096
    assert copy.alias is None and copy.alloc_bytes == whole
    assert copy.out_bytes == whole, "a copy holds its new storage where it runs"

    # slices of the input (its 16 KiB storage) and of the fresh tensor: their tensors only
    views = [n for n in cost.nodes if n.target == "slice.Tensor"]
    assert len(views) == 5
    for view in views:
        value = fakes[view.name]
        assert value.untyped_storage().nbytes() > value.numel() * 4
        assert view.alias is not None and view.alloc_bytes == 0
        assert view.out_bytes == value.numel() * 4, view.name
    assert by_name["arg0_1"].out_bytes == x.numel() * 4

    # the simulated peak counts the copy's layout as a run measures it (the peak is while
    # the copy, its base and the scattered result are alive)
    meter = VirtualDevice("meter", capacity=1 << 40)
    args = [meter.copy_in(a, "input") for a in inputs.values]
    held = meter.ledger.live
    with meter.executing():
        out = gm(*args)
    del out
    measured = meter.ledger.peak - held
    host = _planner.Device("cpu", True, 1e9, 1 << 40, 0.0, 0.0, 0.0)
    sim = _planner.simulate(cost.to_native(), [host], [0] * len(cost.nodes), [])
    simulated = int(sim.peak_bytes[0]) - held
    # to the byte: at the fake storage's 4064 bytes it was 32 under (as DeepSeek-V3's decode
    # step was, which ran 14 bytes over a plan filled to its budget)
    assert measured == simulated, (simulated, measured)


def _capture_fn(fn: Any, x: torch.Tensor) -> list[tuple[CostGraph, int]]:
    graphs: list[tuple[CostGraph, int]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        graphs.append((build_cost_graph(gm, example_inputs), 0))
        return gm.forward

    torch.compile(fn, backend=backend)(x)
    return graphs


def test_dynamic_shapes_record_the_sizes_assumed() -> None:
    model = mlp(32, 2)
    graphs = capture_and_measure(model, torch.randn(6, 32), dynamic=True)
    ((cost, _),) = graphs
    assert sorted(cost.assumed_sizes.values()) == [6]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(6, 32))
    assert cost.total_flops == counter.get_total_flops()
    assert cost.nodes[-1].out_bytes == 6 * 32 * 4


def test_json_round_trip(tmp_path: Path) -> None:
    ((cost, _),) = capture_and_measure(TransformerBlock(32, 4), torch.randn(2, 8, 32))
    path = tmp_path / "graph.json"
    cost.save(path)
    again = CostGraph.load(path)
    assert again == cost
    data = json.loads(path.read_text())
    assert data["format_version"] == 1 and data["format"] == "tensortorrent-cost-graph"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d.update(format_version=99), "version 99 is not supported"),
        (lambda d: d.pop("format"), "not a TensorTorrent cost graph"),
        (lambda d: d.pop("nodes"), "malformed"),
    ],
)
def test_json_refuses_what_it_cannot_read(tmp_path: Path, change: Any, needle: str) -> None:
    ((cost, _),) = capture_and_measure(mlp(8, 1), torch.randn(2, 8))
    data = cost.to_json()
    change(data)
    with pytest.raises(CostGraphFormatError, match=needle):
        CostGraph.from_json(data)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CostGraphFormatError, match="cannot read"):
        CostGraph.load(tmp_path / "bad.json")


def test_hf_model_from_a_config_costs_like_the_flop_counter() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 8))
    graphs = _capture_fn(lambda t: model(t).logits, ids)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    assert sum(g.total_flops for g, _ in graphs) == counter.get_total_flops() > 0
    fqns = {p.fqn for g, _ in graphs for p in g.params}
    assert any(f.endswith("q_proj.weight") for f in fqns)
    assert all(p.home == "cpu" for g, _ in graphs for p in g.params)
