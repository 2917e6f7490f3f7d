//! Candidate search, residency, segments and the final choice.
//!
//! This first version tries a handful of whole-graph placements:
//! * for each accelerator `a`: `all-on-<a>` (every node that may leave the
//!   host runs on `a`, parameters made resident greedily) and
//!   `all-on-<a>/streamed` (the same, every parameter streamed);
//! * with host compute allowed: `all-on-<host>` (everything on the host).
//!
//! Each candidate is simulated (see `crate::simulate`) and the objective picks
//! among the feasible ones.

mod residency;
mod segments;

use std::fmt;
use std::str::FromStr;

use crate::device::{validate_devices, Device};
use crate::error::PlanError;
use crate::graph::CostGraph;
use crate::hash::Fnv1a64;
use crate::simulate::{simulate, Simulation};

pub(crate) use segments::{segment, Placement, Segmentation, HOST};

/// What the plan optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Objective {
    /// Least predicted time for one run.
    Latency,
    /// Least accelerator memory among plans within 10 % of the fastest.
    Memory,
    /// Most runs per second (for now the same choice as [`Objective::Latency`]).
    Throughput,
}

impl Objective {
    /// Every objective, in the order their names are listed.
    pub const ALL: [Self; 3] = [Self::Latency, Self::Memory, Self::Throughput];

    /// The objective's name as parsed by [`str::parse`].
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Latency => "latency",
            Self::Memory => "memory",
            Self::Throughput => "throughput",
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Objective {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        Self::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| {
                let valid: Vec<&str> = Self::ALL.iter().map(|o| o.as_str()).collect();
                PlanError::InvalidObjective(format!(
                    "unknown objective {s:?}; valid objectives are: {}",
                    valid.join(", ")
                ))
            })
    }
}

/// Summary of one candidate placement.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Candidate name, for example `"all-on-virtual:0/streamed"`.
    pub name: String,
    /// Simulated time until the last output is on the host, in seconds.
    pub predicted_time_s: f64,
    /// Whether every device's peak fits its budget.
    pub feasible: bool,
    /// Simulated peak memory per device, in bytes.
    pub peak_bytes: Vec<u64>,
}

/// The chosen plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Device index of each node.
    pub node_device: Vec<u32>,
    /// Segment index of each node.
    pub node_segment: Vec<u32>,
    /// Device index of each segment.
    pub segment_device: Vec<u32>,
    /// Whether each parameter is streamed (otherwise resident where used).
    pub param_streamed: Vec<bool>,
    /// Accelerator whose nodes use each parameter (the first one in node
    /// order if several do); 0 when only host nodes use it.
    pub param_device: Vec<u32>,
    /// For streamed parameters, the first segment using it on
    /// `param_device`; its prefetch is issued when the previous segment on
    /// that device starts (at time 0 when there is none). -1 otherwise.
    pub param_prefetch_segment: Vec<i64>,
    /// For streamed parameters, the last segment using it on
    /// `param_device` (it is evicted after it); -1 otherwise.
    pub param_evict_segment: Vec<i64>,
    /// Simulated time until the last output is on the host, in seconds.
    pub predicted_time_s: f64,
    /// Simulated peak memory per device, in bytes.
    pub peak_bytes: Vec<u64>,
    /// Every candidate considered, in search order.
    pub candidates: Vec<Candidate>,
    /// Name of the chosen candidate.
    pub chosen: String,
    /// 16 lowercase hex digits of a stable FNV-1a 64 hash of the inputs and
    /// the decisions.
    pub plan_hash: String,
}

/// A simulated candidate.
struct Evaluated {
    name: String,
    placement: Placement,
    seg: Segmentation,
    sim: Simulation,
    feasible: bool,
    /// The greedy kept every parameter streamed: identical to the next
    /// (`/streamed`) candidate.
    all_streamed: bool,
}

fn evaluate(g: &CostGraph, devices: &[Device], name: String, placement: Placement) -> Evaluated {
    let seg = segment(g, &placement);
    let sim = simulate(g, devices, &placement, &seg);
    let feasible = sim
        .peak_bytes
        .iter()
        .zip(devices)
        .all(|(&peak, d)| peak <= d.budget_bytes);
    Evaluated {
        name,
        placement,
        seg,
        sim,
        feasible,
        all_streamed: false,
    }
}

/// Builds all candidates in search order.
fn candidates(g: &CostGraph, devices: &[Device], host_compute: bool) -> Vec<Evaluated> {
    let mut out = Vec::new();
    for (a, dev) in devices.iter().enumerate().skip(1) {
        let a = a as u32;
        let node_device: Vec<u32> = g
            .node_host_only()
            .iter()
            .map(|&h| if h { HOST } else { a })
            .collect();
        let mut used_here = vec![false; g.num_params()];
        for (q, used) in used_here.iter_mut().enumerate() {
            *used = g
                .param_users(q)
                .iter()
                .any(|&u| node_device[u as usize] == a);
        }
        let streamed = evaluate(
            g,
            devices,
            format!("all-on-{}/streamed", dev.name),
            Placement {
                node_device: node_device.clone(),
                param_streamed: used_here,
            },
        );
        let param_streamed = residency::greedy_residency(
            g,
            devices,
            a,
            &node_device,
            streamed.sim.peak_bytes[a as usize],
        );
        let greedy = if param_streamed == streamed.placement.param_streamed {
            Evaluated {
                name: format!("all-on-{}", dev.name),
                placement: streamed.placement.clone(),
                seg: streamed.seg.clone(),
                sim: streamed.sim.clone(),
                feasible: streamed.feasible,
                all_streamed: true,
            }
        } else {
            evaluate(
                g,
                devices,
                format!("all-on-{}", dev.name),
                Placement {
                    node_device,
                    param_streamed,
                },
            )
        };
        out.push(greedy);
        out.push(streamed);
    }
    if host_compute {
        out.push(evaluate(
            g,
            devices,
            format!("all-on-{}", devices[0].name),
            Placement {
                node_device: vec![HOST; g.num_nodes()],
                param_streamed: vec![false; g.num_params()],
            },
        ));
    }
    out
}

/// Index of the candidate the objective prefers, if any is feasible.
fn choose(cands: &[Evaluated], objective: Objective) -> Option<usize> {
    let feasible = || cands.iter().enumerate().filter(|(_, c)| c.feasible);
    let fastest = feasible()
        .min_by(|(_, a), (_, b)| a.sim.predicted_time_s.total_cmp(&b.sim.predicted_time_s))
        .map(|(i, _)| i)?;
    match objective {
        Objective::Latency | Objective::Throughput => Some(fastest),
        Objective::Memory => {
            let limit = 1.10 * cands[fastest].sim.predicted_time_s;
            let acc_peak =
                |c: &Evaluated| c.sim.peak_bytes.iter().skip(1).copied().max().unwrap_or(0);
            feasible()
                .filter(|(_, c)| c.sim.predicted_time_s <= limit)
                .min_by(|(i, a), (j, b)| {
                    acc_peak(a)
                        .cmp(&acc_peak(b))
                        .then(a.sim.predicted_time_s.total_cmp(&b.sim.predicted_time_s))
                        .then(i.cmp(j))
                })
                .map(|(i, _)| i)
        }
    }
}

/// Formats a byte count in binary units: `"512 B"`, `"1.00 KiB"`, `"4.00 MiB"`.
pub(crate) fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

fn infeasible(cands: &[Evaluated], devices: &[Device], host_compute: bool) -> PlanError {
    let mut fixes = Vec::new();
    if cands.is_empty() {
        if !host_compute {
            fixes.push("allow host compute".to_string());
        }
        fixes.push("add an accelerator".to_string());
        return PlanError::Infeasible {
            message: format!(
                "no candidate plan: there is no accelerator and host compute is not allowed. \
                 To fix it, {}.",
                fixes.join(" or ")
            ),
            min_budgets: Vec::new(),
        };
    }
    let shortfall = |c: &Evaluated| -> u128 {
        c.sim
            .peak_bytes
            .iter()
            .zip(devices)
            .map(|(&p, d)| u128::from(p.saturating_sub(d.budget_bytes)))
            .sum()
    };
    // A greedy candidate that streams everything is its `/streamed` sibling
    // under a less telling name.
    let lenient = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.all_streamed)
        .min_by_key(|&(i, c)| (shortfall(c), i))
        .map(|(_, c)| c)
        .expect("candidates are not empty");
    let mut min_budgets = Vec::new();
    let mut needs = Vec::new();
    for (&peak, dev) in lenient.sim.peak_bytes.iter().zip(devices) {
        if peak <= dev.budget_bytes {
            continue;
        }
        // An accelerator can only be over budget in `all-on-<it>` when its
        // greedy kept everything streamed, or in `all-on-<it>/streamed`: either
        // way this peak is the all-streamed peak there.
        min_budgets.push((dev.name.clone(), peak));
        needs.push(format!(
            "{} needs at least {} (budget is {})",
            dev.name,
            format_bytes(peak),
            format_bytes(dev.budget_bytes)
        ));
    }
    let names: Vec<&str> = min_budgets.iter().map(|(n, _)| n.as_str()).collect();
    fixes.push(format!("raise the budget of {}", names.join(" and ")));
    if !host_compute {
        fixes.push("allow host compute".to_string());
    }
    fixes.push("add a device".to_string());
    let fix = match fixes.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{}, or {last}", rest.join(", ")),
        _ => fixes.join(""),
    };
    PlanError::Infeasible {
        message: format!(
            "no candidate plan fits the memory budgets (closest: {}): {}. To fix it, {fix}.",
            lenient.name,
            needs.join("; ")
        ),
        min_budgets,
    }
}

fn plan_hash(
    g: &CostGraph,
    devices: &[Device],
    objective: Objective,
    host_compute: bool,
    chosen: &Evaluated,
) -> String {
    let mut h = Fnv1a64::default();
    h.str("tensortorrent-plan/1");
    h.f64s(g.node_flops());
    h.u64s(g.node_out_bytes());
    h.bools(g.node_host_only());
    h.u32s(g.input_offsets());
    h.u32s(g.input_ids());
    h.u64s(g.param_bytes());
    h.u32s(g.param_offsets());
    h.u32s(g.param_users_flat());
    h.u32s(g.output_ids());
    h.u64(devices.len() as u64);
    for d in devices {
        h.str(&d.name);
        h.bool(d.is_host);
        h.f64(d.flops_per_s);
        h.u64(d.budget_bytes);
        h.f64(d.h2d_bytes_per_s);
        h.f64(d.d2h_bytes_per_s);
        h.f64(d.latency_s);
    }
    h.str(objective.as_str());
    h.bool(host_compute);
    h.str(&chosen.name);
    h.u32s(&chosen.placement.node_device);
    h.bools(&chosen.placement.param_streamed);
    h.hex()
}

/// Plans a cost graph over a device list.
///
/// `devices[0]` must be the host; the others are accelerators. With
/// `host_compute` false, nodes that may leave the host never run there.
///
/// # Errors
/// * [`PlanError::InvalidDevices`] for a malformed device list;
/// * [`PlanError::Infeasible`] when no candidate fits the budgets, with the
///   smallest budgets that would make one fit.
pub fn plan(
    graph: &CostGraph,
    devices: &[Device],
    objective: Objective,
    host_compute: bool,
) -> Result<Plan, PlanError> {
    validate_devices(devices)?;
    let cands = candidates(graph, devices, host_compute);
    let Some(best) = choose(&cands, objective) else {
        return Err(infeasible(&cands, devices, host_compute));
    };
    let c = &cands[best];

    let p = graph.num_params();
    let mut param_device = vec![HOST; p];
    let mut param_prefetch_segment = vec![-1i64; p];
    let mut param_evict_segment = vec![-1i64; p];
    for (q, dev) in param_device.iter_mut().enumerate() {
        *dev = graph
            .param_users(q)
            .iter()
            .map(|&u| u as usize)
            .filter(|&u| c.placement.node_device[u] != HOST)
            .min()
            .map_or(HOST, |u| c.placement.node_device[u]);
    }
    for span in &c.seg.spans {
        let q = span.param as usize;
        if span.device == param_device[q] {
            param_prefetch_segment[q] = i64::from(span.first_segment);
            param_evict_segment[q] = i64::from(span.last_segment);
        }
    }

    Ok(Plan {
        node_device: c.placement.node_device.clone(),
        node_segment: c.seg.node_segment.clone(),
        segment_device: c.seg.segment_device.clone(),
        param_streamed: c.placement.param_streamed.clone(),
        param_device,
        param_prefetch_segment,
        param_evict_segment,
        predicted_time_s: c.sim.predicted_time_s,
        peak_bytes: c.sim.peak_bytes.clone(),
        candidates: cands
            .iter()
            .map(|e| Candidate {
                name: e.name.clone(),
                predicted_time_s: e.sim.predicted_time_s,
                feasible: e.feasible,
                peak_bytes: e.sim.peak_bytes.clone(),
            })
            .collect(),
        chosen: c.name.clone(),
        plan_hash: plan_hash(graph, devices, objective, host_compute, c),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(4 << 20), "4.00 MiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(format_bytes(u64::MAX), "16.00 EiB");
    }

    #[test]
    fn objectives_parse_and_print() {
        for o in Objective::ALL {
            assert_eq!(o.as_str().parse::<Objective>(), Ok(o));
            assert_eq!(o.to_string(), o.as_str());
        }
        let err = "fastest".parse::<Objective>().unwrap_err();
        assert_eq!(
            err,
            PlanError::InvalidObjective(
                "unknown objective \"fastest\"; valid objectives are: latency, memory, throughput"
                    .into()
            )
        );
    }
}
