"""explain(): each section says what the plan says (streamed parameters, the disk tier,
the devices)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import tensortorrent as tt
from tensortorrent_dynamo.report.explain import explain_devices, explain_graph
from tests.models import mlp, param_bytes

VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _graph(width: int = 32, depth: int = 3, **options: Any) -> Any:
    model, x = mlp(width, depth), torch.randn(4, width)
    compiled = tt.compile(model, example_inputs=(x,), compiler="eager", **options)
    (graph,) = compiled.graphs
    return graph


def _streamed_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("  streamed parameters")]
    return line


def _planned_streamed(graph: Any) -> list[str]:
    plan = graph.plan
    return [p.fqn for p, r in zip(plan.cost.params, plan.residency, strict=True) if r.streams]


def test_streamed_parameters_are_the_ones_the_plan_streams() -> None:
    graph = _graph(budgets={"virtual:0": "10KiB", "cpu": "1GiB"}, virtual_devices=VIRTUAL)
    streamed = _planned_streamed(graph)
    assert streamed and len(streamed) < len(graph.plan.cost.params)
    line = _streamed_line(explain_graph(graph))
    assert line.startswith(f"  streamed parameters ({len(streamed)}, ")
    assert line.rsplit(": ", 1)[1].split(", ") == streamed


def test_no_streamed_parameters_when_everything_fits() -> None:
    graph = _graph(budgets={"virtual:0": "1GiB", "cpu": "1GiB"}, virtual_devices=VIRTUAL)
    assert not _planned_streamed(graph)
    text = explain_graph(graph)
    assert _streamed_line(text) == "  streamed parameters: none"
    assert "disk tier" not in text


def test_segment_rows_name_each_segment_and_its_device() -> None:
    graph = _graph(budgets={"virtual:0": "10KiB", "cpu": "1GiB"}, virtual_devices=VIRTUAL)
    lines = explain_graph(graph).splitlines()
    rows = [ln.split() for ln in lines if ln.startswith("  submod_")]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (name, device, graph.compilers[name]) for name, device in graph.compilers_by_device()
    ]
    assert lines[0].startswith(
        f"Graph 0: {len(graph.plan.cost.nodes)} nodes, {len(graph.plan.cost.params)} parameters"
    )
    assert graph.plan.plan_hash in lines[0]


def test_the_disk_tier_section_counts_what_the_plan_reads_and_keeps(tmp_path: Path) -> None:
    budget = param_bytes(mlp(64, 4)) // 2
    graph = _graph(
        64, 4, budgets={"cpu": budget}, devices=["cpu"], offload_dir=str(tmp_path / "offload")
    )
    residency = graph.plan.residency
    read = sum(1 for r in residency if r.on_disk and r.streams)
    kept = sum(1 for r in residency if r.on_disk and not r.streams)
    assert read and kept
    text = explain_graph(graph)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("  disk tier:")]
    assert line.startswith(f"  disk tier: {read} parameters (")
    assert f"read from disk each run, {kept} (" in line
    # the streamed ones are read from disk: the streamed section names them too
    assert _streamed_line(text).rsplit(": ", 1)[1].split(", ") == _planned_streamed(graph)
    devices = explain_devices([graph])
    assert sum(ln.startswith("  disk tier:") for ln in devices) == 1


def test_the_device_table_lists_every_planned_device_with_its_budget() -> None:
    graph = _graph(budgets={"virtual:0": "10KiB", "cpu": "1GiB"}, virtual_devices=VIRTUAL)
    lines = explain_devices([graph])
    assert lines[0] == "Devices" and lines[1].split()[0] == "device"
    rows = [ln.split() for ln in lines[2:] if not ln.startswith(("  host RSS", "  ops:"))]
    assert [r[0] for r in rows] == [d.name for d in graph.plan.devices] == ["cpu", "virtual:0"]
    by_name = {r[0]: r for r in rows}
    assert by_name["virtual:0"][1] == "virtual"
    assert by_name["virtual:0"][2:4] == ["10.00", "KiB"]
    assert by_name["cpu"][2:4] == ["1.00", "GiB"]
    assert not any("disk tier" in ln for ln in lines)


def test_the_device_table_of_a_host_only_plan_has_only_the_host() -> None:
    graph = _graph(16, 2, devices=["cpu"])
    lines = explain_devices([graph])[2:]
    rows = [ln.split() for ln in lines if not ln.startswith(("  host RSS", "  ops:"))]
    assert [d.name for d in graph.plan.devices] == ["cpu"]
    assert [r[0] for r in rows] == ["cpu"]


def test_the_ops_line_counts_the_ops_and_names_each_devices_cost_per_op() -> None:
    graph = _graph(budgets={"virtual:0": "10KiB", "cpu": "1GiB"}, virtual_devices=VIRTUAL)
    (line,) = [ln for ln in explain_devices([graph]) if ln.startswith("  ops:")]
    nodes = graph.plan.cost.nodes
    # three layers: a view of the weight, an addmm and a relu each; no op for the input
    assert sum(n.op_count for n in nodes) == 3 * 3
    assert line.startswith("  ops: 9 (each graph once; 3 views or other ops moving no bytes)")
    assert "a fixed cpu " in line and "virtual:0 1.0 us beyond" in line


def test_the_fixed_cost_of_ops_measured_one_by_one_is_shown_with_its_range() -> None:
    from tensortorrent_dynamo.report.explain import _op_costs
    from tests.unit.plan.test_rate_classes import _host

    by_op = {"addmm.default": 4e-6, "t.default": 1.5e-6, "gelu.default": 1e-5}
    host = _host(None, latency_s=3e-6, latency_by_op=by_op)
    called = {"addmm.default", "t.default", "index.Tensor"}
    assert _op_costs(host, called) == (
        "cpu 3.0 us, or the op's own where measured (2 of the 3 kinds of op called: "
        "1.5 us to 4.0 us)"
    )
    assert _op_costs(host, {"index.Tensor"}) == "cpu 3.0 us"
    cold = _host(None, latency_s=3e-6, cold_latency_s=9.5e-6)
    assert _op_costs(cold, {"index.Tensor"}) == (
        "cpu 3.0 us, and 9.5 us more the first time a segment runs each kind (caches cold)"
    )
