"""Host compute costed slower while the disk reader streams: the simulator slows the part of
each host node that runs while reads do."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import torch

import tensortorrent as tt
from tensortorrent_dynamo.io.reader import INLINE_READ_BYTES
from tensortorrent_dynamo.plan.planner import PlannedDevice, native_device_list
from tensortorrent_dynamo.profile import HostProfile
from tensortorrent_dynamo.profile.resolve import nominal_measurements
from tensortorrent_dynamo.profile.schema import (
    INLINE_PROBE_BYTES,
    DiskFigures,
    Figure,
    Measurements,
)
from tests.models import mlp
from tests.unit.cost_graph.test_cost_graph import capture


def _measurements(
    slowdown: float | None,
    stream: float | None = None,
    read_cpu: float | None = None,
    read_inline: float | None = None,
) -> Measurements:
    m = nominal_measurements()
    absent = DiskFigures.absent("not measured here")

    def figure(value: float | None, unit: str, field: str) -> Figure:
        return Figure(value, unit, "fake") if value is not None else getattr(absent, field)

    disk = DiskFigures(
        path="/offload",
        free=Figure(1e12, "B", "fake"),
        read=Figure(1e9, "B/s", "fake"),
        write=Figure(1e9, "B/s", "fake"),
        latency=Figure(1e-4, "s", "fake"),
        compute_slowdown=figure(slowdown, "x", "compute_slowdown"),
        stream=figure(stream, "B/s", "stream"),
        read_cpu=figure(read_cpu, "s", "read_cpu"),
        read_inline=figure(read_inline, "s", "read_inline"),
    )
    return dataclasses.replace(m, disk=disk)


def _profile(slowdown: float | None) -> HostProfile:
    return HostProfile.from_measurements(_measurements(slowdown), "test")


def _streamed(tmp_path: Path, width: int, measurements: Measurements) -> tt.CompiledModule:
    """An 8-layer MLP of ``width`` planned with ``measurements`` at half its weights, so
    that its weights stream from disk, called once and checked against eager."""
    model, x = mlp(width, 8), torch.randn(16, width)
    budget = sum(p.numel() * 4 for p in model.parameters()) // 2
    path = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}.json"
    path.write_text(measurements.to_json())
    with torch.no_grad():
        compiled = tt.compile(
            mlp(width, 8),
            example_inputs=(x,),
            compiler="eager",
            profile=str(path),
            budgets={"cpu": budget},
            offload_dir=str(tmp_path / "offload"),
        )
        torch.testing.assert_close(compiled(x), model(x))
    return compiled


def test_the_host_is_given_its_measured_slowdown_and_keeps_its_rates() -> None:
    (graph,) = capture(mlp(256, 2), torch.randn(4, 256))
    host = _profile(2.0).devices[0]
    for budget in (2 * graph.param_bytes, graph.param_bytes // 2):
        devices = [PlannedDevice(host, budget)]
        (native,) = native_device_list(devices, _profile(2.0), graph)
        assert native.flops_per_s == host.flops_per_s
        assert native.read_slowdown == 2.0
        # unmeasured, or measured under 1 (noise on an unslowed machine): not slowed
        assert native_device_list(devices, _profile(None), graph)[0].read_slowdown == 1.0
        assert native_device_list(devices, _profile(0.9), graph)[0].read_slowdown == 1.0


def test_a_streamed_plan_is_costed_and_explained_with_the_slowdown(tmp_path: Path) -> None:
    busy, sync = {}, {}
    for slowdown in (1.0, 3.0):
        compiled = _streamed(tmp_path, 256, _measurements(slowdown))
        native = compiled.graphs[0].plan.native
        busy[slowdown] = native.busy_fraction["cpu"] * native.predicted_time_s
        (sync_plan,) = [c for c in native.candidates if c.name.endswith("knapsack-sync")]
        sync[slowdown] = sync_plan.predicted_time_s
        text = compiled.explain()
        line = "host compute costed 3.00x its rates while reads run: its measured slowdown"
        assert (line in text) == (slowdown == 3.0), text
    # the host's compute is slowed while reads run: nearly all of it in this streamed plan
    assert busy[3.0] > 2 * busy[1.0], busy
    # a plan that reads only while compute waits never computes while reading
    assert sync[3.0] == sync[1.0]


def test_reads_are_costed_at_the_readers_rate_while_streaming_where_measured(
    tmp_path: Path,
) -> None:
    # The disk's own rate (disk.read) is what raw reads get; a streamed plan's reads go
    # through the reader, verified, while the host computes (disk.stream), and are costed so.
    (graph,) = capture(mlp(256, 2), torch.randn(4, 256))
    host = _profile(None).devices[0]
    devices = [PlannedDevice(host, graph.param_bytes // 2)]
    for stream, rate in ((None, 1e9), (4e8, 4e8)):
        profile = HostProfile.from_measurements(_measurements(None, stream), "test")
        assert profile.disk_read_bytes_per_s == 1e9
        (native,) = native_device_list(devices, profile, graph)
        assert native.disk_bytes_per_s == rate
    read_s = {}
    for stream in (None, 2.5e8):
        # 4 MiB reads: their bytes dominate their fixed costs
        compiled = _streamed(tmp_path, 1024, _measurements(None, stream))
        text = compiled.explain()
        source = "disk.stream" if stream else "disk.read"
        rate_text = "250.00 MB/s" if stream else "1.00 GB/s"
        assert f"at {rate_text} and" in text and f"read rate from profile {source}" in text
        native = compiled.graphs[0].plan.native
        read_s[stream] = native.busy_fraction["disk->cpu"] * native.predicted_time_s
    # the same bytes read four times slower (and their fixed costs as before)
    assert read_s[2.5e8] > 3 * read_s[None], read_s


def test_each_read_is_costed_the_host_compute_it_takes_while_in_flight(tmp_path: Path) -> None:
    # The reader's hand-offs share the interpreter lock with the calling thread's ops: each
    # read takes the host's compute disk.read_cpu, charged in the simulation when issued.
    (graph,) = capture(mlp(256, 2), torch.randn(4, 256))
    host = _profile(None).devices[0]
    devices = [PlannedDevice(host, graph.param_bytes // 2)]
    for read_cpu, charged in ((None, 0.0), (-1e-6, 0.0), (2e-4, 2e-4)):
        profile = HostProfile.from_measurements(_measurements(None, None, read_cpu), "test")
        (native,) = native_device_list(devices, profile, graph)
        assert native.read_cpu_s == charged
    charges = {}
    for read_cpu in (None, 2e-3):
        compiled = _streamed(tmp_path, 256, _measurements(None, None, read_cpu))
        native = compiled.graphs[0].plan.native
        reads = [r for r in native.timeline if r[0] == "disk->cpu" and r[1] == "param"]
        charged = [r for r in native.timeline if r[1] == "read-cpu"]
        assert reads
        charges[read_cpu] = charged
        n_reads = len(reads)
        line = "each read handed to the reader's threads costed 2.00 ms of host compute"
        assert (line in compiled.explain()) == (read_cpu is not None)
    assert charges[None] == []
    # one charge per read, on the host, each its measured figure
    assert all(r[0] == "cpu" and abs(r[4] - r[3] - 2e-3) < 1e-12 for r in charges[2e-3])
    assert len(charges[2e-3]) == n_reads


def test_a_small_read_is_costed_as_the_calling_thread_makes_it(tmp_path: Path) -> None:
    # The runtime's reader reads a tensor of at most INLINE_READ_BYTES on the calling thread
    # (io.reader): the planner is told so, costs such a read disk.read_inline less its
    # 32 KiB at the read rate, plus its bytes, and charges it no hand-offs (disk.read_cpu).
    (graph,) = capture(mlp(256, 2), torch.randn(4, 256))
    host = _profile(None).devices[0]
    for read_inline, fixed in ((None, 1e-4), (3e-4, 3e-4 - INLINE_PROBE_BYTES / 1e9)):
        profile = HostProfile.from_measurements(_measurements(None, None, None, read_inline), "")
        (native,) = native_device_list(
            [PlannedDevice(host, graph.param_bytes // 2)], profile, graph
        )
        assert native.inline_read_bytes == INLINE_READ_BYTES
        assert abs(native.inline_read_s - fixed) < 1e-15
    # 16 KiB weights: every read made by the calling thread
    compiled = _streamed(tmp_path, 64, _measurements(None, None, 2e-3, 3e-4))
    native = compiled.graphs[0].plan.native
    reads = [r for r in native.timeline if r[0] == "disk->cpu" and r[1] == "param"]
    params = {i: p.nbytes for i, p in enumerate(compiled.graphs[0].plan.cost.params)}
    assert reads and all(params[r[2]] <= INLINE_READ_BYTES for r in reads)
    for r in reads:
        assert abs(r[4] - r[3] - (3e-4 - INLINE_PROBE_BYTES / 1e9 + params[r[2]] / 1e9)) < 1e-12
    # one after the other: the thread issues the next once it has made this one
    starts = sorted((r[3], r[4]) for r in reads)
    assert all(b[0] >= a[1] - 1e-12 for a, b in itertools.pairwise(starts))
    assert not [r for r in native.timeline if r[1] == "read-cpu"]
    text = compiled.explain()
    assert f"{len(reads)} of {len(reads)} reads, of at most 64.00 KiB, made by the calling" in text
    assert "each read handed to the reader's threads" not in text
    assert "at 1.00 GB/s\n" in text, "no fixed cost of a read handed on, where none is"
