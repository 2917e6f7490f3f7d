//! Candidate search, residency, segments, simulation and choice.

mod common;

use std::time::Instant;

use common::{accelerator, host, machine, mlp, replayed, single_stays, stays, Builder, KIB, MIB};
use tensortorrent_planner::{plan, Device, Held, Objective, Plan, PlanError, Planner};

fn candidate<'a>(p: &'a Plan, name: &str) -> &'a tensortorrent_planner::Candidate {
    p.candidates
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no candidate {name} in {:?}", p.candidates))
}

fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "{actual} != {expected}"
    );
}

#[test]
fn big_budget_keeps_every_param_resident_in_one_segment() {
    let g = mlp(8, MIB, 4 * KIB, 1e9, true);
    let p = plan(&g, &machine(1 << 30), Objective::Latency, false).unwrap();
    assert_eq!(p.chosen, "all-on-virtual:0");
    assert_eq!(
        p.node_device[0], 0,
        "the input placeholder stays on the host"
    );
    assert!(p.node_device[1..].iter().all(|&d| d == 1));
    assert_eq!(p.param_streamed, vec![false; 8]);
    assert_eq!(p.param_device, vec![1; 8]);
    assert!(p.stream_param.is_empty());
    assert_eq!(p.segment_device, vec![0, 1]);
    assert!(p.node_segment[1..].iter().all(|&s| s == 1));
    assert!(
        p.peak_bytes[1] >= 8 * MIB && p.peak_bytes[1] < 9 * MIB,
        "{:?}",
        p.peak_bytes
    );
    assert!(p.candidates.iter().all(|c| c.name != "all-on-cpu"));
}

#[test]
fn small_budget_streams_one_layer_per_segment() {
    // Streaming needs two 1 MiB buffers (current and next layer); 3.5 MiB
    // leaves room for exactly one resident layer, the first.
    let budget = 7 * MIB / 2;
    let g = mlp(8, MIB, 4 * KIB, 1e9, true);
    let p = plan(&g, &machine(budget), Objective::Latency, false).unwrap();
    assert_eq!(p.chosen, "all-on-virtual:0");
    assert!(p.peak_bytes[1] <= budget);
    assert!(p.peak_bytes[1] > 3 * MIB, "{:?}", p.peak_bytes);
    let mut streamed = vec![true; 8];
    streamed[0] = false;
    assert_eq!(p.param_streamed, streamed);
    // Segment 0: the input; 1: L0 R0 L1 R1 (only L1 streams); then one per layer.
    let expected_segments: Vec<u32> = [0, 1, 1, 1, 1]
        .into_iter()
        .chain((2..=7).flat_map(|s| [s, s]))
        .collect();
    assert_eq!(p.node_segment, expected_segments);
    assert_eq!(
        p.segment_device,
        [0].into_iter().chain([1; 7]).collect::<Vec<_>>()
    );
    let mut prefetch: Vec<i64> = (0..8).collect();
    prefetch[0] = -1;
    let (_, first, last) = single_stays(&p);
    assert_eq!(first, prefetch);
    assert_eq!(last, prefetch);
}

#[test]
fn tight_budget_streams_everything() {
    let budget = 5 * MIB / 2;
    let g = mlp(8, MIB, 4 * KIB, 1e9, true);
    let p = plan(&g, &machine(budget), Objective::Latency, false).unwrap();
    assert_eq!(p.param_streamed, vec![true; 8]);
    assert!(p.peak_bytes[1] <= budget && p.peak_bytes[1] > 2 * MIB);
    let expected: Vec<u32> = [0]
        .into_iter()
        .chain((1..=8).flat_map(|s| [s, s]))
        .collect();
    assert_eq!(p.node_segment, expected);
    let (_, first, last) = single_stays(&p);
    assert_eq!(first, (1..=8).collect::<Vec<i64>>());
    assert_eq!(last, (1..=8).collect::<Vec<i64>>());
    // The greedy keeps everything streamed: only the streamed candidate is
    // listed, once.
    assert_eq!(p.chosen, "all-on-virtual:0/streamed");
    assert!(p.candidates.iter().all(|c| c.name != "all-on-virtual:0"));
}

#[test]
fn a_param_used_again_after_a_gap_stays_once_per_run_of_uses() {
    // Six linears with 1 MiB weights except the last (3 MiB); `shared` (1 MiB)
    // is used by layers 1 and 3. Streaming peaks at 4 MiB around the last
    // layers: making anything resident would exceed 4.5 MiB, so everything
    // streams.
    let mut b = Builder::default();
    let mut prev = b.input(4 * KIB);
    let mut layers = Vec::new();
    for i in 0..6 {
        prev = b.node(1e9, 4 * KIB, false, &[prev]);
        b.param(if i == 5 { 3 * MIB } else { MIB }, &[prev]);
        layers.push(prev);
    }
    let shared = b.param(MIB, &[layers[3], layers[1]]) as usize;
    b.output(prev);
    let g = b.build();
    let budget = 9 * MIB / 2;
    let p = plan(&g, &machine(budget), Objective::Latency, false).unwrap();
    assert_eq!(p.param_streamed, vec![true; 7]);
    assert!(p.peak_bytes[1] <= budget && p.peak_bytes[1] >= 4 * MIB);
    // One segment per layer after the input's.
    assert_eq!(p.node_segment, vec![0, 1, 2, 3, 4, 5, 6]);
    // `shared` leaves after layer 1 (segment 2) and comes back for layer 3
    // (segment 4), prefetched when segment 3 starts, after its eviction.
    let per_param = stays(&p);
    assert_eq!(per_param[shared], vec![(1, 2, 2), (3, 4, 4)]);
    for (s, layer) in (1i64..).zip(&per_param[..6]) {
        assert_eq!(layer, &vec![(if s == 1 { -1 } else { s - 1 }, s, s)]);
    }
}

#[test]
fn a_param_used_at_both_ends_is_not_held_in_between() {
    // A 4 MiB weight used by the first and the last of six layers (a tied
    // embedding); the four between use 2 MiB each. Held from its first use to
    // its last, the weight and two buffers of the middle layers need 8 MiB;
    // evicted after the first layer and prefetched again for the last, 6 MiB
    // (itself beside one 2 MiB buffer) do.
    let mut b = Builder::default();
    let mut prev = b.input(4 * KIB);
    let mut layers = Vec::new();
    for i in 0..6 {
        prev = b.node(1e9, 4 * KIB, false, &[prev]);
        if (1..5).contains(&i) {
            b.param(2 * MIB, &[prev]);
        }
        layers.push(prev);
    }
    let tied = b.param(4 * MIB, &[layers[0], layers[5]]) as usize;
    b.output(prev);
    let g = b.build();
    let budget = 7 * MIB;
    let p = plan(&g, &machine(budget), Objective::Latency, false).unwrap();
    assert!(p.param_streamed[tied]);
    assert!(p.peak_bytes[1] <= budget, "{:?}", p.peak_bytes);
    let per_param = stays(&p);
    assert_eq!(per_param[tied].len(), 2, "{:?}", per_param[tied]);
    let (first, second) = (per_param[tied][0], per_param[tied][1]);
    assert_eq!((first.1, first.2), (1, 1));
    assert_eq!((second.1, second.2), (6, 6));
    assert!(second.0 > first.2, "prefetched again after its eviction");
}

#[test]
fn streaming_overlaps_prefetch_with_compute() {
    // x (host) -> L0(W0) -> L1(W1): 1 ms per weight copy, 2 ms per layer,
    // zero-byte activations and no latency, so the timeline is exact:
    // W0 [0, 1], L0 [1, 3] (W1 prefetched [1, 2]), L1 [3, 5].
    let mut b = Builder::default();
    let x = b.input(0);
    let l0 = b.node(2e9, 0, false, &[x]);
    let l1 = b.node(2e9, 0, false, &[l0]);
    b.param(1000, &[l0]);
    b.param(1000, &[l1]);
    b.output(l1);
    let g = b.build();
    let devices = [
        Device {
            latency_s: 0.0,
            ..host(1 << 30)
        },
        Device {
            flops_per_s: 1e12,
            h2d_bytes_per_s: 1e6,
            d2h_bytes_per_s: 1e6,
            latency_s: 0.0,
            ..accelerator("acc", 2000)
        },
    ];
    let p = plan(&g, &devices, Objective::Latency, false).unwrap();
    let streamed = candidate(&p, "all-on-acc/streamed");
    assert_close(streamed.predicted_time_s, 0.005);
    assert_eq!(streamed.peak_bytes[1], 2000);
    // Both weights fit resident: no copies before L0.
    assert_eq!(p.param_streamed, vec![false, false]);
    assert_close(p.predicted_time_s, 0.004);
    assert_eq!(p.peak_bytes, vec![2000, 2000]);
}

#[test]
fn host_only_nodes_stay_on_the_host_and_transfers_count() {
    // x (host) -> L0 (acc, W0) -> H (host only) -> L1 (acc, W1) -> output.
    let mut b = Builder::default();
    let input = b.input(1000);
    let l0 = b.node(1e9, 1000, false, &[input]);
    let on_host = b.node(1e6, 1000, true, &[l0]);
    let l1 = b.node(1e9, 1000, false, &[on_host]);
    b.param(1000, &[l0]);
    b.param(1000, &[l1]);
    b.output(l1);
    let g = b.build();
    let devices = [
        Device {
            flops_per_s: 1e9,
            latency_s: 0.0,
            ..host(1 << 30)
        },
        Device {
            flops_per_s: 1e12,
            h2d_bytes_per_s: 1e6,
            d2h_bytes_per_s: 1e6,
            latency_s: 0.0,
            ..accelerator("acc", 1 << 30)
        },
    ];
    let p = plan(&g, &devices, Objective::Latency, false).unwrap();
    assert_eq!(p.node_device, vec![0, 1, 0, 1]);
    assert_eq!(p.node_segment, vec![0, 1, 2, 3]);
    assert_eq!(p.segment_device, vec![0, 1, 0, 1]);
    // x->acc [0,1] ms, L0 [1,2], L0->host [2,3], H [3,4], H->acc [4,5],
    // L1 [5,6], output->host [6,7]: 7 ms, of which 4 are copies.
    assert_close(p.predicted_time_s, 0.007);
    // Accelerator: both weights, plus L0's input and output while it runs
    // (or H's copy and L1's output later).
    assert_eq!(p.peak_bytes[1], 4000);
    // Host: both weights, plus L0's copy and H's output while H runs.
    assert_eq!(p.peak_bytes[0], 4000);
}

#[test]
fn host_compute_flag_controls_the_host_candidate() {
    let g = mlp(4, MIB, 4 * KIB, 1e9, true);
    let without = plan(&g, &machine(1 << 30), Objective::Latency, false).unwrap();
    let names: Vec<&str> = without.candidates.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["all-on-virtual:0", "all-on-virtual:0/streamed"]);
    let with = plan(&g, &machine(1 << 30), Objective::Latency, true).unwrap();
    let names: Vec<&str> = with.candidates.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "all-on-virtual:0",
            "all-on-virtual:0/streamed",
            "all-on-cpu"
        ]
    );
    // The host candidate runs everything on the host and streams nothing.
    let host_only = candidate(&with, "all-on-cpu");
    assert!(host_only.feasible);
    assert_eq!(host_only.peak_bytes[1], 0);
}

#[test]
fn slow_accelerator_loses_to_the_host() {
    let g = mlp(4, MIB, 4 * KIB, 1e9, true);
    let devices = vec![
        host(1 << 40),
        Device {
            flops_per_s: 1e3,
            ..accelerator("virtual:0", 1 << 30)
        },
    ];
    let p = plan(&g, &devices, Objective::Latency, true).unwrap();
    assert_eq!(p.chosen, "all-on-cpu");
    assert_eq!(p.node_device, vec![0; g.num_nodes()]);
    assert_eq!(p.segment_device, vec![0]);
    assert_eq!(p.param_device, vec![0; 4]);
    assert_eq!(p.param_streamed, vec![false; 4]);
    assert!(p.predicted_time_s < candidate(&p, "all-on-virtual:0").predicted_time_s);
    // Without host compute the slow accelerator is the only choice.
    let forced = plan(&g, &devices, Objective::Latency, false).unwrap();
    assert_eq!(forced.chosen, "all-on-virtual:0");
}

#[test]
fn absurdly_slow_devices_give_infinite_times_not_panics() {
    let g = mlp(4, MIB, 4 * KIB, 1e9, true);
    let devices = vec![
        host(1 << 40),
        Device {
            flops_per_s: 1e-300,
            h2d_bytes_per_s: 1e-300,
            ..accelerator("virtual:0", 1 << 30)
        },
    ];
    let p = plan(&g, &devices, Objective::Memory, true).unwrap();
    assert_eq!(p.chosen, "all-on-cpu");
    assert!(candidate(&p, "all-on-virtual:0")
        .predicted_time_s
        .is_infinite());
    let forced = plan(&g, &devices, Objective::Latency, false).unwrap();
    assert!(forced.predicted_time_s.is_infinite());
}

#[test]
fn memory_objective_takes_streaming_within_the_slack() {
    // Compute-bound layers (1 ms each) hide their 0.1 ms weight copies.
    let g = mlp(8, MIB, 4 * KIB, 1e9, true);
    let devices = machine(1 << 30);
    let fast = plan(&g, &devices, Objective::Latency, true).unwrap();
    assert_eq!(fast.chosen, "all-on-virtual:0");
    assert_eq!(fast.param_streamed, vec![false; 8]);
    let lean = plan(&g, &devices, Objective::Memory, true).unwrap();
    assert_eq!(lean.chosen, "all-on-virtual:0/streamed");
    assert_eq!(lean.param_streamed, vec![true; 8]);
    assert!(lean.predicted_time_s <= 1.10 * fast.predicted_time_s);
    assert!(lean.predicted_time_s > fast.predicted_time_s);
    assert!(lean.peak_bytes[1] < fast.peak_bytes[1] / 2);
    // The host needs no accelerator memory but is far outside the slack.
    assert!(candidate(&lean, "all-on-cpu").predicted_time_s > 1.10 * fast.predicted_time_s);
    let throughput = plan(&g, &devices, Objective::Throughput, true).unwrap();
    assert_eq!(throughput.chosen, fast.chosen);
}

#[test]
fn memory_objective_keeps_the_fastest_when_streaming_is_slow() {
    // Copy-bound layers: each 1 MiB copy takes 10 ms, each layer 1 ms.
    let g = mlp(8, MIB, 4 * KIB, 1e9, true);
    let devices = vec![
        host(1 << 40),
        Device {
            h2d_bytes_per_s: 1e8,
            ..accelerator("virtual:0", 1 << 30)
        },
    ];
    let lean = plan(&g, &devices, Objective::Memory, false).unwrap();
    assert_eq!(lean.chosen, "all-on-virtual:0");
}

#[test]
fn infeasible_reports_the_all_streamed_peak_which_then_works() {
    let g = mlp(8, MIB, 4 * KIB, 1e9, true);
    let err = plan(&g, &machine(KIB), Objective::Latency, false).unwrap_err();
    let PlanError::Infeasible {
        message,
        min_budgets,
        peaks,
        split,
    } = &err
    else {
        panic!("expected Infeasible, got {err:?}");
    };
    assert_eq!(min_budgets.len(), 1);
    let (name, needed) = &min_budgets[0];
    assert_eq!(name, "virtual:0");
    let reference = plan(&g, &machine(1 << 30), Objective::Latency, false).unwrap();
    assert_eq!(
        *needed,
        candidate(&reference, "all-on-virtual:0/streamed").peak_bytes[1]
    );
    assert!(
        message.contains("(closest: all-on-virtual:0/streamed)"),
        "{message}"
    );
    assert!(
        message.contains("virtual:0 needs at least 2.0"),
        "{message}"
    );
    assert!(message.contains("MiB (budget is 1.00 KiB)"), "{message}");
    assert!(
        message.contains("raise the budget of virtual:0"),
        "{message}"
    );
    assert!(message.contains("allow host compute"), "{message}");
    assert!(message.contains("add a device"), "{message}");
    assert_eq!(err.to_string(), *message);
    // at its peak the device holds the buffers of two layers' weights (one in
    // use, the next prefetched) and activations, no resident weight
    assert!(!split);
    assert_eq!(peaks.len(), 1);
    let peak = &peaks[0];
    assert_eq!((peak.device, peak.bytes), (1, *needed));
    assert!(peak.resident.is_empty(), "{peak:?}");
    let weights: Vec<u64> = peak
        .live
        .iter()
        .filter(|l| l.0 == Held::Weight)
        .map(|l| l.2)
        .collect();
    assert_eq!(weights, vec![MIB, MIB], "{peak:?}");
    let values: u64 = peak
        .live
        .iter()
        .filter(|l| l.0 == Held::Value)
        .map(|l| l.2)
        .sum();
    assert_eq!(2 * MIB + values, *needed, "{peak:?}");
    assert!(peak.reached_by.is_some());

    let p = plan(&g, &machine(*needed), Objective::Latency, false).unwrap();
    assert!(p.peak_bytes[1] <= *needed);
    assert_eq!(p.param_streamed, vec![true; 8]);
    // One byte less is not enough.
    assert!(plan(&g, &machine(*needed - 1), Objective::Latency, false).is_err());
}

#[test]
fn infeasible_host_budget_is_reported() {
    let g = mlp(4, MIB, 4 * KIB, 1e9, true);
    let devices = vec![host(MIB), accelerator("virtual:0", 1 << 30)];
    let err = plan(&g, &devices, Objective::Latency, true).unwrap_err();
    let PlanError::Infeasible {
        message,
        min_budgets,
        peaks,
        ..
    } = err
    else {
        panic!("expected Infeasible");
    };
    assert_eq!(min_budgets.len(), 1, "{min_budgets:?}");
    assert_eq!(min_budgets[0].0, "cpu");
    assert!(
        min_budgets[0].1 >= 4 * MIB,
        "the host always holds every param"
    );
    assert!(message.contains("cpu needs at least 4.0"), "{message}");
    // the host holds every weight for the whole run (their home is host memory)
    assert_eq!(peaks.len(), 1);
    assert_eq!(peaks[0].device, 0);
    assert_eq!(peaks[0].resident, vec![0, 1, 2, 3]);
    assert!(!message.contains("allow host compute"), "{message}");
    let raised = vec![host(min_budgets[0].1), accelerator("virtual:0", 1 << 30)];
    plan(&g, &raised, Objective::Latency, true).unwrap();
}

#[test]
fn no_accelerator_and_no_host_compute_is_infeasible() {
    let g = mlp(2, KIB, KIB, 1e6, false);
    let err = plan(&g, &[host(1 << 30)], Objective::Latency, false).unwrap_err();
    let PlanError::Infeasible {
        message,
        min_budgets,
        ..
    } = err
    else {
        panic!("expected Infeasible");
    };
    assert!(min_budgets.is_empty());
    assert!(message.contains("allow host compute"), "{message}");
    let p = plan(&g, &[host(1 << 30)], Objective::Latency, true).unwrap();
    assert_eq!(p.chosen, "all-on-cpu");
}

#[test]
fn two_accelerators_each_get_candidates() {
    let g = mlp(4, MIB, 4 * KIB, 1e9, true);
    let devices = vec![
        host(1 << 40),
        Device {
            flops_per_s: 1e11,
            ..accelerator("slow", 1 << 30)
        },
        accelerator("fast", 1 << 30),
    ];
    let p = plan(&g, &devices, Objective::Latency, false).unwrap();
    let names: Vec<&str> = p.candidates.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "all-on-slow",
            "all-on-slow/streamed",
            "all-on-fast",
            "all-on-fast/streamed"
        ]
    );
    assert_eq!(p.chosen, "all-on-fast");
    assert_eq!(p.param_device, vec![2; 4]);
    assert_eq!(p.peak_bytes[1], 0);
}

#[test]
fn plans_and_hashes_are_deterministic() {
    let g = mlp(8, MIB, 4 * KIB, 1e9, true);
    let devices = machine(7 * MIB / 2);
    let a = plan(&g, &devices, Objective::Latency, true).unwrap();
    let b = plan(&g, &devices, Objective::Latency, true).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.plan_hash.len(), 16);
    assert!(a
        .plan_hash
        .chars()
        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));

    let other_graph = mlp(8, MIB, 4 * KIB, 2e9, true);
    let c = plan(&other_graph, &devices, Objective::Latency, true).unwrap();
    assert_ne!(a.plan_hash, c.plan_hash);
    let other_objective = plan(&g, &devices, Objective::Throughput, true).unwrap();
    assert_eq!(other_objective.chosen, a.chosen);
    assert_ne!(a.plan_hash, other_objective.plan_hash);
    let other_budget = plan(&g, &machine(7 * MIB / 2 + 1), Objective::Latency, true).unwrap();
    assert_ne!(a.plan_hash, other_budget.plan_hash);
}

#[test]
fn plan_hash_is_pinned() {
    // The encoding is part of the contract: caches keyed by it survive
    // rebuilds and platforms. Change this value only on purpose.
    let g = mlp(2, KIB, 64, 1e6, true);
    let p = plan(&g, &machine(1 << 20), Objective::Latency, true).unwrap();
    assert_eq!(p.plan_hash, "ac2d972283400d24");
}

#[test]
fn ten_thousand_node_chain_plans_quickly() {
    // 5000 linears + 5000 ReLUs + the input: 10 001 nodes, 5000 params.
    let g = mlp(5000, MIB, 64 * KIB, 1e9, true);
    assert_eq!(g.num_nodes(), 10_001);
    let limit = if cfg!(debug_assertions) { 30.0 } else { 1.0 };
    for budget in [1 << 40, 2500 * MIB, 3 * MIB] {
        let start = Instant::now();
        let p = plan(&g, &machine(budget), Objective::Latency, false).unwrap();
        let took = start.elapsed().as_secs_f64();
        assert!(took < limit, "budget {budget}: planning took {took:.3} s");
        assert!(p.peak_bytes[1] <= budget);
        let resident = p.param_streamed.iter().filter(|&&s| !s).count();
        match budget {
            b if b == 1 << 40 => assert_eq!(resident, 5000),
            b if b == 3 * MIB => assert_eq!(resident, 0),
            _ => assert!((2400..2500).contains(&resident), "{resident} resident"),
        }
    }
}

#[test]
fn replaying_the_chosen_placement_gives_the_same_plan_without_search() {
    let g = common::mlp(6, 4 << 20, 1 << 16, 1e9, true);
    let devices = common::machine(10 << 20);
    let planner = Planner::new(Objective::Latency);
    let searched = planner.run(&g, &devices).expect("feasible");
    let replayed = replayed(&planner, &g, &devices, &searched).expect("the chosen placement fits");
    assert_eq!(replayed.plan_hash, searched.plan_hash);
    assert_eq!(replayed.node_segment, searched.node_segment);
    assert_eq!(replayed.stream_issue_segment, searched.stream_issue_segment);
    assert!((replayed.predicted_time_s - searched.predicted_time_s).abs() < 1e-12);
    assert_eq!(replayed.report.candidates_simulated, 1);
    let all_resident = vec![false; searched.param_streamed.len()];
    let too_big = planner.replay(
        &g,
        &devices,
        "x",
        &searched.node_device,
        &all_resident,
        &[],
        1,
        0,
    );
    let Err(PlanError::Infeasible {
        message,
        min_budgets,
        ..
    }) = too_big
    else {
        panic!("keeping every weight resident cannot fit: {too_big:?}");
    };
    // what the given placement needs, not what a search could have found
    assert!(
        message.starts_with("the replayed plan x does not fit the memory budgets: "),
        "{message}"
    );
    let device = &devices[1].name;
    assert!(
        message.contains(&format!("{device} needs at least")),
        "{message}"
    );
    assert!(
        min_budgets.iter().any(|(name, _)| name == device),
        "{min_budgets:?}"
    );
}
