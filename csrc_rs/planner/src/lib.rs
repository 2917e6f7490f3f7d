//! Native planner of the tensortorrent `torch.compile` backend.
//!
//! Given a [`CostGraph`] (the work, data flow and parameters of one captured
//! graph, in topological order) and a list of [`Device`]s (the host at index
//! 0, then accelerators), [`plan`] (or a configured [`Planner`]) searches
//! placements in several candidate families, scores each with the
//! discrete-event simulator ([`simulate`]) and keeps the one the
//! [`Objective`] prefers: where each node runs, which parameters stay
//! resident and which are streamed in per segment, with the predicted time,
//! per-device peak memory, lower bound and timeline. [`exhaustive`] finds the
//! optimum of small graphs by enumeration, to check the search against.
//! When the host budget cannot hold the weights, [`Planner::run_with_split`]
//! moves the parameters allowed to disk (see [`CostGraph::with_disk_allowed`]);
//! [`Planner::replay`] rebuilds a plan from its recorded decisions.
//!
//! ```
//! use tensortorrent_planner::{plan, CostGraph, Device, Objective};
//!
//! // x (a graph input on the host) -> linear(W) -> output.
//! let graph = CostGraph::new(
//!     vec![0.0, 2e9],       // flops per node
//!     vec![4096, 4096],     // output bytes per node
//!     vec![true, false],    // the input placeholder must stay on the host
//!     vec![0, 0, 1],        // input offsets
//!     vec![0],              // node 1 reads node 0
//!     vec![1 << 20],        // one 1 MiB parameter
//!     vec![0, 1],           // param offsets
//!     vec![1],              // used by node 1
//!     vec![1],              // node 1 is the output
//! )?;
//! let device = |name: &str, is_host: bool, flops_per_s: f64| {
//!     Device::new(name, is_host, flops_per_s, 1 << 30, 1e10, 1e10, 1e-5)
//! };
//! let devices = [device("cpu", true, 1e10), device("virtual:0", false, 1e12)];
//!
//! let p = plan(&graph, &devices, Objective::Latency, true)?;
//! assert_eq!(p.chosen, "all-on-virtual:0");
//! assert_eq!(p.node_device, vec![0, 1]);
//! assert_eq!(p.param_streamed, vec![false]);
//! assert!(p.lower_bound_s <= p.predicted_time_s);
//! assert_eq!(p.plan_hash.len(), 16);
//! # Ok::<(), tensortorrent_planner::PlanError>(())
//! ```
#![warn(missing_docs)]

mod device;
mod error;
mod exhaustive;
mod graph;
mod hash;
mod placement;
mod plan;
mod simulate;

pub use crate::{
    device::{validate_devices, Device},
    error::{Held, PeakContents, PlanError},
    exhaustive::{exhaustive, Optimum},
    graph::{CostGraph, Tier},
    plan::{
        plan, Candidate, Family, Objective, Plan, Planner, Report, StopReason, SYNC_SUFFIX,
        WINDOW_PREFIX,
    },
    simulate::{simulate, simulate_spilled, Activity, Record, Resource, Simulation},
};

/// Version of this crate and a hash of its sources (see `build.rs`): two
/// builds with one version plan alike, so a plan cache keys on it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "+src.",
    env!("TENSORTORRENT_PLANNER_SOURCE")
);
