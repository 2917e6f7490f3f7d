"""fit: models that fit in memory, on the CPU: eager vs Inductor vs TensorTorrent.

Each model is run three ways in one process on the same inputs; the figure is
the ratio of median times (TensorTorrent / Inductor, TensorTorrent / eager).
A sample times as many calls in a row as take about 20 ms (a call in a loop, as a
user makes it), the three ways' samples interleaved. ``call_overhead`` is a model
of two 8x8 linears whose call is almost all fixed cost: TensorTorrent's time less
Inductor's there is what a call through the backend adds (``extra_us_per_call``).
Compile time is reported apart; outputs are checked against eager.

    python -m bench.fit [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import tensortorrent as tt
from tests.models import TransformerBlock, mlp

from .common import calls_per_sample, interleaved_median_seconds, write_results


def workloads(quick: bool) -> dict[str, tuple[Callable[[], torch.nn.Module], torch.Tensor]]:
    scale = 4 if quick else 1
    return {
        "call_overhead": (
            lambda: torch.nn.Sequential(
                torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)
            ),
            torch.randn(2, 8),
        ),
        "mlp_512x8": (lambda: mlp(512, 8), torch.randn(64 // scale, 512)),
        "transformer_256": (
            lambda: torch.nn.Sequential(*[TransformerBlock(256, 4, seed=i) for i in range(4)]),
            torch.randn(8 // scale, 128, 256),
        ),
        "mlp_2048x8": (lambda: mlp(2048, 8), torch.randn(64 // scale, 2048)),
    }


def run_one(model: torch.nn.Module, x: torch.Tensor, repeats: int) -> dict[str, Any]:
    with torch.no_grad():
        expected = model(x)
        ways: dict[str, Callable[[], Any]] = {"eager": lambda: model(x)}
        compile_s: dict[str, float] = {}
        torch._dynamo.reset()
        start = time.perf_counter()
        inductor = torch.compile(model)
        inductor(x)
        compile_s["inductor"] = time.perf_counter() - start
        ways["inductor"] = lambda: inductor(x)
        start = time.perf_counter()
        compiled = tt.compile(model, example_inputs=(x,), compiler="inductor")
        compile_s["tensortorrent"] = time.perf_counter() - start
        ways["tensortorrent"] = lambda: compiled(x)
        max_diff = {
            name: float((fn() - expected).abs().max())
            for name, fn in ways.items()
            if name != "eager"
        }
        calls = calls_per_sample(ways["eager"])
        median_ms = {
            name: 1e3 * t
            for name, t in interleaved_median_seconds(
                ways, repeats=repeats, warmup=3, calls=calls
            ).items()
        }
    return {
        "median_ms": median_ms,
        "calls_per_sample": calls,
        "extra_us_per_call": 1e3 * (median_ms["tensortorrent"] - median_ms["inductor"]),
        "compile_s": compile_s,
        "max_abs_diff_vs_eager": max_diff,
        "tensortorrent_over_inductor": median_ms["tensortorrent"] / median_ms["inductor"],
        "tensortorrent_over_eager": median_ms["tensortorrent"] / median_ms["eager"],
        "plan": compiled.graphs[0].plan.native.chosen,
        "compiler": compiled.graphs[0].compiler_note,
        "graphs": len(compiled.graphs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="smaller inputs, fewer repeats")
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats
    results = {}
    for name, (make, x) in workloads(args.quick).items():
        results[name] = run_one(make().eval(), x, repeats)
        r = results[name]
        print(
            f"{name:<16} eager {r['median_ms']['eager']:8.3f} ms  "
            f"inductor {r['median_ms']['inductor']:8.3f} ms  "
            f"tensortorrent {r['median_ms']['tensortorrent']:8.3f} ms  "
            f"tt/inductor {r['tensortorrent_over_inductor']:.3f}  "
            f"tt/eager {r['tensortorrent_over_eager']:.3f}  "
            f"tt-inductor {r['extra_us_per_call']:+.1f} us/call  ({r['plan']})"
        )
    path = write_results(
        "fit",
        {
            "method": (
                f"median over {repeats} samples after 3 warm-up calls, a sample the mean of "
                "calls_per_sample calls in a row (about 20 ms of eager), same inputs, one "
                "process, the three ways' samples interleaved"
            ),
            "quick": args.quick,
            "workloads": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
