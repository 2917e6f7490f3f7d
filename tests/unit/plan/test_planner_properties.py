"""Properties of the native planner over random DAGs and budgets, through the binding."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensortorrent_dynamo import _planner as planner
from tensortorrent_dynamo.errors import PlanInfeasible

KIB = 1024
MIB = 1024 * KIB
BOUNDED = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@dataclasses.dataclass(frozen=True)
class Case:
    """A random graph (a host input first), devices (the host first) and host compute."""

    flops: list[float]
    out_bytes: list[int]
    host_only: list[bool]
    inputs: list[list[int]]
    param_bytes: list[int]
    param_users: list[list[int]]
    devices: list[planner.Device]
    host_compute: bool

    @property
    def n(self) -> int:
        return len(self.flops)

    def graph(self) -> planner.CostGraph:
        input_offsets = [0, *itertools.accumulate(len(i) for i in self.inputs)]
        param_offsets = [0, *itertools.accumulate(len(u) for u in self.param_users)]
        return planner.CostGraph(
            self.flops,
            self.out_bytes,
            self.host_only,
            input_offsets,
            [u for ins in self.inputs for u in ins],
            self.param_bytes,
            param_offsets,
            [u for users in self.param_users for u in users],
            [self.n - 1],
        )

    def with_budgets(self, budgets: dict[str, int]) -> Case:
        devices = [
            planner.Device(
                d.name,
                d.is_host,
                d.flops_per_s,
                budgets.get(d.name, d.budget_bytes),
                d.h2d_bytes_per_s,
                d.d2h_bytes_per_s,
                d.latency_s,
            )
            for d in self.devices
        ]
        return dataclasses.replace(self, devices=devices)


@st.composite
def cases(
    draw: st.DrawFn, max_nodes: int, max_params: int, accelerators: int | None = None
) -> Case:
    n = draw(st.integers(2, max_nodes))
    inputs: list[list[int]] = [[]]
    for v in range(1, n):
        extra = draw(st.lists(st.integers(0, v - 1), max_size=1))
        inputs.append(sorted({v - 1, *extra}))
    params = draw(st.integers(0, max_params))
    users = [draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=2)) for _ in range(params)]
    budget = st.one_of(st.integers(0, 256 * KIB), st.integers(0, 4 * MIB), st.just(1 << 40))
    count = draw(st.integers(1, 2)) if accelerators is None else accelerators
    devices = [planner.Device("cpu", True, 1e9 * draw(st.integers(1, 100)), 1 << 40, 0, 0, 1e-6)]
    for a in range(count):
        devices.append(
            planner.Device(
                f"virtual:{a}",
                False,
                1e9 * draw(st.integers(1, 10_000)),
                draw(budget),
                1e6 * draw(st.integers(1, 10_000)),
                1e6 * draw(st.integers(1, 10_000)),
                1e-6 * draw(st.integers(0, 20)),
            )
        )
    return Case(
        flops=[0.0] + [1e6 * draw(st.integers(0, 1000)) for _ in range(n - 1)],
        out_bytes=[draw(st.integers(0, 64 * KIB)) for _ in range(n)],
        host_only=[True] + [draw(st.booleans()) and draw(st.booleans()) for _ in range(n - 1)],
        inputs=inputs,
        param_bytes=[draw(st.integers(1, MIB)) for _ in range(params)],
        param_users=users,
        devices=devices,
        host_compute=draw(st.booleans()),
    )


def plan_or_none(case: Case) -> planner.Plan | None:
    try:
        return planner.plan(case.graph(), case.devices, "latency", case.host_compute)
    except PlanInfeasible:
        return None


def check_plan(case: Case, p: planner.Plan) -> None:
    """Placement, budgets, the timeline's order, and agreement with ``simulate``."""
    names = [d.name for d in case.devices]
    assert len(p.node_device) == case.n
    for v, d in enumerate(p.node_device):
        assert 0 <= d < len(names)
        if case.host_only[v]:
            assert d == 0
        elif not case.host_compute:
            assert d != 0
    for peak, dev in zip(p.peak_bytes, case.devices, strict=True):
        assert peak <= dev.budget_bytes

    nodes = {i: (r, s, e) for r, kind, i, s, e in p.timeline if kind == "node"}
    assert sorted(nodes) == list(range(case.n))

    def arrival(kind: str, index: int, resource: str) -> float:
        ends = [e for r, k, i, _, e in p.timeline if (r, k, i) == (resource, kind, index)]
        assert ends, f"no {kind} {index} on {resource}"
        return min(ends)

    tolerance = 1e-12
    for v in range(case.n):
        resource, start, _ = nodes[v]
        d = p.node_device[v]
        assert resource == names[d]
        for u in case.inputs[v]:
            du = p.node_device[u]
            if du == d:
                ready = nodes[u][2]
            elif d == 0:
                ready = arrival("value", u, f"{names[du]}->cpu")
            else:
                ready = arrival("value", u, f"cpu->{names[d]}")
            assert start >= ready - tolerance, f"node {v} starts before input {u} arrives"
        # A parameter is on its node's device whenever the node runs: the node's segment
        # is served by one of its stays there, whose copy (the last one begun before
        # the node starts) has landed.
        for q, users in enumerate(case.param_users):
            if v not in users or d == 0:
                continue
            if p.param_streamed[q]:
                copies = [
                    (s, e)
                    for r, k, i, s, e in p.timeline
                    if (r, k, i) == (f"cpu->{names[d]}", "param", q) and s <= start + tolerance
                ]
                assert copies, f"param {q} never copied before node {v}"
                assert start >= max(copies)[1] - tolerance
                segment = p.node_segment[v]
                assert any(
                    first <= segment <= last
                    for param, device, first, last in zip(
                        p.stream_param,
                        p.stream_device,
                        p.stream_first_segment,
                        p.stream_last_segment,
                        strict=True,
                    )
                    if (param, device) == (q, d)
                )
            else:
                assert q not in p.stream_param

    again = planner.simulate(case.graph(), case.devices, p.node_device, p.param_streamed)
    assert again.predicted_time_s == p.predicted_time_s
    assert tuple(again.peak_bytes) == p.peak_bytes
    assert again.timeline == p.timeline
    assert p.lower_bound_s <= p.predicted_time_s * (1 + 1e-12)
    assert all(0.0 <= f <= 1.0 + 1e-9 for f in p.busy_fraction.values())
    chosen = [c for c in p.candidates if c.name == p.chosen]
    assert len(chosen) == 1 and chosen[0].feasible


@BOUNDED
@given(cases(max_nodes=14, max_params=5))
def test_plans_place_every_node_within_budgets_and_respect_dependencies(case: Case) -> None:
    try:
        p = planner.plan(case.graph(), case.devices, "latency", case.host_compute)
    except PlanInfeasible as exc:
        if not exc.min_budgets:
            assert len(case.devices) == 1 and not case.host_compute
            return
        raised = case.with_budgets(exc.min_budgets)
        p = planner.plan(raised.graph(), raised.devices, "latency", raised.host_compute)
        check_plan(raised, p)
        return
    check_plan(case, p)
    same = planner.plan(case.graph(), case.devices, "latency", case.host_compute)
    assert (same.plan_hash, same.node_device, same.param_streamed) == (
        p.plan_hash,
        p.node_device,
        p.param_streamed,
    )
    assert same.timeline == p.timeline


@BOUNDED
@given(cases(max_nodes=9, max_params=3, accelerators=2))
def test_feasible_exactly_when_some_plan_fits_and_near_the_optimum(case: Case) -> None:
    best = planner.exhaustive(case.graph(), case.devices, case.host_compute)
    p = plan_or_none(case)
    assert (best is None) == (p is None), (best, p)
    if best is not None and p is not None:
        assert p.predicted_time_s <= 1.05 * best.predicted_time_s, (p.chosen, best)


def enumerate_in_python(case: Case) -> float | None:
    """The fastest fitting placement's time, by ``simulate`` on every placement."""
    graph = case.graph()
    movable = [d for d in range(len(case.devices)) if d != 0 or case.host_compute]
    choices = [[0] if case.host_only[v] else movable for v in range(case.n)]
    best = None
    for node_device in itertools.product(*choices):
        open_params = [
            q for q, users in enumerate(case.param_users) if any(node_device[u] for u in users)
        ]
        for flags in itertools.product([False, True], repeat=len(open_params)):
            streamed = [False] * len(case.param_users)
            for q, flag in zip(open_params, flags, strict=True):
                streamed[q] = flag
            sim = planner.simulate(graph, case.devices, list(node_device), streamed)
            fits = all(
                peak <= d.budget_bytes for peak, d in zip(sim.peak_bytes, case.devices, strict=True)
            )
            if fits and (best is None or sim.predicted_time_s < best):
                best = sim.predicted_time_s
    return best


@settings(max_examples=30, deadline=None, derandomize=True)
@given(cases(max_nodes=5, max_params=2))
def test_exhaustive_search_agrees_with_enumerating_simulations(case: Case) -> None:
    best = planner.exhaustive(case.graph(), case.devices, case.host_compute)
    expected = enumerate_in_python(case)
    if expected is None:
        assert best is None
    else:
        assert best is not None and best.predicted_time_s == pytest.approx(expected, rel=1e-12)
