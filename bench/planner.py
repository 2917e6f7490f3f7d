"""planner: plan + simulate time on synthetic cost graphs, and plan quality.

Timing: the native planner as ``pip install -e .`` builds it (release) on
transformer-like cost graphs of 1k, 10k and 100k nodes over a host and two unequal
virtual accelerators whose budgets force streaming. Each figure is the median of
whole ``plan()`` calls (every candidate family, every simulation, the winner's
timeline) after one untimed call; building the graph is not timed. The growth
exponent is the least-squares slope of log time against log n, given for the
default limits and for the constructive families alone (``node_limit=0``): the
default node limit has a floor, so small graphs get more local search per node.

Quality: random DAGs of up to 12 nodes over a host and two accelerators with random
rates and budgets. The plan's simulated time is compared with the optimum that
``exhaustive()`` finds by enumeration over the same cost model; the planner must
find a plan exactly when the enumeration does.

    python -m bench.planner [--sizes 1000 10000 100000] [--repeats 5] [--cases 100] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from tensortorrent_dynamo import _planner as planner
from tensortorrent_dynamo.errors import PlanInfeasible

from .common import median_seconds, write_results

SIZES = (1_000, 10_000, 100_000)
WIDTH = 1024
TOKENS = 16
F32 = 4


def synthetic_graph(num_nodes: int) -> tuple[planner.CostGraph, int]:
    """Pre-norm transformer blocks (10 nodes each) after one input, as flat arrays,
    and the bytes of all their weights.

    Matmuls carry FLOPs and a weight; norms, activations and residual adds are
    memory-bound (FLOPs 0, bytes accessed only).
    """
    act = TOKENS * WIDTH * F32
    flops: list[float] = [0.0]
    out_bytes = [act]
    host_only = [True]
    bytes_accessed = [act]
    inputs: list[list[int]] = [[]]
    param_bytes: list[int] = []
    param_users: list[int] = []

    def node(flop: float, reads: list[int], weight: int = 0) -> int:
        flops.append(flop)
        out_bytes.append(act)
        host_only.append(False)
        bytes_accessed.append(act * (len(reads) + 1) + weight)
        inputs.append(reads)
        if weight:
            param_bytes.append(weight)
            param_users.append(len(flops) - 1)
        return len(flops) - 1

    def matmul(reads: list[int], fan_out: int) -> int:
        weight = WIDTH * WIDTH * fan_out * F32
        return node(2.0 * TOKENS * WIDTH * WIDTH * fan_out, reads, weight)

    prev = 0
    while len(flops) + 10 <= num_nodes:
        residual = prev
        h = node(0.0, [prev])
        h = matmul([h], 3)
        h = node(4.0 * TOKENS * TOKENS * WIDTH, [h])
        h = matmul([h], 1)
        mid = node(0.0, [h, residual])
        h = node(0.0, [mid])
        h = matmul([h], 4)
        h = node(0.0, [h])
        h = matmul([h], 4)
        prev = node(0.0, [h, mid])
    input_offsets = [0]
    input_ids: list[int] = []
    for reads in inputs:
        input_ids.extend(reads)
        input_offsets.append(len(input_ids))
    graph = planner.CostGraph(
        flops,
        out_bytes,
        host_only,
        input_offsets,
        input_ids,
        param_bytes,
        list(range(len(param_bytes) + 1)),
        param_users,
        [prev],
        node_bytes_accessed=bytes_accessed,
    )
    return graph, sum(param_bytes)


def synthetic_devices(param_bytes: int) -> list[planner.Device]:
    """A host, a fast accelerator holding 20 % of the weights and a half-as-fast one
    holding 10 %, each with its own 16 GB/s link."""
    host = planner.Device("cpu", True, 1e11, 1 << 50, 0.0, 0.0, 5e-6, mem_bytes_per_s=2e10)
    fast = planner.Device(
        "virtual:0", False, 1e13, param_bytes // 5, 1.6e10, 1.6e10, 5e-6, mem_bytes_per_s=1e12
    )
    slow = planner.Device(
        "virtual:1", False, 5e12, param_bytes // 10, 1.6e10, 1.6e10, 5e-6, mem_bytes_per_s=5e11
    )
    return [host, fast, slow]


def growth_exponent(sizes: Sequence[int], seconds: Sequence[float]) -> float:
    """Least-squares slope of log(seconds) against log(size)."""
    xs = [math.log(n) for n in sizes]
    ys = [math.log(t) for t in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return num / sum((x - mx) ** 2 for x in xs)


def timing(sizes: Sequence[int], repeats: int) -> dict[str, Any]:
    rows = []
    for n in sizes:
        graph, weights = synthetic_graph(n)
        devices = synthetic_devices(weights)
        row: dict[str, Any] = {"nodes": graph.num_nodes, "params": graph.num_params}
        for label, options in (("default", {}), ("constructive", {"node_limit": 0})):
            run = functools.partial(planner.plan, graph, devices, "latency", True, **options)
            result = run()
            seconds = median_seconds(run, repeats=repeats, warmup=0)
            row[label] = {
                "median_ms": 1e3 * seconds,
                "chosen": result.chosen,
                "families": sorted({c.family for c in result.candidates}),
                "predicted_time_s": result.predicted_time_s,
                "lower_bound_ratio": result.predicted_time_s / result.lower_bound_s,
                "report": result.report,
            }
        rows.append(row)
        print(
            f"{row['nodes']:>7} nodes  plan {row['default']['median_ms']:9.1f} ms  "
            f"(constructive {row['constructive']['median_ms']:8.1f} ms)  "
            f"{row['default']['chosen']}: {row['default']['report']}"
        )
    ns = [r["nodes"] for r in rows]
    return {
        "sizes": rows,
        "growth_exponent": {
            label: growth_exponent(ns, [r[label]["median_ms"] for r in rows])
            for label in ("default", "constructive")
        }
        if len(rows) > 1
        else None,
    }


def random_case(
    rng: random.Random, max_nodes: int
) -> tuple[planner.CostGraph, list[planner.Device], bool]:
    """A random DAG (a host input, nodes reading one or two earlier nodes, a tenth of
    them host-only, up to three parameters used by one or two nodes) over a host and
    two accelerators with random rates and budgets, and whether the host computes."""
    n = rng.randint(3, max_nodes)
    flops = [0.0] + [rng.randrange(1000) * 1e6 for _ in range(n - 1)]
    out = [rng.randrange(1, 1 << 16)] + [rng.randrange(1 << 16) for _ in range(n - 1)]
    host_only = [True] + [rng.random() < 0.1 for _ in range(n - 1)]
    offsets, ids = [0, 0], []
    for v in range(1, n):
        ids.append(v - 1)
        if rng.random() < 0.4:
            ids.append(rng.randrange(v))
        offsets.append(len(ids))
    params = rng.randrange(4)
    param_offsets, users = [0], []
    for _ in range(params):
        users.extend(rng.randrange(1, n) for _ in range(rng.randint(1, 2)))
        param_offsets.append(len(users))
    graph = planner.CostGraph(
        flops,
        out,
        host_only,
        offsets,
        ids,
        [rng.randrange(1, 1 << 20) for _ in range(params)],
        param_offsets,
        users,
        [n - 1],
    )

    def budget() -> int:
        return rng.choice([rng.randrange(1 << 20), rng.randrange(4 << 20), 1 << 40])

    devices = [planner.Device("cpu", True, 1e9 * rng.randint(1, 100), 1 << 40, 0.0, 0.0, 1e-6)]
    for a in range(2):
        devices.append(
            planner.Device(
                f"virtual:{a}",
                False,
                1e9 * rng.randint(1, 10_000),
                budget(),
                1e6 * rng.randint(1, 10_000),
                1e6 * rng.randint(1, 10_000),
                1e-6 * rng.randrange(20),
            )
        )
    return graph, devices, rng.random() < 0.5


def quality(cases: int, max_nodes: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    ratios: list[float] = []
    disagreements = []
    infeasible = 0
    for case in range(cases):
        graph, devices, host_compute = random_case(rng, max_nodes)
        best = planner.exhaustive(graph, devices, host_compute, limit=10_000_000)
        try:
            chosen: planner.Plan | None = planner.plan(graph, devices, "latency", host_compute)
        except PlanInfeasible:
            chosen = None
        if (best is None) != (chosen is None):
            disagreements.append(case)
        elif best is None:
            infeasible += 1
        elif chosen is not None:
            ratios.append(chosen.predicted_time_s / best.predicted_time_s)
    return {
        "cases": cases,
        "max_nodes": max_nodes,
        "devices": 3,
        "seed": seed,
        "compared": len(ratios),
        "infeasible_both": infeasible,
        "feasibility_disagreements": disagreements,
        "worst_ratio": max(ratios, default=1.0),
        "mean_ratio": statistics.fmean(ratios) if ratios else 1.0,
        "within_5_percent": sum(r <= 1.05 for r in ratios),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", type=int, default=300, help="random graphs for quality")
    parser.add_argument("--max-nodes", type=int, default=12)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--quick", action="store_true", help="1k and 10k nodes, 20 cases")
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes if s <= 10_000] if args.quick else args.sizes
    cases = min(args.cases, 20) if args.quick else args.cases
    timed = timing(sizes, args.repeats)
    if timed["growth_exponent"] is not None:
        print(f"growth exponent: {timed['growth_exponent']}")
    checked = quality(cases, args.max_nodes, args.seed)
    print(
        f"quality over {checked['compared']} graphs: worst {checked['worst_ratio']:.4f}, "
        f"mean {checked['mean_ratio']:.4f}, "
        f"feasibility disagreements {len(checked['feasibility_disagreements'])}"
    )
    path = write_results(
        "planner",
        {
            "method": (
                f"median of {args.repeats} plan() calls after one untimed call, same graph, "
                "one process; quality against exhaustive() over the same cost model"
            ),
            "planner_version": planner.version(),
            "quick": args.quick,
            "timing": timed,
            "quality": checked,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
