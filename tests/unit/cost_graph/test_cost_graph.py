from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tensortorrent_dynamo.cost_graph import CostGraph, build_cost_graph, fqn_of, tensor_bytes
from tests.models import TransformerBlock, mlp


def capture(model: torch.nn.Module, x: torch.Tensor) -> list[CostGraph]:
    graphs: list[CostGraph] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        graphs.append(build_cost_graph(gm, example_inputs))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    return graphs


def eager_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops())


@pytest.mark.parametrize(
    ("model", "x"),
    [(mlp(64, 3), torch.randn(8, 64)), (TransformerBlock(32, 4), torch.randn(2, 8, 32))],
    ids=["mlp", "transformer_block"],
)
def test_flops_match_flop_counter(model: torch.nn.Module, x: torch.Tensor) -> None:
    (graph,) = capture(model, x)
    assert graph.total_flops == eager_flops(model, x) > 0


def test_params_inputs_and_outputs() -> None:
    model, x = mlp(16, 2), torch.randn(4, 16)
    (graph,) = capture(model, x)
    assert [p.fqn for p in graph.params] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert graph.param_bytes == sum(p.numel() * 4 for p in model.parameters())
    inputs = [n for n in graph.nodes if n.is_graph_input]
    assert len(inputs) == 1 and inputs[0].host_only and inputs[0].out_bytes == 4 * 16 * 4
    weight = graph.params[0]
    assert weight.shape == (16, 16) and weight.dtype == "float32"
    assert [graph.nodes[u].target for u in weight.users] == ["linear"]
    # every input of a node comes before it: the planner relies on topological order
    assert all(i < nid for nid, n in enumerate(graph.nodes) for i in n.inputs)
    assert len(graph.output_ids) == 1
    assert graph.nodes[graph.output_ids[0]].out_bytes == 4 * 16 * 4
    native = graph.to_native()
    assert native.num_nodes == len(graph.nodes)
    assert native.num_params == 4


def test_fqn_from_placeholder_names() -> None:
    assert fqn_of("L_fn_modules_0_parameters_weight_", {}) == "0.weight"
    assert (
        fqn_of("L_self_modules_self_attn_modules_q_proj_parameters_weight_", {})
        == "self_attn.q_proj.weight"
    )
    assert fqn_of("L_self_modules_bn_buffers_running_mean_", {}) == "bn.running_mean"
    assert fqn_of("weird", {}) == "weird"
    assert fqn_of("weird", {"weird": "a.b"}) == "a.b"


def test_tensor_bytes_of_nested_values() -> None:
    assert tensor_bytes((torch.ones(2, 3), [torch.ones(4, dtype=torch.float16), 7])) == 24 + 8
    assert tensor_bytes(None) == 0


def test_nodes_with_flops_carry_their_dtype_and_its_rate_class() -> None:
    model, x = mlp(16, 2).to(torch.bfloat16), torch.randn(4, 16, dtype=torch.bfloat16)
    (graph,) = capture(model, x)
    with_flops = [n for n in graph.nodes if n.flops > 0]
    assert with_flops and all(n.dtype == "bfloat16" for n in with_flops)
    assert all(n.dtype is None for n in graph.nodes if n.flops == 0)
    again = CostGraph.from_json(json.loads(json.dumps(graph.to_json())))
    assert again == graph, "the dtype survives the file"
    (f32,) = capture(mlp(16, 2), torch.randn(4, 16))
    assert {n.dtype for n in f32.nodes if n.flops > 0} == {"float32"}
    assert f32.digest() != graph.digest()


def test_matmul_nodes_carry_the_rows_of_their_result() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    (graph,) = capture(model, torch.randn(3, 5, 16))
    matmuls = [n for n in graph.nodes if n.flops > 0]
    assert len(matmuls) == 2 and all(n.rows == 15 for n in matmuls), matmuls
    assert all(n.rows is None for n in graph.nodes if n.flops == 0)
    again = CostGraph.from_json(json.loads(json.dumps(graph.to_json())))
    assert again == graph, "the rows survive the file"
    node = next(n for n in graph.to_json()["nodes"] if n.get("rows") is None)
    assert "rows" not in node, "kept only where set"


def test_ops_alike_are_counted_once_and_costed_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """FLOPs are counted once per op signature (target, and each tensor argument's dtype,
    shape and strides): a graph of repeated layers (or a tiled decode's tiles) would
    otherwise run every op of every layer under the fake mode. A layer of another width
    is counted on its own."""
    from tensortorrent_dynamo import cost_graph

    counted: list[str] = []
    count = cost_graph._count_flops

    def counting(node: torch.fx.Node, sizes: Any = None) -> float:
        counted.append(node.name)
        return count(node, sizes)

    monkeypatch.setattr(cost_graph, "_count_flops", counting)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *(torch.nn.Linear(32, 32) for _ in range(6)), torch.nn.Linear(32, 8), torch.nn.ReLU()
    )
    x = torch.randn(4, 32)
    (graph,) = capture(model, x)
    assert graph.total_flops == eager_flops(model, x) > 0
    linears = [n for n in graph.nodes if n.target == "linear"]
    assert [n.flops for n in linears] == [2 * 4 * 32 * 32] * 6 + [2 * 4 * 32 * 8]
    assert len(linears) == 7 and len(counted) == 3, counted  # two linears and the relu
