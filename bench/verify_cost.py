"""verify_cost: what checking every disk read costs, paired in one process.

The workload of ``bench.ram_offload`` (``--layers`` x Linear(width, width) + ReLU, float32,
16 x 4096: 1 GiB), built on the meta device and read from its safetensors checkpoint under a
host budget of half its weights, Inductor segments. For each batch, one compiled model is
called cold (page cache dropped before every call) in rounds of two calls: one with every read
verified (the default) and one with the same locations stripped of their guards, the order
alternating by round, so that the disk's drift hits both alike. Figures: median ms of each,
their ratio, the median of each round's ratio, and the reader's verify thread time per call.

    python -m bench.verify_cost [--layers 16 --width 4096 --batches 16 256 --rounds 12
                                 --quick --out-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from tests.models import mlp

from .common import RESULTS, write_results
from .offload.measure import drop_page_cache

SEED = 0


def _checkpoint(directory: Path, layers: int, width: int) -> Path:
    from safetensors.torch import save_file

    path = directory / f"mlp-{layers}x{width}.safetensors"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        save_file(mlp(width, layers, seed=SEED).state_dict(), str(path))
    return path


def measure(
    checkpoint: Path,
    layers: int,
    width: int,
    batch: int,
    rounds: int,
    offload: Path,
    compiler: str,
    drop: bool,
) -> dict[str, Any]:
    import tensortorrent as tt

    with torch.device("meta"):
        model = mlp(width, layers, seed=SEED)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(SEED + batch))
    budget = layers * width * (width + 1) * 4 // 2
    started = time.perf_counter()
    compiled = tt.compile(
        model,
        (x,),
        checkpoint=str(checkpoint),
        budgets={"cpu": budget},
        offload_dir=str(offload),
        compiler=compiler,
    )
    compile_s = time.perf_counter() - started
    disk = next(s.disk for s in compiled.backend.sessions.values() if s.disk is not None)
    ways = {
        "verified": dict(disk.locations),
        "unverified": {k: dataclasses.replace(v, guard=None) for k, v in disk.locations.items()},
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    verify_ms: list[float] = []
    kept: set[str] = set()  # why the page cache could not be dropped, if it could not
    with torch.no_grad():
        reference = compiled(x)
        for r in range(rounds):
            for way in sorted(ways, reverse=r % 2 == 1):
                disk.locations.update(ways[way])
                problem = drop_page_cache() if drop else "page cache kept: --no-drop"
                if problem is not None:
                    kept.add(problem)
                before = disk.reader.verify_seconds
                start = time.perf_counter()
                out = compiled(x)
                times[way].append((time.perf_counter() - start) * 1e3)
                torch.testing.assert_close(out, reference)
                if way == "verified":
                    verify_ms.append((disk.reader.verify_seconds - before) * 1e3)
    median = {way: statistics.median(t) for way, t in times.items()}
    return {
        "batch": batch,
        "rounds": rounds,
        "compile_s": compile_s,
        "page_cache": sorted(kept) or "dropped before every call",
        "bytes_read_per_call": compiled.disk_bytes_read(),
        "median_ms": median,
        "ms": times,
        "verify_thread_ms_per_call_median": statistics.median(verify_ms),
        "verified_over_unverified": median["verified"] / median["unverified"],
        # each round's two calls were made seconds apart: their ratio is the paired figure
        "paired_ratio_median": statistics.median(
            v / u for v, u in zip(times["verified"], times["unverified"], strict=True)
        ),
        "plan": compiled.graphs[0].plan.native.chosen,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--quick", action="store_true", help="a small model, 2 rounds, eager")
    parser.add_argument("--no-drop", action="store_true", help="keep the page cache")
    parser.add_argument("--out-dir", type=Path, default=RESULTS / "tmp" / "verify_cost")
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.rounds, args.compiler = 4, 512, 2, "eager"
    checkpoint = _checkpoint(args.out_dir, args.layers, args.width)
    results = []
    for batch in args.batches:
        torch._dynamo.reset()
        row = measure(
            checkpoint,
            args.layers,
            args.width,
            batch,
            args.rounds,
            args.out_dir / "offload",
            args.compiler,
            not args.no_drop,
        )
        results.append(row)
        print(
            f"batch {batch}: verified {row['median_ms']['verified']:.1f} ms, unverified "
            f"{row['median_ms']['unverified']:.1f} ms (ratio {row['verified_over_unverified']:.3f}"
            f", paired by round {row['paired_ratio_median']:.3f}), verify thread "
            f"{row['verify_thread_ms_per_call_median']:.1f} ms per call, "
            f"{row['bytes_read_per_call'] / 2**20:.0f} MiB read"
        )
    path = write_results(
        "verify_cost",
        {
            "layers": args.layers,
            "width": args.width,
            "compiler": args.compiler,
            "results": results,
        },
        args.results,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
