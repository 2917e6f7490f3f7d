"""The offload benches run on a tiny size and write valid JSON with matching outputs.

No timing is asserted (benchmarks are not tests). Each competitor runs in its own fresh
process as in a real run, which is what makes these tests slow: every process is a fresh
interpreter that imports torch (~2.4 s on 2 cores) and its competitor's library (Accelerate's
hooks and TensorTorrent import torch._dynamo, ~2 s more; the hf workload's transformers
~4 s more in every process, the setup step's included): 13-20 s for ram_offload (4
processes) and 29-37 s for hf_offload (4 processes) here, one round each (``--rounds 1``).
Nearly all of it is interpreter start-up and imports, which only fewer processes would save,
and each of the 4 (setup, eager, Accelerate, TensorTorrent) is checked.
``tensortorrent_in_memory`` is left out for time. ``--no-drop`` keeps the machine's page
cache alone during the test suite (the JSON says so); the drop itself is checked below
without root. How rounds are pooled, paired into ratios and checked against the lower
bound is tested on made-up process results, without processes.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import hf_offload, ram_offload, verify_cost
from bench.offload.cgroup import CgroupUnavailable, MemoryCgroup
from bench.offload.disk import disk_figures, measure_reader
from bench.offload.measure import drop_page_cache
from bench.offload.runner import schedule
from bench.offload.summary import summarize_regime
from bench.offload.workload import fp32_quality, logits_quality, worst_quality

TINY_RAM = ["--layers", "8", "--width", "256", "--batches", "4"]
TINY_HF = [
    *("--hidden", "64", "--layers", "2", "--intermediate", "128", "--heads", "4"),
    *("--kv-heads", "2", "--head-dim", "16", "--vocab", "256", "--seq", "8"),
]
RUN = [
    *("--repeats", "1", "--rounds", "1", "--warmup", "1", "--no-drop"),
    *("--disk-mib", "8", "--timeout", "300"),
]


def run(main: Any, name: str, args: list[str], tmp_path: Path) -> dict[str, Any]:
    main([*args, *RUN, "--out-dir", str(tmp_path / "work"), "--results", str(tmp_path)])
    data: dict[str, Any] = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["bench"] == name
    assert {"torch_version", "fingerprint"} <= set(data["machine"])
    assert data["page_cache"] == "page cache kept: --no-drop was given"
    assert data["rounds"] == 1 and data["repeats"] == 1 and len(data["schedule"]) == 1
    disk = data["disk"]
    (reader,) = disk["reader"]
    assert reader["round"] == 1 and reader["read_bytes_per_s"] > 0, reader
    # every tensor of the checkpoint (the parameters) was read, in each pass
    assert [p["bytes"] for p in reader["passes"]] == [data["param_bytes"]] * 2
    rates = [disk["before"]["read_bytes_per_s"], disk["after"]["read_bytes_per_s"]]
    assert disk["read_bytes_per_s"] == max([*rates, reader["read_bytes_per_s"]]) > 0
    assert 0 < data["budget_bytes"] < data["param_bytes"]
    return data


def check_common(row: dict[str, Any], calls: int = 3) -> None:
    """``calls``: the calls whose output was checked (a warm-up, a cold and a warm call, and
    for TensorTorrent the call of its pair with a read alone, for eager on the CPU the two
    of its triple with the reads)."""
    assert row["ok"], row
    assert row["quality"]["ok"] and row["quality"]["calls_checked"] == calls
    assert row["median_ms_cold"] > 0 and row["median_ms_warm"] > 0
    assert row["warmup_calls"] == 1 and len(row["times_ms_cold"]) == 1
    (only,) = row["rounds"]
    assert only["round"] == 1 and only["median_ms_cold"] == row["median_ms_cold"]
    assert row["round_spread_cold"] == 1
    assert row["peak_rss_bytes"] >= row["rss_baseline_bytes"] > 0
    assert row["setup_s"] >= 0 and row["compile_s"] >= 0


def check_offloaded(data: dict[str, Any], regime: str) -> None:
    rows = data["regimes"][regime]["competitors"]
    check_common(rows["eager"], calls=5)
    accelerate = rows["accelerate"]
    check_common(accelerate)
    split = accelerate["device_map_split"]
    assert set(split) == {"cpu", "disk"}
    assert split["cpu"]["param_bytes"] + split["disk"]["param_bytes"] == data["param_bytes"]
    assert accelerate["streamed_bytes"] == split["disk"]["param_bytes"]
    bound = data["regimes"][regime]["lower_bound"]
    assert bound["accelerate_ms"] > 0 and "DiskReader" in bound["definition"]
    assert bound["check"] and "violations" in bound


def check_tensortorrent(data: dict[str, Any], regime: str) -> None:
    name = "tensortorrent"
    row = data["regimes"][regime]["competitors"][name]
    assert "error" not in row, row["error"]
    check_common(row, calls=4)
    assert row["read_alone_ms"] > 0 and row["call_over_read_alone"] > 0
    assert "Devices" in row["explain"]
    assert row["streamed_bytes"] > 0
    # the call kept the disk busy part of its time, at a rate its bytes over that time
    assert 0 < row["disk_busy_share_cold"] <= 1
    assert row["disk_read_bytes_per_s_while_busy_cold"] > 0
    ratios = data["regimes"][regime]["ratios"][name]
    assert ratios["over_accelerate_cold"] > 0 and ratios["over_lower_bound_cold"] > 0
    # one round: its ratio is the headline, and the ratio of the pooled medians
    for key in ("over_accelerate_cold", "over_lower_bound_cold"):
        assert ratios[f"{key}_by_round"] == [ratios[key]]
        assert ratios[f"{key}_pooled"] == pytest.approx(ratios[key])


@pytest.mark.slow
def test_ram_offload_bench(tmp_path: Path) -> None:
    competitors = ["--competitors", "eager", "accelerate", "tensortorrent"]
    data = run(ram_offload.main, "ram_offload", [*TINY_RAM, *competitors], tmp_path)
    (regime,) = data["regimes"]
    assert regime == "batch4"
    check_offloaded(data, regime)
    assert data["regimes"][regime]["competitors"]["eager"]["quality"]["max_abs_diff"] == 0
    check_tensortorrent(data, regime)
    # eager computing while the bytes over the budget are read: the floor of a streamed call
    overlap = data["regimes"][regime]["competitors"]["eager"]["overlap"]
    assert overlap["streamed_bytes"] >= data["param_bytes"] - data["budget_bytes"]
    assert overlap["compute_with_reads_ms"] > 0 and overlap["reads_alone_ms"] > 0
    assert data["regimes"][regime]["ratios"]["tensortorrent"]["over_compute_with_reads_cold"] > 0
    assert set(data["figure"]["batch4"]) == {
        "over_accelerate_cold",
        "over_accelerate_warm",
        "over_lower_bound_cold",
        "call_over_read_alone",
        "over_compute_with_reads_cold",
    }


@pytest.mark.slow
def test_hf_offload_bench(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    data = run(hf_offload.main, "hf_offload", TINY_HF, tmp_path)
    (regime,) = data["regimes"]
    assert regime == "batch1_seq8"
    check_offloaded(data, regime)
    quality = data["regimes"][regime]["competitors"]["accelerate"]["quality"]
    assert quality["cosine"] >= 0.99 and quality["argmax_agreement"] >= 0.9
    check_tensortorrent(data, regime)


@pytest.mark.slow
def test_a_competitor_over_its_memory_limit_is_reported_not_a_crash(tmp_path: Path) -> None:
    """``--mem-limit``: each competitor in a memory cgroup of the budget plus an allowance; one
    that goes over it (here every one: 1 MiB allows no interpreter) is a failed competitor
    whose error says so, and the bench goes on to write its JSON."""
    try:
        MemoryCgroup.create(2**30).remove()
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup here: {exc}")
    args = [*TINY_RAM, "--competitors", "eager", "--mem-limit", "1MiB"]
    data = run(ram_offload.main, "ram_offload", args, tmp_path)
    assert data["mem_limit"] == {
        "allowance_bytes": 2**20,
        "limit_bytes": data["budget_bytes"] + 2**20,
    }
    row = data["regimes"]["batch4"]["competitors"]["eager"]
    assert not row["ok"]
    (error,) = data["errors"].values()
    assert f"killed by its memory limit of {data['budget_bytes'] + 2**20} bytes" in error


def test_rounds_alternate_their_order() -> None:
    first, second, third = schedule(["b16", "b256"], ["eager", "tt"], 3)
    assert first == [("b16", "eager"), ("b16", "tt"), ("b256", "eager"), ("b256", "tt")]
    assert second == first[::-1] and third == first


def process(
    round_: int,
    cold: list[float],
    warm: list[float],
    rss: int = 1000,
    setup_s: float = 1.0,
    streamed: int | None = None,
    disk_map_bytes: int | None = None,
    paired: list[tuple[float, float]] | None = None,
    overlap: list[tuple[float, float, float]] | None = None,
) -> dict[str, Any]:
    """One competitor process's result as ``run_competitor`` writes it (made up)."""
    per_call = [{} if streamed is None else {"disk_bytes_read": streamed} for _ in cold]

    def phase(times: list[float]) -> dict[str, Any]:
        return {
            "times_ms": times,
            "median_ms": statistics.median(times),
            "per_call": per_call,
            "peak_rss_calls_bytes": rss,
            "rss_growth_bytes": rss - 10,
            "rss_after_calls": {"VmRSS": rss},
            "page_cache": "dropped",
        }

    info = {}
    if disk_map_bytes is not None:
        split = {"cpu": {"modules": 1, "param_bytes": 1}, "disk": {"param_bytes": disk_map_bytes}}
        info = {"device_map_split": split, "device_map": {"": "disk"}}
    result = {
        "ok": True,
        "holds_in_ram": "made up",
        "rss_baseline": {"VmRSS": 10},
        "rss_after_setup": {"VmHWM": rss // 2},
        "setup_s": setup_s,
        "compile_s": 0.5,
        "warmup_calls": 1,
        "cold": phase(cold),
        "warm": phase(warm),
        "quality": {"ok": True, "max_abs_diff": 0.0, "calls_checked": 1 + len(cold) + len(warm)},
        "peak_rss_bytes": rss,
        "info": info,
    }
    if paired is not None:
        pairs = [{"read_alone_s": alone, "call_s": call} for alone, call in paired]
        result["paired"] = {"pairs": pairs, "quality": {"ok": True}}
    if overlap is not None:
        triples = [{"call_s": c, "reads_s": r, "together_s": t} for c, r, t in overlap]
        result["overlap"] = {"triples": triples, "bytes": 7, "quality": {"ok": True}}
    return {"round": round_, "order": 0, "started_s": 0.0, "process_s": 1.0, "result": result}


def test_rounds_are_pooled_and_ratios_paired_by_round() -> None:
    # Round 2 ran on a slower disk: every competitor's times are higher in it.
    runs = {
        "eager": [process(1, [90, 90], [100, 100]), process(2, [190, 190], [200, 200])],
        "accelerate": [
            process(1, [400, 420], [300, 300], rss=2000, disk_map_bytes=200_000_000),
            process(2, [1000, 1000], [600, 600], rss=3000, disk_map_bytes=200_000_000),
        ],
        "tensortorrent": [
            process(1, [300, 300], [200, 200], setup_s=1.0, streamed=500_000_000),
            process(2, [700, 700], [400, 400], setup_s=3.0, streamed=500_000_000),
        ],
    }
    out = summarize_regime(runs, 10**9, 5 * 10**8, 1e9, cuda=False)
    tt = out["competitors"]["tensortorrent"]
    assert tt["ok"] and tt["times_ms_cold"] == [300, 300, 700, 700]
    assert tt["median_ms_cold"] == 500 and tt["median_ms_warm"] == 300
    assert [r["median_ms_cold"] for r in tt["rounds"]] == [300, 700]
    assert tt["round_spread_cold"] == pytest.approx(7 / 3) and tt["setup_s"] == 2.0
    assert tt["quality"]["calls_checked"] == 10 and tt["streamed_bytes"] == 500_000_000
    accelerate = out["competitors"]["accelerate"]
    assert accelerate["peak_rss_bytes"] == 3000 and accelerate["peak_rss_cold_calls_bytes"] == 3000
    assert accelerate["streamed_bytes"] == 200_000_000 and accelerate["median_ms_cold"] == 710

    ratios = out["ratios"]["tensortorrent"]
    assert ratios["over_accelerate_cold_by_round"] == pytest.approx([300 / 410, 700 / 1000])
    assert ratios["over_accelerate_cold"] == pytest.approx((300 / 410 + 0.7) / 2)
    assert ratios["over_accelerate_cold_pooled"] == pytest.approx(500 / 710)
    assert ratios["over_eager_warm_by_round"] == pytest.approx([2.0, 2.0])

    bound = out["lower_bound"]
    # eager's compute: the lower of its cold and warm medians, in each round and pooled
    assert bound["compute_ms_by_round"] == [90, 190] and bound["compute_ms"] == 140
    # Accelerate's bound: 200 MB at 1 GB/s, more than eager's compute in either round.
    assert bound["accelerate_ms_by_round"] == pytest.approx([200, 200])
    # TensorTorrent streams 500 MB: at the measured 1 GB/s, 500 ms at least.
    assert bound["tensortorrent_ms_by_round"] == pytest.approx([500, 500])
    assert ratios["over_lower_bound_cold_by_round"] == pytest.approx([0.6, 1.4])
    assert bound["violations"] == {}  # the median over rounds is 1.0: within noise
    # Had it taken 300 ms in both rounds, it would have read faster than the rate allows:
    # the rate was underestimated, and the JSON says so.
    fast = {**runs, "tensortorrent": [runs["tensortorrent"][0]] * 2}
    bound = summarize_regime(fast, 10**9, 5 * 10**8, 1e9, cuda=False)["lower_bound"]
    assert set(bound["violations"]) == {"tensortorrent"}
    assert bound["check"].startswith("the disk rate is underestimated: tensortorrent")
    assert bound["violations"]["tensortorrent"]["implied_read_bytes_per_s_cold"] == (
        pytest.approx(500_000_000 / 0.3)
    )


def test_a_call_is_compared_with_its_own_reads_alone_pair_by_pair() -> None:
    # The disk ran twice as fast in round 1's second pair: each call is set against the read
    # made just before it, not against the run's best rate.
    runs = {
        "eager": [process(1, [90], [100]), process(2, [90], [100])],
        "tensortorrent": [
            process(1, [300], [300], streamed=1, paired=[(0.2, 0.22), (0.1, 0.13)]),
            process(2, [300], [300], streamed=1, paired=[(0.2, 0.2)]),
        ],
    }
    out = summarize_regime(runs, 10**9, 5 * 10**8, 1e9, cuda=False)
    tt = out["competitors"]["tensortorrent"]
    assert [r["call_over_read_alone"] for r in tt["rounds"]] == pytest.approx([1.2, 1.0])
    assert tt["call_over_read_alone"] == pytest.approx(1.1)  # the median of all three pairs
    assert tt["read_alone_ms"] == pytest.approx(200)
    ratios = out["ratios"]["tensortorrent"]
    assert ratios["call_over_read_alone_by_round"] == pytest.approx([1.2, 1.0])
    assert ratios["call_over_read_alone"] == pytest.approx(1.1)
    assert "call_over_read_alone" not in out["ratios"]["eager"]


def test_competitors_are_set_against_eager_computing_while_the_reads_run() -> None:
    # Eager's compute and the streamed reads run at once took longer than the slower of
    # the two alone (the reads took CPU time from the compute): that is the floor a
    # streamed call is set against, and where it lies against Accelerate, round by round.
    runs = {
        "eager": [
            process(1, [90], [100], overlap=[(0.1, 0.2, 0.25), (0.1, 0.2, 0.3)]),
            process(2, [90], [100], overlap=[(0.1, 0.4, 0.4)]),
        ],
        "accelerate": [process(1, [1000], [900]), process(2, [800], [900])],
        "tensortorrent": [process(1, [550], [500]), process(2, [400], [500])],
    }
    out = summarize_regime(runs, 10**9, 5 * 10**8, 1e9, cuda=False)
    eager = out["competitors"]["eager"]
    assert [r["compute_with_reads_ms"] for r in eager["rounds"]] == pytest.approx([275, 400])
    overlap = eager["overlap"]
    assert overlap["compute_with_reads_ms"] == pytest.approx(300)  # the median of all three
    assert overlap["compute_alone_ms"] == pytest.approx(100)
    assert overlap["reads_alone_ms"] == pytest.approx(200)
    assert overlap["compute_with_reads_over_slower_alone"] == pytest.approx(1.25)
    assert overlap["streamed_bytes"] == 7
    bound = out["lower_bound"]
    assert bound["compute_with_reads_ms_by_round"] == pytest.approx([275, 400])
    assert bound["compute_with_reads_over_accelerate_cold_by_round"] == pytest.approx([0.275, 0.5])
    ratios = out["ratios"]["tensortorrent"]
    assert ratios["over_compute_with_reads_cold_by_round"] == pytest.approx([2.0, 1.0])
    assert ratios["over_compute_with_reads_cold"] == pytest.approx(1.5)
    assert ratios["over_compute_with_reads_cold_pooled"] == pytest.approx(475 / 300)
    assert "over_compute_with_reads_cold" not in out["ratios"]["eager"]
    # without eager's triples (a GPU run, or no page cache to drop) there is no such figure
    runs["eager"] = [process(1, [90], [100]), process(2, [90], [100])]
    out = summarize_regime(runs, 10**9, 5 * 10**8, 1e9, cuda=False)
    assert "compute_with_reads_ms" not in out["lower_bound"]
    assert "over_compute_with_reads_cold" not in out["ratios"]["tensortorrent"]


def test_a_failed_round_fails_the_competitor() -> None:
    failed = process(2, [1], [1])
    failed["result"] = {"ok": False, "error": "RuntimeError: out of memory"}
    runs = {"eager": [process(1, [1], [1])], "accelerate": [process(1, [2], [2]), failed]}
    out = summarize_regime(runs, 10, 5, 1e9, cuda=False)
    row = out["competitors"]["accelerate"]
    assert not row["ok"] and row["errors_by_round"] == {"2": "RuntimeError: out of memory"}
    assert row["error"] == "round 2: RuntimeError: out of memory"
    assert "accelerate" not in out["ratios"]


def test_the_bound_uses_the_highest_rate_measured() -> None:
    reader = [{"round": 1, "read_bytes_per_s": 1.3e9}, {"round": 2, "read_bytes_per_s": None}]
    disk = disk_figures({"read_bytes_per_s": 1e9}, {"read_bytes_per_s": 0.8e9}, reader)
    assert disk["read_bytes_per_s"] == 1.3e9 and disk["source"] == "disk_reader_round_1"
    assert disk_figures({"read_bytes_per_s": None}, {"error": "x"})["read_bytes_per_s"] is None


def test_the_reader_reads_every_tensor_of_the_checkpoint(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    tensors = {"a": torch.randn(300, 7), "b": torch.arange(5, dtype=torch.int64)}
    safetensors.save_file(tensors, str(tmp_path / "model.safetensors"))
    measured = measure_reader(tmp_path / "model.safetensors", drop=False)
    assert measured["tensors"] == 2 and measured["tensor_bytes"] == 300 * 7 * 4 + 5 * 8
    assert [p["buffers"] for p in measured["passes"]] == ["fresh", "pooled"]
    assert all(p["bytes"] == measured["tensor_bytes"] for p in measured["passes"])
    assert measured["read_bytes_per_s"] == max(p["bytes_per_s"] for p in measured["passes"])
    missing = measure_reader(tmp_path / "missing.safetensors", drop=False)
    assert missing["read_bytes_per_s"] is None and "CheckpointError" in missing["error"]


def test_page_cache_drop_says_why_it_could_not(tmp_path: Path) -> None:
    problem = drop_page_cache(tmp_path / "missing" / "drop_caches")
    assert problem is not None and problem.startswith("page cache not dropped: cannot write")


def test_quality_checks() -> None:
    x = torch.zeros(4, 8)
    assert fp32_quality(x + 1e-6, x) == {"ok": True, "max_abs_diff": pytest.approx(1e-6)}
    off = fp32_quality(x + 1e-3, x)
    assert not off["ok"] and off["mismatch"][0] == "Tensor-likes are not close!"

    expected = torch.randn(1, 1000, 1000).bfloat16()
    same = logits_quality(expected.clone(), expected)
    assert same["ok"] and same["cosine"] == pytest.approx(1.0, abs=1e-12)
    flipped = logits_quality(-expected, expected)
    assert not flipped["ok"] and flipped["cosine"] < 0
    worst = worst_quality([logits_quality(expected, expected), flipped])
    assert not worst["ok"] and worst["calls_checked"] == 2


def test_verify_cost_bench(tmp_path: Path) -> None:
    verify_cost.main(
        [
            "--quick",
            "--no-drop",
            "--batches",
            "4",
            "--out-dir",
            str(tmp_path),
            "--results",
            str(tmp_path),
        ]
    )
    data = json.loads((tmp_path / "verify_cost.json").read_text())
    (row,) = data["results"]
    assert row["bytes_read_per_call"] > 0, "the plan reads weights from disk"
    assert len(row["ms"]["verified"]) == len(row["ms"]["unverified"]) == 2
    assert row["verify_thread_ms_per_call_median"] > 0
