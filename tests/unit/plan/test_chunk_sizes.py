"""The row-chunk sizes a disk plan is planned in (``stream_chunk_bytes``): the setting's, or
16 MiB and 4 MiB where the profile measured 4 MiB reads faster, each costed at its reads'
rate, the plan predicted faster kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.plan.chunk_sizes import chunk_sizes
from tensortorrent_dynamo.plan.planner import PlannedDevice, native_device_list
from tensortorrent_dynamo.profile import HostProfile
from tensortorrent_dynamo.profile.schema import Figure, Measurements
from tensortorrent_dynamo.settings import parse_options
from tests.models import mlp
from tests.unit.cost_graph.test_cost_graph import capture
from tests.unit.plan.test_compute_slowdown import _measurements

MIB = 2**20
STREAM = 1e9


def _with_small(small: float | None) -> Measurements:
    m = _measurements(1.0, stream=STREAM)
    figure = Figure(small, "B/s", "fake") if small is not None else m.disk.stream_small
    return dataclasses.replace(m, disk=dataclasses.replace(m.disk, stream_small=figure))


def _profile(small: float | None) -> HostProfile:
    return HostProfile.from_measurements(_with_small(small), "test")


@pytest.mark.parametrize(
    ("options", "small", "saved", "expected"),
    [
        ({}, 2 * STREAM, None, [16 * MIB]),  # the default: 16 MiB, "auto" is opt-in
        ({"stream_chunk_bytes": "auto"}, 2 * STREAM, None, [16 * MIB, 4 * MIB]),
        # small reads measured slower: not planned
        ({"stream_chunk_bytes": "auto"}, STREAM / 2, None, [16 * MIB]),
        # not measured (an older or nominal profile)
        ({"stream_chunk_bytes": "auto"}, None, None, [16 * MIB]),
        ({"stream_chunk_bytes": "8MiB"}, 2 * STREAM, None, [8 * MIB]),
        ({"stream_chunk_bytes": 0}, 2 * STREAM, None, []),
        ({"plan": "saved.json"}, 2 * STREAM, 4 * MIB, [4 * MIB]),
        ({"plan": "saved.json"}, 2 * STREAM, None, [16 * MIB]),  # saved before it was recorded
        ({"plan": "saved.json", "stream_chunk_bytes": "2MiB"}, 2 * STREAM, None, [2 * MIB]),
    ],
)
def test_sizes_follow_the_setting_then_a_saved_plan_then_the_profile(
    options: dict[str, object], small: float | None, saved: int | None, expected: list[int]
) -> None:
    plan = options.pop("plan", None)
    settings = dataclasses.replace(parse_options(options), plan=plan)
    assert chunk_sizes(settings, _profile(small), plan is not None, saved) == expected


def test_a_plan_keeping_another_graph_s_copies_is_made_in_that_graph_s_chunks() -> None:
    settings = parse_options({})
    profile = _profile(2 * STREAM)
    assert chunk_sizes(settings, profile, pinned=True, size=4 * MIB) == [4 * MIB]
    assert chunk_sizes(settings, profile, pinned=True, size=None) == [16 * MIB]


def test_reads_of_small_chunks_are_costed_at_the_small_stream_s_rate() -> None:
    (graph,) = capture(mlp(256, 2), torch.randn(4, 256))
    profile = _profile(3 * STREAM)
    host = profile.devices[0]
    devices = [PlannedDevice(profile=host, budget_bytes=graph.param_bytes // 2)]
    rates = {
        chunk: native_device_list(devices, profile, graph, chunk_bytes=chunk)[0].disk_bytes_per_s
        for chunk in (None, 16 * MIB, 4 * MIB, 64 * 2**10)
    }
    assert rates == {None: STREAM, 16 * MIB: STREAM, 4 * MIB: 3 * STREAM, 64 * 2**10: 3 * STREAM}
    assert profile.disk_read_rate(4 * MIB)[1].startswith("profile disk.stream_small")
    unmeasured = _profile(None)
    assert unmeasured.disk_read_rate(4 * MIB) == unmeasured.disk_read_rate(None)


def _compiled(tmp_path: Path, small: float) -> tuple[tt.CompiledModule, torch.Tensor]:
    """A 4-layer MLP of 16 MiB weights planned at half its weights with a profile whose
    4 MiB reads run at ``small``, called and checked against eager."""
    model, x = mlp(2048, 4), torch.randn(16, 2048)
    path = tmp_path / f"profile-{small:.0f}.json"
    path.write_text(_with_small(small).to_json())
    with torch.no_grad():
        compiled = tt.compile(
            mlp(2048, 4),
            example_inputs=(x,),
            compiler="eager",
            profile=str(path),
            budgets={"cpu": sum(p.numel() * 4 for p in model.parameters()) // 2},
            offload_dir=str(tmp_path / "offload"),
            plan_cache=False,
            stream_chunk_bytes="auto",
        )
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x))
    return compiled, x


def test_a_disk_plan_is_planned_in_the_chunks_predicted_faster(tmp_path: Path) -> None:
    torch._dynamo.reset()
    compiled, _ = _compiled(tmp_path, 20 * STREAM)  # 4 MiB reads far faster: chosen
    (graph,) = compiled.graphs
    assert graph.plan.split and graph.plan.chunk_bytes == 4 * MIB
    ((size, other),) = graph.plan.other_chunk_plans
    # the 16 MiB weights are not cut in 16 MiB chunks: that plan reads them whole
    assert size == 16 * MIB and other is not None and other > graph.plan.predicted_time_s
    text = compiled.explain()
    assert "row chunks of at most 4.00 MiB (stream_chunk_bytes auto: the faster predicted" in text
    assert "read rate from profile disk.stream_small" in text

    torch._dynamo.reset()
    compiled, _ = _compiled(tmp_path, STREAM / 2)  # slower: 4 MiB chunks not even planned
    (graph,) = compiled.graphs
    assert graph.plan.chunk_bytes is None and graph.plan.other_chunk_plans == ()


def test_a_saved_plan_in_small_chunks_reproduces(tmp_path: Path) -> None:
    torch._dynamo.reset()
    compiled, x = _compiled(tmp_path, 20 * STREAM)
    saved = tmp_path / "plan.json"
    compiled.save(saved)
    (graph,) = compiled.graphs
    torch._dynamo.reset()
    model = mlp(2048, 4)
    again = tt.compile(
        model,
        example_inputs=(x,),
        compiler="eager",
        profile=str(tmp_path / f"profile-{20 * STREAM:.0f}.json"),
        budgets={"cpu": sum(p.numel() * 4 for p in model.parameters()) // 2},
        offload_dir=str(tmp_path / "offload-again"),
        plan=str(saved),
        stream_chunk_bytes="auto",
    )
    (replayed,) = again.graphs
    assert replayed.plan.chunk_bytes == 4 * MIB
    assert replayed.plan.plan_hash == graph.plan.plan_hash
