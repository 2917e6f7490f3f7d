"""Each node's FLOPs are costed at its device's rate for the node's dtype: a bfloat16 graph
on a host whose bfloat16 matmuls are 4x its float32 ones is predicted faster, and a dtype
the profile did not measure runs at the float32 rate."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tensortorrent_dynamo._native import native_planner
from tensortorrent_dynamo.cost_graph import RateKey, build_cost_graph, is_attention, kinds_of
from tensortorrent_dynamo.functional import capture as functional_capture
from tensortorrent_dynamo.plan.planner import (
    PlannedDevice,
    attention_rate,
    calls_attention,
    class_latencies,
    class_rates,
    native_device_list,
    node_rate,
    rate_keys,
    width_factor,
)
from tensortorrent_dynamo.profile import DeviceProfile, HostProfile
from tests.models import mlp
from tests.unit.cost_graph.test_cost_graph import capture


def _host(
    bf16_rate: float | None,
    by_rows: dict[str, dict[int, float]] | None = None,
    latency_s: float = 0.0,
    latency_by_op: dict[str, float] | None = None,
    cold_latency_s: float = 0.0,
    attention_flops_per_s: float | None = None,
    attention_by_tokens: dict[int, float] | None = None,
) -> DeviceProfile:
    rates = {"float32": 1e9, **({"bfloat16": bf16_rate} if bf16_rate else {})}
    return DeviceProfile(
        name="cpu",
        kind="cpu",
        memory_bytes=1 << 34,
        flops_per_s=1e9,
        h2d_bytes_per_s=float("inf"),
        d2h_bytes_per_s=float("inf"),
        latency_s=latency_s,
        flops_by_dtype=rates,
        flops_by_rows=by_rows or {},
        latency_by_op=latency_by_op or {},
        cold_latency_s=cold_latency_s,
        attention_flops_per_s=attention_flops_per_s,
        attention_by_tokens=attention_by_tokens or {},
    )


def _predicted(
    bf16_rate: float | None,
    by_rows: dict[str, dict[int, float]] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    batch: int = 64,
) -> float:
    model = mlp(512, 2).to(dtype)
    (graph,) = capture(model, torch.randn(batch, 512, dtype=dtype))
    host = _host(bf16_rate, by_rows)
    profile = HostProfile(devices=(host,), source="test")
    keys = rate_keys([graph], [host])
    devices = native_device_list([PlannedDevice(host, 1 << 34)], profile, graph, keys)
    native = native_planner().plan(graph.to_native(rate_classes=keys), devices, "latency", True)
    return float(native.predicted_time_s)


def test_a_devices_rate_per_dtype_is_what_its_nodes_are_costed_at() -> None:
    keys = [
        RateKey("bfloat16", None, None, ("mm.default",)),
        RateKey("float16", None, None, ("mm.default",)),
    ]
    assert class_rates(_host(4e9), keys) == [4e9, 1e9], "float16 unmeasured: float32's"
    unmeasured, measured = _predicted(None), _predicted(4e9)
    flops = 2 * 2 * 64 * 512 * 512
    assert unmeasured >= flops / 1e9
    assert measured < unmeasured / 3, (measured, unmeasured)


ROWS = {"float32": {1: 1e7, 16: 1.6e8, 256: 1e9}}


def test_a_matmuls_rate_is_interpolated_in_the_rates_measured_by_rows() -> None:
    host = _host(None, ROWS)
    assert node_rate(host, "float32", 1) == 1e7
    assert node_rate(host, "float32", 4) == pytest.approx(4e7), "log-log: rate ~ rows here"
    assert node_rate(host, "float32", 16) == pytest.approx(1.6e8)
    assert node_rate(host, "float32", 4096) == 1e9, "beyond the last measured: the last"
    assert node_rate(host, "float32", None) == 1e9, "not a matmul: the square rate"
    assert node_rate(host, "bfloat16", 4) == 1e9, "no bfloat16 rows measured: float32's"
    assert node_rate(_host(None), "float32", 4) == 1e9, "no rows measured: the square rate"


def test_a_small_batch_matmul_is_costed_at_the_rate_of_its_rows() -> None:
    model = mlp(512, 2)
    (graph,) = capture(model, torch.randn(4, 512))
    assert {n.rows for n in graph.nodes if n.flops > 0} == {4}
    assert rate_keys([graph], [_host(None, ROWS)]) == (("float32", 4, 512, ("linear",)),)
    assert rate_keys([graph], [_host(None)]) == (), "every FLOP at the float32 rate"
    square = _predicted(None, dtype=torch.float32, batch=4)
    by_rows = _predicted(None, ROWS, dtype=torch.float32, batch=4)
    # at 4 rows the matmuls run at 4e7 FLOP/s, 25x below the square rate
    assert by_rows > 20 * square, (by_rows, square)


def test_each_op_pays_the_fixed_cost_measured_for_it() -> None:
    """A node pays the profile's figure for each op it calls (the weight's transpose
    included, called where its matmul runs), an op without one the device's figure per op;
    a profile without figures by op plans with one figure for every op, as before them."""
    ((gm, inputs),) = functional_capture(mlp(512, 2), torch.randn(4, 512))
    graph = build_cost_graph(gm, inputs.values, inputs.params)
    calls = {key.ops for key in graph.rate_keys() if key.ops}
    assert calls == {("addmm.default", "t.default"), ("relu.default",)}, calls
    one_cost = _host(None, latency_s=1.0)
    assert rate_keys([graph], [one_cost]) == ()
    by_op = _host(None, latency_s=1.0, latency_by_op={"addmm.default": 3.0, "t.default": 0.5})
    keys = rate_keys([graph], [by_op])
    assert [key.ops for key in keys] == [("addmm.default", "t.default")], keys
    assert class_latencies(by_op, keys) == [3.5]

    def predicted(host: DeviceProfile) -> float:
        profile = HostProfile(devices=(host,), source="test")
        keys = rate_keys([graph], [host])
        devices = native_device_list([PlannedDevice(host, 1 << 34)], profile, graph, keys)
        native = native_planner().plan(graph.to_native(rate_classes=keys), devices, "latency", True)
        return float(native.predicted_time_s)

    # two layers of addmm + t (2 s each at one figure, 3.5 s by op) and relu (1 s), and
    # 2 * 2 * 4 * 512^2 FLOPs at 1e9 FLOP/s
    flops_s = 2 * 2 * 4 * 512**2 / 1e9
    assert predicted(one_cost) == pytest.approx(6.0 + flops_s, rel=1e-6)
    assert predicted(by_op) == pytest.approx(9.0 + flops_s, rel=1e-6)


def test_a_segment_pays_the_cold_cost_once_for_each_kind_of_op_it_runs() -> None:
    """Nodes name the kinds of op they call, a weight's transpose with its matmul; on a
    host with a cold cost, the one segment of an all-host plan pays it once per kind, on
    top of each op's fixed cost, and nothing changes the classes."""
    ((gm, inputs),) = functional_capture(mlp(512, 3), torch.randn(4, 512))
    graph = build_cost_graph(gm, inputs.values, inputs.params)
    calls = zip(kinds_of(graph.node_calls()), graph.node_calls(), strict=True)
    called = [kinds for kinds, ops in calls if ops]
    assert called == [[0, 1], [2], [0, 1], [2], [0, 1], [2]], called
    warm, cold = _host(None, latency_s=1.0), _host(None, latency_s=1.0, cold_latency_s=10.0)
    assert rate_keys([graph], [cold]) == rate_keys([graph], [warm]) == ()

    def predicted(host: DeviceProfile) -> float:
        profile = HostProfile(devices=(host,), source="test")
        devices = native_device_list([PlannedDevice(host, 1 << 34)], profile, graph, ())
        native = native_planner().plan(graph.to_native(), devices, "latency", True)
        return float(native.predicted_time_s)

    # three layers of addmm + t and relu at 1 s an op, and 3 * 2 * 4 * 512^2 FLOPs at 1e9
    # FLOP/s; cold, 3 kinds run the first time at 10 s more
    flops_s = 3 * 2 * 4 * 512**2 / 1e9
    assert predicted(warm) == pytest.approx(9.0 + flops_s, rel=1e-6)
    assert predicted(cold) == pytest.approx(9.0 + 30.0 + flops_s, rel=1e-6)


def test_a_matmul_wider_than_the_rates_by_rows_runs_at_the_rate_measured_that_wide() -> None:
    """Rates by rows measured 1024 wide, and float32's 4096 wide half as fast at 4 rows and
    as fast at 64: a 4096-wide layer at 4 rows runs at half the rate, a 2048-wide one
    halfway in log width, one at 64 rows or 1024 wide or narrower as measured; a bfloat16
    one scales the same way."""
    rows = {"float32": {4: 4e9, 64: 64e9}, "bfloat16": {4: 8e9, 64: 128e9}}
    host = dataclasses.replace(
        _host(2e11, rows),
        rows_width=1024,
        flops_by_rows_wide={4096: {"float32": {4: 2e9, 64: 64e9}}},
    )
    assert node_rate(host, "float32", 4, 4096) == pytest.approx(2e9)
    assert node_rate(host, "float32", 4, 8192) == pytest.approx(2e9), "beyond: the widest"
    assert node_rate(host, "float32", 4, 2048) == pytest.approx(4e9 / 2**0.5)
    assert node_rate(host, "float32", 4, 1024) == node_rate(host, "float32", 4, 256) == 4e9
    assert node_rate(host, "float32", 64, 4096) == pytest.approx(64e9)
    assert node_rate(host, "float32", 256, 4096) == pytest.approx(64e9), "as at 64 rows"
    assert node_rate(host, "float32", 4, None) == 4e9, "width unknown: as measured"
    assert node_rate(host, "bfloat16", 4, 4096) == pytest.approx(4e9)
    assert width_factor(dataclasses.replace(host, rows_width=None), 4, 4096) == 1.0
    ((gm, inputs),) = functional_capture(mlp(2048, 1), torch.randn(4, 2048))
    graph = build_cost_graph(gm, inputs.values, inputs.params)
    assert [key[:3] for key in rate_keys([graph], [host])] == [("float32", 4, 2048)]


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(1, 32, 4, 16).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_attention_is_costed_at_the_rate_measured_for_it() -> None:
    """A node that calls attention runs at the profile's attention rate (scaled for other
    dtypes as their matmuls are), the others at their own; without the figure, at the
    square rate, in no class of its own."""
    ((gm, inputs),) = functional_capture(_Attention(), torch.randn(1, 32, 64))
    graph = build_cost_graph(gm, inputs.values, inputs.params)
    (attention,) = [k for k in graph.rate_keys() if calls_attention(k)]
    assert attention.rows == 32 and attention.dtype == "float32", "its query's tokens"
    assert rate_keys([graph], [_host(None)]) == ()
    host = _host(4e9, attention_flops_per_s=2.5e8)
    keys = rate_keys([graph], [host])
    assert keys == (attention,), "the projection runs at the square rate, in class 0"
    assert class_rates(host, keys) == [2.5e8]
    assert attention_rate(host, "bfloat16") == pytest.approx(1e9), "4x, as bfloat16 matmuls"
    assert attention_rate(_host(None), "float32") == 1e9
    assert is_attention("_scaled_dot_product_flash_attention_for_cpu.default")
    assert is_attention("_efficient_attention_forward.default")
    assert not is_attention("addmm.default")


def test_attention_over_few_tokens_is_costed_at_the_rate_measured_over_as_few() -> None:
    """With attention's rate measured at several query lengths, a node is costed at its
    query's tokens, interpolated in log tokens and log rate, the nearest beyond them; a
    node of unknown tokens at the rate over most tokens."""
    rates = {16: 2e8, 64: 8e8, 256: 1.6e9}
    host = _host(4e9, attention_flops_per_s=1.6e9, attention_by_tokens=rates)
    assert attention_rate(host, "float32", 32) == pytest.approx(4e8), "halfway in log"
    assert attention_rate(host, "float32", 64) == pytest.approx(8e8)
    assert attention_rate(host, "float32", 1) == pytest.approx(2e8)
    assert attention_rate(host, "float32", 4096) == pytest.approx(1.6e9)
    assert attention_rate(host, "float32") == pytest.approx(1.6e9)
    assert attention_rate(host, "bfloat16", 32) == pytest.approx(1.6e9), "4x, as its matmuls"
    ((gm, inputs),) = functional_capture(_Attention(), torch.randn(1, 32, 64))
    graph = build_cost_graph(gm, inputs.values, inputs.params)
    keys = rate_keys([graph], [host])
    assert class_rates(host, keys) == [pytest.approx(4e8)], "its 32 tokens' rate"
    alone = _host(4e9, attention_flops_per_s=1.6e9)
    assert class_rates(alone, rate_keys([graph], [alone])) == [1.6e9], "one rate: that one"
