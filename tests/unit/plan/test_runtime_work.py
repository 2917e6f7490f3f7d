"""The runtime's own work between segments (a segment's call, a resident weight's lookup, a
streamed weight's prefetch, wait and evict): the profile's figures reach the planner on
the host only, the simulator charges them before each segment, and explain() says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from tensortorrent_dynamo.plan.planner import PlannedDevice, native_device_list
from tensortorrent_dynamo.profile import HostProfile
from tensortorrent_dynamo.profile.resolve import nominal_measurements
from tensortorrent_dynamo.profile.schema import Figure, Measurements, RuntimeFigures
from tensortorrent_dynamo.run import ops
from tensortorrent_dynamo.units import format_seconds
from tests.models import mlp
from tests.unit.cost_graph.test_cost_graph import capture
from tests.unit.plan.test_compute_slowdown import _measurements, _streamed

CALL_S, RESIDENT_S, STREAM_S = 3e-4, 1e-4, 5e-4


def _with_work(m: Measurements) -> Measurements:
    figures = (Figure(v, "s", "fake") for v in (CALL_S, RESIDENT_S, STREAM_S))
    return dataclasses.replace(m, runtime=RuntimeFigures(*figures))


def test_the_host_alone_is_given_the_runtime_s_work() -> None:
    (graph,) = capture(mlp(256, 2), torch.randn(4, 256))
    profile = HostProfile.from_measurements(_with_work(nominal_measurements()), "test")
    assert profile.runtime_work_s == (CALL_S, RESIDENT_S, STREAM_S)
    host = profile.devices[0]
    accelerator = dataclasses.replace(host, name="virtual:0", kind="virtual")
    natives = native_device_list(
        [PlannedDevice(host, graph.param_bytes), PlannedDevice(accelerator, graph.param_bytes)],
        profile,
        graph,
    )
    assert [(d.segment_call_s, d.resident_lookup_s, d.stream_op_s) for d in natives] == [
        (CALL_S, RESIDENT_S, STREAM_S),
        (0.0, 0.0, 0.0),
    ]
    unmeasured = HostProfile.from_measurements(nominal_measurements(), "test")
    assert unmeasured.runtime_work_s == (0.0, 0.0, 0.0)


def test_a_streamed_plan_is_costed_its_runtime_s_work_and_explains_it(tmp_path: Path) -> None:
    # 16 KiB weights streamed from disk at half their bytes: several segments, each
    # called by the rewritten graph after its weight's prefetch and wait
    compiled = _streamed(tmp_path, 64, _with_work(_measurements(None)))
    (graph,) = compiled.graphs
    nodes = list(graph.module.graph.nodes)
    calls = sum(n.op == "call_module" for n in nodes)
    residents = sum(n.target is ops.resident for n in nodes)
    streams = sum(n.target is ops.prefetch for n in nodes)
    assert calls > 1 and streams > 0, graph.module.code
    work = calls * CALL_S + residents * RESIDENT_S + streams * STREAM_S
    # the work runs on the calling thread, one segment after the other: no plan of these
    # segments finishes before it is done
    assert graph.plan.predicted_time_s > work
    text = compiled.explain()
    assert (
        f"the runtime's own work between segments, costed on the calling thread: "
        f"{format_seconds(work)} a call ({calls} segment calls at 300.0 us, {residents} "
        f"resident weights looked up at 100.0 us, {streams} streamed weights' prefetch, wait "
        "and evict at 500.0 us; profile runtime.segment_call" in text
    ), text
    # the same plan without the figures is predicted faster by the work, at most
    without = _streamed(tmp_path, 64, _measurements(None))
    (plain,) = without.graphs
    assert plain.plan.plan_hash != graph.plan.plan_hash
    assert "the runtime's own work" not in without.explain()
    assert plain.plan.predicted_time_s < graph.plan.predicted_time_s
    assert plain.plan.predicted_time_s + work >= graph.plan.predicted_time_s - 1e-12


def test_a_plan_called_as_its_one_segment_is_costed_no_runtime_work(tmp_path: Path) -> None:
    import tensortorrent as tt

    model, x = mlp(64, 4), torch.randn(4, 64)
    predicted = []
    for m in (_with_work(nominal_measurements()), nominal_measurements()):
        path = tmp_path / f"profile-{len(predicted)}.json"
        path.write_text(m.to_json())
        compiled = tt.compile(model, example_inputs=(x,), compiler="eager", profile=str(path))
        with torch.no_grad():
            compiled(x)
        (graph,) = compiled.graphs
        assert graph.direct is not None
        assert "the runtime's own work" not in compiled.explain()
        predicted.append(graph.plan.predicted_time_s)
    assert predicted[0] == predicted[1]
