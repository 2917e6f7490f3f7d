//! The candidate families: where each kind of graph ends up, and the
//! search's limits and report.

mod common;

use std::time::Duration;

use common::{
    accelerator, host, mlp, replayed, replayed_candidate, single_stays, Builder, KIB, MIB,
};
use tensortorrent_planner::{
    plan, Device, Family, Objective, Plan, PlanError, Planner, StopReason,
};

const GIB: u64 = 1024 * MIB;

/// A deep MLP: an input of `batch` rows of 4096 fp32, then 16 linear layers
/// of 4096x4096 fp32 weights (64 MiB each), every layer reading its weight
/// and activations through device memory.
fn deep_mlp(batch: u64) -> tensortorrent_planner::CostGraph {
    let width = 4096u64;
    let act = batch * width * 4;
    let weight = width * width * 4;
    let mut b = Builder::default();
    let mut prev = b.input(act);
    let mut bytes = vec![act];
    for _ in 0..16 {
        prev = b.node((2 * batch * width * width) as f64, act, false, &[prev]);
        b.param(weight, &[prev]);
        bytes.push(weight + 2 * act);
    }
    b.output(prev);
    b.build().with_node_bytes_accessed(bytes).unwrap()
}

/// A host of 100 GFLOP/s and 20 GB/s memory, and a 10 TFLOP/s accelerator
/// with 256 MiB and a slow 2 GB/s link.
fn small_accelerator_slow_link() -> Vec<Device> {
    let mut cpu = host(64 * GIB);
    cpu.flops_per_s = 1e11;
    cpu.mem_bytes_per_s = 2e10;
    let mut acc = accelerator("virtual:0", 256 * MIB);
    acc.flops_per_s = 1e13;
    acc.mem_bytes_per_s = 1e12;
    acc.h2d_bytes_per_s = 2e9;
    acc.d2h_bytes_per_s = 2e9;
    vec![cpu, acc]
}

fn count_on(p: &Plan, device: u32) -> usize {
    p.node_device.iter().filter(|&&d| d == device).count()
}

#[test]
fn deep_mlp_with_a_small_accelerator_and_slow_link_runs_on_the_host() {
    let devices = small_accelerator_slow_link();
    for batch in [1, 4, 16] {
        let g = deep_mlp(batch);
        let p = plan(&g, &devices, Objective::Latency, true).unwrap();
        // No weight crosses the slow link: the layers whose weights fit the
        // accelerator for good may run there, every other one on the host.
        assert_eq!(
            p.param_streamed,
            vec![false; 16],
            "batch {batch}: {}",
            p.chosen
        );
        let resident: u64 = (0..16)
            .filter(|&q| p.param_device[q] == 1)
            .map(|q| g.param_bytes()[q])
            .sum();
        assert!(resident <= 256 * MIB, "batch {batch}");
        assert!(count_on(&p, 0) >= 13, "batch {batch}: {:?}", p.node_device);
        // Streaming 64 MiB over 2 GB/s per layer costs ~34 ms; the host
        // reads it from memory in ~3.4 ms.
        let streamed = p
            .candidates
            .iter()
            .find(|c| c.name == "all-on-virtual:0/streamed")
            .unwrap();
        assert!(streamed.predicted_time_s > 5.0 * p.predicted_time_s);
        // With no room for a single layer, everything runs on the host.
        let mut tiny = devices.clone();
        tiny[1].budget_bytes = 48 * MIB;
        let q = plan(&g, &tiny, Objective::Latency, true).unwrap();
        assert_eq!(
            q.node_device,
            vec![0; g.num_nodes()],
            "batch {batch}: {}",
            q.chosen
        );
        // Memory-bound on the host: the lower bound is the host's traffic.
        let traffic = 16.0 * (64 * MIB) as f64 / 2e10;
        assert!(q.lower_bound_s >= traffic, "batch {batch}");
    }
}

#[test]
fn compute_heavy_graph_with_the_same_budget_streams_to_the_accelerator() {
    let devices = small_accelerator_slow_link();
    let g = deep_mlp(2048);
    let p = plan(&g, &devices, Objective::Latency, true).unwrap();
    assert_eq!(count_on(&p, 1), 16, "{}", p.chosen);
    // 1 GiB of weights through a 256 MiB budget: most of them stream.
    let streamed = p.param_streamed.iter().filter(|&&s| s).count();
    assert!(streamed >= 12, "{streamed} streamed");
    assert!(p.peak_bytes[1] <= 256 * MIB);
    let on_host = p
        .candidates
        .iter()
        .find(|c| c.name == "all-on-cpu")
        .unwrap();
    assert!(on_host.predicted_time_s > 5.0 * p.predicted_time_s);
}

/// Twelve 1 MiB layers over a fast accelerator with room for eight and a
/// slow one with room for four; copies are far too slow to stream.
fn unequal_pair() -> (tensortorrent_planner::CostGraph, Vec<Device>) {
    let g = mlp(12, MIB, 4 * KIB, 1e9, false);
    let mut fast = accelerator("fast", 8 * MIB + 64 * KIB);
    fast.flops_per_s = 2e12;
    let mut slow = accelerator("slow", 4 * MIB + 64 * KIB);
    slow.flops_per_s = 1e12;
    for d in [&mut fast, &mut slow] {
        d.h2d_bytes_per_s = 1e7;
        d.d2h_bytes_per_s = 1e7;
    }
    (g, vec![host(GIB), fast, slow])
}

#[test]
fn unequal_accelerators_get_unequal_segments() {
    let (g, devices) = unequal_pair();
    let p = plan(&g, &devices, Objective::Latency, false).unwrap();
    let (fast, slow) = (count_on(&p, 1), count_on(&p, 2));
    assert!(
        fast > slow && slow > 0,
        "fast {fast}, slow {slow}: {}",
        p.chosen
    );
    assert_eq!(fast + slow, 12);
    assert_eq!(p.param_streamed, vec![false; 12]);
    // Each device runs one contiguous segment.
    assert_eq!(p.segment_device.len(), 3, "{:?}", p.node_segment);
    let segments = p
        .candidates
        .iter()
        .find(|c| c.family == Family::Segments)
        .expect("the segments family proposes the split");
    assert!(segments.feasible);
    for name in ["all-on-fast", "all-on-slow"] {
        let single = p.candidates.iter().find(|c| c.name.starts_with(name));
        assert!(single.is_none_or(|c| c.predicted_time_s > 2.0 * p.predicted_time_s));
    }
}

#[test]
fn memory_bound_stretches_move_to_the_host() {
    // Eight compute-heavy layers with small weights, then eight layers with
    // large weights and little work: the accelerator keeps the first eight,
    // the host computes the rest rather than wait for their weights.
    let mut b = Builder::default();
    let mut prev = b.input(64 * KIB);
    let mut bytes = vec![0];
    for i in 0..16 {
        let (flops, weight) = if i < 8 {
            (1e11, 256 * KIB)
        } else {
            (1e6, 64 * MIB)
        };
        prev = b.node(flops, 64 * KIB, false, &[prev]);
        b.param(weight, &[prev]);
        bytes.push(weight);
    }
    b.output(prev);
    let g = b.build().with_node_bytes_accessed(bytes).unwrap();
    let devices = small_accelerator_slow_link();
    let p = plan(&g, &devices, Objective::Latency, true).unwrap();
    assert_eq!(&p.node_device[1..9], &[1; 8], "{}", p.chosen);
    // No weight is streamed: the large layers run on the host, but for the
    // few whose weights the budget holds for good.
    assert_eq!(p.param_streamed, vec![false; 16], "{}", p.chosen);
    let large_on_host = p.node_device[9..].iter().filter(|&&d| d == 0).count();
    assert!(large_on_host >= 5, "{:?}", p.node_device);
    for single in ["all-on-cpu", "all-on-virtual:0/streamed"] {
        let c = p.candidates.iter().find(|c| c.name == single).unwrap();
        assert!(c.predicted_time_s > 1.5 * p.predicted_time_s, "{single}");
    }
    // The host-stretches family proposes it without local search.
    let constructive = Planner::new(Objective::Latency)
        .with_node_limit(0)
        .run(&g, &devices)
        .unwrap();
    let stretches = constructive
        .candidates
        .iter()
        .find(|c| c.family == Family::HostStretches)
        .expect("a host-stretches candidate");
    assert!(stretches.feasible);
    let streamed = constructive
        .candidates
        .iter()
        .find(|c| c.name == "all-on-virtual:0/streamed")
        .unwrap();
    assert!(stretches.predicted_time_s < 0.5 * streamed.predicted_time_s);
    assert!(constructive.predicted_time_s < 1.2 * p.predicted_time_s);
}

#[test]
fn every_candidate_names_its_family() {
    let (g, devices) = unequal_pair();
    let p = plan(&g, &devices, Objective::Latency, true).unwrap();
    for c in &p.candidates {
        let expected = if c.name == "local-search" {
            Family::LocalSearch
        } else if c.name == "segments" {
            Family::Segments
        } else if c.name.starts_with("host-stretches/") {
            Family::HostStretches
        } else if c.name.contains("/knapsack") {
            Family::Knapsack
        } else {
            Family::SingleDevice
        };
        assert_eq!(c.family, expected, "{}", c.name);
    }
    assert_eq!(Family::HostStretches.to_string(), "host-stretches");
}

#[test]
fn node_limit_bounds_local_search_only() {
    let (g, devices) = unequal_pair();
    let full = Planner::new(Objective::Latency)
        .with_node_limit(u64::MAX)
        .run(&g, &devices)
        .unwrap();
    assert_eq!(full.report.stop_reason, StopReason::Saturated);
    assert!(full
        .report
        .to_string()
        .starts_with("searched all families: "));

    let bounded = Planner::new(Objective::Latency)
        .with_node_limit(0)
        .run(&g, &devices)
        .unwrap();
    assert_eq!(bounded.report.stop_reason, StopReason::NodeLimit(0));
    assert!(bounded
        .candidates
        .iter()
        .all(|c| c.family != Family::LocalSearch));
    assert!(bounded
        .candidates
        .iter()
        .any(|c| c.family == Family::Segments));
    assert!(bounded.report.candidates_simulated < full.report.candidates_simulated);
    assert_eq!(
        bounded.report.nodes_simulated,
        bounded.report.candidates_simulated * g.num_nodes() as u64
    );
    assert!(
        bounded.report.to_string().starts_with(&format!(
            "node limit 0 reached after {} candidates",
            bounded.report.candidates_simulated
        )),
        "{}",
        bounded.report
    );
}

#[test]
fn time_limit_keeps_the_single_device_family() {
    let (g, devices) = unequal_pair();
    let p = Planner::new(Objective::Latency)
        .with_time_limit(Duration::ZERO)
        .run(&g, &devices)
        .unwrap();
    assert_eq!(p.report.stop_reason, StopReason::TimeLimit(Duration::ZERO));
    assert!(p
        .candidates
        .iter()
        .all(|c| c.family == Family::SingleDevice));
    assert!(p
        .report
        .to_string()
        .starts_with("time limit 0 ms reached after "));
}

#[test]
fn search_is_deterministic_and_options_are_hashed() {
    let (g, devices) = unequal_pair();
    let a = plan(&g, &devices, Objective::Latency, true).unwrap();
    let b = plan(&g, &devices, Objective::Latency, true).unwrap();
    assert_eq!(a, b);
    let deeper = Planner::new(Objective::Latency)
        .with_prefetch_depth(2)
        .run(&g, &devices)
        .unwrap();
    assert_ne!(deeper.plan_hash, a.plan_hash);
    let err = Planner::new(Objective::Latency)
        .with_prefetch_depth(0)
        .run(&g, &devices)
        .unwrap_err();
    assert!(err.to_string().contains("prefetch_depth"), "{err}");
    let err = Planner::new(Objective::Memory)
        .with_memory_slack(-0.5)
        .run(&g, &devices)
        .unwrap_err();
    assert!(err.to_string().contains("memory_slack"), "{err}");
}

#[test]
fn deeper_prefetch_issues_earlier_and_holds_more() {
    // Every weight streamed: with two segments of lookahead each copy is
    // issued one segment earlier, with one more buffer alive.
    let g = mlp(8, MIB, 4 * KIB, 1e10, false);
    let devices = vec![host(GIB), accelerator("acc", GIB)];
    let on_acc: Vec<u32> = (0..9).map(|v| u32::from(v > 0)).collect();
    let one = tensortorrent_planner::simulate(&g, &devices, &on_acc, &[true; 8], 1).unwrap();
    let two = tensortorrent_planner::simulate(&g, &devices, &on_acc, &[true; 8], 2).unwrap();
    assert_eq!(two.peak_bytes[1] - one.peak_bytes[1], MIB);
    let copy_start = |sim: &tensortorrent_planner::Simulation, q: u32| {
        sim.timeline
            .iter()
            .find(|r| r.activity == tensortorrent_planner::Activity::Param && r.index == q)
            .unwrap()
            .start_s
    };
    assert!(copy_start(&two, 2) < copy_start(&one, 2));

    // The plan says which segment issues each prefetch.
    let tight = vec![host(GIB), accelerator("acc", 5 * MIB / 2)];
    let p = plan(&g, &tight, Objective::Latency, false).unwrap();
    assert_eq!(p.param_streamed, vec![true; 8]);
    let (issue, first, _) = single_stays(&p);
    assert_eq!(first, (1..=8).collect::<Vec<i64>>());
    assert_eq!(issue, [-1, 1, 2, 3, 4, 5, 6, 7]);
    let deeper = Planner::new(Objective::Latency)
        .with_host_compute(false)
        .with_prefetch_depth(2)
        .run(&g, &[host(GIB), accelerator("acc", 7 * MIB / 2)])
        .unwrap();
    assert_eq!(deeper.param_streamed, vec![true; 8]);
    assert_eq!(deeper.stream_issue_segment, [-1, -1, 1, 2, 3, 4, 5, 6]);
}

/// `deep_mlp(16)` with every weight's home disk, and a host with a budget of half the
/// weights, 100 GFLOP/s, 20 GB/s of memory bandwidth and a 1 GB/s disk.
fn deep_mlp_on_disk() -> (tensortorrent_planner::CostGraph, Device) {
    let g = deep_mlp(16)
        .with_param_home(vec![tensortorrent_planner::Tier::Disk; 16])
        .unwrap();
    let mut cpu = host(GIB / 2);
    cpu.flops_per_s = 1e11;
    cpu.mem_bytes_per_s = 2e10;
    cpu.disk_bytes_per_s = 1e9;
    (g, cpu)
}

#[test]
fn host_keeps_what_fits_of_disk_parameters_and_reads_the_rest() {
    // 1 GiB of weights on disk, a host budget of half that: the host keeps
    // about half in memory and reads the others each run.
    let (g, cpu) = deep_mlp_on_disk();
    let p = Planner::new(Objective::Latency).run(&g, &[cpu]).unwrap();
    assert_eq!(p.chosen, "all-on-cpu/knapsack", "{:?}", p.candidates);
    assert!(p.peak_bytes[0] <= GIB / 2);
    let resident = p.param_streamed.iter().filter(|&&s| !s).count();
    assert!((5..=7).contains(&resident), "{resident} resident");
    let streamed = p
        .candidates
        .iter()
        .find(|c| c.name == "all-on-cpu/streamed")
        .unwrap();
    assert!(p.predicted_time_s < streamed.predicted_time_s);
}

#[test]
fn a_read_issued_to_an_idle_disk_costs_its_fixed_latency_too() {
    // The same candidates replayed with each disk read's fixed cost at 10 ms:
    // reading each weight when its segment starts (the disk idle each time)
    // pays it on every read; prefetching queues reads behind one another,
    // which overlap it, so it pays less. A latency of 0 plans as before.
    let (g, cpu) = deep_mlp_on_disk();
    let planner = Planner::new(Objective::Latency);
    let base = planner.run(&g, std::slice::from_ref(&cpu)).unwrap();
    let mut slow = cpu.clone();
    slow.disk_latency_s = 0.01;
    let extra = |name: &str| {
        let c = base.candidates.iter().find(|c| c.name == name).unwrap();
        let again = replayed_candidate(&planner, &g, &[slow.clone()], c).unwrap();
        assert_ne!(again.plan_hash, c.plan_hash, "the latency is hashed");
        let reads = c.param_streamed.iter().filter(|&&s| s).count() as f64;
        (again.predicted_time_s - c.predicted_time_s, reads)
    };
    let sync = format!("all-on-cpu/knapsack{}", tensortorrent_planner::SYNC_SUFFIX);
    let (sync_extra, sync_reads) = extra(&sync);
    assert!(
        (sync_extra - 0.01 * sync_reads).abs() < 1e-9,
        "{sync_extra} {sync_reads}"
    );
    let (ahead_extra, ahead_reads) = extra("all-on-cpu/knapsack");
    assert!(
        ahead_extra > 0.0 && ahead_extra < 0.01 * ahead_reads,
        "{ahead_extra}"
    );
    let again = planner.run(&g, &[cpu]).unwrap();
    assert_eq!(again.plan_hash, base.plan_hash);
    slow.disk_latency_s = f64::NAN;
    assert!(planner.run(&g, &[slow]).is_err());
}

#[test]
fn every_candidate_replays_from_its_decisions_to_its_hash() {
    // What lets a caller run a candidate other than the chosen one (the
    // bench that checks the choice against measured times does).
    let (g, cpu) = deep_mlp_on_disk();
    let planner = Planner::new(Objective::Latency);
    let p = planner.run(&g, std::slice::from_ref(&cpu)).unwrap();
    let feasible: Vec<_> = p.candidates.iter().filter(|c| c.feasible).collect();
    assert!(feasible.len() > 2, "{:?}", p.candidates);
    let chosen = p.candidates.iter().find(|c| c.name == p.chosen).unwrap();
    assert_eq!(chosen.plan_hash, p.plan_hash);
    for c in feasible {
        let again = replayed_candidate(&planner, &g, std::slice::from_ref(&cpu), c).unwrap();
        assert_eq!(again.plan_hash, c.plan_hash, "{}", c.name);
        assert!(
            (again.predicted_time_s - c.predicted_time_s).abs() < 1e-12,
            "{}",
            c.name
        );
    }
}

#[test]
fn a_tight_host_budget_reads_synchronously_to_keep_one_more_weight() {
    // Room for 7 weights and one read buffer, not two: reading each weight
    // when its layer starts keeps 7 in memory and reads 9, where a double
    // buffer keeps 6 and reads 10. With little compute to hide reads behind
    // (a batch of 4), the synchronous plan is faster.
    let g = deep_mlp(4)
        .with_param_home(vec![tensortorrent_planner::Tier::Disk; 16])
        .unwrap();
    let weight = 4096 * 4096 * 4;
    let mut cpu = host(8 * weight + 4 * MIB);
    cpu.flops_per_s = 1e11;
    cpu.mem_bytes_per_s = 2e10;
    cpu.disk_bytes_per_s = 1e9;
    let devs = [cpu];
    let p = Planner::new(Objective::Latency).run(&g, &devs).unwrap();
    let sync = format!("all-on-cpu/knapsack{}", tensortorrent_planner::SYNC_SUFFIX);
    assert_eq!(p.chosen, sync, "{:?}", p.candidates);
    assert_eq!(p.prefetch_depth, 0);
    assert_eq!(p.param_streamed.iter().filter(|&&s| !s).count(), 7);
    assert!(p.peak_bytes[0] <= 8 * weight + 4 * MIB);
    // each streamed weight is read when the segment using it starts
    let (issue, first, _) = single_stays(&p);
    for q in 0..16 {
        if p.param_streamed[q] {
            assert_eq!(issue[q], first[q]);
        }
    }
    // replaying the choice (the plan cache does) gives the same plan
    let again = replayed(
        &Planner::new(Objective::Latency),
        &g,
        &[host(8 * weight + 4 * MIB)],
        &p,
    )
    .unwrap();
    assert_eq!(again.prefetch_depth, 0);
    assert_eq!(again.stream_issue_segment, p.stream_issue_segment);
    // The recorded depth, not the name, makes it synchronous: with the same
    // devices the same plan and hash; under another name the same reads;
    // at depth 1 the reads are issued ahead again.
    let planner = Planner::new(Objective::Latency);
    let replay = |name: &str, depth: u32| {
        planner.replay(
            &g,
            &devs,
            name,
            &p.node_device,
            &p.param_streamed,
            &p.value_spilled,
            depth,
            0,
        )
    };
    let same = replay(&p.chosen, p.prefetch_depth).unwrap();
    assert_eq!(same.plan_hash, p.plan_hash);
    assert_eq!(
        same.predicted_time_s.to_bits(),
        p.predicted_time_s.to_bits()
    );
    let relabelled = replay("x", 0).unwrap();
    assert_eq!(relabelled.stream_issue_segment, p.stream_issue_segment);
    assert_ne!(relabelled.plan_hash, p.plan_hash, "the name is hashed");
    match replay(&p.chosen, 1) {
        Ok(ahead) => assert_ne!(ahead.stream_issue_segment, p.stream_issue_segment),
        Err(e) => assert!(matches!(e, PlanError::Infeasible { .. }), "{e}"),
    }
}
