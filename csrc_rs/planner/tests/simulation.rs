//! The simulator on its own: memory traffic, disk reads, resources, the
//! timeline, and the checks on placements given from outside.

mod common;

use common::{accelerator, host, mlp, Builder, KIB, MIB};
use tensortorrent_planner::{
    exhaustive, simulate, Activity, CostGraph, Device, PlanError, Record, Resource, Simulation,
    Tier,
};

fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs().max(1e-12),
        "{actual} != {expected}"
    );
}

/// x (host, 1 kB) -> L0(W0, 1 MB) -> L1(W1, 1 MB) -> output, exact rates
/// and no latency.
fn two_layers() -> CostGraph {
    let mut b = Builder::default();
    let x = b.input(1000);
    let l0 = b.node(1e9, 1000, false, &[x]);
    let l1 = b.node(1e9, 1000, false, &[l0]);
    b.param(1_000_000, &[l0]);
    b.param(1_000_000, &[l1]);
    b.output(l1);
    b.build()
}

fn exact_devices() -> Vec<Device> {
    let mut cpu = host(1 << 30);
    cpu.flops_per_s = 1e9;
    cpu.latency_s = 0.0;
    let mut acc = accelerator("acc", 1 << 30);
    acc.flops_per_s = 1e12;
    acc.h2d_bytes_per_s = 1e9;
    acc.d2h_bytes_per_s = 1e9;
    acc.latency_s = 0.0;
    vec![cpu, acc]
}

fn records(timeline: &[Record], activity: Activity) -> Vec<Record> {
    timeline
        .iter()
        .copied()
        .filter(|r| r.activity == activity)
        .collect()
}

#[test]
fn memory_traffic_bounds_node_time() {
    let g = two_layers();
    let mut devices = exact_devices();
    let all_host = [0, 0, 0];
    let compute = simulate(&g, &devices, &all_host, &[false; 2], 1).unwrap();
    assert_close(compute.predicted_time_s, 2.0);
    // 4 GB of traffic per layer at 1 GB/s: 4 s each, slower than compute.
    let g = g
        .with_node_bytes_accessed(vec![0, 4_000_000_000, 1000])
        .unwrap();
    devices[0].mem_bytes_per_s = 1e9;
    let traffic = simulate(&g, &devices, &all_host, &[false; 2], 1).unwrap();
    assert_close(traffic.predicted_time_s, 4.0 + 1.0);
    assert_close(traffic.lower_bound_s, 5.0);
    assert_eq!(
        traffic.busy_s[0],
        (Resource::Compute(0), traffic.lower_bound_s)
    );
}

#[test]
fn a_nodes_rate_class_selects_its_devices_rate() {
    let mut devices = exact_devices();
    let all_host = [0, 0, 0];
    let base = simulate(&two_layers(), &devices, &all_host, &[false; 2], 1).unwrap();
    assert_close(base.predicted_time_s, 2.0);
    // The second layer is of class 2, which the host runs 4x faster; class 1
    // (the first listed) is not used, and a class past the list runs at
    // flops_per_s.
    devices[0].class_flops_per_s = vec![1.0, devices[0].flops_per_s * 4.0];
    let g = two_layers().with_node_rate_class(vec![0, 0, 2]).unwrap();
    let faster = simulate(&g, &devices, &all_host, &[false; 2], 1).unwrap();
    assert_close(faster.predicted_time_s, 1.0 + 0.25);
    let g = two_layers().with_node_rate_class(vec![0, 3, 3]).unwrap();
    let unlisted = simulate(&g, &devices, &all_host, &[false; 2], 1).unwrap();
    assert_close(unlisted.predicted_time_s, 2.0);
    assert!(two_layers().with_node_rate_class(vec![0]).is_err());
    devices[0].class_flops_per_s = vec![0.0];
    assert!(simulate(&g, &devices, &all_host, &[false; 2], 1).is_err());
}

#[test]
fn busy_fractions_and_lower_bound_follow_the_timeline() {
    // All streamed: W0 [0, 1] ms, x [1, 1.001], L0 [1.001, 2.001], W1
    // prefetched [1.001, 2.001] behind x, L1 [2.001, 3.001], out back.
    let g = two_layers();
    let devices = exact_devices();
    let sim = simulate(&g, &devices, &[0, 1, 1], &[true, true], 1).unwrap();
    let out_back = 1e-6;
    assert_close(sim.predicted_time_s, 0.003_001 + out_back);
    let h2d = sim
        .busy_s
        .iter()
        .find(|(r, _)| *r == Resource::HostToDevice(1))
        .unwrap()
        .1;
    assert_close(h2d, 0.002 + 1e-6);
    assert_close(sim.lower_bound_s, h2d);
    let fractions = sim.busy_fraction();
    assert_eq!(
        fractions.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        [
            Resource::Compute(0),
            Resource::Compute(1),
            Resource::HostToDevice(1),
            Resource::DeviceToHost(1)
        ]
    );
    assert_close(fractions[2].1, h2d / sim.predicted_time_s);
    let names: Vec<String> = fractions.iter().map(|(r, _)| r.name(&devices)).collect();
    assert_eq!(names, ["cpu", "acc", "cpu->acc", "acc->cpu"]);
    assert_eq!(Resource::Disk.name(&devices), "disk->cpu");

    let nodes = records(&sim.timeline, Activity::Node);
    assert_eq!(nodes.len(), 3);
    let params = records(&sim.timeline, Activity::Param);
    assert_eq!(params.len(), 2);
    for (q, r) in params.iter().enumerate() {
        assert_eq!((r.resource, r.index), (Resource::HostToDevice(1), q as u32));
        assert!(r.end_s <= nodes[q + 1].start_s + 1e-15);
    }
    let outputs = records(&sim.timeline, Activity::Output);
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].resource, Resource::DeviceToHost(1));
    assert_close(outputs[0].end_s, sim.predicted_time_s);
    assert_eq!(Activity::Value.to_string(), "value");
}

#[test]
fn disk_parameters_are_read_into_host_staging() {
    // W0 lives on disk (read at 0.5 GB/s), W1 in host memory.
    let g = two_layers()
        .with_param_home(vec![Tier::Disk, Tier::Host])
        .unwrap();
    let mut devices = exact_devices();
    devices[0].disk_bytes_per_s = 5e8;
    let sim = simulate(&g, &devices, &[0, 1, 1], &[true, true], 1).unwrap();
    let params = records(&sim.timeline, Activity::Param);
    let read = params
        .iter()
        .find(|r| r.resource == Resource::Disk)
        .unwrap();
    assert_eq!(read.index, 0);
    assert_close(read.end_s - read.start_s, 0.002);
    let copy = params
        .iter()
        .find(|r| r.resource == Resource::HostToDevice(1) && r.index == 0)
        .unwrap();
    assert!(copy.start_s >= read.end_s);
    // The host holds W1 for good, W0 while it is staged, and the input
    // until its copy (queued behind W0's) is done.
    assert_eq!(sim.peak_bytes[0], 2_000_000 + 1000);
    assert!(sim.busy_s.iter().any(|&(r, _)| r == Resource::Disk));

    // Resident on the accelerator, a disk parameter never touches the host.
    let resident = simulate(&g, &devices, &[0, 1, 1], &[false, false], 1).unwrap();
    assert_eq!(resident.peak_bytes[0], 1_000_000 + 1000);
    assert!(records(&resident.timeline, Activity::Param).is_empty());

    // Host nodes stream a disk parameter into host memory and drop it after.
    let on_host = simulate(&g, &devices, &[0, 0, 0], &[true, false], 1).unwrap();
    let reads = records(&on_host.timeline, Activity::Param);
    assert_eq!(reads.len(), 1);
    assert_eq!(reads[0].resource, Resource::Disk);
    assert_close(on_host.predicted_time_s, 0.002 + 2.0);
    // Not streamed, it is held in host memory for the whole run.
    let held = simulate(&g, &devices, &[0, 0, 0], &[false, false], 1).unwrap();
    assert!(records(&held.timeline, Activity::Param).is_empty());
    assert_eq!(held.peak_bytes[0], 2_000_000 + 1000 + 1000);
}

#[test]
fn flags_of_parameters_that_cannot_stream_are_ignored() {
    let g = two_layers();
    let devices = exact_devices();
    let a = simulate(&g, &devices, &[0, 0, 0], &[true, true], 1).unwrap();
    let b = simulate(&g, &devices, &[0, 0, 0], &[false, false], 1).unwrap();
    assert_eq!(a, b);
}

#[test]
fn placements_from_outside_are_checked() {
    let g = two_layers();
    let devices = exact_devices();
    let placement_error =
        |nodes: &[u32], params: &[bool]| match simulate(&g, &devices, nodes, params, 1) {
            Err(PlanError::InvalidPlacement(msg)) => msg,
            other => panic!("expected InvalidPlacement, got {other:?}"),
        };
    assert_eq!(
        placement_error(&[0, 1], &[false, false]),
        "node_device has 2 entries but the graph has 3 nodes"
    );
    assert_eq!(
        placement_error(&[0, 1, 1], &[false]),
        "param_streamed has 1 entries but the graph has 2 params"
    );
    assert_eq!(
        placement_error(&[0, 1, 2], &[false, false]),
        "node_device[2] = 2 is out of range for 2 devices"
    );
    assert_eq!(
        placement_error(&[1, 1, 1], &[false, false]),
        "node 0 is host-only but node_device[0] = 1 (\"acc\")"
    );
    let err = simulate(&g, &devices, &[0, 1, 1], &[false, false], 0).unwrap_err();
    assert!(matches!(err, PlanError::InvalidOptions(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "invalid option: prefetch_depth is 0; it must be at least 1 (1 is a double buffer)"
    );
    let err = simulate(&g, &devices[1..], &[0, 0, 0], &[false, false], 1).unwrap_err();
    assert!(matches!(err, PlanError::InvalidDevices(_)), "{err:?}");
}

#[test]
fn exhaustive_search_is_bounded_and_finds_the_optimum() {
    let g = two_layers();
    let devices = exact_devices();
    let best = exhaustive(&g, &devices, true, 1, 100).unwrap().unwrap();
    // Both layers on the accelerator with both weights resident.
    assert_eq!(best.node_device, vec![0, 1, 1]);
    assert_eq!(best.param_streamed, vec![false, false]);
    // 4 placements with no accelerator param, 2 + 2 with one, 4 with both.
    assert_eq!(best.placements, 1 + 2 + 2 + 4);
    let err = exhaustive(&g, &devices, true, 1, 8).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid option: exhaustive search could simulate 16 placements, over the limit of 8"
    );
    // Nothing fits a 1 kB accelerator without host compute.
    let mut small = devices.clone();
    small[1].budget_bytes = KIB;
    assert_eq!(exhaustive(&g, &small, false, 1, 100).unwrap(), None);
    small[1].budget_bytes = 3 * MIB;
    assert!(exhaustive(&g, &small, false, 1, 100).unwrap().is_some());
}

#[test]
fn each_op_a_node_runs_pays_the_fixed_cost() {
    let mut devices = exact_devices();
    devices[0].latency_s = 0.5;
    let all_host = [0, 0, 0];
    // By default a node that computes pays one fixed cost, the input none.
    let base = simulate(&two_layers(), &devices, &all_host, &[false; 2], 1).unwrap();
    assert_close(base.predicted_time_s, 2.0 + 2.0 * 0.5);
    // Set per node: the input runs nothing, the first layer three ops (a
    // view and two kernels, say), the second one.
    let g = two_layers().with_node_ops(vec![0, 3, 1]).unwrap();
    let ops = simulate(&g, &devices, &all_host, &[false; 2], 1).unwrap();
    assert_close(ops.predicted_time_s, 2.0 + 4.0 * 0.5);
    // A view computes and moves nothing but is still called.
    let mut b = Builder::default();
    let x = b.input(1000);
    let view = b.node(0.0, 1000, false, &[x]);
    b.output(view);
    let g = b.build().with_node_ops(vec![0, 1]).unwrap();
    let view_only = simulate(&g, &devices, &[0, 0], &[], 1).unwrap();
    assert_close(view_only.predicted_time_s, 0.5);
    assert!(matches!(
        two_layers().with_node_ops(vec![1, 1]),
        Err(PlanError::InvalidGraph(_))
    ));
}

#[test]
fn a_node_of_a_class_with_a_fixed_cost_pays_it_for_all_its_ops() {
    let mut devices = exact_devices();
    devices[0].latency_s = 0.5;
    // Class 1 (the first layer's) costs 0.25 s, all its ops together; class
    // 2 is not listed.
    devices[0].class_latency_s = vec![0.25];
    let g = two_layers()
        .with_node_rate_class(vec![0, 1, 2])
        .unwrap()
        .with_node_ops(vec![0, 3, 1])
        .unwrap();
    let sim = simulate(&g, &devices, &[0, 0, 0], &[false; 2], 1).unwrap();
    // The first layer: its class's 0.25 for its three ops; the second: the
    // device's 0.5 for its one; the input nothing.
    assert_close(node_seconds(&sim, 1), 1.0 + 0.25);
    assert_close(node_seconds(&sim, 2), 1.0 + 0.5);
    assert_close(sim.predicted_time_s, 2.0 + 0.25 + 0.5);
    // The planner's hash tells the two fixed costs apart.
    let hash = |devices: &[Device]| {
        tensortorrent_planner::plan(&g, devices, tensortorrent_planner::Objective::Latency, true)
            .unwrap()
            .plan_hash
    };
    let mut other = devices.clone();
    other[0].class_latency_s = vec![0.3];
    assert_ne!(hash(&devices), hash(&other));
}

#[test]
fn a_segment_pays_the_cold_cost_once_for_each_kind_of_op_it_runs() {
    let mut devices = exact_devices();
    devices[0].cold_latency_s = 0.25;
    devices[1].cold_latency_s = 0.5;
    // both layers run the same kind of op (0), the input none
    let g = two_layers()
        .with_node_kinds(&[vec![], vec![0], vec![0]])
        .unwrap();
    // One segment on the host: its first layer runs kind 0 cold, the second warm.
    let host = simulate(&g, &devices, &[0, 0, 0], &[false; 2], 1).unwrap();
    assert_close(node_seconds(&host, 1), 1.0 + 0.25);
    assert_close(node_seconds(&host, 2), 1.0);
    // The second layer in a segment of its own, on the accelerator: cold there too.
    let split = simulate(&g, &devices, &[0, 0, 1], &[false; 2], 1).unwrap();
    assert_close(node_seconds(&split, 1), 1.0 + 0.25);
    assert_close(node_seconds(&split, 2), 1e-3 + 0.5);
    // No cold cost: the kinds change nothing, and the hash tells the two apart.
    let warm = exact_devices();
    let plain = simulate(&g, &warm, &[0, 0, 0], &[false; 2], 1).unwrap();
    assert_close(plain.predicted_time_s, 2.0);
    let hash = |g: &CostGraph, devices: &[Device]| {
        tensortorrent_planner::plan(g, devices, tensortorrent_planner::Objective::Latency, true)
            .unwrap()
            .plan_hash
    };
    assert_eq!(hash(&g, &warm), hash(&two_layers(), &warm));
    assert_ne!(hash(&g, &devices), hash(&g, &warm));
}

/// `two_layers` run on the host (`exact_devices`, as `host` sets its disk)
/// with both weights on disk, streamed, and both reads issued at the start
/// (depth 2).
fn both_read_from_disk(host: impl FnOnce(&mut Device)) -> Simulation {
    let g = two_layers()
        .with_param_home(vec![Tier::Disk, Tier::Disk])
        .unwrap();
    let mut devices = exact_devices();
    host(&mut devices[0]);
    simulate(&g, &devices, &[0, 0, 0], &[true, true], 2).unwrap()
}

/// How long node `x` ran in `sim`.
fn node_seconds(sim: &Simulation, x: u32) -> f64 {
    let r = records(&sim.timeline, Activity::Node)
        .into_iter()
        .find(|r| r.index == x)
        .unwrap();
    r.end_s - r.start_s
}

#[test]
fn a_queued_read_hides_its_fixed_cost_behind_the_transfer_before_it() {
    // Both weights (1 MB each) on disk at 1 GB/s: 1 ms of transfer each,
    // the second read issued while the first is still in flight.
    let disk_reads = |latency: f64| {
        let sim = both_read_from_disk(|host| {
            host.disk_bytes_per_s = 1e9;
            host.disk_latency_s = latency;
        });
        let mut reads = records(&sim.timeline, Activity::Param);
        reads.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        assert_eq!(reads.len(), 2);
        assert!(reads[1].start_s >= reads[0].end_s - 1e-12, "{reads:?}");
        reads
            .iter()
            .map(|r| r.end_s - r.start_s)
            .collect::<Vec<_>>()
    };
    // a fixed cost under the transfer before it: the first read pays it,
    // the second hides it
    let short = disk_reads(0.0005);
    assert_close(short[0], 0.0015);
    assert_close(short[1], 0.001);
    // a fixed cost past it (reads of a few KiB, whose hand-offs run one
    // after the other): the second pays what the transfer did not hide
    let long = disk_reads(0.003);
    assert_close(long[0], 0.004);
    assert_close(long[1], 0.001 + 0.002);
}

#[test]
fn a_segment_issues_its_prefetches_before_waiting_for_its_own_read() {
    // Three layers (1 s of compute each) on the host, their weights (1 MB
    // each) on disk at 0.5 MB/s (2 s a read) with a fixed cost of 0.5 s,
    // one segment ahead (depth 1): W0 and W1 are issued at the start, W2
    // when L1's segment starts. As the runtime does, L1's segment issues W2
    // once the host is free (L0 done at 3.5 s), before it waits for W1
    // (in flight until 4.5 s): W2 queues behind W1 and hides its fixed cost.
    let g = mlp(3, 1_000_000, 1000, 1e9, false)
        .with_param_home(vec![Tier::Disk; 3])
        .unwrap();
    let mut devices = exact_devices();
    devices[0].disk_bytes_per_s = 5e5;
    devices[0].disk_latency_s = 0.5;
    let sim = simulate(&g, &devices, &[0, 0, 0, 0], &[true; 3], 1).unwrap();
    let mut reads = records(&sim.timeline, Activity::Param);
    reads.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let spans: Vec<(f64, f64)> = reads.iter().map(|r| (r.start_s, r.end_s)).collect();
    assert_eq!(spans.len(), 3, "{spans:?}");
    assert_close(spans[0].1, 2.5);
    assert_close(spans[1].1, 4.5);
    assert_close(spans[2].0, 4.5);
    assert_close(spans[2].1, 6.5);
    assert_close(node_seconds(&sim, 3), 1.0);
    assert_close(sim.predicted_time_s, 7.5);
}

#[test]
fn host_compute_is_slowed_only_while_reads_run() {
    // Both weights (1 MB each) on disk at 1 GB/s, both reads issued at the
    // start (depth 2): the disk is busy until 2 ms. L0 starts at 1 ms, once
    // W0 is in; its first wall millisecond, overlapping W1's read, does half
    // a millisecond of its work at half speed; L1 runs with the disk idle.
    let run = |slowdown: f64| {
        let sim = both_read_from_disk(|host| {
            host.disk_bytes_per_s = 1e9;
            host.read_slowdown = slowdown;
        });
        (
            node_seconds(&sim, 1),
            node_seconds(&sim, 2),
            sim.predicted_time_s,
        )
    };
    let (l0, l1, total) = run(1.0);
    assert_close(l0, 1.0);
    assert_close(l1, 1.0);
    assert_close(total, 2.001);
    let (l0, l1, total) = run(2.0);
    assert_close(l0, 0.001 + (1.0 - 0.0005));
    assert_close(l1, 1.0);
    assert_close(total, 2.0015);
}

#[test]
fn a_node_run_wholly_under_reads_is_slowed_throughout() {
    // At 0.5 MB/s W1's read keeps the disk busy for 2 s after W0's: all of
    // L0's 1 s of work, slowed to 1.5 s, overlaps it.
    let sim = both_read_from_disk(|host| {
        host.disk_bytes_per_s = 5e5;
        host.read_slowdown = 1.5;
    });
    assert_close(node_seconds(&sim, 1), 1.5);
}

/// A view owns no memory but keeps its base's storage alive: a small slice
/// of a large value, read late, holds the whole value until then.
#[test]
fn a_view_keeps_its_base_alive_until_it_is_freed() {
    // x (host) -> big (1 MB) -> slice (view of big, 1 kB); x -> other (1 MB);
    // late (1 kB) reads other and slice -> output
    let mut b = Builder::default();
    let x = b.input(1000);
    let big = b.node(1e6, 1_000_000, false, &[x]);
    let slice = b.node(0.0, 1000, false, &[big]);
    let other = b.node(1e6, 1_000_000, false, &[x]);
    let late = b.node(1e6, 1000, false, &[other, slice]);
    b.output(late);
    let values = b.build();
    let mut alias = vec![u32::MAX; values.num_nodes()];
    alias[slice as usize] = big;
    let views = values.clone().with_node_alias(alias).unwrap();
    let devices = exact_devices();
    let on_acc = [0, 1, 1, 1, 1];
    let peak = |g: &CostGraph| simulate(g, &devices, &on_acc, &[], 1).unwrap().peak_bytes[1];
    // x's copy is held to the end of the segment. As values: big is freed
    // once the slice is made, before `other`; as a view, the slice owns
    // nothing and holds big until `late` has read it
    assert_eq!(peak(&values), 1000 + 1000 + 1_000_000 + 1000);
    assert_eq!(peak(&views), 1000 + 2 * 1_000_000 + 1000);
    // a view must be of one of its inputs
    let mut wrong = vec![u32::MAX; values.num_nodes()];
    wrong[late as usize] = big;
    assert!(matches!(
        values.with_node_alias(wrong),
        Err(PlanError::InvalidGraph(_))
    ));
}

#[test]
fn a_value_another_device_reads_stays_until_its_segment_returns_it() {
    // input (host) -> made (acc, 1 MB) -> on_host (host); on the
    // accelerator, after made: pause (10 ms of compute) -> after (1 MB) ->
    // last; out (host) reads on_host and last. The runtime copies made to
    // the host once the accelerator's segment (made, pause, after, last)
    // returns it, so made is still there when after is made, though its copy
    // would have taken 1 ms.
    let mut b = Builder::default();
    let input = b.input(1000);
    let made = b.node(1e6, 1_000_000, false, &[input]);
    let pause = b.node(1e10, 1000, false, &[input]);
    let after = b.node(1e6, 1_000_000, false, &[pause]);
    let last = b.node(1e6, 1000, false, &[after]);
    let on_host = b.node(1e3, 1000, false, &[made]);
    let out = b.node(1e3, 1000, false, &[on_host, last]);
    b.output(out);
    let g = b.build();
    let devices = exact_devices();
    let placement = [0, 1, 1, 1, 1, 0, 0];
    let sim = simulate(&g, &devices, &placement, &[], 1).unwrap();
    // input's copy, made, after and last at once (pause freed once after is
    // done)
    assert_eq!(sim.peak_bytes[1], 1000 + 1_000_000 + 1_000_000 + 1000);
}

#[test]
fn each_read_takes_its_cpu_from_the_host_when_issued() {
    // Both weights (1 MB each) on disk at 1 GB/s, both reads issued at the
    // start (depth 2): W0 is in at 1 ms. Each read charges the host's
    // compute `read_cpu_s` at its issue, one after the other.
    let run = |read_cpu: f64| {
        let sim = both_read_from_disk(|host| {
            host.disk_bytes_per_s = 1e9;
            host.read_cpu_s = read_cpu;
        });
        let charges = records(&sim.timeline, Activity::ReadCpu);
        let l0 = records(&sim.timeline, Activity::Node)
            .into_iter()
            .find(|r| r.index == 1)
            .unwrap();
        (charges, l0.start_s, sim.predicted_time_s)
    };
    let (none, start, total) = run(0.0);
    assert!(none.is_empty());
    assert_close(start, 0.001);
    // charges that end before W0 is in cost no time, but keep the host busy
    let (small, small_start, small_total) = run(0.0004);
    assert_eq!(small.len(), 2);
    for (k, r) in small.iter().enumerate() {
        assert_eq!(r.resource, Resource::Compute(0));
        assert_close(r.start_s, 0.0004 * k as f64);
        assert_close(r.end_s - r.start_s, 0.0004);
    }
    assert_close(small_start, start);
    assert_close(small_total, total);
    // longer ones delay the first layer past its weight's arrival
    let (_, late_start, late_total) = run(0.25);
    assert_close(late_start, 0.5);
    assert_close(late_total, total + 0.5 - 0.001);
}

#[test]
fn a_small_read_is_made_by_the_calling_thread_when_issued() {
    // Both weights (1 MB each) on disk at 1 GB/s, both reads issued at the
    // start (depth 2).
    let run = |inline_bytes: u64| {
        let sim = both_read_from_disk(|host| {
            host.disk_bytes_per_s = 1e9;
            host.disk_latency_s = 0.0005;
            host.read_cpu_s = 0.0004;
            host.inline_read_bytes = inline_bytes;
            host.inline_read_s = 0.0002;
        });
        let l0 = records(&sim.timeline, Activity::Node)
            .into_iter()
            .find(|r| r.index == 1)
            .unwrap();
        (sim, l0.start_s)
    };
    // Made by the calling thread: each holds the host for 0.2 ms plus its
    // bytes, the second issued once the first is in, and neither is charged
    // the hand-offs' `read_cpu_s`; the first layer starts after both.
    let (inline, start) = run(1_000_000);
    let reads = records(&inline.timeline, Activity::Param);
    assert_eq!(reads.len(), 2);
    for (k, r) in reads.iter().enumerate() {
        assert_eq!(r.resource, Resource::Disk);
        assert_close(r.start_s, 0.0012 * k as f64);
        assert_close(r.end_s, 0.0012 * (k + 1) as f64);
    }
    assert!(records(&inline.timeline, Activity::ReadCpu).is_empty());
    assert_close(start, 0.0024);
    assert_close(inline.predicted_time_s, 0.0024 + 2.0);
    let disk_busy = |sim: &Simulation| {
        sim.busy_s
            .iter()
            .find(|&&(r, _)| r == Resource::Disk)
            .unwrap()
            .1
    };
    assert_close(disk_busy(&inline), 0.0024);
    // A byte over: handed to the reader's threads, each charged `read_cpu_s`,
    // and the first layer waits for its own weight only (0.5 ms + 1 ms).
    let (handed, start) = run(999_999);
    assert_eq!(records(&handed.timeline, Activity::ReadCpu).len(), 2);
    assert_close(start, 0.0015);
    assert_close(disk_busy(&handed), 0.0025);
}

#[test]
fn a_small_read_issued_behind_a_read_in_flight_is_handed_on() {
    // W0 (2 MB, handed to the reader's threads) then W1 (1 MB, small enough
    // for the calling thread) on disk at 1 GB/s, both issued at the start.
    // W1 is issued while W0 is at the disk: made by the calling thread it
    // would wait for W0 and hold the host meanwhile, so it goes to the
    // threads too, queued behind W0, and charged the hand-offs' `read_cpu_s`.
    let mut b = Builder::default();
    let x = b.input(1000);
    let l0 = b.node(1e9, 1000, false, &[x]);
    let l1 = b.node(1e9, 1000, false, &[l0]);
    b.param(2_000_000, &[l0]);
    b.param(1_000_000, &[l1]);
    b.output(l1);
    let g = b
        .build()
        .with_param_home(vec![Tier::Disk, Tier::Disk])
        .unwrap();
    let mut devices = exact_devices();
    devices[0].disk_bytes_per_s = 1e9;
    devices[0].disk_latency_s = 0.0005;
    devices[0].read_cpu_s = 0.0004;
    devices[0].inline_read_bytes = 1_000_000;
    devices[0].inline_read_s = 0.0002;
    let sim = simulate(&g, &devices, &[0, 0, 0], &[true, true], 2).unwrap();
    let mut reads = records(&sim.timeline, Activity::Param);
    reads.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    assert_eq!(reads.len(), 2);
    assert_eq!((reads[0].index, reads[1].index), (0, 1));
    assert_close(reads[0].start_s, 0.0);
    assert_close(reads[0].end_s, 0.0025);
    // queued: its fixed cost hides behind W0's transfer
    assert_close(reads[1].start_s, 0.0025);
    assert_close(reads[1].end_s, 0.0035);
    let charges = records(&sim.timeline, Activity::ReadCpu);
    assert_eq!(charges.len(), 2, "both handed on: {charges:?}");
    // the first layer waits for its own weight only, not for W1's
    let l0 = records(&sim.timeline, Activity::Node)
        .into_iter()
        .find(|r| r.index == 1)
        .unwrap();
    assert_close(l0.start_s, 0.0025);
}

#[test]
fn the_runtime_s_own_work_holds_each_segment_back() {
    // Two 1 s layers on the host, each weight 1 MB; the calling thread
    // spends 10 ms calling a segment, 20 ms looking up a resident weight
    // and 100 ms on a streamed one (reads themselves take no time here).
    let run = |home: Tier, streamed: bool| {
        let g = two_layers().with_param_home(vec![home, home]).unwrap();
        let mut devices = exact_devices();
        devices[0].segment_call_s = 0.01;
        devices[0].resident_lookup_s = 0.02;
        devices[0].stream_op_s = 0.1;
        let sim = simulate(&g, &devices, &[0, 0, 0], &[streamed, streamed], 1).unwrap();
        let start = |x: u32| {
            records(&sim.timeline, Activity::Node)
                .into_iter()
                .find(|r| r.index == x)
                .unwrap()
                .start_s
        };
        (start(1), start(2), sim.predicted_time_s)
    };
    // Both streamed from disk: two segments, each called after its weight's
    // prefetch, wait and evict.
    let (l0, l1, total) = run(Tier::Disk, true);
    assert_close(l0, 0.11);
    assert_close(l1, 1.22);
    assert_close(total, 2.22);
    // Both kept in RAM after their first read: one segment, both weights
    // looked up before it is called.
    let (l0, l1, total) = run(Tier::Disk, false);
    assert_close(l0, 0.05);
    assert_close(l1, 1.05);
    assert_close(total, 2.05);
    // The host's own weights, one host segment: the graph is called as that
    // segment, with no work of the runtime's.
    let (l0, _, total) = run(Tier::Host, false);
    assert_close(l0, 0.0);
    assert_close(total, 2.0);
}
