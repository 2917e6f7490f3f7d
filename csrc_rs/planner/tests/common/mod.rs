//! Builders shared by the integration tests.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use tensortorrent_planner::{CostGraph, Device, Plan, PlanError, Planner};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

/// Builds a cost graph node by node.
#[derive(Default, Clone)]
pub struct Builder {
    flops: Vec<f64>,
    out: Vec<u64>,
    host_only: Vec<bool>,
    inputs: Vec<Vec<u32>>,
    params: Vec<(u64, Vec<u32>)>,
    outputs: Vec<u32>,
}

impl Builder {
    pub fn node(&mut self, flops: f64, out: u64, host_only: bool, inputs: &[u32]) -> u32 {
        self.flops.push(flops);
        self.out.push(out);
        self.host_only.push(host_only);
        self.inputs.push(inputs.to_vec());
        self.flops.len() as u32 - 1
    }

    /// A host-only graph input.
    pub fn input(&mut self, out: u64) -> u32 {
        self.node(0.0, out, true, &[])
    }

    pub fn param(&mut self, bytes: u64, users: &[u32]) -> u32 {
        self.params.push((bytes, users.to_vec()));
        self.params.len() as u32 - 1
    }

    pub fn output(&mut self, node: u32) {
        self.outputs.push(node);
    }

    pub fn build(&self) -> CostGraph {
        let mut input_offsets = vec![0u32];
        let mut input_ids = Vec::new();
        for ins in &self.inputs {
            input_ids.extend_from_slice(ins);
            input_offsets.push(input_ids.len() as u32);
        }
        let mut param_offsets = vec![0u32];
        let mut param_users = Vec::new();
        for (_, users) in &self.params {
            param_users.extend_from_slice(users);
            param_offsets.push(param_users.len() as u32);
        }
        CostGraph::new(
            self.flops.clone(),
            self.out.clone(),
            self.host_only.clone(),
            input_offsets,
            input_ids,
            self.params.iter().map(|p| p.0).collect(),
            param_offsets,
            param_users,
            self.outputs.clone(),
        )
        .expect("test graphs are valid")
    }
}

/// A chain MLP: a host input, then `layers` linear nodes (each with its own
/// `weight`-byte parameter and `flops` work), each followed by a parameterless
/// activation node when `relu`; the last node is the output.
pub fn mlp(layers: usize, weight: u64, act: u64, flops: f64, relu: bool) -> CostGraph {
    let mut b = Builder::default();
    let mut prev = b.input(act);
    for _ in 0..layers {
        let lin = b.node(flops, act, false, &[prev]);
        b.param(weight, &[lin]);
        prev = lin;
        if relu {
            prev = b.node(act as f64, act, false, &[prev]);
        }
    }
    b.output(prev);
    b.build()
}

pub fn host(budget: u64) -> Device {
    Device::new("cpu", true, 1e10, budget, 0.0, 0.0, 1e-6)
}

pub fn accelerator(name: &str, budget: u64) -> Device {
    Device::new(name, false, 1e12, budget, 1e10, 1e10, 1e-6)
}

/// Host with a large budget plus one accelerator `virtual:0`.
pub fn machine(acc_budget: u64) -> Vec<Device> {
    vec![host(1 << 40), accelerator("virtual:0", acc_budget)]
}

/// Tiny deterministic xorshift64* generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// `p` rebuilt by `planner` from the decisions it records (what the plan cache and saved
/// plans do), on `g`, the graph it was planned for.
pub fn replayed(
    planner: &Planner,
    g: &CostGraph,
    devices: &[Device],
    p: &Plan,
) -> Result<Plan, PlanError> {
    planner.replay(
        g,
        devices,
        &p.chosen,
        &p.node_device,
        &p.param_streamed,
        &p.value_spilled,
        p.prefetch_depth,
        p.prefetch_window_bytes,
    )
}

/// The plan of `p`'s candidate `c` rebuilt by `planner` from the decisions the candidate
/// carries, on `g` (the graph `p` was planned for) and `devices`.
pub fn replayed_candidate(
    planner: &Planner,
    g: &CostGraph,
    devices: &[Device],
    c: &tensortorrent_planner::Candidate,
) -> Result<Plan, PlanError> {
    planner.replay(
        g,
        devices,
        &c.name,
        &c.node_device,
        &c.param_streamed,
        &c.value_spilled,
        c.prefetch_depth,
        c.prefetch_window_bytes,
    )
}

/// Each parameter's stays on its `param_device`, in order, as `(issue, first, last)`
/// segments.
pub fn stays(p: &Plan) -> Vec<Vec<(i64, i64, i64)>> {
    let mut out = vec![Vec::new(); p.param_streamed.len()];
    for k in 0..p.stream_param.len() {
        let q = p.stream_param[k] as usize;
        if p.stream_device[k] == p.param_device[q] {
            out[q].push((
                p.stream_issue_segment[k],
                i64::from(p.stream_first_segment[k]),
                i64::from(p.stream_last_segment[k]),
            ));
        }
    }
    out
}

/// For a plan whose streamed parameters each stay once on their device: per parameter,
/// the segment issuing its prefetch, its first and its last using segment (`-1` each
/// when it does not stream).
pub fn single_stays(p: &Plan) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let per_param = stays(p);
    let one = |k: usize| -> Vec<i64> {
        per_param
            .iter()
            .map(|s| match s.as_slice() {
                [] => -1,
                [stay] => [stay.0, stay.1, stay.2][k],
                more => panic!("a parameter stays {} times", more.len()),
            })
            .collect()
    };
    (one(0), one(1), one(2))
}
