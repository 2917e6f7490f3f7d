"""A competitor's process: ``python -m bench.offload.child {run,setup} SPEC.json OUT.json``.

``setup`` builds the seeded model and saves the checkpoint, the inputs and eager's outputs
(for a ``GenerateWorkload``, eager's greedy tokens and first logits); ``run`` runs one
competitor on one regime (setup, compile, warm-up, cold and warm timed calls) and writes what
it measured.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .competitors import COMPETITORS, Call, Competitor, Context, Eager
from .generation import Generate
from .measure import (
    PeakRss,
    evict_files,
    io_read_bytes,
    param_bytes,
    proc_status,
    read_all,
)
from .workload import GenerateWorkload, Workload, load_workload, worst_quality

CHECKPOINT = "model.safetensors"
REFERENCE = "reference.pt"
SHARDS = "shards"
"""The directory of the checkpoint's sharded copy (``shard_bytes``), for Accelerate."""
SHARD_INDEX = "model.safetensors.index.json"


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed_calls(
    call: Call,
    competitor: Competitor,
    expected: Any,
    workload: Workload,
    count: int,
    cold: Path | None,
    peaks: PeakRss,
) -> dict[str, Any]:
    """``count`` timed calls; with ``cold``, its files are evicted from the page cache before
    each (``evict_files``)."""
    times: list[float] = []
    per_call: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    notes: set[str] = set()
    reset = peaks.reset()
    for _ in range(count):
        if cold is not None:
            problem = evict_files(cold)
            if problem:
                notes.add(problem)
        io_before = io_read_bytes()
        start = time.perf_counter()
        out = call()
        synchronize(competitor.ctx.device)
        times.append(time.perf_counter() - start)
        io_after = io_read_bytes()
        extra = competitor.after_call()
        if io_before is not None and io_after is not None:
            extra["io_read_bytes"] = io_after - io_before
        per_call.append(extra)
        checks.append(workload.quality(out, expected))
        del out
    status = proc_status()
    return {
        "times_ms": [1e3 * t for t in times],
        "median_ms": 1e3 * statistics.median(times) if times else None,
        "per_call": per_call,
        "quality": worst_quality(checks),
        "peak_rss_calls_bytes": status.get("VmHWM") if reset else None,
        "rss_after_calls": status,
        "page_cache": sorted(notes)[0] if notes else ("evicted" if cold else "kept"),
    }


def paired_reads(
    call: Call,
    competitor: Competitor,
    count: int,
    cold: Path | None,
    check: Callable[[Any], dict[str, Any]],
) -> dict[str, Any] | None:
    """``count`` pairs, each the competitor's reader reading one call's disk bytes alone
    (``Competitor.read_alone``) and then one call, with ``cold`` its files evicted from the
    page cache before each: the call's time over the disk's, both measured seconds apart,
    whatever the disk's drift over minutes. ``None`` for a competitor with no reader of its
    own to ask."""
    pairs: list[dict[str, float]] = []
    checks: list[dict[str, Any]] = []
    for _ in range(count):
        if cold is not None:
            evict_files(cold)
        alone = competitor.read_alone()
        if alone is None:
            return None
        if cold is not None:
            evict_files(cold)
        start = time.perf_counter()
        out = call()
        pairs.append({"read_alone_s": alone, "call_s": time.perf_counter() - start})
        checks.append(check(out))
        del out
    return {"pairs": pairs, "quality": worst_quality(checks)}


def overlap_triples(
    call: Call,
    competitor: Competitor,
    count: int,
    cold: Path | None,
    check: Callable[[Any], dict[str, Any]],
) -> dict[str, Any] | None:
    """``count`` triples, with ``cold`` its files evicted from the page cache before each
    part (the reads bypass it where ``O_DIRECT`` works, in any case): one call alone, the bytes
    a plan under the budget must stream each call read alone (``Eager.streamed_reads``), and
    both at once, every read submitted as the call starts, timed until the call and the
    reads are both done. The third is what a plan that overlapped its reads with its compute
    perfectly would take on this machine: its reads and their checks take their CPU time
    from the compute. ``None`` for a competitor with no such reads (all but CPU eager)."""
    streamed = competitor.streamed_reads() if isinstance(competitor, Eager) else None
    if streamed is None:
        return None
    reader, locations = streamed
    triples: list[dict[str, float]] = []
    checks: list[dict[str, Any]] = []
    for _ in range(count):
        if cold is not None:
            evict_files(cold)
        start = time.perf_counter()
        checks.append(check(call()))
        call_s = time.perf_counter() - start
        if cold is not None:
            evict_files(cold)
        reads_s = read_all(reader, locations)
        if cold is not None:
            evict_files(cold)
        start = time.perf_counter()
        futures = [reader.submit(loc) for loc in locations]
        checks.append(check(call()))
        for future in futures:
            reader.pool.give(future.result().buffer)
        together_s = time.perf_counter() - start
        triples.append({"call_s": call_s, "reads_s": reads_s, "together_s": together_s})
    return {
        "triples": triples,
        "bytes": sum(loc.nbytes for loc in locations),
        "quality": worst_quality(checks),
    }


def run_competitor(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a competitor's process measures on one regime (see ``bench.offload``)."""
    torch.set_grad_enabled(False)
    workload = load_workload(spec["workload"], spec["params"])
    ctx = Context(spec, workload)
    competitor = COMPETITORS[spec["competitor"]](ctx)
    competitor.imports()
    reference = torch.load(spec["reference"], weights_only=True)[spec["regime"]]
    model = workload.build_meta()
    peaks = PeakRss()
    baseline = proc_status()
    start = time.perf_counter()
    competitor.setup(model)
    setup_s = time.perf_counter() - start
    after_setup = proc_status()
    inputs = tuple(t.to(competitor.device) for t in reference["inputs"])
    expected = reference["output"]
    start = time.perf_counter()
    call = competitor.prepare(model, inputs)
    compile_s = time.perf_counter() - start
    warm_checks = [workload.quality(call(), expected) for _ in range(spec["warmup"])]
    synchronize(ctx.device)
    # the run's weight files (the checkpoint, its shards, every offload directory), evicted
    # from the page cache before each cold part; None: kept (--no-drop)
    evict = Path(spec["evict_dir"]) if spec["evict_dir"] else None
    cold = timed_calls(call, competitor, expected, workload, spec["repeats"], evict, peaks)
    warm = timed_calls(call, competitor, expected, workload, spec["repeats"], None, peaks)
    # the process's peak before the pairs' reads alone, which hold every read at once
    lifetime_peak = peaks.lifetime()
    paired = overlap = None
    if ctx.new_tokens is None:
        check = functools.partial(workload.quality, expected=expected)
        paired = paired_reads(call, competitor, spec["repeats"], evict, check)
        overlap = overlap_triples(call, competitor, spec["repeats"], evict, check)
    for phase in (cold, warm):
        peak, base = phase["peak_rss_calls_bytes"], baseline.get("VmRSS")
        phase["rss_growth_bytes"] = peak - base if peak and base else None
    quality = worst_quality(
        [
            *warm_checks,
            cold["quality"],
            warm["quality"],
            *(extra["quality"] for extra in (paired, overlap) if extra),
        ]
    )
    return {
        "ok": quality["ok"],
        "holds_in_ram": competitor.holds,
        "rss_baseline": baseline,
        "setup_s": setup_s,
        "rss_after_setup": after_setup,
        "compile_s": compile_s,
        "warmup_calls": spec["warmup"],
        "cold": cold,
        "warm": warm,
        **({"paired": paired} if paired is not None else {}),
        **({"overlap": overlap} if overlap is not None else {}),
        "quality": quality,
        "peak_rss_bytes": lifetime_peak,
        "info": competitor.info,
        **competitor.regime_info(),
    }


def child_main(spec_path: Path, out_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    try:
        result = run_competitor(spec)
    except Exception as exc:
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0]
        result = {"ok": False, "error": f"{type(exc).__name__}: {first}"}
    out_path.write_text(json.dumps(result, indent=1))
    return 0


def save_shards(state: Mapping[str, torch.Tensor], directory: Path, shard_bytes: int) -> Path:
    """The same tensors as shards of at most ``shard_bytes`` (a tensor larger than that has a
    shard of its own) with a Hugging Face index (``model.safetensors.index.json``), which
    ``load_checkpoint_and_dispatch`` loads one shard at a time; the index's path."""
    from safetensors.torch import save_file

    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append({})
            size = 0
        groups[-1][key] = tensor
        size += nbytes
    directory.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, start=1):
        name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file(dict(group), str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = directory / SHARD_INDEX
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return index


def setup_main(spec_path: Path, out_path: Path) -> int:
    """Build the seeded model, save the checkpoint (and with ``shard_bytes`` its sharded
    copy), the inputs and eager's outputs."""
    from safetensors.torch import save_file

    spec = json.loads(spec_path.read_text())
    torch.set_grad_enabled(False)
    work = Path(spec["work_dir"])
    start = time.perf_counter()
    workload = load_workload(spec["workload"], spec["params"])
    model = workload.build().eval()
    built_s = time.perf_counter() - start
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(work / CHECKPOINT), metadata={"format": "pt"})
    shards = None
    if spec.get("shard_bytes"):
        index = json.loads(save_shards(state, work / SHARDS, spec["shard_bytes"]).read_text())
        shards = len(set(index["weight_map"].values()))
    del state
    saved_s = time.perf_counter() - start - built_s
    reference: dict[str, dict[str, Any]] = {}
    for regime in workload.regimes:
        inputs = workload.inputs(regime)
        if isinstance(workload, GenerateWorkload):
            output = Generate(model, inputs[0], workload.new_tokens)()
        else:
            output = model(*inputs)
        reference[regime] = {"inputs": list(inputs), "output": output}
    torch.save(reference, work / REFERENCE)
    out_path.write_text(
        json.dumps(
            {
                "param_bytes": param_bytes(model),
                "checkpoint_bytes": (work / CHECKPOINT).stat().st_size,
                "shards": shards,
                "build_s": built_s,
                "save_s": saved_s,
                "seconds": time.perf_counter() - start,
                "input_shapes": {
                    r: [list(t.shape) for t in v["inputs"]] for r, v in reference.items()
                },
                # what a memory limit adds per regime to the budget and the allowance
                "kv_cache_bytes": {
                    r: workload.kv_cache_bytes(r)
                    for r in reference
                    if isinstance(workload, GenerateWorkload)
                },
            }
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 3 or argv[0] not in ("run", "setup"):
        print("usage: python -m bench.offload.child {run,setup} SPEC.json OUT.json")
        return 2
    command, spec, out = argv
    if command == "setup":
        return setup_main(Path(spec), Path(out))
    return child_main(Path(spec), Path(out))


if __name__ == "__main__":
    sys.exit(main())
