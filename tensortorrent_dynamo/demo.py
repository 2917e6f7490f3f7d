"""The main job in one command: a model larger than its budget, planned, explained, run.

A DeepMLP whose parameters are larger than a virtual accelerator's budget is
compiled with TensorTorrent; the plan is printed, the model runs with streamed
parameters, and the output is checked against eager PyTorch. Then the same model
runs on the CPU alone with a host RAM budget smaller than its weights: the weights
it cannot keep live on disk and are read back on every call.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

import torch

from .api import compile as tt_compile
from .units import format_bytes, format_seconds


def deep_mlp(width: int, depth: int, seed: int = 0) -> torch.nn.Sequential:
    """``depth`` Linear(width, width)+ReLU layers with seeded random weights."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """What the demo measured."""

    explain: str
    max_abs_diff: float
    tolerance: float
    param_bytes: int
    budget_bytes: int
    measured_peak_bytes: int
    eager_s: float
    tensortorrent_s: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.measured_peak_bytes <= self.budget_bytes


def run_demo(
    width: int = 1024, depth: int = 8, batch: int = 64, budget: str = "12MiB"
) -> DemoResult:
    model = deep_mlp(width, depth)
    x = torch.randn(batch, width)
    options = {
        "budgets": {"virtual:0": budget},
        "virtual_devices": {"virtual:0": {"flops": "2T", "bandwidth": "16GB"}},
        "compiler": "eager",
    }
    compiled = tt_compile(model, example_inputs=(x,), **options)
    with torch.no_grad():
        start = time.perf_counter()
        expected = model(x)
        eager_s = time.perf_counter() - start
        start = time.perf_counter()
        got = compiled(x)
        tt_s = time.perf_counter() - start
    budget_bytes = compiled.graphs[0].settings.budgets["virtual:0"]
    return DemoResult(
        explain=compiled.explain(),
        max_abs_diff=float((got - expected).abs().max()),
        tolerance=1e-4,
        param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        budget_bytes=budget_bytes,
        measured_peak_bytes=compiled.measured_peaks()["virtual:0"],
        eager_s=eager_s,
        tensortorrent_s=tt_s,
    )


@dataclasses.dataclass(frozen=True)
class DiskDemoResult:
    """What the disk-tier half of the demo measured."""

    explain: str
    max_abs_diff: float
    tolerance: float
    budget_bytes: int
    predicted_host_peak_bytes: int
    disk_bytes_read: int

    @property
    def ok(self) -> bool:
        return (
            self.max_abs_diff <= self.tolerance
            and self.predicted_host_peak_bytes <= self.budget_bytes
            and self.disk_bytes_read > 0
        )


def run_disk_demo(
    width: int = 1024, depth: int = 8, batch: int = 64, budget: str = "12MiB"
) -> DiskDemoResult:
    model = deep_mlp(width, depth)
    x = torch.randn(batch, width)
    with torch.no_grad():
        expected = model(x)  # before compiling: the offloaded weights leave RAM
    with tempfile.TemporaryDirectory(prefix="tensortorrent-demo-") as offload:
        compiled = tt_compile(
            model, (x,), budgets={"cpu": budget}, offload_dir=offload, compiler="eager"
        )
        with torch.no_grad():
            got = compiled(x)
        graph = compiled.graphs[0]
        return DiskDemoResult(
            explain=compiled.explain(),
            max_abs_diff=float((got - expected).abs().max()),
            tolerance=1e-4,
            budget_bytes=graph.settings.budgets["cpu"],
            predicted_host_peak_bytes=graph.plan.predicted_peak("cpu"),
            disk_bytes_read=compiled.disk_bytes_read(),
        )


def main() -> int:
    result = run_demo()
    print(
        f"DeepMLP: {format_bytes(result.param_bytes)} of parameters, "
        f"virtual:0 budget {format_bytes(result.budget_bytes)}\n"
    )
    print(result.explain)
    print()
    print(
        f"measured peak on virtual:0: {format_bytes(result.measured_peak_bytes)} "
        f"(budget {format_bytes(result.budget_bytes)})"
    )
    print(
        f"one forward: eager {format_seconds(result.eager_s)}, "
        f"tensortorrent {format_seconds(result.tensortorrent_s)} "
        "(virtual devices run on the CPU: a correctness demo, not a speed figure)"
    )
    verdict = "OK" if result.ok else "FAILED"
    print(
        f"max abs diff vs eager: {result.max_abs_diff:.3g} "
        f"(tolerance {result.tolerance:g}): {verdict}"
    )
    disk = run_disk_demo()
    print(
        f"\nThe same model on the CPU alone, host RAM budget {format_bytes(disk.budget_bytes)}: "
        "the weights that do not fit live on disk\n"
    )
    print(disk.explain)
    print()
    print(
        f"read from disk in one call: {format_bytes(disk.disk_bytes_read)}; predicted host "
        f"peak {format_bytes(disk.predicted_host_peak_bytes)} "
        f"(budget {format_bytes(disk.budget_bytes)})"
    )
    disk_verdict = "OK" if disk.ok else "FAILED"
    print(
        f"max abs diff vs eager: {disk.max_abs_diff:.3g} "
        f"(tolerance {disk.tolerance:g}): {disk_verdict}"
    )
    return 0 if result.ok and disk.ok else 1
