"""Each node's FLOPs are costed at its device's rate for the node's dtype: a bfloat16 graph
on a host whose bfloat16 matmuls are 4x its float32 ones is predicted faster, and a dtype
the profile did not measure runs at the float32 rate."""

from __future__ import annotations

import torch

from tensortorrent_dynamo._native import native_planner
from tensortorrent_dynamo.plan.planner import (
    RATE_CLASSES,
    PlannedDevice,
    class_rates,
    native_device_list,
)
from tensortorrent_dynamo.profile import DeviceProfile, HostProfile
from tests.models import mlp
from tests.unit.cost_graph.test_cost_graph import capture


def _host(bf16_rate: float | None) -> DeviceProfile:
    rates = {"float32": 1e9, **({"bfloat16": bf16_rate} if bf16_rate else {})}
    return DeviceProfile(
        name="cpu",
        kind="cpu",
        memory_bytes=1 << 34,
        flops_per_s=1e9,
        h2d_bytes_per_s=float("inf"),
        d2h_bytes_per_s=float("inf"),
        latency_s=0.0,
        flops_by_dtype=rates,
    )


def _predicted(bf16_rate: float | None) -> float:
    model = mlp(512, 2).to(torch.bfloat16)
    (graph,) = capture(model, torch.randn(64, 512, dtype=torch.bfloat16))
    host = _host(bf16_rate)
    profile = HostProfile(devices=(host,), source="test")
    devices = native_device_list([PlannedDevice(host, 1 << 34)], profile, has_params=True)
    native = native_planner().plan(
        graph.to_native(rate_classes=RATE_CLASSES), devices, "latency", True
    )
    return float(native.predicted_time_s)


def test_a_devices_rate_per_dtype_is_what_its_nodes_are_costed_at() -> None:
    assert class_rates(_host(4e9)) == [4e9, 1e9], "float16 unmeasured: float32's"
    unmeasured, measured = _predicted(None), _predicted(4e9)
    flops = 2 * 2 * 64 * 512 * 512
    assert unmeasured >= flops / 1e9
    assert measured < unmeasured / 3, (measured, unmeasured)
