//! Properties over random chains and DAGs.

mod common;

use common::{stays, Builder, Rng, KIB};
use tensortorrent_planner::{
    exhaustive, Activity, CostGraph, Device, Held, Objective, PeakContents, Plan, PlanError,
    Planner, Record, Resource, Tier,
};

/// Enough search for these small graphs in a debug build.
const NODE_LIMIT: u64 = 20_000;

fn plan(
    g: &CostGraph,
    devices: &[Device],
    objective: Objective,
    host_compute: bool,
) -> Result<Plan, PlanError> {
    Planner::new(objective)
        .with_host_compute(host_compute)
        .with_node_limit(NODE_LIMIT)
        .run(g, devices)
}

/// A random DAG (or a plain chain): one to three host inputs, then nodes
/// reading one to three earlier nodes, some host-only; parameters used by one
/// to three nodes; the last node and sometimes others as outputs.
fn random_graph(rng: &mut Rng) -> CostGraph {
    let chain = rng.chance(30);
    let mut b = Builder::default();
    let inputs = 1 + rng.below(3) as u32;
    for _ in 0..inputs {
        b.input(rng.below(64 * KIB));
    }
    let n = inputs + 1 + rng.below(40) as u32;
    for v in inputs..n {
        let mut ins = vec![v - 1];
        if !chain {
            for _ in 0..rng.below(3) {
                ins.push(rng.below(u64::from(v)) as u32);
            }
        }
        let host_only = !chain && rng.chance(10);
        b.node(
            (rng.below(1000) * 1_000_000) as f64,
            rng.below(64 * KIB),
            host_only,
            &ins,
        );
    }
    for _ in 0..rng.below(16) {
        let users: Vec<u32> = (0..=rng.below(2))
            .map(|_| inputs + rng.below(u64::from(n - inputs)) as u32)
            .collect();
        b.param(1 + rng.below(256 * KIB), &users);
    }
    b.output(n - 1);
    if rng.chance(30) {
        b.output(rng.below(u64::from(n)) as u32);
    }
    let mut g = b.build();
    if rng.chance(30) {
        let bytes = (0..g.num_nodes()).map(|_| rng.below(1 << 20)).collect();
        g = g.with_node_bytes_accessed(bytes).unwrap();
    }
    if rng.chance(20) {
        let homes = (0..g.num_params())
            .map(|_| {
                if rng.chance(50) {
                    Tier::Disk
                } else {
                    Tier::Host
                }
            })
            .collect();
        g = g.with_param_home(homes).unwrap();
    }
    if rng.chance(30) {
        // some nodes are views of their first input
        let alias = (0..g.num_nodes())
            .map(|v| {
                if v as u32 >= inputs && rng.chance(25) {
                    g.inputs(v)[0]
                } else {
                    u32::MAX
                }
            })
            .collect();
        g = g.with_node_alias(alias).unwrap();
    }
    g
}

fn random_devices(rng: &mut Rng) -> Vec<Device> {
    let budget = |rng: &mut Rng| match rng.below(4) {
        0 => rng.below(256 * KIB),
        1 => rng.below(1024 * KIB),
        2 => rng.below(8192 * KIB),
        _ => 1 << 40,
    };
    let mut devices = vec![Device::new(
        "cpu",
        true,
        1e9 * (1 + rng.below(100)) as f64,
        if rng.chance(20) { budget(rng) } else { 1 << 40 },
        0.0,
        0.0,
        1e-6,
    )];
    if rng.chance(30) {
        devices[0].mem_bytes_per_s = 1e9 * (1 + rng.below(100)) as f64;
        devices[0].disk_bytes_per_s = 1e8 * (1 + rng.below(100)) as f64;
    }
    for a in 0..rng.below(3) {
        devices.push(Device::new(
            format!("virtual:{a}"),
            false,
            1e9 * (1 + rng.below(10_000)) as f64,
            budget(rng),
            1e6 * (1 + rng.below(10_000)) as f64,
            1e6 * (1 + rng.below(10_000)) as f64,
            1e-6 * rng.below(20) as f64,
        ));
    }
    devices
}

fn check(g: &CostGraph, devices: &[Device], objective: Objective, host_compute: bool, p: &Plan) {
    // a plan says what each device holds at its peak, as a refusal does
    let named: Vec<(String, u64)> = devices
        .iter()
        .zip(&p.peak_bytes)
        .map(|(d, &b)| (d.name.clone(), b))
        .collect();
    check_peaks(g, devices, &named, &p.peaks, 0);
    let n = g.num_nodes();
    assert_eq!(p.node_device.len(), n);
    assert_eq!(p.node_segment.len(), n);
    for v in 0..n {
        let d = p.node_device[v];
        assert!((d as usize) < devices.len());
        if g.node_host_only()[v] {
            assert_eq!(d, 0, "host-only node {v} placed on {d}");
        } else if !host_compute {
            assert_ne!(d, 0, "node {v} on the host without host compute");
        }
    }
    for (d, dev) in devices.iter().enumerate() {
        assert!(
            p.peak_bytes[d] <= dev.budget_bytes,
            "{}: {} > {}",
            dev.name,
            p.peak_bytes[d],
            dev.budget_bytes
        );
    }
    // Segments are contiguous runs on one device.
    for v in 0..n {
        let s = p.node_segment[v];
        if v == 0 {
            assert_eq!(s, 0);
        } else {
            let prev = p.node_segment[v - 1];
            assert!(s == prev || s == prev + 1);
            if p.node_device[v] != p.node_device[v - 1] {
                assert_eq!(s, prev + 1);
            }
        }
        assert_eq!(p.segment_device[s as usize], p.node_device[v]);
    }
    assert_eq!(
        p.segment_device.len(),
        p.node_segment.last().map_or(0, |&s| s as usize + 1)
    );
    // Parameters.
    for (q, mine) in stays(p).iter().enumerate() {
        let on_acc: Vec<u32> = g
            .param_users(q)
            .iter()
            .copied()
            .filter(|&u| p.node_device[u as usize] != 0)
            .collect();
        let expected_device = on_acc
            .iter()
            .min()
            .map_or(0, |&u| p.node_device[u as usize]);
        assert_eq!(p.param_device[q], expected_device);
        let on_disk = g.param_home()[q] == Tier::Disk;
        if p.param_streamed[q] {
            assert!(
                !on_acc.is_empty() || on_disk,
                "param {q} streamed but unused on accelerators"
            );
            // Its stays there serve exactly its using segments, in runs: a
            // stay starts and ends at a use, and the next one is issued after
            // the previous one's eviction.
            let mut segs: Vec<i64> = g
                .param_users(q)
                .iter()
                .filter(|&&u| p.node_device[u as usize] == expected_device)
                .map(|&u| i64::from(p.node_segment[u as usize]))
                .collect();
            segs.sort_unstable();
            segs.dedup();
            assert!(!mine.is_empty(), "param {q} streamed without a stay");
            let mut served: Vec<i64> = Vec::new();
            for (k, &(issue, first, last)) in mine.iter().enumerate() {
                assert!(issue < first, "param {q} stay {k}");
                assert!(segs.contains(&first) && segs.contains(&last));
                if k > 0 {
                    assert!(issue > mine[k - 1].2, "param {q} stay {k}");
                }
                served.extend(segs.iter().filter(|&&s| first <= s && s <= last));
            }
            assert_eq!(served, segs, "param {q}");
        } else {
            assert!(mine.is_empty(), "param {q} resident with a stay");
        }
    }
    check_timeline(g, devices, p);
    // The choice.
    assert!(p.predicted_time_s.is_finite() && p.predicted_time_s >= 0.0);
    let chosen = p
        .candidates
        .iter()
        .find(|c| c.name == p.chosen)
        .expect("chosen is a candidate");
    assert!(chosen.feasible);
    assert_eq!(
        chosen.predicted_time_s.to_bits(),
        p.predicted_time_s.to_bits()
    );
    assert_eq!(chosen.peak_bytes, p.peak_bytes);
    let best = p
        .candidates
        .iter()
        .filter(|c| c.feasible)
        .map(|c| c.predicted_time_s)
        .fold(f64::INFINITY, f64::min);
    match objective {
        Objective::Latency | Objective::Throughput => {
            assert_eq!(p.predicted_time_s.to_bits(), best.to_bits());
        }
        Objective::Memory => assert!(p.predicted_time_s <= 1.10 * best),
    }
    for c in &p.candidates {
        let fits = c
            .peak_bytes
            .iter()
            .zip(devices)
            .all(|(&b, d)| b <= d.budget_bytes);
        assert_eq!(c.feasible, fits, "{}", c.name);
    }
    assert_eq!(p.plan_hash.len(), 16);
}

/// The winner's timeline: one record per node on its device, no resource
/// running two things at once, every input and streamed parameter on the
/// node's device before it starts, busy fractions within the run, and the
/// lower bound below the predicted time.
fn check_timeline(g: &CostGraph, devices: &[Device], p: &Plan) {
    let eps = |t: f64| 1e-9 * t.abs().max(1e-12);
    let mut node: Vec<Option<Record>> = vec![None; g.num_nodes()];
    let mut by_resource: Vec<(Resource, f64, f64)> = Vec::new();
    for r in &p.timeline {
        assert!(r.start_s <= r.end_s, "{r:?}");
        by_resource.push((r.resource, r.start_s, r.end_s));
        if r.activity == Activity::Node {
            assert_eq!(
                r.resource,
                Resource::Compute(p.node_device[r.index as usize])
            );
            assert!(node[r.index as usize].replace(*r).is_none(), "{r:?} twice");
        }
    }
    by_resource.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    for w in by_resource.windows(2) {
        if w[0].0 == w[1].0 {
            assert!(
                w[1].1 >= w[0].2 - eps(w[0].2),
                "{:?} overlaps {:?}",
                w[1],
                w[0]
            );
        }
    }
    let arrival = |activity: Activity, index: u32, resource: Resource| -> f64 {
        p.timeline
            .iter()
            .filter(|r| r.activity == activity && r.index == index && r.resource == resource)
            .map(|r| r.end_s)
            .fold(f64::INFINITY, f64::min)
    };
    for v in 0..g.num_nodes() {
        let rec = node[v].unwrap_or_else(|| panic!("node {v} has no record"));
        let d = p.node_device[v];
        for &u in g.inputs(v) {
            let du = p.node_device[u as usize];
            let ready = if du == d {
                node[u as usize].unwrap().end_s
            } else if d == 0 {
                arrival(Activity::Value, u, Resource::DeviceToHost(du))
            } else {
                arrival(Activity::Value, u, Resource::HostToDevice(d))
            };
            assert!(
                rec.start_s >= ready - eps(ready),
                "node {v} starts at {} before its input {u} arrives at {ready}",
                rec.start_s
            );
        }
        for &q in g.node_params(v) {
            let q = q as usize;
            let on_disk = g.param_home()[q] == Tier::Disk;
            if !p.param_streamed[q] || (d == 0 && !on_disk) {
                continue;
            }
            let resource = if d == 0 {
                Resource::Disk
            } else {
                Resource::HostToDevice(d)
            };
            let ready = arrival(Activity::Param, q as u32, resource);
            assert!(
                rec.start_s >= ready - eps(ready),
                "node {v} starts at {} before param {q} arrives at {ready}",
                rec.start_s
            );
        }
    }
    // Spilled values: made on an accelerator, used only there and not a
    // graph output, out to the host after they are made, back before every
    // use from their reload segment on.
    for x in (0..g.num_nodes()).filter(|&x| p.value_spilled[x]) {
        let (d, made) = (p.node_device[x], p.node_segment[x]);
        assert!(d != 0 && !g.is_output(x), "value {x} is not spillable");
        let reload = p.value_reload_segment[x];
        assert!(reload > i64::from(made), "value {x} reloaded at {reload}");
        let out = arrival(Activity::Spill, x as u32, Resource::DeviceToHost(d));
        let back = p
            .timeline
            .iter()
            .find(|r| r.activity == Activity::Reload && r.index == x as u32)
            .unwrap_or_else(|| panic!("value {x} never comes back"));
        assert_eq!(back.resource, Resource::HostToDevice(d));
        assert!(out >= node[x].unwrap().end_s && back.start_s >= out - eps(out));
        for &c in g.consumers(x) {
            assert_eq!(
                p.node_device[c as usize], d,
                "value {x} used off its device"
            );
            // Uses from the reload segment on read the reloaded copy.
            if i64::from(p.node_segment[c as usize]) >= reload {
                let start = node[c as usize].unwrap().start_s;
                assert!(start >= back.end_s - eps(back.end_s), "{c} uses {x} early");
            }
        }
    }
    let t = p.predicted_time_s;
    assert!(p.lower_bound_s <= t + eps(t), "{} > {t}", p.lower_bound_s);
    for (name, f) in &p.busy_fraction {
        assert!((0.0..=1.0 + 1e-9).contains(f), "{name}: {f}");
    }
    assert!(p.busy_fraction.len() >= devices.len());
}

/// A refusal's peaks: one per device it names, of the bytes it names, each
/// its resident parameters' bytes plus what else is live, every live piece
/// a parameter or node of the graph.
fn check_peaks(
    g: &CostGraph,
    devices: &[Device],
    min_budgets: &[(String, u64)],
    peaks: &[PeakContents],
    case: usize,
) {
    assert_eq!(peaks.len(), min_budgets.len(), "case {case}");
    for (peak, (name, bytes)) in peaks.iter().zip(min_budgets) {
        assert_eq!(&devices[peak.device as usize].name, name, "case {case}");
        assert_eq!(peak.bytes, *bytes, "case {case}");
        let resident: u64 = peak
            .resident
            .iter()
            .map(|&q| g.param_bytes()[q as usize])
            .sum();
        let live: u64 = peak.live.iter().map(|&(_, _, b)| b).sum();
        assert_eq!(resident + live, peak.bytes, "case {case}: {peak:?}");
        for &(held, index, _) in &peak.live {
            let limit = match held {
                Held::Value => g.num_nodes(),
                Held::Weight | Held::Staging => g.num_params(),
                Held::Copy => panic!("case {case}: live bytes are a value's, never a copy's"),
            };
            assert!((index as usize) < limit, "case {case}: {peak:?}");
        }
        if let Some((held, index)) = peak.reached_by {
            let limit = match held {
                Held::Value | Held::Copy => g.num_nodes(),
                Held::Weight | Held::Staging => g.num_params(),
            };
            assert!((index as usize) < limit, "case {case}: {peak:?}");
        }
        assert_eq!(
            peak.reached_by.is_none(),
            peak.live.is_empty(),
            "case {case}"
        );
    }
}

#[test]
fn random_graphs_plan_within_budgets() {
    let mut rng = Rng::new(2024);
    let (mut planned, mut raised, mut spilled) = (0, 0, 0);
    for case in 0..400 {
        let g = random_graph(&mut rng);
        let mut devices = random_devices(&mut rng);
        let objective = Objective::ALL[rng.below(3) as usize];
        let host_compute = rng.chance(50);
        match plan(&g, &devices, objective, host_compute) {
            Ok(p) => {
                check(&g, &devices, objective, host_compute, &p);
                spilled += usize::from(p.value_spilled.contains(&true));
                if case % 10 == 0 {
                    assert_eq!(plan(&g, &devices, objective, host_compute).unwrap(), p);
                }
                planned += 1;
            }
            Err(PlanError::Infeasible {
                message,
                min_budgets,
                peaks,
                ..
            }) => {
                check_peaks(&g, &devices, &min_budgets, &peaks, case);
                if min_budgets.is_empty() {
                    assert!(
                        devices.len() == 1 && !host_compute,
                        "case {case}: {message}"
                    );
                    continue;
                }
                for (name, bytes) in &min_budgets {
                    let d = devices
                        .iter_mut()
                        .find(|d| &d.name == name)
                        .expect("named device");
                    assert!(*bytes > d.budget_bytes, "case {case}: {message}");
                    assert!(message.contains(name.as_str()), "case {case}: {message}");
                    d.budget_bytes = *bytes;
                }
                let p = plan(&g, &devices, objective, host_compute)
                    .unwrap_or_else(|e| panic!("case {case}: raised budgets still fail: {e}"));
                check(&g, &devices, objective, host_compute, &p);
                raised += 1;
            }
            Err(other) => panic!("case {case}: unexpected {other:?}"),
        }
    }
    assert!(
        planned > 100 && raised > 50,
        "planned {planned}, raised {raised}"
    );
    eprintln!("{spilled} of {planned} plans spill");
}

/// A small random DAG for the exhaustive search: a host input, up to six
/// nodes, up to three parameters.
fn small_graph(rng: &mut Rng) -> CostGraph {
    let mut b = Builder::default();
    b.input(rng.below(64 * KIB));
    let n = 2 + rng.below(6) as u32;
    for v in 1..n {
        let mut ins = vec![v - 1];
        if rng.chance(40) {
            ins.push(rng.below(u64::from(v)) as u32);
        }
        b.node(
            (rng.below(1000) * 1_000_000) as f64,
            rng.below(64 * KIB),
            rng.chance(10),
            &ins,
        );
    }
    for _ in 0..rng.below(4) {
        let users: Vec<u32> = (0..=rng.below(1))
            .map(|_| 1 + rng.below(u64::from(n - 1)) as u32)
            .collect();
        b.param(1 + rng.below(1024 * KIB), &users);
    }
    b.output(n - 1);
    b.build()
}

/// On small graphs over three devices, the planner finds a plan exactly
/// when the exhaustive search finds one, and its time is within 5 % of the
/// optimum.
#[test]
fn planner_matches_the_exhaustive_optimum() {
    let mut rng = Rng::new(7);
    let (mut both, mut neither) = (0, 0);
    for case in 0..60 {
        let g = small_graph(&mut rng);
        let mut devices = random_devices(&mut rng);
        while devices.len() < 3 {
            devices = random_devices(&mut rng);
        }
        let host_compute = rng.chance(50);
        let best = exhaustive(&g, &devices, host_compute, 1, 1_000_000).unwrap();
        match (best, plan(&g, &devices, Objective::Latency, host_compute)) {
            (Some(best), Ok(p)) => {
                let ratio = p.predicted_time_s / best.predicted_time_s;
                assert!(
                    ratio <= 1.05 || p.predicted_time_s <= best.predicted_time_s,
                    "case {case}: {ratio} ({} vs optimum {:?} {:?})",
                    p.chosen,
                    best.node_device,
                    best.param_streamed
                );
                both += 1;
            }
            (None, Err(PlanError::Infeasible { .. })) => neither += 1,
            (best, planned) => panic!("case {case}: exhaustive {best:?}, planner {planned:?}"),
        }
    }
    assert!(both > 30 && neither > 3, "both {both}, neither {neither}");
}

/// A chain with long skips: every layer has a weight (so that, streamed,
/// each is a segment of its own) and some layers also read a value made
/// several layers earlier.
fn skip_graph(rng: &mut Rng) -> CostGraph {
    let mut b = Builder::default();
    b.input(rng.below(64 * KIB));
    let n = 6 + rng.below(20) as u32;
    for v in 1..n {
        let mut ins = vec![v - 1];
        if v > 4 && rng.chance(30) {
            ins.push(1 + rng.below(u64::from(v - 3)) as u32);
        }
        b.node(
            (1 + rng.below(1000)) as f64 * 1e6,
            1 + rng.below(2048 * KIB),
            false,
            &ins,
        );
        b.param(1 + rng.below(256 * KIB), &[v]);
    }
    b.output(n - 1);
    b.build()
}

#[test]
fn plans_that_spill_keep_their_budgets_and_their_order() {
    let mut rng = Rng::new(7);
    let (mut planned, mut spilled) = (0, 0);
    for case in 0..300 {
        let g = skip_graph(&mut rng);
        let mut devices = vec![
            Device::new("cpu", true, 1e10, 1 << 40, 0.0, 0.0, 1e-6),
            Device::new(
                "virtual:0",
                false,
                1e9 * (1 + rng.below(1000)) as f64,
                1024 * KIB + rng.below(6144 * KIB),
                1e8 * (1 + rng.below(100)) as f64,
                1e8 * (1 + rng.below(100)) as f64,
                1e-6,
            ),
        ];
        let host_compute = rng.chance(30);
        match plan(&g, &devices, Objective::Latency, host_compute) {
            Ok(p) => {
                check(&g, &devices, Objective::Latency, host_compute, &p);
                planned += 1;
                spilled += usize::from(p.value_spilled.contains(&true));
            }
            Err(PlanError::Infeasible { min_budgets, .. }) => {
                for (name, bytes) in &min_budgets {
                    let d = devices.iter_mut().find(|d| &d.name == name).unwrap();
                    d.budget_bytes = *bytes;
                }
                let p = plan(&g, &devices, Objective::Latency, host_compute)
                    .unwrap_or_else(|e| panic!("case {case}: raised budgets still fail: {e}"));
                check(&g, &devices, Objective::Latency, host_compute, &p);
            }
            Err(other) => panic!("case {case}: unexpected {other:?}"),
        }
    }
    eprintln!("{spilled} of {planned} plans spill");
    assert!(spilled >= 10, "{spilled} of {planned} plans spill");
}
