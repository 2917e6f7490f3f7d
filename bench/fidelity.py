"""fidelity: the simulator's predictions against what the calls measured.

For each case, a model is compiled by TensorTorrent and called (one warm-up call, then
``--repeats`` timed calls; for cases that read from disk, the offload directory's files are
evicted from the page cache before each, ``offload.measure.evict_files``, and not the whole
page cache, whose drop makes the next call fault the program's own code back in); after
each call its plan is compared with the call (``report.fidelity.compare``): the call's
time, each resource's busy time (compute per device, copies per link, disk reads) and, on
virtual devices, the peak memory. The measured figure is the median over
the timed calls; the error is (predicted - measured) / measured.

Cases, of the kinds the other benches and the corpus plan:

- ``host/*``: everything on the CPU, no budget: the fit bench's three workloads, 200
  small linears in a row (per-op cost), wide linears at batch 4 (memory-bound matmuls),
  and a tiny Llama from the corpus;
- ``disk/*``: a CPU budget of half the weights, the rest read from disk each call (the
  ram_offload bench's quick MLP at batch 16 and at batch 256, and the tiny Llama);
- ``virtual/*``: the corpus's quick entries on a virtual device at a third of their
  weights. A virtual device computes on the host at the host's speed while the plan
  assumed the virtual device's figures, so only its peak memory is compared there.

Summary (``summary`` in the JSON): mean and worst absolute error of the time, of the busy
times and of the peaks, over the host and disk cases (the goal: mean within 15%, worst
within 30%) and of the peaks over the virtual ones.

Each case is planned with a short host profile (the one a first compile measures) measured
just before it, not the cached one: the cache is keyed by the hardware's fingerprint, and
the same fingerprint on another day runs at other rates; and on a shared virtual machine
the rates drift within minutes (an MLP of wide layers at batch 4 took 30-55 ms a call in
eager over ten minutes of one session), so a profile measured a minute before a case
measures another machine. The error is then the simulator's, given the figures of the
moment. ``--profile start`` measures one at the start of each round; ``--profile cached``
plans with the cached one.

    python -m bench.fidelity [--repeats 5] [--rounds 3] [--quick] [--no-drop]
                             [--profile case|start|cached]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import tensortorrent as tt
from tensortorrent_dynamo.report.fidelity import compare, summary
from tests.models import TransformerBlock, mlp, param_bytes

from .common import write_results
from .offload.measure import evict_files

Inputs = tuple[Any, ...]


def _llama() -> tuple[torch.nn.Module, dict[str, Any]]:
    from tests.integration.corpus.models import BY_NAME

    entry = BY_NAME["llama"]
    return entry.build(), entry.inputs(0)


def _host_cases(quick: bool) -> dict[str, tuple[Callable[[], torch.nn.Module], Inputs]]:
    scale = 4 if quick else 1
    return {
        "mlp_512x8": (lambda: mlp(512, 8), (torch.randn(64 // scale, 512),)),
        "transformer_256": (
            lambda: torch.nn.Sequential(*[TransformerBlock(256, 4, seed=i) for i in range(4)]),
            (torch.randn(8 // scale, 128, 256),),
        ),
        "mlp_2048x8": (lambda: mlp(2048, 8), (torch.randn(64 // scale, 2048),)),
        "small_linears_200": (lambda: mlp(64, 200), (torch.randn(4, 64),)),
        "wide_linears_batch4": (lambda: mlp(4096, 4), (torch.randn(4, 4096),)),
    }


def run_case(
    model: torch.nn.Module,
    inputs: Inputs | dict[str, Any],
    options: dict[str, Any],
    repeats: int,
    cold: Path | None,
) -> dict[str, Any]:
    """Compile on a first call (untimed), then call ``repeats`` times; each figure's
    prediction and the median of what the calls measured. ``inputs``: positional, or
    keyword arguments (a dict); ``cold``: the directory of the weights the plan reads, whose
    files are evicted from the page cache before each call."""
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (inputs, {})
    torch._dynamo.reset()  # the cases share forward code: each is compiled afresh
    compiled = tt.compile(model.eval(), **options)
    per_call: dict[str, list[float]] = {}
    predicted: dict[str, tuple[float, str]] = {}
    dropped = None
    with torch.no_grad():
        start = time.perf_counter()
        compiled(*args, **kwargs)
        compile_s = time.perf_counter() - start
        for _ in range(repeats):
            if cold is not None:
                dropped = evict_files(cold)
            compiled(*args, **kwargs)
            for graph in compiled.graphs:
                if graph.calls < 2:  # a graph this call did not run
                    continue
                prefix = f"graph {graph.plan.graph_index} " if len(compiled.graphs) > 1 else ""
                for c in compare(graph):
                    per_call.setdefault(prefix + c.what, []).append(c.measured)
                    predicted[prefix + c.what] = (c.predicted, c.unit)
    figures = {}
    for what, measured in per_call.items():
        value, unit = predicted[what]
        median = statistics.median(measured)
        figures[what] = {
            "predicted": value,
            "measured": median,
            "unit": unit,
            "error": (value - median) / median if median else (0.0 if value == 0 else None),
            "measured_calls": measured,
        }
    return {
        "first_call_s": compile_s,
        "plans": [g.plan.native.chosen for g in compiled.graphs],
        "page_cache": (
            f"the files under {cold} evicted before each call" if dropped is None else dropped
        )
        if cold is not None
        else "kept",
        "figures": figures,
    }


def merge_rounds(rounds: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per case, its rounds and per figure the median of their errors (a round that failed
    is kept with its error, and counts for nothing)."""
    merged: dict[str, dict[str, Any]] = {}
    for name in rounds[0]:
        runs = [r[name] for r in rounds if name in r]
        figures: dict[str, dict[str, Any]] = {}
        for run in runs:
            for what, figure in run.get("figures", {}).items():
                into = figures.setdefault(
                    what,
                    {"unit": figure["unit"], "predicted": [], "measured": [], "errors": []},
                )
                into["predicted"].append(figure["predicted"])
                into["measured"].append(figure["measured"])
                if figure["error"] is not None:
                    into["errors"].append(figure["error"])
        for figure in figures.values():
            figure["error"] = statistics.median(figure["errors"]) if figure["errors"] else None
        merged[name] = {"rounds": runs, **({"figures": figures} if figures else {})}
        if not figures:
            merged[name]["error"] = runs[0].get("error", "no figures")
    return merged


def _kind(what: str) -> str:
    name = what.split(" ", 2)[-1] if what.startswith("graph ") else what
    if name == "time":
        return "time"
    if name.startswith("peak"):
        return "peak"
    resource = name.removeprefix("busy ")
    return (
        "busy disk"
        if resource.startswith("disk")
        else ("busy link" if "->" in resource else "busy compute")
    )


def summarize(cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Mean and worst absolute error per kind of figure, host and disk cases apart from the
    virtual ones (of which only peaks count)."""
    out: dict[str, Any] = {}
    for group, prefixes in (("host_and_disk", ("host/", "disk/")), ("virtual", ("virtual/",))):
        errors: dict[str, list[float]] = {}
        for name, case in cases.items():
            if not name.startswith(prefixes) or "figures" not in case:
                continue
            for what, figure in case["figures"].items():
                kind = _kind(what)
                if group == "virtual" and kind != "peak":
                    continue
                if figure["error"] is not None:
                    errors.setdefault(kind, []).append(figure["error"])
        out[group] = {kind: summary(e) for kind, e in sorted(errors.items())}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every case this many times, each with its profile; a figure's error is the "
        "median of its rounds'",
    )
    parser.add_argument(
        "--profile",
        choices=("case", "start", "cached"),
        default="case",
        help="measure a short host profile before each case (default), once at the start of "
        "each round, or plan with the cached one",
    )
    parser.add_argument("--quick", action="store_true", help="smaller inputs, fewer cases")
    parser.add_argument("--no-drop", action="store_true", help="keep the page cache")
    parser.add_argument("--results", type=Path, default=None, help="directory of the JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rounds: list[dict[str, dict[str, Any]]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tt-fidelity-") as scratch:
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", flush=True)
            rounds.append({})
            _run_cases(args, rounds[-1], Path(scratch))
    cases = merge_rounds(rounds)
    results = {
        "method": (
            "per case: tt.compile, one untimed call, then `repeats` calls (for disk cases "
            "the offload directory's files evicted from the page cache before each); after "
            "each call the plan's predictions "
            "(the call's time, each resource's busy time from the simulated timeline, each "
            "virtual device's peak) are compared with what the call measured (its time, the "
            "union of the runtime's spans per resource, the device ledger's peak); measured "
            "= median over the calls; error = (predicted - measured) / measured; each case "
            "runs `rounds` times (all cases, then all again), each planned with a profile "
            "of its own: a figure's error is the median of its rounds' errors"
        ),
        "quick": args.quick,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "page_cache": "kept (--no-drop)"
        if args.no_drop
        else "the offload directory's files evicted before disk cases' calls",
        "profile": {
            "cached": "the cached host profile",
            "start": "a short host profile measured at the start of each round",
            "case": "a short host profile measured just before each case (its figures in "
            "the case's `profile`)",
        }[args.profile],
        "summary": summarize(cases),
        "cases": cases,
        "runtime_s": time.perf_counter() - started,
    }
    for group, kinds in results["summary"].items():
        for kind, s in kinds.items():
            if s.get("count"):
                print(
                    f"{group:<14} {kind:<13} mean |error| {s['mean_abs_error']:.0%}  "
                    f"worst {s['worst_abs_error']:.0%}  ({s['count']} figures)"
                )
    path = write_results("fidelity", results, args.results)
    print(f"wrote {path}")


def _fresh_profile(scratch: Path, disk: bool) -> tuple[Path, dict[str, Any]]:
    """Measure the short host profile now (its disk in ``scratch`` when ``disk``), write it
    there; the file and the figures the plans use from it."""
    from tensortorrent_dynamo.profile.host import HostProfile
    from tensortorrent_dynamo.profile.measure import measure_host

    started = time.perf_counter()
    measured = measure_host("short", scratch / "disk" if disk else None)
    path = scratch / f"profile-{time.monotonic_ns()}.json"
    path.write_text(measured.to_json())
    profile = HostProfile.from_measurements(measured, "measured now")
    cpu = profile.device("cpu")
    figures = {
        "measured_s": time.perf_counter() - started,
        "cpu_flops_per_s": cpu.flops_per_s,
        "cpu_memory_bytes_per_s": cpu.memory_bandwidth_bytes_per_s,
        "cpu_op_latency_s": cpu.latency_s,
        "disk_read_bytes_per_s": profile.disk_read_bytes_per_s,
        "disk_stream_bytes_per_s": profile.disk_stream_bytes_per_s,
        "disk_stream_small_bytes_per_s": profile.disk_stream_small_bytes_per_s,
        "compute_slowdown_while_reading": profile.compute_slowdown_while_reading,
        "read_cpu_s": profile.read_cpu_s,
        "inline_read_s": profile.inline_read_s,
        "runtime_work_s": dict(
            zip(("segment_call", "resident", "stream"), profile.runtime_work_s, strict=True)
        ),
    }
    disk_text = (
        f", disk {figures['disk_read_bytes_per_s'] / 1e9:.2f} GB/s "
        f"({(figures['disk_stream_bytes_per_s'] or 0) / 1e9:.2f} streaming, "
        f"{(figures['disk_stream_small_bytes_per_s'] or 0) / 1e9:.2f} in 4 MiB reads, compute "
        f"{figures['compute_slowdown_while_reading']:.2f}x while reading, "
        f"{figures['read_cpu_s'] * 1e6:.0f} us a read handed on, "
        f"{figures['inline_read_s'] * 1e6:.0f} us one made inline)"
        if figures["disk_read_bytes_per_s"]
        else ""
    )
    print(
        f"  profile ({figures['measured_s']:.1f} s): cpu {cpu.flops_per_s / 1e9:.0f} GFLOP/s, "
        f"memory {(cpu.memory_bandwidth_bytes_per_s or 0) / 1e9:.1f} GB/s, "
        f"op {cpu.latency_s * 1e6:.2f} us, runtime "
        + "/".join(f"{v * 1e6:.1f}" for v in profile.runtime_work_s)
        + f" us (segment call/resident/stream){disk_text}",
        flush=True,
    )
    return path, figures


def _run_cases(args: argparse.Namespace, cases: dict[str, dict[str, Any]], scratch: Path) -> None:
    """Run every case into ``cases``, each planned with the profile ``args.profile`` names
    (``scratch``: where fresh ones are measured)."""
    started: list[tuple[Path, dict[str, Any]]] = []

    def profile_options(disk: bool) -> tuple[dict[str, str], dict[str, Any] | None]:
        if args.profile == "cached":
            return {}, None
        if args.profile == "case" or not started:
            fresh = _fresh_profile(scratch, disk=disk or args.profile == "start")
            started[:] = [fresh]
        path, figures = started[0]
        return {"profile": str(path)}, figures

    def record(
        name: str, fn: Callable[[dict[str, str]], dict[str, Any]], disk: bool = False
    ) -> None:
        print(name, flush=True)
        try:
            profile, figures = profile_options(disk)
            cases[name] = fn(profile)
            if figures is not None:
                cases[name]["profile"] = figures
        except Exception as exc:  # a case that fails is recorded, the others still run
            cases[name] = {"error": f"{type(exc).__name__}: {exc}"}
        case = cases[name]
        if "figures" in case:
            shown = ", ".join(
                f"{what} {f['error']:+.0%}"
                for what, f in case["figures"].items()
                if f["error"] is not None and not what.endswith("->cpu")
            )
            print(f"  {shown}", flush=True)
        else:
            print(f"  {case['error']}", flush=True)

    host = _host_cases(args.quick)
    if args.quick:
        host = {k: host[k] for k in ("mlp_512x8", "small_linears_200")}
    for name, (make, inputs) in host.items():
        record(
            f"host/{name}",
            lambda profile, make=make, inputs=inputs: run_case(  # type: ignore[misc]
                make(), inputs, {"compiler": "eager", **profile}, args.repeats, cold=None
            ),
        )
    if not args.quick:
        llama, llama_inputs = _llama()
        record(
            "host/llama_tiny",
            lambda profile: run_case(
                llama, llama_inputs, {"compiler": "eager", **profile}, args.repeats, cold=None
            ),
        )
    # after every host case: a disk tier bounds what the process's heap keeps from a call
    # to the next (``io.pool.bound_heap_retention``), for every graph from then on
    with tempfile.TemporaryDirectory(prefix="tt-fidelity-") as offload:
        disk: dict[str, tuple[torch.nn.Module, Inputs | dict[str, Any]]] = {
            "ram_offload_quick": (mlp(2048, 8), (torch.randn(16, 2048),)),
            # batch 256: the matmuls bound by FLOPs while the reads run, as at the
            # ram_offload bench's large batch (the reads and the compute slow each other)
            "ram_offload_quick_b256": (mlp(2048, 8), (torch.randn(256, 2048),)),
        }
        if not args.quick:
            disk["llama_tiny"] = _llama()
        cold = None if args.no_drop else Path(offload)
        for name, (model, disk_inputs) in disk.items():
            options = {
                "compiler": "eager",
                "budgets": {"cpu": param_bytes(model) // 2},
                "offload_dir": offload,
            }
            record(
                f"disk/{name}",
                lambda profile, model=model, inputs=disk_inputs, options=options: run_case(  # type: ignore[misc]
                    model, inputs, {**options, **profile}, args.repeats, cold=cold
                ),
                disk=True,
            )
    from tests.integration.corpus.harness import options as corpus_options
    from tests.integration.corpus.models import ENTRIES

    for entry in [e for e in ENTRIES if e.quick][: 1 if args.quick else None]:
        built = entry.build()
        record(
            f"virtual/{entry.name}",
            lambda profile, built=built, entry=entry: run_case(  # type: ignore[misc]
                built,
                entry.inputs(0),
                {**corpus_options("third", built), **profile},
                args.repeats,
                cold=None,
            ),
        )


if __name__ == "__main__":
    main()
