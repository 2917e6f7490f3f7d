//! Validation of cost graphs, devices and objectives.

mod common;

use common::{accelerator, host, mlp};
use tensortorrent_planner::{plan, validate_devices, CostGraph, Objective, PlanError};

struct Arrays {
    node_flops: Vec<f64>,
    node_out_bytes: Vec<u64>,
    node_host_only: Vec<bool>,
    input_offsets: Vec<u32>,
    input_ids: Vec<u32>,
    param_bytes: Vec<u64>,
    param_offsets: Vec<u32>,
    param_users: Vec<u32>,
    output_ids: Vec<u32>,
}

/// x -> a -> b, one param used by a and b, output b.
fn valid() -> Arrays {
    Arrays {
        node_flops: vec![0.0, 10.0, 10.0],
        node_out_bytes: vec![8, 8, 8],
        node_host_only: vec![true, false, false],
        input_offsets: vec![0, 0, 1, 2],
        input_ids: vec![0, 1],
        param_bytes: vec![64],
        param_offsets: vec![0, 2],
        param_users: vec![1, 2],
        output_ids: vec![2],
    }
}

fn build(a: Arrays) -> Result<CostGraph, PlanError> {
    CostGraph::new(
        a.node_flops,
        a.node_out_bytes,
        a.node_host_only,
        a.input_offsets,
        a.input_ids,
        a.param_bytes,
        a.param_offsets,
        a.param_users,
        a.output_ids,
    )
}

fn graph_error(edit: impl FnOnce(&mut Arrays)) -> String {
    let mut a = valid();
    edit(&mut a);
    match build(a) {
        Err(PlanError::InvalidGraph(msg)) => msg,
        other => panic!("expected InvalidGraph, got {other:?}"),
    }
}

#[test]
fn node_kinds_are_one_list_per_node_each_kind_once() {
    let g = build(valid()).unwrap();
    let short = g.clone().with_node_kinds(&[vec![], vec![0]]);
    assert!(matches!(short, Err(PlanError::InvalidGraph(m)) if m.contains("node_kinds")));
    let twice = g.clone().with_node_kinds(&[vec![], vec![0, 1], vec![1, 1]]);
    assert!(
        matches!(twice, Err(PlanError::InvalidGraph(m)) if m.contains("node_kinds[2] lists kind 1 twice"))
    );
    let g = g.with_node_kinds(&[vec![], vec![0, 3], vec![3]]).unwrap();
    assert_eq!(
        (g.node_kinds(1), g.node_kinds(2), g.num_kinds()),
        (&[0, 3][..], &[3][..], 4)
    );
}

#[test]
fn valid_graph_builds() {
    let g = build(valid()).unwrap();
    assert_eq!(g.num_nodes(), 3);
    assert_eq!(g.num_params(), 1);
    assert_eq!(g.consumers(1), &[2]);
}

#[test]
fn empty_graph_is_valid_and_plans() {
    let g = CostGraph::new(
        vec![],
        vec![],
        vec![],
        vec![0],
        vec![],
        vec![],
        vec![0],
        vec![],
        vec![],
    )
    .unwrap();
    let p = plan(
        &g,
        &[host(0), accelerator("a", 0)],
        Objective::Latency,
        true,
    )
    .unwrap();
    assert!(p.node_device.is_empty());
    assert_eq!(p.predicted_time_s.to_bits(), 0f64.to_bits());
}

#[test]
fn bad_lengths_are_named() {
    let msg = graph_error(|a| a.node_out_bytes.pop().map(drop).unwrap());
    assert_eq!(msg, "node_out_bytes has 2 entries but node_flops has 3");
    let msg = graph_error(|a| a.node_host_only.push(false));
    assert_eq!(msg, "node_host_only has 4 entries but node_flops has 3");
    let msg = graph_error(|a| a.input_offsets.pop().map(drop).unwrap());
    assert_eq!(
        msg,
        "input_offsets has 3 entries, expected 4 (one more than the 3 rows)"
    );
    let msg = graph_error(|a| a.param_offsets = vec![0]);
    assert_eq!(
        msg,
        "param_offsets has 1 entries, expected 2 (one more than the 1 rows)"
    );
}

#[test]
fn bad_offsets_are_named() {
    let msg = graph_error(|a| a.input_offsets = vec![1, 1, 1, 2]);
    assert_eq!(msg, "input_offsets[0] is 1, expected 0");
    let msg = graph_error(|a| a.input_offsets = vec![0, 2, 1, 2]);
    assert_eq!(msg, "input_offsets decreases at index 2: 2 > 1");
    let msg = graph_error(|a| a.input_offsets = vec![0, 0, 1, 1]);
    assert_eq!(msg, "input_offsets[3] is 1 but input_ids has 2 entries");
    let msg = graph_error(|a| a.param_offsets = vec![0, 3]);
    assert_eq!(msg, "param_offsets[1] is 3 but param_users has 2 entries");
}

#[test]
fn non_topological_input_is_rejected() {
    // Node 1 reads node 2, which comes after it.
    let msg = graph_error(|a| a.input_ids = vec![2, 1]);
    assert!(
        msg.contains("input_ids[0] = 2 is an input of node 1"),
        "{msg}"
    );
    assert!(msg.contains("topological order"), "{msg}");
    // A node reading itself.
    let msg = graph_error(|a| a.input_ids = vec![0, 2]);
    assert!(
        msg.contains("input_ids[1] = 2 is an input of node 2"),
        "{msg}"
    );
}

#[test]
fn out_of_range_ids_are_rejected() {
    let msg = graph_error(|a| a.input_ids = vec![0, 7]);
    assert_eq!(
        msg,
        "input_ids[1] = 7 (an input of node 2) is out of range for 3 nodes"
    );
    let msg = graph_error(|a| a.param_users = vec![1, 3]);
    assert_eq!(msg, "param_users[1] = 3 is out of range for 3 nodes");
    let msg = graph_error(|a| a.output_ids = vec![2, 9]);
    assert_eq!(msg, "output_ids[1] = 9 is out of range for 3 nodes");
}

#[test]
fn bad_flops_are_rejected() {
    let msg = graph_error(|a| a.node_flops[1] = f64::NAN);
    assert_eq!(
        msg,
        "node_flops[1] is NaN; flops must be finite and non-negative"
    );
    let msg = graph_error(|a| a.node_flops[2] = -1.0);
    assert_eq!(
        msg,
        "node_flops[2] is -1; flops must be finite and non-negative"
    );
}

#[test]
fn repeated_ids_count_once() {
    let g = build(Arrays {
        input_offsets: vec![0, 0, 2, 3],
        input_ids: vec![0, 0, 1],
        param_offsets: vec![0, 3],
        param_users: vec![2, 1, 2],
        output_ids: vec![2, 2],
        ..valid()
    })
    .unwrap();
    assert_eq!(g.inputs(1), &[0, 0]);
    assert_eq!(g.consumers(0), &[1]);
    assert_eq!(g.node_params(2), &[0]);
    let p = plan(
        &g,
        &[host(1 << 30), accelerator("a", 1 << 30)],
        Objective::Latency,
        false,
    )
    .unwrap();
    assert_eq!(p.node_device, vec![0, 1, 1]);
}

fn device_error(devices: &[tensortorrent_planner::Device]) -> String {
    match validate_devices(devices) {
        Err(PlanError::InvalidDevices(msg)) => msg,
        other => panic!("expected InvalidDevices, got {other:?}"),
    }
}

#[test]
fn devices_need_exactly_one_host_first() {
    assert!(validate_devices(&[host(1), accelerator("a", 1)]).is_ok());
    assert!(device_error(&[]).contains("empty"));
    assert_eq!(
        device_error(&[accelerator("a", 1), host(1)]),
        "device 0 (\"a\") must be the host (is_host = true)"
    );
    let mut second = host(1);
    second.name = "cpu2".into();
    assert!(device_error(&[host(1), second]).contains("device 1 (\"cpu2\") is a second host"));
}

#[test]
fn devices_need_unique_names_and_sane_rates() {
    assert_eq!(
        device_error(&[host(1), accelerator("a", 1), accelerator("a", 2)]),
        "devices 1 and 2 are both named \"a\"; names must be unique"
    );
    let mut slow = accelerator("a", 1);
    slow.flops_per_s = 0.0;
    assert!(device_error(&[host(1), slow]).contains("flops_per_s = 0"));
    let mut no_link = accelerator("a", 1);
    no_link.h2d_bytes_per_s = 0.0;
    assert!(device_error(&[host(1), no_link]).contains("h2d_bytes_per_s = 0"));
    let mut late = accelerator("a", 1);
    late.latency_s = -1.0;
    assert!(device_error(&[host(1), late]).contains("latency_s = -1"));
    let mut odd = accelerator("a", 1);
    odd.class_latency_s = vec![1e-6, -1.0];
    assert!(device_error(&[host(1), odd]).contains("class_latency_s[1] = -1"));
    let mut cold = host(1);
    cold.cold_latency_s = f64::INFINITY;
    assert!(device_error(&[cold]).contains("cold_latency_s = inf"));
    let mut quick = host(1);
    quick.read_slowdown = 0.5;
    assert!(device_error(&[quick]).contains("read_slowdown = 0.5"));
    let mut unknown = host(1);
    unknown.read_slowdown = f64::NAN;
    assert!(device_error(&[unknown]).contains("read_slowdown = NaN"));
    let mut giving = host(1);
    giving.read_cpu_s = -1e-5;
    assert!(device_error(&[giving]).contains("read_cpu_s = -0.00001"));
    let mut early = host(1);
    early.inline_read_s = -1e-5;
    assert!(device_error(&[early]).contains("inline_read_s = -0.00001"));
    let mut calling = host(1);
    calling.segment_call_s = f64::NAN;
    assert!(device_error(&[calling]).contains("segment_call_s = NaN"));
    let mut looking = host(1);
    looking.resident_lookup_s = -1e-6;
    assert!(device_error(&[looking]).contains("resident_lookup_s = -0.000001"));
    let mut streaming = host(1);
    streaming.stream_op_s = f64::INFINITY;
    assert!(device_error(&[streaming]).contains("stream_op_s = inf"));
    let mut nameless = accelerator("", 1);
    nameless.name.clear();
    assert_eq!(
        device_error(&[host(1), nameless]),
        "device 1 has an empty name"
    );
}

#[test]
fn infinite_rates_are_accepted_and_nan_is_not() {
    let mut free_host = host(1 << 30);
    free_host.h2d_bytes_per_s = f64::INFINITY;
    free_host.d2h_bytes_per_s = f64::NAN; // ignored on the host
    let mut instant = accelerator("a", 1 << 30);
    instant.flops_per_s = f64::INFINITY;
    instant.h2d_bytes_per_s = f64::INFINITY;
    instant.d2h_bytes_per_s = f64::INFINITY;
    let devices = [free_host, instant];
    validate_devices(&devices).unwrap();
    let g = mlp(3, 1024, 64, 1e6, true);
    let p = plan(&g, &devices, Objective::Latency, true).unwrap();
    assert!(p.predicted_time_s.is_finite());
    assert_eq!(p.chosen, "all-on-a");

    let mut broken = accelerator("a", 1);
    broken.d2h_bytes_per_s = f64::NAN;
    assert!(device_error(&[host(1), broken]).contains("d2h_bytes_per_s = NaN"));
    let mut endless = accelerator("a", 1);
    endless.latency_s = f64::INFINITY;
    assert!(device_error(&[host(1), endless]).contains("latency_s = inf"));
}

#[test]
fn plan_validates_devices() {
    let g = mlp(2, 16, 4, 1.0, false);
    let err = plan(&g, &[accelerator("a", 1)], Objective::Latency, true).unwrap_err();
    assert!(matches!(err, PlanError::InvalidDevices(_)), "{err:?}");
}

#[test]
fn unknown_objective_lists_valid_ones() {
    let err = "speed".parse::<Objective>().unwrap_err();
    let PlanError::InvalidObjective(msg) = &err else {
        panic!("expected InvalidObjective, got {err:?}");
    };
    assert!(msg.contains("\"speed\""), "{msg}");
    assert!(msg.contains("latency, memory, throughput"), "{msg}");
    assert_eq!("memory".parse::<Objective>(), Ok(Objective::Memory));
}
