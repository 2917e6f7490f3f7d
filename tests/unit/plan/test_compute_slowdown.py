"""Host compute costed slower while the disk reader streams, where every plan reads from disk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

import tensortorrent as tt
from tensortorrent_dynamo.plan.planner import (
    PlannedDevice,
    host_compute_slowdown,
    native_device_list,
    reads_disk_each_call,
)
from tensortorrent_dynamo.profile import HostProfile
from tensortorrent_dynamo.profile.resolve import nominal_measurements
from tensortorrent_dynamo.profile.schema import DiskFigures, Figure, Measurements
from tests.models import mlp
from tests.unit.cost_graph.test_cost_graph import capture


def _measurements(slowdown: float | None) -> Measurements:
    m = nominal_measurements()
    disk = DiskFigures(
        path="/offload",
        free=Figure(1e12, "B", "fake"),
        read=Figure(1e9, "B/s", "fake"),
        write=Figure(1e9, "B/s", "fake"),
        latency=Figure(1e-4, "s", "fake"),
        compute_slowdown=(
            Figure(slowdown, "x", "fake")
            if slowdown is not None
            else DiskFigures.absent("not measured here").compute_slowdown
        ),
    )
    return dataclasses.replace(m, disk=disk)


def _profile(slowdown: float | None) -> HostProfile:
    return HostProfile.from_measurements(_measurements(slowdown), "test")


def test_the_host_is_slowed_only_where_every_plan_reads_from_disk() -> None:
    (graph,) = capture(mlp(256, 2), torch.randn(4, 256))
    profile = _profile(2.0)
    host = profile.devices[0]
    fits = [PlannedDevice(host, 2 * graph.param_bytes)]
    streams = [PlannedDevice(host, graph.param_bytes // 2)]
    assert not reads_disk_each_call(graph, fits) and reads_disk_each_call(graph, streams)
    assert native_device_list(fits, profile, graph)[0].flops_per_s == host.flops_per_s
    assert native_device_list(streams, profile, graph)[0].flops_per_s == host.flops_per_s / 2
    assert host_compute_slowdown(profile, graph, streams) == 2.0
    assert host_compute_slowdown(profile, graph, fits) == 1.0
    # unmeasured, or measured under 1 (noise on an unslowed machine): not slowed
    assert host_compute_slowdown(_profile(None), graph, streams) == 1.0
    assert host_compute_slowdown(_profile(0.9), graph, streams) == 1.0


def test_a_streamed_plan_is_costed_and_explained_with_the_slowdown(tmp_path: Path) -> None:
    model, x = mlp(256, 8), torch.randn(16, 256)
    budget = sum(p.numel() * 4 for p in model.parameters()) // 2
    predicted = {}
    for slowdown in (1.0, 3.0):
        path = tmp_path / f"profile-{slowdown}.json"
        path.write_text(_measurements(slowdown).to_json())
        options = {"budgets": {"cpu": budget}, "offload_dir": str(tmp_path / "offload")}
        with torch.no_grad():
            compiled = tt.compile(
                mlp(256, 8), example_inputs=(x,), compiler="eager", profile=str(path), **options
            )
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        (graph,) = compiled.graphs
        predicted[slowdown] = graph.plan.predicted_time_s
        text = compiled.explain()
        line = "host compute costed 3.00x its rates: its measured slowdown while the disk"
        assert (line in text) == (slowdown == 3.0), text
    assert predicted[3.0] > predicted[1.0]
