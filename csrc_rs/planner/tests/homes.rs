//! The planner decides each parameter's home tier: a graph whose weights the
//! host budget cannot hold is planned again with the disk-allowed weights on
//! disk (or its split variant is).

mod common;

use common::{accelerator, host, mlp, replayed, Builder, KIB, MIB};
use tensortorrent_planner::{CostGraph, Device, Objective, PlanError, Planner, Tier};

const LAYERS: usize = 4;
const WEIGHT: u64 = 4 * MIB;

/// Four 4 MiB layers (16 MiB of weights), host homes.
fn model() -> CostGraph {
    mlp(LAYERS, WEIGHT, 64 * KIB, 1e9, false)
}

/// The same work with each weight cut into two row chunks.
fn split_model() -> CostGraph {
    let mut b = Builder::default();
    let mut prev = b.input(64 * KIB);
    for _ in 0..LAYERS {
        let lin = b.node(1e9, 64 * KIB, false, &[prev]);
        b.param(WEIGHT / 2, &[lin]);
        b.param(WEIGHT / 2, &[lin]);
        prev = lin;
    }
    b.output(prev);
    b.build()
}

/// A host alone, `budget` bytes, reading disk at 1 GB/s.
fn cpu(budget: u64) -> Vec<Device> {
    let mut cpu = host(budget);
    cpu.mem_bytes_per_s = 2e10;
    cpu.disk_bytes_per_s = 1e9;
    vec![cpu]
}

fn allowed(g: CostGraph) -> CostGraph {
    let p = g.num_params();
    g.with_disk_allowed(vec![true; p]).unwrap()
}

fn on_disk(g: CostGraph) -> CostGraph {
    let p = g.num_params();
    g.with_param_home(vec![Tier::Disk; p]).unwrap()
}

fn planner() -> Planner {
    Planner::new(Objective::Latency)
}

fn host_short(e: &PlanError) -> bool {
    matches!(e, PlanError::Infeasible { min_budgets, .. } if min_budgets.iter().any(|(n, _)| n == "cpu"))
}

#[test]
fn disk_allowed_is_validated_and_defaults_to_none() {
    let g = model();
    assert_eq!(g.param_disk_allowed(), &[false; LAYERS]);
    let err = model().with_disk_allowed(vec![true]).unwrap_err();
    assert_eq!(
        err,
        PlanError::InvalidGraph("param_disk_allowed has 1 entries but param_bytes has 4".into())
    );
}

#[test]
fn homes_move_to_disk_only_when_the_host_is_short_and_they_may() {
    let tight = cpu(10 * MIB);
    // Not allowed: the host cannot hold 16 MiB of weights.
    let err = planner().run(&model(), &tight).unwrap_err();
    assert!(host_short(&err), "{err}");

    // Allowed: planned with every weight on disk, as that graph is planned.
    let p = planner().run(&allowed(model()), &tight).unwrap();
    assert_eq!(p.param_home, vec![Tier::Disk; LAYERS]);
    assert!(!p.split);
    assert!(p.peak_bytes[0] <= 10 * MIB);
    assert!(p.param_streamed.iter().any(|&s| s), "{}", p.chosen);
    let direct = planner().run(&on_disk(model()), &tight).unwrap();
    assert_eq!(p, direct);

    // Only what is allowed moves (the host then holds one weight for good).
    let one = model()
        .with_disk_allowed(vec![false, true, true, true])
        .unwrap();
    let p = planner().run(&one, &cpu(13 * MIB)).unwrap();
    assert_eq!(
        p.param_home,
        vec![Tier::Host, Tier::Disk, Tier::Disk, Tier::Disk]
    );

    // With room for the weights nothing moves.
    let roomy = cpu(1 << 30);
    let p = planner().run(&allowed(model()), &roomy).unwrap();
    assert_eq!(p.param_home, vec![Tier::Host; LAYERS]);
    assert_eq!(p, planner().run(&model(), &roomy).unwrap());

    // Short on an accelerator, not on the host: the error stands.
    let devices = vec![host(1 << 40), accelerator("virtual:0", KIB)];
    let no_host = planner().with_host_compute(false);
    let err = no_host.run(&model(), &devices).unwrap_err();
    assert!(matches!(err, PlanError::Infeasible { .. }) && !host_short(&err));
    assert_eq!(no_host.run(&allowed(model()), &devices).unwrap_err(), err);
}

#[test]
fn the_split_graph_is_planned_when_given() {
    let tight = cpu(10 * MIB);
    let split = allowed(split_model());
    let p = planner()
        .run_with_split(&allowed(model()), Some(&split), &tight)
        .unwrap();
    assert!(p.split);
    assert_eq!(p.param_home, vec![Tier::Disk; 2 * LAYERS]);
    assert_eq!(p.param_streamed.len(), 2 * LAYERS);
    let direct = planner().run(&on_disk(split_model()), &tight).unwrap();
    assert_eq!(p.plan_hash, direct.plan_hash);
    assert_eq!(p.node_device, direct.node_device);
    assert_eq!(p.param_streamed, direct.param_streamed);

    // Not needed, not planned.
    let roomy = cpu(1 << 30);
    let p = planner()
        .run_with_split(&allowed(model()), Some(&split), &roomy)
        .unwrap();
    assert!(!p.split);
    assert_eq!(p.param_home, vec![Tier::Host; LAYERS]);

    // Nothing may move: the split graph is not planned either.
    let err = planner()
        .run_with_split(&model(), Some(&split), &tight)
        .unwrap_err();
    assert_eq!(err, planner().run(&model(), &tight).unwrap_err());
}

#[test]
fn weights_already_on_disk_are_planned_in_the_split_graph_from_the_start() {
    // The first weight is bound to a checkpoint: in the split graph, its two chunks are.
    let homes = |n: usize, disk: usize| {
        (0..n)
            .map(|q| if q < disk { Tier::Disk } else { Tier::Host })
            .collect::<Vec<_>>()
    };
    let graph = allowed(model()).with_param_home(homes(LAYERS, 1)).unwrap();
    let split = allowed(split_model())
        .with_param_home(homes(2 * LAYERS, 2))
        .unwrap();
    let roomy = cpu(1 << 30);
    let p = planner()
        .run_with_split(&graph, Some(&split), &roomy)
        .unwrap();
    assert!(p.split);
    assert_eq!(p.param_home, homes(2 * LAYERS, 2));
    assert_eq!(
        p.plan_hash,
        planner().run(&split, &roomy).unwrap().plan_hash
    );

    // Short of host memory, its other weights move to disk as well.
    let tight = cpu(10 * MIB);
    let p = planner()
        .run_with_split(&graph, Some(&split), &tight)
        .unwrap();
    assert!(p.split);
    assert_eq!(p.param_home, vec![Tier::Disk; 2 * LAYERS]);

    // Without a split graph, the graph is planned with its homes as given.
    let p = planner().run_with_split(&graph, None, &roomy).unwrap();
    assert!(!p.split);
    assert_eq!(p.param_home, homes(LAYERS, 1));
}

#[test]
fn the_disk_variants_error_is_returned() {
    // Too small for even one weight read at a time.
    let tiny = cpu(2 * MIB);
    let first = planner().run(&model(), &tiny).unwrap_err();
    assert!(host_short(&first), "{first}");
    let err = planner().run(&allowed(model()), &tiny).unwrap_err();
    assert_eq!(err, planner().run(&on_disk(model()), &tiny).unwrap_err());
    assert_ne!(err, first);
    let split = allowed(split_model());
    let err = planner()
        .run_with_split(&allowed(model()), Some(&split), &tiny)
        .unwrap_err();
    // the split graph's error, which says that the graph it names is the split one
    let PlanError::Infeasible {
        message,
        min_budgets,
        peaks,
        split: false,
    } = planner().run(&on_disk(split_model()), &tiny).unwrap_err()
    else {
        panic!("expected Infeasible");
    };
    assert_eq!(
        err,
        PlanError::Infeasible {
            message,
            min_budgets,
            peaks,
            split: true
        }
    );
}

#[test]
fn the_disk_rate_is_hashed_only_with_disk_params() {
    let roomy = |disk_bytes_per_s: f64| {
        let mut devices = cpu(1 << 30);
        devices[0].disk_bytes_per_s = disk_bytes_per_s;
        devices
    };
    let plan = |g: &CostGraph, rate: f64| planner().run(g, &roomy(rate)).unwrap().plan_hash;
    // Without disk homes the disk rate changes nothing, hash included.
    let g = allowed(model());
    assert_eq!(plan(&g, f64::INFINITY), plan(&g, 1e9));
    assert_eq!(plan(&g, 1e9), plan(&g, 5e8));
    // With them it is an input like any other.
    let g = on_disk(model());
    assert_ne!(plan(&g, 1e9), plan(&g, 5e8));
}

#[test]
fn a_plan_with_moved_homes_replays_on_the_graph_planned() {
    let tight = cpu(10 * MIB);
    let split = allowed(split_model());
    for given in [None, Some(&split)] {
        let p = planner()
            .run_with_split(&allowed(model()), given, &tight)
            .unwrap();
        // The caller rebuilds the graph planned: the split one when `split`,
        // with the homes the plan reports.
        let planned = if p.split { split_model() } else { model() };
        let planned = planned.with_param_home(p.param_home.clone()).unwrap();
        let again = replayed(&planner(), &planned, &tight, &p).unwrap();
        assert_eq!(again.plan_hash, p.plan_hash);
        assert_eq!(again.param_home, p.param_home);
        assert_eq!(again.stream_issue_segment, p.stream_issue_segment);
    }
}
