"""Rounds, medians and ratios: one competitor's processes over the rounds pooled into
medians, and per regime the lower bound and the ratios (headline, pooled, per round):
``summarize_regime`` for calls of one forward, ``summarize_generate_regime`` for
``generate()`` calls (prefill, decode tokens/s, and a lower bound per decode step)."""

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


def _forwards(result: Mapping[str, Any]) -> int:
    """Forwards of the model per call: 1, or a generation's steps."""
    calls = result["cold"]["per_call"]
    return int(calls[0].get("forwards", 1)) if calls else 1


def _streamed(result: Mapping[str, Any]) -> tuple[int | float | None, str | None]:
    """The bytes a competitor's process read from disk per cold call, and where from."""
    split = result["info"].get("device_map_split")
    if split is not None:
        forwards = _forwards(result)
        source = "parameter bytes of the modules mapped to 'disk'"
        if forwards > 1:
            source += f", read by each of the call's {forwards} forwards"
        return split.get("disk", {}).get("param_bytes", 0) * forwards, source
    reads = [c["disk_bytes_read"] for c in result["cold"]["per_call"] if "disk_bytes_read" in c]
    if reads:
        return _median(reads), "compiled.disk_bytes_read(), median over cold calls"
    return None, None


def _paired(paired: Mapping[str, Any] | None) -> dict[str, Any]:
    """Figures of a process's pairs of a read alone and a call (``child.paired_reads``)."""
    if not paired or not paired["pairs"]:
        return {}
    pairs = paired["pairs"]
    return {
        "call_over_read_alone": _median([p["call_s"] / p["read_alone_s"] for p in pairs]),
        "read_alone_ms": _median([1e3 * p["read_alone_s"] for p in pairs]),
        "paired_call_ms": _median([1e3 * p["call_s"] for p in pairs]),
    }


def _overlap(overlap: Mapping[str, Any] | None) -> dict[str, Any]:
    """Figures of a process's triples of a call, its streamed reads, and both at once
    (``child.overlap_triples``)."""
    if not overlap or not overlap["triples"]:
        return {}
    triples = overlap["triples"]
    return {
        "compute_with_reads_ms": _median([1e3 * t["together_s"] for t in triples]),
        "compute_alone_ms": _median([1e3 * t["call_s"] for t in triples]),
        "reads_alone_ms": _median([1e3 * t["reads_s"] for t in triples]),
        "compute_with_reads_over_slower_alone": _median(
            [t["together_s"] / max(t["call_s"], t["reads_s"]) for t in triples]
        ),
    }


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
                **_paired(r.get("paired")),
                **_overlap(r.get("overlap")),
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
        "cgroup_peak_bytes": _max([r.get("cgroup", {}).get("peak_bytes") for r in results]),
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
    busy = [
        (c["disk_busy_s"], ms / 1e3, c.get("disk_bytes_read"))
        for r in results
        for ms, c in zip(r["cold"]["times_ms"], r["cold"]["per_call"], strict=True)
        if c.get("disk_busy_s")
    ]
    if busy:
        # how much of its time a call kept the disk busy, and the rate its reads got meanwhile:
        # the runtime's overlap apart from the disk's speed during the call
        row["disk_busy_share_cold"] = _median([b / s for b, s, _ in busy])
        row["disk_read_bytes_per_s_while_busy_cold"] = _median([n / b for b, _, n in busy if n])
        row["disk_busy_source"] = (
            "DiskReader.busy_seconds over each cold call (time with at least one read in "
            "flight): its share of the call, and the call's disk bytes over it; medians over "
            "every cold call of every round"
        )
    pairs = [p for r in results for p in r.get("paired", {}).get("pairs", [])]
    if pairs:
        row.update(_paired({"pairs": pairs}))
        row["paired_source"] = (
            "after the warm calls, pairs of (the competitor's own reader reading one call's "
            "disk bytes alone, all submitted at once) then one call, the run's weight files "
            "evicted from the page cache before each; call_over_read_alone is the median "
            "over pairs of the call's seconds over the read's: how close a call comes to its "
            "disk's rate measured seconds before it, whatever the disk's drift over minutes"
        )
    triples = [t for r in results for t in r.get("overlap", {}).get("triples", [])]
    if triples:
        row["overlap"] = {
            **_overlap({"triples": triples}),
            "streamed_bytes": results[0]["overlap"]["bytes"],
            "source": (
                "after the warm calls, triples of one call alone, the checkpoint's last "
                "tensors (at least its bytes over the budget, what a plan under the budget "
                "must read each call) read alone by a DiskReader with the backend's settings, "
                "every read verified as the backend's are, and both at once (the reads "
                "submitted as the call starts, timed until both are done), the run's weight "
                "files evicted from the page cache before each where they can be; medians "
                "over every triple of every round"
            ),
        }
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
    generation = _generation(results, rounds)
    if generation is not None:
        row["generate"] = generation
    return row


GENERATE_KEYS = ("prefill_ms", "decode_ms_per_step", "decode_tokens_per_s")
"""A generation's per-call figures (``bench.offload.generation``), pooled by median."""


def _generation(
    results: Sequence[Mapping[str, Any]], rounds: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """A generative competitor's figures: per phase (cold, warm) the median over every call
    of every round of its prefill ms, decode ms per step and tokens/s (each round's under
    ``rounds``), and the bytes it read per step and per new token."""
    first = results[0]["cold"]["per_call"]
    if not first or "decode_tokens_per_s" not in first[0]:
        return None
    batch, new_tokens = int(first[0]["batch"]), int(first[0]["new_tokens"])
    out: dict[str, Any] = {"batch": batch, "new_tokens": new_tokens}

    def values(rs: Sequence[Mapping[str, Any]], phase: str, key: str) -> list[float]:
        return [c[key] for r in rs for c in r[phase]["per_call"] if c.get(key) is not None]

    for phase in ("cold", "warm"):
        for key in GENERATE_KEYS:
            out[f"{key}_{phase}"] = _median(values(results, phase, key))
            for x, r in zip(rounds, results, strict=True):
                x[f"{key}_{phase}"] = _median(values([r], phase, key))
        for key in ("io_read_bytes", "disk_bytes_read"):
            per_call = _median(values(results, phase, key))
            if per_call is not None:
                out[f"{key}_per_step_{phase}"] = per_call / new_tokens
                out[f"{key}_per_new_token_{phase}"] = per_call / (batch * new_tokens)
    out["definitions"] = (
        "prefill_ms: from the start of generate() to the first new token's logits; "
        "decode_tokens_per_s: batch x (new_tokens - 1) over the time from the first new "
        "token's logits to the last; decode_ms_per_step that time over new_tokens - 1; "
        "*_per_step: the bytes a call read over its new_tokens forwards, *_per_new_token over "
        "batch x new_tokens; io_read_bytes from /proc/self/io (read_bytes: what the process "
        "fetched from storage), disk_bytes_read from TensorTorrent's disk reader"
    )
    return out


def summarize_generate_regime(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    param_nbytes: int,
    budget: int,
    disk_bw: float | None,
    cuda: bool,
    main: str = "tensortorrent",
) -> dict[str, Any]:
    """Per competitor figures of one regime of ``generate()`` calls over its rounds, the
    lower bound of a decode step and the ratios of decode tokens/s (headline: the median
    over rounds of each round's ratio; ``_pooled``, ``_by_round`` as ``summarize_regime``).
    ``figure``: the headline ratios of ``main``."""
    rows = {name: summarize_competitor(competitor_runs) for name, competitor_runs in runs.items()}

    # Every competitor that ran has figures, its outputs' check apart (``quality``): greedy
    # tokens that part from eager's late in a float32 run do not make its speed unknown.
    def generation(name: str) -> dict[str, Any]:
        figures: dict[str, Any] = rows.get(name, {}).get("generate", {})
        return figures

    def per_round(name: str, key: str) -> dict[int, float | None]:
        return {x["round"]: x.get(key) for x in rows.get(name, {}).get("rounds", [])}

    eager = generation("eager")
    batch = next((g["batch"] for g in map(generation, rows) if g), None)
    # eager holds every weight: its cold and warm steps both time the compute alone
    compute = _min(eager.get("decode_ms_per_step_cold"), eager.get("decode_ms_per_step_warm"))
    eager_cold = per_round("eager", "decode_ms_per_step_cold")
    compute_rounds = {
        r: _min(warm, eager_cold.get(r))
        for r, warm in per_round("eager", "decode_ms_per_step_warm").items()
    }
    streamed = max(0, param_nbytes - budget)
    has_bound = not cuda and bool(disk_bw) and batch is not None

    def bound_ms(compute_ms: float | None) -> float | None:
        if not has_bound or compute_ms is None or not disk_bw:
            return None
        return max(compute_ms, 1e3 * streamed / disk_bw)

    step_bound = bound_ms(compute)
    bound_rounds = {r: bound_ms(c) for r, c in compute_rounds.items()}
    bound: dict[str, Any] = {
        "compute_ms_per_step": compute,
        "compute_ms_per_step_by_round": [compute_rounds[r] for r in sorted(compute_rounds)],
        "compute_source": "eager, no budget and no memory limit: the lower of its cold and "
        "warm median decode ms per step; per round, that round's",
        "streamed_bytes_per_step": streamed,
        "disk_read_bytes_per_s": disk_bw,
        "step_ms": step_bound,
        "step_ms_by_round": [bound_rounds[r] for r in sorted(bound_rounds)],
        "decode_tokens_per_s": _ratio(1e3 * batch, step_bound) if batch else None,
        "definition": "a decode step's lower bound: max(eager's decode ms per step, streamed "
        "bytes per step / the disk read bandwidth), where the streamed bytes per step are the "
        "parameter bytes the budget leaves out (parameter bytes - budget: each step is a "
        "forward that needs every weight once, and at best the budget's worth stay in RAM) "
        "and the bandwidth is the highest measured in this run (disk.source); the bound's "
        "decode tokens/s is batch over it. decode_tokens_per_s_over_bound: a competitor's "
        "decode tokens/s over the bound's (at most 1 but for noise; the median over rounds of "
        "each round's, with the round's eager compute); decode_step_over_bound its inverse",
    }
    if cuda:
        bound["note"] = "not computed in CUDA mode (needs the host-to-device bandwidth)"
    ratios: dict[str, Any] = {}
    violations: dict[str, Any] = {}
    for name in rows:
        mine = generation(name)
        if not mine:
            continue
        ratios[name] = {}
        for phase in ("cold", "warm"):
            key = f"decode_tokens_per_s_{phase}"
            rates = per_round(name, key)
            if name.startswith("tensortorrent"):
                theirs = generation("accelerate").get(key)
                ratio = _ratio(mine[key], theirs)
                against = per_round("accelerate", key)
                _put_ratio(ratios[name], f"{key}_over_accelerate", rates, against, ratio)
            if name != "eager" and eager:
                ratio = _ratio(mine[key], eager.get(key))
                against = per_round("eager", key)
                _put_ratio(ratios[name], f"{key}_over_eager", rates, against, ratio)
        if step_bound is not None and batch and name != "eager":
            rates = per_round(name, "decode_tokens_per_s_cold")
            limits = {r: _ratio(1e3 * batch, b) for r, b in bound_rounds.items()}
            pooled = _ratio(mine["decode_tokens_per_s_cold"], bound["decode_tokens_per_s"])
            _put_ratio(ratios[name], "decode_tokens_per_s_over_bound_cold", rates, limits, pooled)
            over = ratios[name]["decode_tokens_per_s_over_bound_cold"]
            ratios[name]["decode_step_over_bound_cold"] = _ratio(1.0, over)
            if over is not None and over > 1 + BOUND_NOISE:
                violations[name] = {
                    "decode_tokens_per_s_over_bound_cold": over,
                    "decode_ms_per_step_cold": mine.get("decode_ms_per_step_cold"),
                    "bound_step_ms": step_bound,
                }
    if step_bound is not None:
        bound["violations"] = violations
        bound["check"] = (
            f"the disk rate is underestimated: {', '.join(violations)} beat the bound by more "
            f"than {BOUND_NOISE:.0%} (see violations)"
            if violations
            else f"no competitor beat the bound by more than {BOUND_NOISE:.0%}"
        )
    figure_keys = (
        "decode_tokens_per_s_cold_over_accelerate",
        "decode_tokens_per_s_warm_over_accelerate",
        "decode_tokens_per_s_over_bound_cold",
        "decode_step_over_bound_cold",
    )
    return {
        "competitors": rows,
        "lower_bound": bound,
        "ratios": ratios,
        "figure": {k: v for k, v in ratios.get(main, {}).items() if k in figure_keys},
    }


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
    # slow one phase of one process).
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
    overlap_ms = rows.get("eager", {}).get("overlap", {}).get("compute_with_reads_ms")
    overlap_rounds = {
        x["round"]: x["compute_with_reads_ms"]
        for x in rows.get("eager", {}).get("rounds", [])
        if x.get("compute_with_reads_ms") is not None
    }
    if overlap_ms is not None:
        bound["compute_with_reads_ms"] = overlap_ms
        bound["compute_with_reads_ms_by_round"] = [
            overlap_rounds[r] for r in sorted(overlap_rounds)
        ]
        accelerate = per_round("accelerate", "median_ms_cold")
        if accelerate:
            _put_ratio(
                bound,
                "compute_with_reads_over_accelerate_cold",
                overlap_rounds,
                accelerate,
                _ratio(overlap_ms, pooled("accelerate", "median_ms_cold")),
            )

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
        if row.get("call_over_read_alone") is not None:
            paired = {x["round"]: x.get("call_over_read_alone") for x in row["rounds"]}
            ones = dict.fromkeys(paired, 1.0)
            pooled_paired = row["call_over_read_alone"]
            _put_ratio(ratios[name], "call_over_read_alone", paired, ones, pooled_paired)
        if overlap_rounds and name != "eager":
            ratio = _ratio(row["median_ms_cold"], overlap_ms)
            _put_ratio(ratios[name], "over_compute_with_reads_cold", cold, overlap_rounds, ratio)
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
        "median: the least rate it read at (its calls compute too). compute_with_reads_ms "
        "(eager's overlap): eager's call and the reads a plan under the budget must make, "
        "run at once in one process with no wait between them, each read verified: a "
        "perfect overlap on this machine, the CPU time of the reads and checks included, "
        "which the max() above leaves out; over_compute_with_reads_cold is a competitor's "
        "cold median over it, per round as above"
    )
    out["lower_bound"] = bound
    out["ratios"] = ratios
    return out
