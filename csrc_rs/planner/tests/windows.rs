//! Prefetch windows: a large weight read as early as the memory it needs is
//! free, rather than one segment ahead.

mod common;

use common::{host, replayed, single_stays, Builder, MIB};
use tensortorrent_planner::{CostGraph, Device, Objective, Planner, Tier, WINDOW_PREFIX};

/// Four blocks, each a 32 MiB weight (10 ms of compute) then three layers
/// of 1 MiB weights (20 ms each); every weight on disk.
fn blocks() -> CostGraph {
    let mut b = Builder::default();
    let mut prev = b.input(64 * 1024);
    for _ in 0..4 {
        prev = b.node(1e9, 64 * 1024, false, &[prev]);
        b.param(32 * MIB, &[prev]);
        for _ in 0..3 {
            prev = b.node(2e9, 64 * 1024, false, &[prev]);
            b.param(MIB, &[prev]);
        }
    }
    b.output(prev);
    let g = b.build();
    let homes = vec![Tier::Disk; g.num_params()];
    g.with_param_home(homes).unwrap()
}

/// A host of 100 GFLOP/s reading 1 GB/s from disk, with room for one
/// large weight and a few small ones, not two large ones.
fn cpu() -> Device {
    let mut cpu = host(48 * MIB);
    cpu.flops_per_s = 1e11;
    cpu.disk_bytes_per_s = 1e9;
    cpu
}

#[test]
fn a_window_hides_large_reads_behind_the_layers_before_them() {
    let g = blocks();
    let p = Planner::new(Objective::Latency).run(&g, &[cpu()]).unwrap();
    assert!(p.chosen.contains(WINDOW_PREFIX), "{:?}", p.candidates);
    let window = p.prefetch_window_bytes;
    assert!(window > 0);
    assert!(p.peak_bytes[0] <= 48 * MIB);
    let double = p
        .candidates
        .iter()
        .filter(|c| c.feasible && !c.name.contains(WINDOW_PREFIX))
        .map(|c| c.predicted_time_s)
        .fold(f64::INFINITY, f64::min);
    // Each of the last three large reads (33.5 ms) hides behind the three
    // small layers before it (60 ms) instead of one (20 ms).
    assert!(
        p.predicted_time_s < double - 0.03,
        "{} vs {double}",
        p.predicted_time_s
    );

    // The large weights are read right after the previous one is evicted.
    let (issue, first, last) = single_stays(&p);
    for big in [4, 8, 12] {
        assert!(p.param_streamed[big]);
        assert!(issue[big] <= last[big - 4] + 1, "weight {big}");
        assert!(issue[big] < first[big] - 1, "weight {big}");
    }
    // Buffers held at once never exceed the window.
    let bytes = g.param_bytes();
    let segments = i64::try_from(p.segment_device.len()).unwrap();
    for s in 0..segments {
        let held: u64 = (0..g.num_params())
            .filter(|&q| p.param_streamed[q])
            .filter(|&q| {
                let from = issue[q].max(0);
                from <= s && s <= last[q]
            })
            .map(|q| bytes[q])
            .sum();
        assert!(held <= window, "segment {s}: {held} > {window}");
    }

    // Replayed from its decisions (the recorded depth and window), the plan
    // comes back the same.
    let again = replayed(&Planner::new(Objective::Latency), &g, &[cpu()], &p).unwrap();
    assert_eq!(again.plan_hash, p.plan_hash);
    assert_eq!(again.prefetch_window_bytes, window);
    assert_eq!(again.stream_issue_segment, p.stream_issue_segment);
    // The name is only a label: the recorded window issues the prefetches.
    let replay = |name: &str, window: u64| {
        Planner::new(Objective::Latency)
            .replay(
                &g,
                &[cpu()],
                name,
                &p.node_device,
                &p.param_streamed,
                &p.value_spilled,
                p.prefetch_depth,
                window,
            )
            .unwrap()
    };
    let relabelled = replay("x", window);
    assert_eq!(relabelled.stream_issue_segment, p.stream_issue_segment);
    assert_eq!(relabelled.prefetch_window_bytes, window);
    let unwindowed = replay(&p.chosen, 0);
    assert_eq!(unwindowed.prefetch_window_bytes, 0);
    assert_ne!(unwindowed.stream_issue_segment, p.stream_issue_segment);
    assert_ne!(unwindowed.plan_hash, p.plan_hash);
}

#[test]
fn an_explicit_depth_gets_no_windows() {
    let g = blocks();
    let p = Planner::new(Objective::Latency)
        .with_prefetch_depth(2)
        .run(&g, &[cpu()]);
    if let Ok(p) = p {
        assert!(p.candidates.iter().all(|c| !c.name.contains(WINDOW_PREFIX)));
        assert_eq!(p.prefetch_window_bytes, 0);
    }
}

/// A 16 MiB embedding then forty layers of 1 MiB weights, every weight on
/// disk, little compute: bound by its reads.
fn embedding_then_layers() -> CostGraph {
    let mut b = Builder::default();
    let mut prev = b.input(64 * 1024);
    prev = b.node(1e6, 64 * 1024, false, &[prev]);
    b.param(16 * MIB, &[prev]);
    for _ in 0..40 {
        prev = b.node(1e6, 64 * 1024, false, &[prev]);
        b.param(MIB, &[prev]);
    }
    b.output(prev);
    let g = b.build();
    let homes = vec![Tier::Disk; g.num_params()];
    g.with_param_home(homes).unwrap()
}

#[test]
fn the_room_a_resident_weight_leaves_keeps_more_resident() {
    // With everything streamed the embedding's buffer sets the peak (17 MiB
    // with its neighbour's), which leaves 23 MiB of a 40 MiB budget for
    // resident weights: the embedding and seven layers. Resident, the
    // embedding needs no buffer, and the layers still read need a few MiB
    // of buffers: the room that leaves keeps about twenty layers.
    let g = embedding_then_layers();
    let mut cpu = host(40 * MIB);
    cpu.disk_bytes_per_s = 1e9;
    let p = Planner::new(Objective::Latency).run(&g, &[cpu]).unwrap();
    let knapsack = p
        .candidates
        .iter()
        .find(|c| c.name == "all-on-cpu/knapsack")
        .unwrap();
    assert!(knapsack.peak_bytes[0] <= 40 * MIB);
    assert!(!knapsack.param_streamed[0], "the embedding is resident");
    let resident = knapsack.param_streamed.iter().filter(|&&s| !s).count();
    assert!(
        resident >= 19,
        "{resident} resident: the embedding and 18 layers at least"
    );
}

#[test]
fn a_window_too_narrow_to_issue_anything_earlier_is_not_listed_again() {
    // Eight 16 MiB weights with 8 KiB biases, half of them in a budget of
    // half: the narrow windows of a few biases issue every read where the
    // double buffer does, so they are the knapsack's plan again, listed once.
    let mut b = Builder::default();
    let mut prev = b.input(128 * 1024);
    for _ in 0..8 {
        prev = b.node(1e9, 128 * 1024, false, &[prev]);
        b.param(16 * MIB, &[prev]);
        b.param(8 * 1024, &[prev]);
    }
    b.output(prev);
    let g = b.build();
    let homes = vec![Tier::Disk; g.num_params()];
    let g = g.with_param_home(homes).unwrap();
    let mut cpu = host(64 * MIB);
    cpu.flops_per_s = 1e11;
    cpu.disk_bytes_per_s = 1e9;
    let planner = Planner::new(Objective::Latency);
    let p = planner.run(&g, std::slice::from_ref(&cpu)).unwrap();
    let windowed: Vec<_> = p
        .candidates
        .iter()
        .filter(|c| c.name.contains(WINDOW_PREFIX))
        .collect();
    for c in windowed {
        let plain = tensortorrent_planner::Candidate {
            prefetch_window_bytes: 0,
            ..c.clone()
        };
        let with = common::replayed_candidate(&planner, &g, std::slice::from_ref(&cpu), c);
        let without = common::replayed_candidate(&planner, &g, std::slice::from_ref(&cpu), &plain);
        assert_ne!(
            with.unwrap().stream_issue_segment,
            without.unwrap().stream_issue_segment,
            "{} issues as the double buffer does",
            c.name
        );
    }
}
