"""What every bench shares: timing by medians, the machine's description, JSON output."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_median_seconds(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int, calls: int = 1
) -> dict[str, float]:
    """Median wall time of one call of each function over ``repeats`` samples, the samples
    interleaved (a, b, c, a, b, c, ...) so that a machine whose speed drifts slows every
    competitor alike; a sample times ``calls`` calls in a row (the time of a call in a loop,
    its per-call costs included) and counts their mean."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def calls_per_sample(fn: Callable[[], object], sample_s: float = 0.02) -> int:
    """How many calls of ``fn`` take about ``sample_s`` (at least one), from a few timed."""
    start = time.perf_counter()
    for _ in range(3):
        fn()
    one = (time.perf_counter() - start) / 3
    return max(1, round(sample_s / max(one, 1e-9)))


def machine() -> dict[str, Any]:
    """Torch version, CPU model, cores and the fingerprint the host profile is cached under."""
    from tensortorrent_dynamo.profile.detect import current_fingerprint

    return {
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "fingerprint": current_fingerprint().to_dict(),
    }


def write_results(name: str, payload: dict[str, Any], directory: Path | None = None) -> Path:
    """Write ``<directory>/<name>.json`` (default ``bench/results``), with ``machine()``."""
    directory = RESULTS if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"bench": name, "machine": machine(), **payload}, indent=1))
    return path
