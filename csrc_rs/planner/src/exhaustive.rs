//! The optimum by enumeration, to check the planner on small graphs.

use crate::device::{validate_devices, Device};
use crate::error::PlanError;
use crate::graph::CostGraph;
use crate::placement::{segment, streamable, Placement, HOST};
use crate::simulate::{check_depth, Workspace};

/// The fastest placement that fits, found by enumeration.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimum {
    /// Device index of each node.
    pub node_device: Vec<u32>,
    /// Whether each parameter is streamed.
    pub param_streamed: Vec<bool>,
    /// Simulated time, in seconds.
    pub predicted_time_s: f64,
    /// Simulated peak memory per device, in bytes.
    pub peak_bytes: Vec<u64>,
    /// Placements simulated.
    pub placements: u64,
}

/// Simulates every placement of `graph` on `devices` the planner could
/// choose (every node that may leave the host on every device, the host
/// only with `host_compute`; every streamable parameter streamed or not)
/// and returns the fastest whose peaks fit every budget, the first
/// enumerated among equals; `None` when none fits.
///
/// # Errors
/// * [`PlanError::InvalidDevices`] for a malformed device list;
/// * [`PlanError::InvalidOptions`] for a prefetch depth of 0, or when the
///   enumeration could exceed `limit` placements.
pub fn exhaustive(
    graph: &CostGraph,
    devices: &[Device],
    host_compute: bool,
    prefetch_depth: u32,
    limit: u64,
) -> Result<Option<Optimum>, PlanError> {
    validate_devices(devices)?;
    check_depth(prefetch_depth)?;
    let g = graph;
    let n = g.num_nodes();
    let first = if host_compute { HOST } else { HOST + 1 };
    let choices: Vec<u32> = (first..devices.len() as u32).collect();
    let movable: Vec<usize> = (0..n).filter(|&v| !g.node_host_only()[v]).collect();
    if choices.is_empty() && !movable.is_empty() {
        return Ok(None);
    }
    let flags = (0..g.num_params())
        .filter(|&q| !g.param_users(q).is_empty())
        .count();
    let power = |base: f64, exp: usize| base.powi(i32::try_from(exp).unwrap_or(i32::MAX));
    let bound = power(choices.len() as f64, movable.len()) * power(2.0, flags);
    if bound > limit as f64 {
        return Err(PlanError::InvalidOptions(format!(
            "exhaustive search could simulate {bound:.0} placements, over the limit of {limit}"
        )));
    }

    let mut node_device = vec![HOST; n];
    let mut digits = vec![0usize; movable.len()];
    for &v in &movable {
        node_device[v] = choices[0];
    }
    let mut best: Option<Optimum> = None;
    let mut placements = 0u64;
    let mut workspace = Workspace::default();
    loop {
        let open: Vec<usize> = (0..g.num_params())
            .filter(|&q| streamable(g, &node_device, q))
            .collect();
        for mask in 0u64..1 << open.len() {
            let mut streamed = vec![false; g.num_params()];
            for (k, &q) in open.iter().enumerate() {
                streamed[q] = mask >> k & 1 == 1;
            }
            let pl = Placement::new(g, node_device.clone(), streamed);
            let seg = segment(g, &pl, prefetch_depth);
            let sim = workspace.run(g, devices, &pl, &seg, false);
            placements += 1;
            let fits = sim
                .peak_bytes
                .iter()
                .zip(devices)
                .all(|(&p, d)| p <= d.budget_bytes);
            if fits
                && best
                    .as_ref()
                    .is_none_or(|b| sim.predicted_time_s < b.predicted_time_s)
            {
                best = Some(Optimum {
                    node_device: pl.node_device,
                    param_streamed: pl.param_streamed,
                    predicted_time_s: sim.predicted_time_s,
                    peak_bytes: sim.peak_bytes,
                    placements: 0,
                });
            }
        }
        // Next assignment of the movable nodes (an odometer).
        let mut k = 0;
        loop {
            if k == movable.len() {
                return Ok(best.map(|b| Optimum { placements, ..b }));
            }
            digits[k] += 1;
            if digits[k] < choices.len() {
                node_device[movable[k]] = choices[digits[k]];
                break;
            }
            digits[k] = 0;
            node_device[movable[k]] = choices[0];
            k += 1;
        }
    }
}
