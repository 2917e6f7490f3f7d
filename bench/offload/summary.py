"""Rounds, medians and ratios: one competitor's processes over the rounds pooled into
medians, and per regime the lower bound and the ratios (headline, pooled, per round)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .workload import worst_quality

BOUND_NOISE = 0.10
"""A competitor whose cold median is more than this fraction under its lower bound beat
the bound by more than noise: the bound's disk rate is underestimated and the JSON says so."""


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _streamed(result: Mapping[str, Any]) -> tuple[int | float | None, str | None]:
    """The bytes a competitor's process read from disk per cold call, and where from."""
    split = result["info"].get("device_map_split")
    if split is not None:
        return split.get("disk", {}).get("param_bytes", 0), (
            "parameter bytes of the modules mapped to 'disk'"
        )
    reads = [c["disk_bytes_read"] for c in result["cold"]["per_call"] if "disk_bytes_read" in c]
    if reads:
        return _median(reads), "compiled.disk_bytes_read(), median over cold calls"
    return None, None


def _min(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _max(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def summarize_competitor(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One competitor on one regime over its rounds (``runs``: per round, the process's
    ``result`` with ``round``, ``order``, ``started_s`` and ``process_s``).

    Medians over every timed call of every round; each round's own medians under
    ``rounds``; setup and compile seconds the median over rounds; RSS figures the max over
    rounds. A round that failed fails the competitor.
    """
    failed = {
        str(run["round"]): run["result"].get("error", "no result")
        for run in runs
        if not run["result"] or "error" in run["result"]
    }
    if failed or not runs:
        first = next(iter(failed.items()), ("-", "no round ran"))
        return {"ok": False, "error": f"round {first[0]}: {first[1]}", "errors_by_round": failed}
    results = [run["result"] for run in runs]
    rounds: list[dict[str, Any]] = []
    for run, r in zip(runs, results, strict=True):
        streamed, _ = _streamed(r)
        rounds.append(
            {
                "round": run["round"],
                "order": run["order"],
                "started_s": run["started_s"],
                "process_s": run["process_s"],
                "ok": r["quality"]["ok"],
                "median_ms_cold": r["cold"]["median_ms"],
                "median_ms_warm": r["warm"]["median_ms"],
                "times_ms_cold": r["cold"]["times_ms"],
                "times_ms_warm": r["warm"]["times_ms"],
                "setup_s": r["setup_s"],
                "compile_s": r["compile_s"],
                "peak_rss_bytes": r["peak_rss_bytes"],
                "peak_rss_cold_calls_bytes": r["cold"]["peak_rss_calls_bytes"],
                "streamed_bytes": streamed,
            }
        )
    cold = [t for r in results for t in r["cold"]["times_ms"]]
    warm = [t for r in results for t in r["warm"]["times_ms"]]
    cold_rounds = [x["median_ms_cold"] for x in rounds if x["median_ms_cold"]]
    warm_rounds = [x["median_ms_warm"] for x in rounds if x["median_ms_warm"]]
    peak = max(results, key=lambda r: r["peak_rss_bytes"])
    io_reads = [
        c["io_read_bytes"] for r in results for c in r["cold"]["per_call"] if "io_read_bytes" in c
    ]
    page_cache = sorted({r["cold"]["page_cache"] for r in results})
    row: dict[str, Any] = {
        "ok": all(r["quality"]["ok"] for r in results),
        "median_ms_cold": _median(cold),
        "median_ms_warm": _median(warm),
        "times_ms_cold": cold,
        "times_ms_warm": warm,
        "round_spread_cold": _ratio(max(cold_rounds, default=None), min(cold_rounds, default=0)),
        "round_spread_warm": _ratio(max(warm_rounds, default=None), min(warm_rounds, default=0)),
        "rounds": rounds,
        "warmup_calls": results[0]["warmup_calls"],
        "page_cache_cold": page_cache[0] if len(page_cache) == 1 else page_cache,
        "quality": worst_quality([r["quality"] for r in results]),
        "setup_s": _median([r["setup_s"] for r in results]),
        "compile_s": _median([r["compile_s"] for r in results]),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
        "peak_rss_setup_bytes": _max([r["rss_after_setup"].get("VmHWM") for r in results]),
        "peak_rss_cold_calls_bytes": _max([r["cold"]["peak_rss_calls_bytes"] for r in results]),
        "peak_rss_warm_calls_bytes": _max([r["warm"]["peak_rss_calls_bytes"] for r in results]),
        "rss_growth_cold_calls_bytes": _max([r["cold"]["rss_growth_bytes"] for r in results]),
        "rss_growth_warm_calls_bytes": _max([r["warm"]["rss_growth_bytes"] for r in results]),
        "rss_baseline_bytes": _max([r["rss_baseline"].get("VmRSS") for r in results]),
        "rss_after_setup": peak["rss_after_setup"],
        "rss_after_cold_calls": peak["cold"]["rss_after_calls"],
        "io_read_bytes_cold_median": _median(io_reads),
        "holds_in_ram": results[0]["holds_in_ram"],
    }
    disk_reads = [
        c["disk_bytes_read"]
        for r in results
        for c in r["cold"]["per_call"]
        if "disk_bytes_read" in c
    ]
    if disk_reads:
        row["disk_bytes_read_cold"] = disk_reads
    streamed, source = _streamed(results[0])
    if streamed is not None:
        row["streamed_bytes"] = _median([x["streamed_bytes"] for x in rounds])
        row["streamed_bytes_source"] = source + (", median over rounds" if len(runs) > 1 else "")
        cold_s = (row["median_ms_cold"] or 0) / 1e3
        row["implied_read_bytes_per_s_cold"] = _ratio(row["streamed_bytes"], cold_s)
    split = results[0]["info"].get("device_map_split")
    if split is not None:
        row["device_map_split"] = split
        row["device_map"] = results[0]["info"]["device_map"]
        if any(r["info"].get("device_map_split") != split for r in results):
            row["device_map_note"] = "the device_map differed between rounds; round 1's is shown"
    if "explain" in results[0]:
        row["explain"] = results[0]["explain"]
    return row


def _put_ratio(
    out: dict[str, Any],
    key: str,
    num: Mapping[int, float | None],
    den: Mapping[int, float | None],
    pooled: float | None,
) -> None:
    """``key``: the median over rounds of each round's ratio (the headline: both figures of a
    round were measured close in time); ``key_pooled``: the ratio of the pooled medians;
    ``key_by_round``: each round's ratio."""
    by_round = [_ratio(num[r], den.get(r)) for r in sorted(num)]
    known = [x for x in by_round if x is not None]
    out[key] = _median(known)
    out[f"{key}_pooled"] = pooled
    out[f"{key}_by_round"] = by_round


def summarize_regime(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    param_nbytes: int,
    budget: int,
    disk_bw: float | None,
    cuda: bool,
) -> dict[str, Any]:
    """Per competitor figures of one regime over its rounds (``runs``: each competitor's
    processes, one a round), the lower bound and the ratios."""
    rows = {name: summarize_competitor(competitor_runs) for name, competitor_runs in runs.items()}

    def pooled(name: str, key: str) -> float | None:
        row = rows.get(name, {})
        return row.get(key) if row.get("ok") else None

    def per_round(name: str, key: str) -> dict[int, float | None]:
        row = rows.get(name, {})
        return {x["round"]: x[key] for x in row.get("rounds", [])} if row.get("ok") else {}

    out: dict[str, Any] = {"competitors": rows}
    eager_warm = pooled("eager", "median_ms_warm")
    eager_warm_rounds = per_round("eager", "median_ms_warm")
    # Eager holds every weight in RAM: its cold and warm calls both time the compute alone,
    # and the lower of the two is the better floor (a burst of load on a shared host can
    # slow one phase of one process, as a dropped cache can slow a cold call's code pages).
    compute_ms = _min(eager_warm, pooled("eager", "median_ms_cold"))
    eager_cold_rounds = per_round("eager", "median_ms_cold")
    compute_rounds = {
        r: _min(warm, eager_cold_rounds.get(r)) for r, warm in eager_warm_rounds.items()
    }
    bound: dict[str, Any] = {
        "compute_ms": compute_ms,
        "compute_ms_by_round": [compute_rounds[r] for r in sorted(compute_rounds)],
        "compute_source": "eager, no budget: the lower of its cold and warm medians (it holds "
        "every weight in RAM, so both time the compute alone); per round, that round's",
        "disk_read_bytes_per_s": disk_bw,
        "min_streamed_bytes": max(0, param_nbytes - budget),
    }
    has_bound = not cuda and compute_ms is not None and bool(disk_bw)

    def lower(compute: float | None, streamed: float | None) -> float | None:
        if compute is None or streamed is None or not disk_bw:
            return None
        return max(compute, 1e3 * streamed / disk_bw)

    ratios: dict[str, Any] = {}
    violations: dict[str, Any] = {}
    for name, row in rows.items():
        if not row.get("ok"):
            continue
        ratios[name] = {}
        cold, warm = per_round(name, "median_ms_cold"), per_round(name, "median_ms_warm")
        if name.startswith("tensortorrent"):
            for phase, mine in (("cold", cold), ("warm", warm)):
                field = f"median_ms_{phase}"
                theirs = per_round("accelerate", field)
                ratio = _ratio(row[field], pooled("accelerate", field))
                _put_ratio(ratios[name], f"over_accelerate_{phase}", mine, theirs, ratio)
        if name != "eager":
            ratio = _ratio(row["median_ms_warm"], eager_warm)
            _put_ratio(ratios[name], "over_eager_warm", warm, eager_warm_rounds, ratio)
        streamed = row.get("streamed_bytes")
        if has_bound and streamed is not None:
            streamed_rounds = {x["round"]: x["streamed_bytes"] for x in row["rounds"]}
            bounds = {r: lower(compute_rounds.get(r), s) for r, s in streamed_rounds.items()}
            bound[f"{name}_ms"] = lower(compute_ms, streamed)
            bound[f"{name}_ms_by_round"] = [bounds[r] for r in sorted(bounds)]
            ratio = _ratio(row["median_ms_cold"], bound[f"{name}_ms"])
            _put_ratio(ratios[name], "over_lower_bound_cold", cold, bounds, ratio)
            headline = ratios[name]["over_lower_bound_cold"]
            if headline is not None and headline < 1 - BOUND_NOISE:
                violations[name] = {
                    "over_lower_bound_cold": headline,
                    "median_ms_cold": row["median_ms_cold"],
                    "bound_ms": bound[f"{name}_ms"],
                    "streamed_bytes": streamed,
                    "implied_read_bytes_per_s_cold": row.get("implied_read_bytes_per_s_cold"),
                }
    if has_bound:
        bound["min_bytes_ms"] = lower(compute_ms, bound["min_streamed_bytes"])
        bound["check"] = (
            f"the disk rate is underestimated: {', '.join(violations)} beat the bound by more "
            f"than {BOUND_NOISE:.0%} (see violations)"
            if violations
            else f"no competitor beat its bound by more than {BOUND_NOISE:.0%}"
        )
        bound["violations"] = violations
    if cuda:
        bound["note"] = "not computed in CUDA mode (needs the host-to-device bandwidth)"
    bound["definition"] = (
        "max(compute_ms, streamed bytes / disk read bandwidth) per competitor, with its own "
        "streamed bytes; min_bytes_ms uses the bytes that cannot fit the budget. The disk "
        "read bandwidth is the highest measured in this run (disk.source): DiskBench's single "
        "stream of O_DIRECT reads before and after the competitors, and DiskReader reading "
        "model.safetensors cold with every tensor submitted at once (4 threads by default) "
        "once per round. Per round the bound uses that round's eager compute_ms; "
        "over_lower_bound_cold is the median over rounds of the round's cold median over the "
        "round's bound (_pooled: pooled cold median over the bound of the pooled figures). A "
        f"competitor more than {BOUND_NOISE:.0%} under its bound is listed in violations: "
        "the bound would then not be a bound, the disk rate being underestimated. A "
        "competitor's implied_read_bytes_per_s_cold is its streamed bytes over its cold "
        "median: the least rate it read at (its calls compute too)"
    )
    out["lower_bound"] = bound
    out["ratios"] = ratios
    return out
