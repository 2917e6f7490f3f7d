"""The ``tensortorrent`` command: ``doctor``, ``validate-hardware`` and ``demo``."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path


def _existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest parent that exists (where free space and access are known)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


def _devices_section(hints: list[str]) -> None:
    """Print the compute devices and their memory (the host's RAM first)."""
    import psutil
    import torch

    from .profile import detect_cuda_devices, detect_xpu_devices
    from .profile.detect import cpu_model, gpu_runtime
    from .units import format_bytes

    mem = psutil.virtual_memory()
    print(
        f"cpu           {cpu_model()}, {psutil.cpu_count(logical=True)} logical cores "
        f"({psutil.cpu_count(logical=False) or '?'} physical), "
        f"torch uses {torch.get_num_threads()} threads"
    )
    print(f"ram           {format_bytes(mem.total)} total, {format_bytes(mem.available)} available")
    cuda = detect_cuda_devices()
    xpu = detect_xpu_devices()
    for name in cuda:
        index = int(name.split(":")[1])
        props = torch.cuda.get_device_properties(index)
        try:
            free, _ = torch.cuda.mem_get_info(index)
            free_text = f", {format_bytes(free)} free"
        except RuntimeError as exc:
            free_text = f", free memory unknown ({exc})"
        print(
            f"{name:<13} {props.name}, {format_bytes(props.total_memory)} total{free_text} "
            f"({gpu_runtime()})"
        )
    for name in xpu:
        xprops = torch.xpu.get_device_properties(int(name.split(":")[1]))
        print(
            f"{name:<13} {xprops.name}, {format_bytes(xprops.total_memory)} total "
            "(seen; the planner does not place on XPU devices yet)"
        )
    if not cuda and not xpu:
        print("accelerators  none seen (virtual:N devices can be declared through options)")
        if torch.version.cuda is None and torch.version.hip is None:
            hints.append(
                "this torch has no GPU runtime: install a CUDA or ROCm build of torch to use a GPU"
            )
    print(f"planner sees  {', '.join(['cpu', *cuda])} (add virtual:N through options)")


def _profile_section(hints: list[str]) -> None:
    """Print the offload directory's free space and the cached profile, if any."""
    import psutil

    from .io.store import in_use
    from .profile import cache
    from .profile.detect import current_fingerprint
    from .profile.disk import filesystem
    from .profile.report import format_value
    from .settings import PROFILE_ENV, default_profile
    from .units import format_bytes

    offload = cache.default_offload_dir()
    on = _existing_ancestor(offload)
    free = psutil.disk_usage(str(on)).free
    print(f"offload dir   {offload}: {format_bytes(free)} free ({filesystem(on)})")
    stores = sorted(offload.glob("*/manifest.json")) if offload.is_dir() else []
    if stores:
        held = sum(f.stat().st_size for m in stores for f in m.parent.iterdir() if f.is_file())
        used = sum(in_use(m.parent) for m in stores)
        print(
            f"              {len(stores)} offload store(s) holding {format_bytes(held)} of "
            f"weights (one per set of weights), {used} in use by a running process (its "
            "weights' only copy); delete one not in use to reclaim it: it is written again "
            "when a model needs it"
        )
    if not os.access(on, os.W_OK):
        hints.append(
            f"{on} is not writable: pass --offload-dir to validate-hardware, or set "
            f"{cache.CACHE_DIR_ENV} to a writable directory"
        )
    source = f" (from ${PROFILE_ENV})" if os.environ.get(PROFILE_ENV) else ""
    print(f"profile       option default {default_profile()!r}{source}")
    found = cache.lookup(current_fingerprint())
    m = found.measurements
    if m is None:
        print(f"cached        none: {found.problem}")
        hints.append(
            f"{found.problem}: run `tensortorrent validate-hardware` (otherwise the first "
            "compile measures a short profile, a few seconds)"
        )
        return
    print(f"cached        {found.path}, {m.mode}, {cache.age_text(m.created_at)} old")
    cpu = m.device("cpu")
    if cpu is not None:
        print(
            f"              cpu {format_value(cpu.matmul['float32'])} float32, "
            f"memory {format_value(cpu.memory_bandwidth)}"
        )
    if m.disk.read.value is not None:
        print(
            f"              disk read {format_value(m.disk.read)} "
            f"({format_value(m.disk.stream)} while streaming), "
            f"write {format_value(m.disk.write)} at {m.disk.path}"
        )
    if m.mode == "short":
        hints.append(
            "the cached profile is the short one (float32 and memory bandwidth only): "
            "run `tensortorrent validate-hardware` for every dtype, link and the disk"
        )


def doctor() -> int:
    """Print what this machine offers TensorTorrent and what is missing."""
    import torch

    from ._native import native_planner
    from .errors import NativePlannerUnavailable

    hints: list[str] = []
    print(f"python        {platform.python_version()}")
    print(
        f"torch         {torch.__version__} (CUDA runtime {torch.version.cuda or 'none'}, "
        f"HIP {torch.version.hip or 'none'})"
    )
    _devices_section(hints)
    _profile_section(hints)
    problems = 0
    try:
        planner = native_planner()
        print(f"planner       native, version {planner.version()}")
    except NativePlannerUnavailable as exc:
        problems += 1
        print(f"planner       MISSING: {exc}")
    backends = torch._dynamo.list_backends()
    if "tensortorrent" in backends:
        print("backend       'tensortorrent' registered with torch.compile")
    else:
        problems += 1
        print("backend       NOT registered: reinstall the package (`pip install -e .`)")
    for hint in hints:
        print(f"to do         {hint}")
    return 1 if problems else 0


def _offload_dir(requested: Path | None) -> Path | None:
    """The directory to measure the disk at, or ``None`` after printing why there is none."""
    from .profile import cache
    from .profile.disk import writable_problem

    if requested is not None:
        problem = writable_problem(requested)
        if problem:
            print(
                f"error: {problem}; pass --offload-dir with a directory you can write",
                file=sys.stderr,
            )
            return None
        return requested
    offload, problem = cache.measured_offload_dir()
    if problem:
        print(f"note: {problem}; measuring the disk at {offload} instead", file=sys.stderr)
    return offload


def validate_hardware(output: Path | None, quick: bool, offload_dir: Path | None) -> int:
    """Measure every device, link and the disk; print the table, cache it, write ``output``."""
    from .profile import cache, measure_host
    from .profile.progress import ProgressBar
    from .profile.report import format_report

    offload = _offload_dir(offload_dir)
    if offload is None:
        return 1
    if output is not None and not os.access(_existing_ancestor(output.parent), os.W_OK):
        print(f"error: cannot write the report to {output}", file=sys.stderr)
        return 1
    measured = measure_host("quick" if quick else "full", offload, ProgressBar())
    print(format_report(measured))
    try:
        print(f"cached as {cache.save(measured)} (plans use it with profile='auto')")
    except OSError as exc:
        print(
            f"warning: could not cache the profile in {cache.cache_dir()} ({exc.strerror}); "
            f"set {cache.CACHE_DIR_ENV} to a writable directory",
            file=sys.stderr,
        )
    if output is not None:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(measured.to_json())
        except OSError as exc:
            print(f"error: cannot write the report to {output} ({exc.strerror})", file=sys.stderr)
            return 1
        print(f"wrote {output}")
    return 0


def cost_graph(path: Path, budgets: Sequence[str], objective: str, profile: str) -> int:
    """Summarise a saved cost graph and plan it offline with the given budgets."""
    from .cost_graph import CostGraph
    from .errors import TensorTorrentError
    from .plan.peaks import say_peak
    from .plan.planner import plan_graph
    from .profile import host_profile
    from .settings import parse_options
    from .units import format_bytes, format_rate, format_seconds

    try:
        graph = CostGraph.load(path)
        pairs = {b.partition("=")[0]: b.partition("=")[2] for b in budgets}
        settings = parse_options(budgets=pairs, objective=objective, profile=profile)
        print(
            f"{path}: {len(graph.nodes)} nodes, {len(graph.params)} parameters "
            f"({format_bytes(graph.param_bytes)}), {format_rate(graph.total_flops, 'FLOP')}, "
            f"activation peak {format_bytes(graph.peak_live_bytes)}"
        )
        if graph.assumed_sizes:
            print(f"assumed sizes: {dict(graph.assumed_sizes)}")
        for node in graph.fallbacks:
            print(f"host fallback: {node.name} ({node.target}): {node.fallback}")
        plan = plan_graph(0, graph, host_profile(settings), settings, {})
    except TensorTorrentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    predicted = format_seconds(plan.predicted_time_s)
    print(f"plan {plan.plan_hash}: {plan.native.chosen}, predicted {predicted}")
    for device, peak in zip(plan.devices, plan.peaks, strict=True):
        print(
            f"  {device.name:<10} budget {format_bytes(device.budget_bytes):>12}  "
            f"predicted peak {format_bytes(peak.bytes):>12}"
        )
        if peak.bytes and device.name in settings.budgets:
            print(f"    {say_peak(peak)}")
    streamed = sum(r.streams for r in plan.residency)
    print(f"  {streamed} of {len(graph.params)} parameters streamed")
    return 0


def explain_saved(path: Path) -> int:
    """Print the report a saved plan was written with."""
    from .errors import PlanFormatError
    from .plan.files import load

    try:
        saved = load(path)
    except PlanFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(saved.explain)
    print(f"\nsaved with torch {saved.torch_version} on {saved.hardware['cpu_model']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tensortorrent", description="Plan heterogeneous execution for PyTorch models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="what was detected, what is missing").set_defaults(
        run=lambda args: doctor()
    )
    validate = sub.add_parser(
        "validate-hardware",
        help="measure FLOP/s, memory, link and disk bandwidth; print, cache and save them",
    )
    validate.add_argument("--output", type=Path, help="write the measurements as JSON here")
    validate.add_argument("--quick", action="store_true", help="smaller, faster measurements")
    validate.add_argument(
        "--offload-dir",
        type=Path,
        help="where to measure the disk (default: the cache's offload dir)",
    )
    validate.set_defaults(
        run=lambda args: validate_hardware(args.output, args.quick, args.offload_dir)
    )
    sub.add_parser(
        "demo", help="plan, explain and run a model larger than its budget"
    ).set_defaults(run=lambda args: _demo())
    offline = sub.add_parser(
        "cost-graph", help="summarise a saved cost graph (CostGraph.save) and plan it offline"
    )
    offline.add_argument("path", type=Path)
    offline.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="DEVICE=SIZE",
        help="a budget, e.g. virtual:0=64MiB (repeatable)",
    )
    offline.add_argument("--objective", default="latency")
    offline.add_argument("--profile", default="nominal", help="'nominal', 'auto' or a path")
    offline.set_defaults(
        run=lambda args: cost_graph(args.path, args.budget, args.objective, args.profile)
    )
    explain = sub.add_parser("explain", help="print the plan table of a saved plan")
    explain.add_argument("path", type=Path)
    explain.set_defaults(run=lambda args: explain_saved(args.path))
    args = parser.parse_args(argv)
    return int(args.run(args))


def _demo() -> int:
    from .demo import main as demo_main

    return demo_main()


if __name__ == "__main__":
    sys.exit(main())
