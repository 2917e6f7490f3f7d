//! Properties over random chains and DAGs.

mod common;

use common::{Builder, Rng, KIB};
use tensortorrent_planner::{plan, CostGraph, Device, Objective, Plan, PlanError};

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
    b.build()
}

fn random_devices(rng: &mut Rng) -> Vec<Device> {
    let budget = |rng: &mut Rng| match rng.below(4) {
        0 => rng.below(256 * KIB),
        1 => rng.below(1024 * KIB),
        2 => rng.below(8192 * KIB),
        _ => 1 << 40,
    };
    let mut devices = vec![Device {
        name: "cpu".into(),
        is_host: true,
        flops_per_s: 1e9 * (1 + rng.below(100)) as f64,
        budget_bytes: if rng.chance(20) { budget(rng) } else { 1 << 40 },
        h2d_bytes_per_s: 0.0,
        d2h_bytes_per_s: 0.0,
        latency_s: 1e-6,
    }];
    for a in 0..rng.below(3) {
        devices.push(Device {
            name: format!("virtual:{a}"),
            is_host: false,
            flops_per_s: 1e9 * (1 + rng.below(10_000)) as f64,
            budget_bytes: budget(rng),
            h2d_bytes_per_s: 1e6 * (1 + rng.below(10_000)) as f64,
            d2h_bytes_per_s: 1e6 * (1 + rng.below(10_000)) as f64,
            latency_s: 1e-6 * rng.below(20) as f64,
        });
    }
    devices
}

fn check(g: &CostGraph, devices: &[Device], objective: Objective, host_compute: bool, p: &Plan) {
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
    for q in 0..g.num_params() {
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
        if p.param_streamed[q] {
            assert!(
                !on_acc.is_empty(),
                "param {q} streamed but unused on accelerators"
            );
            let segs = on_acc
                .iter()
                .filter(|&&u| p.node_device[u as usize] == expected_device);
            let segs: Vec<i64> = segs
                .map(|&u| i64::from(p.node_segment[u as usize]))
                .collect();
            assert_eq!(p.param_prefetch_segment[q], *segs.iter().min().unwrap());
            assert_eq!(p.param_evict_segment[q], *segs.iter().max().unwrap());
        } else {
            assert_eq!(
                (p.param_prefetch_segment[q], p.param_evict_segment[q]),
                (-1, -1)
            );
        }
    }
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

#[test]
fn random_graphs_plan_within_budgets() {
    let mut rng = Rng::new(2024);
    let (mut planned, mut raised) = (0, 0);
    for case in 0..400 {
        let g = random_graph(&mut rng);
        let mut devices = random_devices(&mut rng);
        let objective = Objective::ALL[rng.below(3) as usize];
        let host_compute = rng.chance(50);
        match plan(&g, &devices, objective, host_compute) {
            Ok(p) => {
                check(&g, &devices, objective, host_compute, &p);
                if case % 10 == 0 {
                    assert_eq!(plan(&g, &devices, objective, host_compute).unwrap(), p);
                }
                planned += 1;
            }
            Err(PlanError::Infeasible {
                message,
                min_budgets,
            }) => {
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
}
