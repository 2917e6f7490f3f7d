"""The native planner through its binding: where graphs go, and what a plan reports."""

from __future__ import annotations

import re

import pytest

from tensortorrent_dynamo import _planner as planner
from tensortorrent_dynamo.errors import InvalidCostGraph, OptionsError

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
FAMILIES = {"single-device", "knapsack", "segments", "host-stretches", "local-search"}


def chain(
    layers: int, weight: int, act: int, flops: float, *, weight_traffic: bool = False
) -> planner.CostGraph:
    """A host input, then ``layers`` linear nodes each with its own weight."""
    n = layers + 1
    return planner.CostGraph(
        [0.0] + [flops] * layers,
        [act] * n,
        [True] + [False] * layers,
        [0, *range(n)],
        list(range(layers)),
        [weight] * layers,
        list(range(layers + 1)),
        list(range(1, n)),
        [layers],
        node_bytes_accessed=[act] + [weight + 2 * act] * layers if weight_traffic else None,
    )


def host(budget: int = GIB, **rates: float) -> planner.Device:
    return planner.Device("cpu", True, 1e11, budget, 0.0, 0.0, 1e-6, **rates)


def accelerator(
    name: str, budget: int, flops: float, link: float, **rates: float
) -> planner.Device:
    return planner.Device(name, False, flops, budget, link, link, 1e-6, **rates)


def small_accelerator_slow_link() -> list[planner.Device]:
    return [
        host(64 * GIB, mem_bytes_per_s=2e10),
        accelerator("virtual:0", 256 * MIB, 1e13, 2e9, mem_bytes_per_s=1e12),
    ]


def deep_mlp(batch: int) -> planner.CostGraph:
    """16 layers of 4096x4096 fp32 weights (64 MiB each)."""
    width = 4096
    return chain(
        16, width * width * 4, batch * width * 4, 2.0 * batch * width * width, weight_traffic=True
    )


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_deep_mlp_with_a_small_accelerator_and_slow_link_stays_on_the_host(batch: int) -> None:
    devices = small_accelerator_slow_link()
    p = planner.plan(deep_mlp(batch), devices, "latency", True)
    # No weight crosses the slow link; at most the few that fit stay on the accelerator.
    assert not any(p.param_streamed), p.chosen
    assert p.node_device.count(0) >= 13
    streamed = next(c for c in p.candidates if c.name == "all-on-virtual:0/streamed")
    assert streamed.predicted_time_s > 5 * p.predicted_time_s
    # With no room for a single layer, the whole graph runs on the host.
    devices[1] = accelerator("virtual:0", 48 * MIB, 1e13, 2e9, mem_bytes_per_s=1e12)
    q = planner.plan(deep_mlp(batch), devices, "latency", True)
    assert q.node_device == (0,) * 17
    assert q.chosen == "all-on-cpu"


def test_compute_heavy_graph_with_the_same_budget_streams_to_the_accelerator() -> None:
    p = planner.plan(deep_mlp(2048), small_accelerator_slow_link(), "latency", True)
    assert p.node_device[1:] == (1,) * 16, p.chosen
    assert sum(p.param_streamed) >= 12
    assert p.peak_bytes[1] <= 256 * MIB
    # Streaming is copy-bound: the link is the busiest resource.
    assert p.busy_fraction["cpu->virtual:0"] == max(p.busy_fraction.values())


def test_unequal_accelerators_get_unequal_segments() -> None:
    devices = [
        host(),
        accelerator("fast", 8 * MIB + 64 * KIB, 2e12, 1e7),
        accelerator("slow", 4 * MIB + 64 * KIB, 1e12, 1e7),
    ]
    p = planner.plan(chain(12, MIB, 4 * KIB, 1e9), devices, "latency", False)
    fast, slow = p.node_device.count(1), p.node_device.count(2)
    assert fast > slow > 0, p.node_device
    assert not any(p.param_streamed)
    assert "segments" in {c.family for c in p.candidates}


def test_a_plan_explains_its_search() -> None:
    devices = [host(), accelerator("virtual:0", 3 * MIB, 1e12, 1e10)]
    p = planner.plan(chain(8, MIB, 4 * KIB, 1e9), devices, "latency", True)
    assert {c.family for c in p.candidates} <= FAMILIES
    assert [c.family for c in p.candidates][:2] == ["single-device", "single-device"]
    assert 0 < p.lower_bound_s <= p.predicted_time_s
    assert list(p.busy_fraction) == ["cpu", "virtual:0", "cpu->virtual:0", "virtual:0->cpu"]
    assert p.report.startswith(("searched all families", "node limit"))
    assert p.candidates_simulated > len(p.candidates)
    assert p.nodes_simulated == p.candidates_simulated * 9
    assert p.stop_reason in p.report
    kinds = {kind for _, kind, _, _, _ in p.timeline}
    assert {"node", "param", "value", "output"} >= kinds >= {"node", "output"}
    resource, kind, index, start, end = p.timeline[-1]
    assert (resource, kind, index) == ("virtual:0->cpu", "output", 8)
    assert end == p.predicted_time_s and start <= end
    assert p.stream_param == tuple(range(8))  # one stay each, in order of use


def test_a_plans_vectors_are_tuples_built_once() -> None:
    """The compiler reads a plan's vectors an index at a time in loops over a graph's nodes
    (``GraphPlan.node_segment``): a getter building a new list at each read made such a
    loop quadratic. Each is one immutable tuple, the same at every read."""
    devices = [host(), accelerator("virtual:0", 3 * MIB, 1e12, 1e10)]
    p = planner.plan(chain(8, MIB, 4 * KIB, 1e9), devices, "latency", True)
    names = [
        "node_device",
        "node_segment",
        "segment_device",
        "param_streamed",
        "param_device",
        "stream_param",
        "stream_device",
        "stream_issue_segment",
        "stream_first_segment",
        "stream_last_segment",
        "value_spilled",
        "value_reload_segment",
        "param_home",
        "peak_bytes",
    ]
    for name in names:
        value = getattr(p, name)
        assert isinstance(value, tuple) and value is getattr(p, name), name
    assert len(p.node_segment) == len(p.node_device) == 9
    assert len(p.param_home) == len(p.param_streamed) == 8


def test_limits_and_options() -> None:
    graph = chain(8, MIB, 4 * KIB, 1e9)
    devices = [host(), accelerator("virtual:0", 3 * MIB, 1e12, 1e10)]
    bounded = planner.plan(graph, devices, "latency", True, node_limit=0)
    assert bounded.stop_reason == "node limit 0 reached"
    assert "local-search" not in {c.family for c in bounded.candidates}
    hurried = planner.plan(graph, devices, "latency", True, time_limit_s=0.0)
    assert hurried.report.startswith("time limit 0 ms reached after ")
    assert {c.family for c in hurried.candidates} == {"single-device"}
    deeper = planner.plan(graph, devices, "memory", True, prefetch_depth=2, memory_slack=0.5)
    assert deeper.plan_hash != planner.plan(graph, devices, "memory", True).plan_hash
    with pytest.raises(OptionsError, match="time_limit_s"):
        planner.plan(graph, devices, "latency", True, time_limit_s=-1.0)
    with pytest.raises(OptionsError, match="prefetch_depth"):
        planner.plan(graph, devices, "latency", True, prefetch_depth=0)
    with pytest.raises(OptionsError, match="memory_slack"):
        planner.plan(graph, devices, "memory", True, memory_slack=float("nan"))
    with pytest.raises(OptionsError, match="over the limit"):
        planner.exhaustive(graph, devices, True, limit=10)


def test_new_graph_inputs_are_validated() -> None:
    args = ([0.0, 1.0], [4, 4], [True, False], [0, 0, 1], [0], [8], [0, 1], [1], [1])
    with pytest.raises(InvalidCostGraph, match="node_bytes_accessed has 1 entries"):
        planner.CostGraph(*args, node_bytes_accessed=[1])
    with pytest.raises(InvalidCostGraph, match='unknown parameter home "tape"'):
        planner.CostGraph(*args, param_home=["tape"])
    assert planner.CostGraph(*args, param_home=["disk"]).num_params == 1


def test_disk_parameters_are_read_through_host_memory() -> None:
    layers, weight = 4, MIB
    on_disk = planner.CostGraph(
        [0.0] + [1e9] * layers,
        [KIB] * (layers + 1),
        [True] + [False] * layers,
        [0, *range(layers + 1)],
        list(range(layers)),
        [weight] * layers,
        list(range(layers + 1)),
        list(range(1, layers + 1)),
        [layers],
        param_home=["disk"] * layers,
    )
    devices = [
        host(disk_bytes_per_s=1e9),
        accelerator("virtual:0", 3 * MIB, 1e12, 1e10),
    ]
    sim = planner.simulate(on_disk, devices, [0] + [1] * layers, [True] * layers)
    reads = [r for r in sim.timeline if r[0] == "disk->cpu"]
    assert [r[2] for r in reads] == list(range(layers))
    assert all(r[1] == "param" for r in reads)
    assert "disk->cpu" in sim.busy_fraction
    # The host holds at most two staged weights, never all four.
    assert sim.peak_bytes[0] < 3 * weight
    p = planner.plan(on_disk, devices, "latency", True)
    assert p.peak_bytes[1] <= 3 * MIB


def test_positional_calls_keep_working() -> None:
    graph = planner.CostGraph(
        [0.0, 1e6], [8, 8], [True, False], [0, 0, 1], [0], [64], [0, 1], [1], [1]
    )
    cpu = planner.Device("cpu", True, 1e9, 1 << 30, 0.0, 0.0, 1e-6)
    acc = planner.Device("virtual:0", False, 1e12, 1 << 30, 1e10, 1e10, 1e-6)
    p = planner.plan(graph, [cpu, acc], "latency", True)
    assert p.node_device == (0, 1)
    assert p.param_device == (1,) and p.param_streamed == (False,)
    assert cpu.mem_bytes_per_s == float("inf") and cpu.disk_bytes_per_s == float("inf")
    assert "mem_bytes_per_s=float('inf')" in repr(cpu)


def test_a_device_s_class_lists_are_in_its_repr_when_given() -> None:
    plain = planner.Device("cpu", True, 1e9, 1 << 30, 0.0, 0.0, 1e-6)
    assert "class_" not in repr(plain)
    classes = planner.Device(
        "cpu", True, 1e9, 1 << 30, 0.0, 0.0, 1e-6, class_flops_per_s=[2e9], class_latency_s=[3e-6]
    )
    assert repr(classes).endswith(", class_flops_per_s=[2000000000.0], class_latency_s=[3e-6])")


def test_a_device_s_cold_cost_is_in_its_repr_and_read_back_when_given() -> None:
    plain = planner.Device("cpu", True, 1e9, 1 << 30, 0.0, 0.0, 1e-6)
    assert "cold_latency_s" not in repr(plain) and plain.cold_latency_s == 0.0
    cold = planner.Device("cpu", True, 1e9, 1 << 30, 0.0, 0.0, 1e-6, cold_latency_s=9.5e-6)
    assert repr(cold).endswith(", cold_latency_s=9.5e-6)") and cold.cold_latency_s == 9.5e-6


def test_the_version_names_the_sources_so_a_cached_plan_of_another_search_misses() -> None:
    # the plan cache keys on it: a change to the search (same crate version) must miss
    import tensortorrent_dynamo

    version = planner.version()
    assert re.fullmatch(r"(\d+\.\d+\.\d+)\+src\.[0-9a-f]{16}", version), version
    assert version.split("+")[0] == tensortorrent_dynamo.__version__
