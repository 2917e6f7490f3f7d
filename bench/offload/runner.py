"""A run of a bench, from the parent process: the options every offload bench has, the
competitors' processes in interleaved rounds, the JSON and the printed summary."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..common import RESULTS, write_results
from .cgroup import CgroupUnavailable, MemoryCgroup, limited_run
from .child import CHECKPOINT, REFERENCE, SHARD_INDEX, SHARDS
from .competitors import COMPETITORS
from .disk import disk_figures, measure_disk, measure_reader
from .summary import summarize_regime

DEFAULT_REPEATS = 3
"""Cold and warm timed calls per process."""
DEFAULT_ROUNDS = 3
"""Rounds of every competitor's processes at full size (``--quick``: 1)."""
MAIN_TT = "tensortorrent"
"""The TensorTorrent competitor whose figures are the bench's headline ratios."""
CUDA_COMPETITORS = ("eager_cpu", "eager", "accelerate", "tensortorrent")
"""The competitors of the CUDA mode (the budget on the GPU)."""
RATIO_KEYS = (
    "over_accelerate_cold",
    "over_accelerate_warm",
    "over_lower_bound_cold",
    "call_over_read_alone",
    "over_compute_with_reads_cold",
)
"""The headline ratios of the main TensorTorrent competitor (the bench's ``figure``)."""

Summarize = Callable[[Mapping[str, Sequence[Mapping[str, Any]]], int, int, float | None, bool], Any]
"""A regime's processes (by competitor, one a round), parameter bytes, budget, disk read
bandwidth, CUDA mode -> the regime's figures: ``summarize_regime`` or
``summarize_generate_regime``; a ``figure`` key in them is the bench's headline."""


def add_arguments(parser: argparse.ArgumentParser, default_repeats: int = DEFAULT_REPEATS) -> None:
    """Options every offload bench has."""
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"cold and warm timed calls per process (default {default_repeats})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of every competitor's processes, interleaved: round 2 runs them in the "
        f"reverse order, round 3 as round 1, ... (default {DEFAULT_ROUNDS}; 1 with --quick)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per process")
    parser.add_argument("--quick", action="store_true", help="smaller model, one round")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="work directory: checkpoint, reference outputs, offload dirs, logs "
        "(default bench/results/tmp/<bench>)",
    )
    parser.add_argument(
        "--results", type=Path, default=None, help="directory of the JSON (default bench/results)"
    )
    parser.add_argument(
        "--competitors", nargs="+", default=None, choices=sorted(COMPETITORS), help="subset"
    )
    parser.add_argument(
        "--no-drop", action="store_true", help="do not drop the page cache (cold = warm then)"
    )
    parser.add_argument(
        "--budget", default=None, help="the memory budget, e.g. 512MiB (default: a fraction)"
    )
    parser.add_argument(
        "--budget-fraction",
        type=float,
        default=0.5,
        help="the budget as a fraction of the parameter bytes (default 0.5)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    parser.add_argument(
        "--disk-mib", type=int, default=None, help="size of the DiskBench probe file"
    )
    parser.add_argument(
        "--accelerate-shard-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="Accelerate loads a sharded copy of the checkpoint (shards of at most MIB MiB, "
        "with an index), one shard at a time, instead of the single file, which "
        "load_checkpoint_and_dispatch reads into RAM whole (default: the single file)",
    )
    parser.add_argument(
        "--mem-limit",
        default=None,
        metavar="ALLOWANCE",
        help="run each competitor's process in a memory cgroup of its own, limited to the "
        "budget plus ALLOWANCE (e.g. 1GiB: the process itself, torch imported, the model "
        "built on meta); its page cache counts against the limit (CPU mode only; 'none': "
        "no limit)",
    )


def _subprocess(
    command: str,
    spec: Mapping[str, Any],
    work: Path,
    label: str,
    timeout: float,
    limit_bytes: int | None = None,
) -> tuple[dict[str, Any] | None, str | None, float]:
    """Run ``python -m bench.offload.child COMMAND`` in a fresh process (in a memory cgroup
    limited to ``limit_bytes``, when given); its JSON or error."""
    spec_path = work / f"{label}.spec.json"
    out_path = work / f"{label}.result.json"
    log_path = work / "logs" / f"{label}.log"
    log_path.parent.mkdir(exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    out_path.unlink(missing_ok=True)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    error = None
    cgroup: dict[str, Any] | None = None
    with open(log_path, "w") as log:
        argv: list[str | os.PathLike[str]] = [
            sys.executable,
            "-m",
            "bench.offload.child",
            command,
            spec_path,
            out_path,
        ]
        io: dict[str, Any] = {"cwd": root, "env": env, "stdout": log, "stderr": subprocess.STDOUT}
        try:
            if limit_bytes is None:
                proc = subprocess.run(argv, timeout=timeout, check=False, **io)
                if proc.returncode:
                    error = f"exit status {proc.returncode}"
            else:
                limited = limited_run(argv, limit_bytes, timeout=timeout, **io)
                cgroup = {"limit_bytes": limit_bytes, "peak_bytes": limited.peak_bytes}
                if limited.returncode:
                    error = limited.describe()
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    result = json.loads(out_path.read_text()) if out_path.is_file() else None
    if result is not None and cgroup is not None:
        # the cgroup's peak: the process and the page cache its reads filled
        result["cgroup"] = cgroup
    if error or result is None:
        tail = log_path.read_text().strip().splitlines()[-5:]
        error = f"{error or 'no result written'}; log {log_path}: " + " | ".join(tail)
    return result, error, seconds


def _mem_limit(
    allowance: str | None, budget: int, cuda: bool, unlimited: Sequence[str] = ()
) -> tuple[dict[str, Any] | None, int | None]:
    """What ``--mem-limit`` gives: its record for the JSON and the cgroup limit (``None`` for
    none: not asked, the GPU mode, or no cgroup can be made here, the record saying why).
    ``unlimited``: competitors that run without the limit whatever it is (a reference)."""
    if allowance is None or allowance.lower() == "none":
        return None, None
    from tensortorrent_dynamo.units import parse_bytes

    allowance_bytes = parse_bytes(allowance, "--mem-limit")
    if cuda:
        return {"skipped": "the budget is on the GPU: host RAM is not limited"}, None
    limit = budget + allowance_bytes
    try:
        MemoryCgroup.create(limit).remove()
    except CgroupUnavailable as exc:
        return {"skipped": str(exc)}, None
    record: dict[str, Any] = {"allowance_bytes": allowance_bytes, "limit_bytes": limit}
    if unlimited:
        record["unlimited"] = list(unlimited)
    return record, limit


def schedule(
    regimes: Sequence[str], competitors: Sequence[str], rounds: int
) -> list[list[tuple[str, str]]]:
    """The (regime, competitor) processes of each round: odd rounds in the given order, even
    rounds in reverse, so that two competitors run as close in time in every round and each
    runs first as often as the other (for an even number of rounds)."""
    order = [(regime, competitor) for regime in regimes for competitor in competitors]
    return [order if r % 2 == 0 else order[::-1] for r in range(rounds)]


def run_bench(
    name: str,
    workload_ref: str,
    params: Mapping[str, Any],
    args: argparse.Namespace,
    repeats: int,
    competitors: Sequence[str],
    device: str = "cpu",
    disk_mib: int = 256,
    summarize: Summarize = summarize_regime,
    unlimited: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
    report: Callable[[str, Mapping[str, Any]], None] | None = None,
) -> Path:
    """Setup, disk bandwidth, every competitor in its own process, in rounds; write the JSON.

    ``competitors`` are the CPU mode's defaults; ``--competitors`` overrides them.
    ``summarize`` makes each regime's figures; the competitors in ``unlimited`` run without
    ``--mem-limit``'s cgroup; ``extra`` is added to the JSON; ``report`` prints the summary
    (default ``print_summary``).
    """
    started = time.perf_counter()
    rounds = (1 if args.quick else DEFAULT_ROUNDS) if args.rounds is None else args.rounds
    if rounds < 1 or repeats < 1:
        raise ValueError(f"--rounds and --repeats must be at least 1, got {rounds}, {repeats}")
    work = (args.out_dir or RESULTS / "tmp" / name).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "offload").mkdir(parents=True)
    cuda = device.startswith("cuda")
    base = {"workload": workload_ref, "params": dict(params), "work_dir": str(work)}
    shard_mib = getattr(args, "accelerate_shard_mib", None)
    if shard_mib:
        base["shard_bytes"] = shard_mib << 20
    setup, error, _ = _subprocess("setup", base, work, "setup", args.timeout)
    if setup is None or error:
        raise RuntimeError(f"{name}: setup failed: {error}")
    param_nbytes = int(setup["param_bytes"])
    if args.budget is not None:
        from tensortorrent_dynamo.units import parse_bytes

        budget = parse_bytes(args.budget, "--budget")
    else:
        budget = int(param_nbytes * args.budget_fraction)
    print(
        f"{name}: setup {setup['seconds']:.1f} s, {param_nbytes} parameter bytes, budget {budget} B"
        f", {rounds} round(s) of {repeats} cold + {repeats} warm calls per process"
    )
    mem_limit, limit_bytes = _mem_limit(args.mem_limit, budget, cuda, unlimited)
    if limit_bytes is not None and mem_limit is not None and setup.get("kv_cache_bytes"):
        mem_limit["plus_kv_cache_bytes"] = dict(setup["kv_cache_bytes"])
        mem_limit["per_regime"] = (
            "a generation regime's limit is the budget plus the allowance plus its KV cache's "
            "bytes at the longest (prompt plus new tokens), the same for every competitor: "
            "the machine has room for the process, the weights' budget and the cache"
        )
        print(f"{name}: plus each regime's KV cache: {mem_limit['plus_kv_cache_bytes']} B")
    if limit_bytes is not None:
        print(
            f"{name}: each competitor runs in a memory cgroup limited to {limit_bytes} B"
            + (f" (but {', '.join(unlimited)})" if unlimited else "")
        )
    elif mem_limit is not None:
        print(f"{name}: no memory limit: {mem_limit['skipped']}")
    disk_before = measure_disk(work / "offload", args.disk_mib or disk_mib)
    drop_note = "page cache kept: --no-drop was given" if args.no_drop else None
    names = list(args.competitors or (CUDA_COMPETITORS if cuda else competitors))
    regimes_run = list(setup["input_shapes"])
    plan = schedule(regimes_run, names, rounds)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        regime: {competitor: [] for competitor in names} for regime in regimes_run
    }
    reader: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    process_s: dict[str, float] = {}
    for number, order in enumerate(plan, start=1):
        measured = measure_reader(work / CHECKPOINT, drop=drop_note is None)
        reader.append({"round": number, **measured})
        rate = measured.get("read_bytes_per_s")
        print(
            f"{name} round {number}/{rounds}: DiskReader "
            + (f"{rate / 1e9:.2f} GB/s" if rate else f"failed: {measured.get('error')}")
        )
        for position, (regime, competitor) in enumerate(order):
            label = f"{competitor}-{regime}-r{number}"
            offload = work / "offload" / label
            offload.mkdir(parents=True)
            # a generation regime's limit has room for its KV cache too, the same for all
            cache = int(setup.get("kv_cache_bytes", {}).get(regime, 0))
            spec = {
                **base,
                "competitor": competitor,
                "regime": regime,
                "checkpoint": str(work / CHECKPOINT),
                "accelerate_checkpoint": str(work / SHARDS / SHARD_INDEX) if shard_mib else None,
                "reference": str(work / REFERENCE),
                "offload_dir": str(offload),
                "budget_bytes": budget,
                "device": device,
                "repeats": repeats,
                "warmup": args.warmup,
                "evict_dir": str(work) if drop_note is None else None,
                "kv_cache_bytes": cache,
            }
            start_s = time.perf_counter() - started
            limit = None if competitor in unlimited or limit_bytes is None else limit_bytes + cache
            result, error, process_s[label] = _subprocess(
                "run", spec, work, label, args.timeout, limit
            )
            if error and (result is None or "error" not in result):
                result = {**(result or {}), "ok": False, "error": error}
            result = result or {"ok": False, "error": "no result"}
            if "error" in result:
                errors[label] = result["error"]
            runs[regime][competitor].append(
                {
                    "round": number,
                    "order": position,
                    "started_s": start_s,
                    "process_s": process_s[label],
                    "result": result,
                }
            )
            print_row(f"{competitor} {regime}", result, process_s[label])
            shutil.rmtree(offload, ignore_errors=True)
    disk = disk_figures(
        disk_before, measure_disk(work / "offload", args.disk_mib or disk_mib), reader
    )
    regimes = {
        regime: summarize(by_name, param_nbytes, budget, disk["read_bytes_per_s"], cuda)
        for regime, by_name in runs.items()
    }
    # the headline: the summary's own ``figure``, else the main TensorTorrent's RATIO_KEYS
    figure = {
        regime: data.pop("figure")
        if "figure" in data
        else {k: v for k, v in data["ratios"].get(MAIN_TT, {}).items() if k in RATIO_KEYS}
        for regime, data in regimes.items()
    }
    payload = {
        "method": (
            f"each competitor and regime in its own fresh Python process, {rounds} round(s) of "
            "them, interleaved (odd rounds in the order of `schedule`, even rounds in "
            f"reverse); per process {args.warmup} warm-up call(s) excluded, then {repeats} timed "
            f"calls with the run's weight files evicted from the page cache before each (cold), "
            f"then {repeats} without (warm), then for a competitor with a disk reader of its own "
            f"{repeats} pairs of its reader reading one call's disk bytes alone and a call "
            "(cold, `paired_source`), and for eager on the CPU as many triples of a call, the "
            "bytes over the budget read alone and both at once (cold, the overlap's `source`); "
            "medians over every timed call of every round, each round's "
            "medians kept under `rounds`; setup and compile seconds the median over rounds, "
            "peak RSS the max over rounds; every call's output checked against eager's, saved "
            "by the setup step"
        ),
        "ratios_definition": (
            "the headline ratio (e.g. over_accelerate_cold, and `figure`) is the median over "
            "rounds of the ratio of the two figures measured in the same round, which ran close "
            "in time, so that the disk's and CPU's drift over minutes cancels; *_pooled is the "
            "ratio of the medians over every call of every round; *_by_round each round's ratio"
        ),
        "quick": bool(args.quick),
        "device": device,
        "params": dict(params),
        "param_bytes": param_nbytes,
        "budget_bytes": budget,
        "budget_device": device if cuda else "cpu",
        "mem_limit": mem_limit,
        "rounds": rounds,
        "repeats": repeats,
        "warmup": args.warmup,
        "schedule": [[f"{c}-{r}" for r, c in order] for order in plan],
        "page_cache": drop_note
        or (
            "every file of the run's work directory (the checkpoint, its shards, every "
            "offload directory) evicted before each cold timed call (sync, then "
            "posix_fadvise(POSIX_FADV_DONTNEED) on each: bench.offload.measure.evict_files); "
            "the program's own code stays cached, as for a user's next call"
        ),
        "setup": setup,
        "accelerate_checkpoint": (
            f"{SHARDS}/{SHARD_INDEX}: {setup.get('shards')} shards of at most {shard_mib} MiB"
            if shard_mib
            else CHECKPOINT
        ),
        "disk": disk,
        "regimes": regimes,
        "figure": figure,
        "errors": errors,
        "process_s": process_s,
        "runtime_s": time.perf_counter() - started,
        "work_dir": str(work),
        **(extra or {}),
    }
    # A GPU run must not overwrite the CPU run's figures.
    path = write_results(f"{name}_cuda" if cuda else name, payload, args.results)
    (report or print_summary)(name, payload)
    print(f"wrote {path} ({payload['runtime_s']:.0f} s)")
    return path


def print_row(label: str, result: Mapping[str, Any], seconds: float) -> None:
    if "error" in result:
        print(f"  {label:<34} failed ({seconds:.0f} s): {result['error'][:300]}")
        return
    mib = 2**20
    calls = result["cold"]["per_call"]
    steps = ""
    if calls and calls[0].get("decode_tokens_per_s") is not None:
        steps = (
            f"prefill {calls[0]['prefill_ms']:8.1f} ms  "
            f"decode {calls[0]['decode_tokens_per_s']:7.2f} tok/s (cold)  "
        )
    print(
        f"  {label:<34} cold {result['cold']['median_ms']:9.1f} ms  "
        f"warm {result['warm']['median_ms']:9.1f} ms  {steps}"
        f"peak RSS {result['peak_rss_bytes'] / mib:6.0f} MiB "
        f"(cold calls {(result['cold']['peak_rss_calls_bytes'] or 0) / mib:6.0f} MiB)  "
        f"ok={result['ok']}  ({seconds:.0f} s)"
    )


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_summary(name: str, payload: Mapping[str, Any]) -> None:
    """Pooled medians, each round's, and the ratios (headline, pooled, per round)."""
    disk = payload["disk"]
    print(
        f"{name}: bound's disk rate {_fmt((disk['read_bytes_per_s'] or 0) / 1e9)} GB/s "
        f"({disk['source']}); DiskReader by round: "
        + ", ".join(_fmt((m.get("read_bytes_per_s") or 0) / 1e9) for m in disk["reader"])
        + f"; DiskBench before {_fmt((disk['before'].get('read_bytes_per_s') or 0) / 1e9)}, "
        f"after {_fmt((disk['after'].get('read_bytes_per_s') or 0) / 1e9)}"
    )
    for regime, data in payload["regimes"].items():
        print(f"{name} {regime}: median ms over all rounds (each round's medians)")
        for competitor, row in data["competitors"].items():
            if not row.get("ok"):
                print(f"  {competitor:<24} failed: {str(row.get('error'))[:200]}")
                continue
            cold = " ".join(_fmt(x["median_ms_cold"], ".0f") for x in row["rounds"])
            warm = " ".join(_fmt(x["median_ms_warm"], ".0f") for x in row["rounds"])
            busy = ""
            if row.get("disk_busy_share_cold") is not None:
                rate = (row.get("disk_read_bytes_per_s_while_busy_cold") or 0) / 1e9
                busy = (
                    f"  disk busy {100 * row['disk_busy_share_cold']:.0f}% of a cold call, "
                    f"reading {_fmt(rate)} GB/s meanwhile"
                )
            print(
                f"  {competitor:<24} cold {_fmt(row['median_ms_cold'], '8.1f')} ({cold})  "
                f"warm {_fmt(row['median_ms_warm'], '8.1f')} ({warm}){busy}"
            )
        for competitor, ratios in data["ratios"].items():
            for key in (*RATIO_KEYS, "over_eager_warm"):
                if key in ratios:
                    rounds = " ".join(_fmt(x) for x in ratios[f"{key}_by_round"])
                    print(
                        f"  {competitor} {key}: {_fmt(ratios[key])} "
                        f"(pooled {_fmt(ratios[f'{key}_pooled'])}; rounds {rounds})"
                    )
        together = data["lower_bound"].get("compute_with_reads_ms")
        if together is not None:
            share = data["lower_bound"].get("compute_with_reads_over_accelerate_cold")
            print(
                f"  eager computing while the bytes over the budget are read: {together:.1f} ms"
                f" ({_fmt(share)} of Accelerate's cold time)"
            )
        check = data["lower_bound"].get("check")
        if check:
            print(f"  lower bound: {check}")
