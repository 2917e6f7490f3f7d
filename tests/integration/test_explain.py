"""The text of explain() and of the generated schedule, pinned with expecttest."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import expecttest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.profile import resolve
from tensortorrent_dynamo.profile.schema import Figure, Measurements
from tests.models import mlp


def _compiled(layers: int = 3, budget: str = "10KiB", **options: object) -> tt.CompiledModule:
    model, x = mlp(32, layers), torch.randn(4, 32)
    return tt.compile(
        model,
        example_inputs=(x,),
        budgets={"virtual:0": budget, "cpu": "1GiB"},
        virtual_devices={"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}},
        compiler="eager",
        profile="nominal",
        **options,
    )


def _mask_measured_times(text: str) -> str:
    """Wall-clock figures change from run to run; everything else must not."""
    text = re.sub(r"(measured \(last call\): )[0-9.]+ (us|ms|s)", r"\1<time>", text)
    text = re.sub(r"[0-9.]+ [KMG]iB RSS", "<rss>", text)
    return re.sub(r"(?m)^(  submod_.*  )[0-9.]+ (us|ms|s)$", r"\1<time>", text)


class TestExplain(expecttest.TestCase):
    def test_explain_table(self) -> None:
        torch._dynamo.reset()
        compiled = _compiled()
        self.assertExpectedInline(
            _mask_measured_times(compiled.explain()),
            """\
TensorTorrent plan: 1 graph(s), objective latency, profile nominal

Devices
  device     kind     budget     compute        link h2d    peak predicted  peak measured
  cpu        cpu      1.00 GiB   50.00 GFLOP/s  -           12.88 KiB       <rss>
  virtual:0  virtual  10.00 KiB  2.00 TFLOP/s   16.00 GB/s  9.88 KiB        9.88 KiB
  ops: 9 (each graph once; 3 views or other ops moving no bytes), each costed a fixed cpu 5.0 us, virtual:0 1.0 us beyond its FLOPs or bytes
  host RSS: the whole process's resident memory during the last call (sampled every 2 ms), Python and torch included; the budget and prediction cover the model's weights and activations

Graph 0: 10 nodes, 6 parameters (12.38 KiB), 24.58 kFLOP, plan a90eb4aa9f9b2446
  candidates (searched all families: 5211 candidates simulated (52110 nodes)):
    single-device: all-on-virtual:0 9.3 us (chosen) | all-on-virtual:0/streamed 9.3 us | all-on-cpu 45.5 us
    knapsack: all-on-virtual:0/knapsack 9.3 us
  lower bound 9.0 us (busiest resource's work); predicted / bound 1.04x; busy: virtual:0 97%, cpu->virtual:0 6%, virtual:0->cpu 0%
  segment   device     compiler  nodes  FLOPs       params resident  streamed  copied in  measured
  submod_1  virtual:0  eager     3      8.19 kFLOP  128 B            4.00 KiB  512 B      <time>
  submod_2  virtual:0  eager     3      8.19 kFLOP  4.00 KiB         128 B     0 B        <time>
  submod_3  virtual:0  eager     3      8.19 kFLOP  128 B            4.00 KiB  0 B        <time>
  streamed parameters (3, prefetched one segment ahead, evicted after last use): 0.weight, 2.bias, 4.weight
  cpu's peak of 12.88 KiB comes when input arg2_1 is passed in; it then holds 12.38 KiB of weights in host memory (0.weight 4.00 KiB, 2.weight 4.00 KiB, 4.weight 4.00 KiB, 3 more 384 B); 512 B of activations (input arg2_1 512 B).
  virtual:0's peak of 9.88 KiB comes when relu (1) allocates its output; it then holds 4.25 KiB of weights kept there (2.weight 4.00 KiB, 0.bias 128 B, 4.bias 128 B); 4.12 KiB of streamed weights (0.weight 4.00 KiB, 2.bias 128 B); 1.50 KiB of activations (input arg2_1 512 B, addmm (0) 512 B, relu (1) 512 B).
  predicted time: 9.3 us, measured (last call): <time>

Predicted time per forward: 9.3 us""",
        )

    def test_schedule_code(self) -> None:
        torch._dynamo.reset()
        compiled = _compiled()
        code = compiled.graphs[0].module.code
        body = [
            line.strip()
            for line in code.splitlines()
            if "tensortorrent_dynamo" in line or "self.submod_" in line
        ]
        calls = [re.sub(r";.*", "", line) for line in body]
        self.assertExpectedInline(
            "\n".join(calls),
            """\
prefetch = tensortorrent_dynamo_run_ops_prefetch(tt_runtime, arg0_1, '0.weight', 'virtual:0')
prefetch_1 = tensortorrent_dynamo_run_ops_prefetch(tt_runtime, arg4_1, '2.bias', 'virtual:0')
wait = tensortorrent_dynamo_run_ops_wait(prefetch)
resident = tensortorrent_dynamo_run_ops_resident(tt_runtime, arg1_1, '0.bias', 'virtual:0')
transfer = tensortorrent_dynamo_run_ops_transfer(tt_runtime, arg2_1, 'virtual:0')
submod_1 = self.submod_1(wait, resident, transfer)
evict = tensortorrent_dynamo_run_ops_evict(prefetch)
prefetch_2 = tensortorrent_dynamo_run_ops_prefetch(tt_runtime, arg5_1, '4.weight', 'virtual:0')
resident_1 = tensortorrent_dynamo_run_ops_resident(tt_runtime, arg3_1, '2.weight', 'virtual:0')
wait_1 = tensortorrent_dynamo_run_ops_wait(prefetch_1)
submod_2 = self.submod_2(resident_1, wait_1, submod_1)
evict_1 = tensortorrent_dynamo_run_ops_evict(prefetch_1)
wait_2 = tensortorrent_dynamo_run_ops_wait(prefetch_2)
resident_2 = tensortorrent_dynamo_run_ops_resident(tt_runtime, arg6_1, '4.bias', 'virtual:0')
submod_3 = self.submod_3(wait_2, resident_2, submod_2)
evict_2 = tensortorrent_dynamo_run_ops_evict(prefetch_2)
transfer_1 = tensortorrent_dynamo_run_ops_transfer(tt_runtime, submod_3, 'cpu')""",
        )


def test_explain_says_how_many_segments_ahead_streamed_parameters_are_prefetched() -> None:
    torch._dynamo.reset()
    compiled = _compiled(layers=6, budget="16KiB", prefetch_depth=2)
    (graph,) = compiled.graphs
    assert graph.plan.native.prefetch_depth == 2
    (line,) = [s for s in compiled.explain().splitlines() if "streamed parameters (" in s]
    assert "prefetched 2 segments ahead" in line, line


def test_explain_points_at_the_profile_when_a_call_is_far_off_its_prediction() -> None:
    torch._dynamo.reset()
    model, x = mlp(32, 3), torch.randn(4, 32)
    compiled = tt.compile(model, example_inputs=(x,), compiler="eager", profile="nominal")
    (graph,) = compiled.graphs
    predicted = graph.plan.predicted_time_s

    def off_lines() -> list[str]:
        return [s for s in compiled.explain().splitlines() if "the last call took" in s]

    assert graph.calls == 1  # the call that compiled, which warms the caches up
    graph.last_call_s = 3 * predicted
    assert off_lines() == []
    with torch.no_grad():
        compiled(x)
    for measured, shown in ((2 * predicted, "2.00x"), (predicted / 4, "0.25x")):
        graph.last_call_s = measured
        (line,) = off_lines()
        assert f"took {shown} the predicted time" in line
        assert "profile nominal" in line and "tensortorrent validate-hardware" in line
    for measured in (predicted, 1.25 * predicted, predicted / 1.25):
        graph.last_call_s = measured
        assert off_lines() == []


def test_explain_says_a_virtual_device_is_off_its_prediction_by_emulation() -> None:
    """A plan that runs on a virtual device is off its prediction because the device runs
    its ops on the CPU through a Python layer, whatever the profile: the line says so and
    does not send the user to measure the host again."""
    torch._dynamo.reset()
    model, x = mlp(32, 3), torch.randn(4, 32)
    compiled = tt.compile(
        model,
        example_inputs=(x,),
        compiler="eager",
        profile="nominal",
        virtual_devices={"virtual:0": {"flops": "2T", "bandwidth": "16GB", "capacity": "1GiB"}},
        devices=["virtual:0"],
    )
    with torch.no_grad():
        compiled(x)
    (graph,) = compiled.graphs
    graph.last_call_s = 50 * graph.plan.predicted_time_s
    (line,) = [s for s in compiled.explain().splitlines() if "the last call took" in s]
    assert "50.00x the predicted time" in line
    assert "virtual:0 runs its ops on the CPU" in line
    assert "validate-hardware" not in line


def test_explain_names_the_rate_each_dtypes_flops_are_costed_at() -> None:
    torch._dynamo.reset()
    model, x = mlp(32, 3).to(torch.bfloat16), torch.randn(4, 32, dtype=torch.bfloat16)
    compiled = tt.compile(model, example_inputs=(x,), compiler="eager", profile="nominal")
    lines = compiled.explain().splitlines()
    start = lines.index("  FLOPs by dtype, and the rate each device's are costed at:")
    assert lines[start + 1] == (
        "    bfloat16: 24.58 kFLOP (each graph once); "
        "costed at cpu 50.00 GFLOP/s (float32's: not measured)"
    )


def test_explain_names_the_rate_of_each_count_of_matmul_rows(tmp_path: Path) -> None:
    m = resolve.nominal_measurements()
    rates = {1: 1e9, 4: 4e9, 64: 2e10}
    cpu = dataclasses.replace(
        m.devices[0],
        matmul_rows={"float32": {r: Figure(v, "FLOP/s", "test") for r, v in rates.items()}},
    )
    lines = _rate_lines(
        tmp_path,
        dataclasses.replace(m, devices=(cpu, *m.devices[1:])),
        mlp(32, 3),
        torch.randn(4, 32),
    )
    assert lines[1] == (
        "    float32: 24.58 kFLOP (each graph once); "
        "costed at cpu matmuls 4.00 GFLOP/s at 4 rows (24.58 kFLOP)"
    )


def test_explain_names_the_rate_attention_is_costed_at(tmp_path: Path) -> None:
    from tests.unit.plan.test_rate_classes import _Attention

    m = resolve.nominal_measurements()
    cpu = dataclasses.replace(m.devices[0], attention=Figure(2e9, "FLOP/s", "test"))
    m = dataclasses.replace(m, devices=(cpu, *m.devices[1:]))
    lines = _rate_lines(tmp_path, m, _Attention(), torch.randn(1, 32, 64))
    assert lines[2] == (
        "    attention in float32 over 32 tokens: 262.14 kFLOP (each graph once); "
        "costed at cpu 2.00 GFLOP/s (measured)"
    ), lines[:3]
    # measured at few tokens too: costed at its 32 tokens' rate, between 16's and 256's
    at_16 = Figure(5e8, "FLOP/s", "test")
    cpu = dataclasses.replace(cpu, attention_tokens={16: at_16})
    m = dataclasses.replace(m, devices=(cpu, *m.devices[1:]))
    lines = _rate_lines(tmp_path, m, _Attention(), torch.randn(1, 32, 64))
    assert lines[2].endswith("costed at cpu 707.11 MFLOP/s (measured)"), lines[:3]


def _rate_lines(
    tmp_path: Path, measurements: Measurements, model: torch.nn.Module, x: torch.Tensor
) -> list[str]:
    """Explain's lines from its rates' heading on, for ``model`` planned with a profile of
    ``measurements``."""
    path = tmp_path / "profile.json"
    path.write_text(measurements.to_json())
    torch._dynamo.reset()
    compiled = tt.compile(model, example_inputs=(x,), compiler="eager", profile=str(path))
    lines = compiled.explain().splitlines()
    return lines[lines.index("  FLOPs by dtype, and the rate each device's are costed at:") :]
