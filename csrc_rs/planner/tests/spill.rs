//! Activation spill: a value the accelerator would hold across segments
//! that do not use it goes to the host and comes back for its next use.

mod common;

use common::{accelerator, host, replayed, Builder, MIB};
use tensortorrent_planner::{
    plan, simulate, simulate_spilled, Activity, CostGraph, Device, Objective, Planner, Record,
    Resource, Simulation,
};

/// A long skip connection: `skip` (32 MiB, node 1) is made first and used
/// again only by the last node; five layers in between each stream a
/// 16 MiB weight (so each is a segment of its own), the second of them
/// making a wide 48 MiB activation. Each node computes for 10 ms, longer
/// than any copy.
fn skip_graph() -> CostGraph {
    let mut b = Builder::default();
    let x = b.input(4 * MIB);
    let skip = b.node(1e10, 32 * MIB, false, &[x]);
    let mut prev = skip;
    for (k, out) in [4, 48, 4, 4, 4].into_iter().enumerate() {
        let inputs = if k == 0 { vec![skip] } else { vec![prev] };
        prev = b.node(1e10, out * MIB, false, &inputs);
        b.param(16 * MIB, &[prev]);
    }
    let last = b.node(1e10, MIB, false, &[prev, skip]);
    b.output(last);
    b.build()
}

const SKIP: usize = 1;

fn on_accelerator(g: &CostGraph) -> Vec<u32> {
    let mut d = vec![1; g.num_nodes()];
    d[0] = 0; // the graph input stays on the host
    d
}

fn devices(budget: u64) -> Vec<Device> {
    vec![host(64 * 1024 * MIB), accelerator("virtual:0", budget)]
}

fn spilled(g: &CostGraph, nodes: &[usize]) -> Vec<bool> {
    (0..g.num_nodes()).map(|x| nodes.contains(&x)).collect()
}

/// The timeline's record of `activity` for node `x`.
fn record(sim: &Simulation, activity: Activity, x: usize) -> &Record {
    sim.timeline
        .iter()
        .find(|r| r.activity == activity && r.index == x as u32)
        .unwrap_or_else(|| panic!("no {activity} of node {x}"))
}

#[test]
fn a_spilled_skip_leaves_the_accelerator_between_its_uses() {
    let g = skip_graph();
    let devs = devices(1024 * MIB);
    let nodes = on_accelerator(&g);
    let streamed = vec![true; g.num_params()];
    let kept = simulate(&g, &devs, &nodes, &streamed, 1).unwrap();
    let spill = spilled(&g, &[SKIP]);
    let sim = simulate_spilled(&g, &devs, &nodes, &streamed, &spill, 1).unwrap();
    // The widest segment no longer holds the 32 MiB skip.
    assert_eq!(kept.peak_bytes[1] - sim.peak_bytes[1], 32 * MIB);
    // Host memory holds it meanwhile.
    assert!(sim.peak_bytes[0] >= 32 * MIB);

    let (out, back) = (
        record(&sim, Activity::Spill, SKIP),
        record(&sim, Activity::Reload, SKIP),
    );
    assert_eq!(out.resource, Resource::DeviceToHost(1));
    assert_eq!(back.resource, Resource::HostToDevice(1));
    let made = record(&sim, Activity::Node, SKIP);
    let used = record(&sim, Activity::Node, g.num_nodes() - 1);
    assert!(out.start_s >= made.end_s);
    assert!(back.start_s >= out.end_s);
    assert!(used.start_s >= back.end_s);
    // Both copies cost time on their engines, nothing else.
    assert!(sim.predicted_time_s >= kept.predicted_time_s);
}

/// The skip (32 MiB, node 1) is spilled, read once more in its own segment
/// (node 2), which then makes a wide 48 MiB activation (node 3, streaming
/// a 16 MiB weight) before it returns; four more layers, then the skip's
/// last use.
fn skip_then_wide_graph() -> CostGraph {
    let mut b = Builder::default();
    let x = b.input(4 * MIB);
    let skip = b.node(1e10, 32 * MIB, false, &[x]);
    let near = b.node(1e10, 4 * MIB, false, &[skip]);
    let wide = b.node(1e10, 48 * MIB, false, &[near]);
    b.param(16 * MIB, &[wide]);
    let mut prev = wide;
    for _ in 0..4 {
        prev = b.node(1e10, 4 * MIB, false, &[prev]);
        b.param(16 * MIB, &[prev]);
    }
    let last = b.node(1e10, MIB, false, &[prev, skip]);
    b.output(last);
    b.build()
}

#[test]
fn a_spilled_value_stays_on_the_device_until_its_segment_returns() {
    // The runtime spills a value once the segment that made it returns it: a
    // spill landing early (a fast copy engine) does not free the device copy
    // while the segment still runs, so the wide activation the segment makes
    // after its last read of the skip is made beside it.
    let g = skip_then_wide_graph();
    let devs = devices(1024 * MIB);
    let nodes = on_accelerator(&g);
    let streamed = vec![true; g.num_params()];
    let sim = simulate_spilled(&g, &devs, &nodes, &streamed, &spilled(&g, &[SKIP]), 1).unwrap();
    let spill = record(&sim, Activity::Spill, SKIP);
    let wide = record(&sim, Activity::Node, 3);
    assert!(
        spill.end_s <= wide.start_s,
        "the spill landed before node 3"
    );
    // skip + its near read + the wide activation + the weight it streams
    let together = (32 + 4 + 48 + 16) * MIB;
    assert!(
        sim.peak_bytes[1] >= together,
        "peak {} MiB: the skip was freed before its segment returned",
        sim.peak_bytes[1] / MIB
    );
}

#[test]
fn the_device_waits_for_a_slow_spill_before_going_past_its_near_uses() {
    // The runtime waits for the copy out after the last segment that reads
    // the value as made, so the device copy is gone before anything later
    // allocates; the simulation keeps the device idle until then too.
    let g = skip_graph();
    let mut devs = devices(1024 * MIB);
    devs[1].d2h_bytes_per_s = 1e8; // 32 MiB out in 0.34 s, against 10 ms a node
    let nodes = on_accelerator(&g);
    let streamed = vec![true; g.num_params()];
    let sim = simulate_spilled(&g, &devs, &nodes, &streamed, &spilled(&g, &[SKIP]), 1).unwrap();
    let out = record(&sim, Activity::Spill, SKIP);
    let node = |x: usize| record(&sim, Activity::Node, x);
    // node 2 is the skip's near use; it runs while the copy is out
    assert!(node(2).start_s < out.end_s);
    for x in 3..g.num_nodes() {
        assert!(
            node(x).start_s >= out.end_s,
            "node {x} started before the spill landed"
        );
    }
}

#[test]
fn values_that_cannot_be_spilled_are_left_alone() {
    let g = skip_graph();
    let devs = devices(1024 * MIB);
    let nodes = on_accelerator(&g);
    let streamed = vec![true; g.num_params()];
    let kept = simulate(&g, &devs, &nodes, &streamed, 1).unwrap();
    // Node 2 is used by the next segment only, the input lives on the host,
    // and the last node is a graph output.
    let last = g.num_nodes() - 1;
    for x in [0, 2, last] {
        let sim = simulate_spilled(&g, &devs, &nodes, &streamed, &spilled(&g, &[x]), 1).unwrap();
        assert_eq!(sim.peak_bytes, kept.peak_bytes, "node {x}");
        assert_eq!(
            sim.predicted_time_s.to_bits(),
            kept.predicted_time_s.to_bits(),
            "node {x}"
        );
    }
    // A value also used on the host is not spilled either.
    let mut mixed = nodes.clone();
    mixed[last] = 0;
    let plain = simulate(&g, &devs, &mixed, &streamed, 1).unwrap();
    let sim = simulate_spilled(&g, &devs, &mixed, &streamed, &spilled(&g, &[SKIP]), 1).unwrap();
    assert_eq!(sim.peak_bytes, plain.peak_bytes);
}

#[test]
fn the_planner_spills_when_that_is_what_fits() {
    let g = skip_graph();
    let nodes = on_accelerator(&g);
    let streamed = vec![true; g.num_params()];
    let big = devices(1024 * MIB);
    let kept = simulate(&g, &big, &nodes, &streamed, 1).unwrap().peak_bytes[1];
    let with = simulate_spilled(&g, &big, &nodes, &streamed, &spilled(&g, &[SKIP]), 1)
        .unwrap()
        .peak_bytes[1];
    let budget = u64::midpoint(kept, with);
    let devs = devices(budget);
    let p = Planner::new(Objective::Latency)
        .with_host_compute(false)
        .run(&g, &devs)
        .expect("spilling the skip fits");
    assert!(p.chosen.ends_with("/spill"), "{}", p.chosen);
    assert!(p.value_spilled[SKIP]);
    assert_eq!(p.value_spilled.iter().filter(|&&s| s).count(), 1);
    let made = i64::from(p.node_segment[SKIP]);
    let used = i64::from(p.node_segment[g.num_nodes() - 1]);
    let reload = p.value_reload_segment[SKIP];
    assert!(
        made < reload && reload <= used,
        "{made} < {reload} <= {used}"
    );
    assert!(p.peak_bytes[1] <= budget);
    // Replayed from its decisions, the plan comes back the same.
    let again = replayed(
        &Planner::new(Objective::Latency).with_host_compute(false),
        &g,
        &devs,
        &p,
    )
    .unwrap();
    assert_eq!(again.plan_hash, p.plan_hash);
    assert_eq!(again.value_reload_segment, p.value_reload_segment);
    // With room to hold it, nothing is spilled.
    let roomy = plan(&g, &devices(kept), Objective::Latency, false).unwrap();
    assert!(roomy.value_spilled.iter().all(|&s| !s), "{}", roomy.chosen);
}

#[test]
fn a_value_used_next_and_much_later_is_reloaded_for_the_later_use() {
    // The first layer's 32 MiB output feeds the second layer (the next
    // segment) and the last node: the device holds it for the second
    // layer, then drops it until the reload for the last node.
    let mut b = Builder::default();
    let x = b.input(4 * MIB);
    let first = b.node(1e10, 32 * MIB, false, &[x]);
    b.param(16 * MIB, &[first]);
    let mut prev = first;
    for out in [4, 48, 4, 4, 4] {
        prev = b.node(1e10, out * MIB, false, &[prev]);
        b.param(16 * MIB, &[prev]);
    }
    let last = b.node(1e10, MIB, false, &[prev, first]);
    b.output(last);
    let g = b.build();
    let devs = devices(1024 * MIB);
    let nodes = on_accelerator(&g);
    let streamed = vec![true; g.num_params()];
    let kept = simulate(&g, &devs, &nodes, &streamed, 1).unwrap();
    let sim = simulate_spilled(&g, &devs, &nodes, &streamed, &spilled(&g, &[1]), 1).unwrap();
    assert_eq!(kept.peak_bytes[1] - sim.peak_bytes[1], 32 * MIB);

    let budget = u64::midpoint(kept.peak_bytes[1], sim.peak_bytes[1]);
    let p = Planner::new(Objective::Latency)
        .with_host_compute(false)
        .run(&g, &devices(budget))
        .expect("spilling fits");
    assert!(p.value_spilled[1], "{}", p.chosen);
    // reloaded after its use by the second layer, before the last node
    let second = i64::from(p.node_segment[2]);
    let reload = p.value_reload_segment[1];
    assert!(second < reload && reload <= i64::from(p.node_segment[last as usize]));
    assert!(p.peak_bytes[1] <= budget);
}
