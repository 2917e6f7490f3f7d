//! What the search reports: the families, the candidates and the chosen plan.

use std::fmt;

use crate::error::PeakContents;
use crate::graph::Tier;
use crate::plan::report::Report;
use crate::simulate::Record;

/// The family of search that proposed a candidate (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Everything on one device.
    SingleDevice,
    /// Everything on one accelerator, resident set by knapsack.
    Knapsack,
    /// Contiguous segments over the devices by dynamic programming.
    Segments,
    /// An accelerator's resident set kept, the rest computed on the host
    /// where streaming it costs more.
    HostStretches,
    /// A candidate over an accelerator's budget with its values spilled.
    Spill,
    /// Improved by local search.
    LocalSearch,
    /// A placement given from outside, simulated without search.
    Replayed,
}

impl Family {
    /// The family's name: `"single-device"`, `"knapsack"`, `"segments"`,
    /// `"host-stretches"`, `"spill"`, `"local-search"` or `"replayed"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SingleDevice => "single-device",
            Self::Knapsack => "knapsack",
            Self::Segments => "segments",
            Self::HostStretches => "host-stretches",
            Self::Spill => "spill",
            Self::LocalSearch => "local-search",
            Self::Replayed => "replayed",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Summary of one candidate placement.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Candidate name, for example `"all-on-virtual:0/streamed"`.
    pub name: String,
    /// The family that proposed it.
    pub family: Family,
    /// Simulated time until the last output is on the host, in seconds.
    pub predicted_time_s: f64,
    /// Whether every device's peak fits its budget.
    pub feasible: bool,
    /// Simulated peak memory per device, in bytes.
    pub peak_bytes: Vec<u64>,
    /// Device index of each node (its decisions are the chosen plan's
    /// fields of the same names: replaying them gives this candidate as a
    /// plan, whose hash is `plan_hash`).
    pub node_device: Vec<u32>,
    /// Whether each parameter is streamed.
    pub param_streamed: Vec<bool>,
    /// Whether each node's value is spilled to the host.
    pub value_spilled: Vec<bool>,
    /// Its prefetch depth (0: each segment reads its own parameters).
    pub prefetch_depth: u32,
    /// Bytes of buffers its prefetches may fill ahead of use (0: none).
    pub prefetch_window_bytes: u64,
    /// The hash the plan of this candidate has.
    pub plan_hash: String,
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
    /// The stays of streamed parameters on the devices they stream to,
    /// ordered by first segment, then parameter (the `stream_` fields,
    /// indexed by stay): stay `k` brings parameter `stream_param[k]` to
    /// device `stream_device[k]`, serves the segments from
    /// `stream_first_segment[k]` to `stream_last_segment[k]` that use it
    /// there and is evicted after the last. A parameter used again after a
    /// gap (a tied embedding, a layer applied in a loop) has a stay per run
    /// of uses.
    pub stream_param: Vec<u32>,
    /// The device each stay brings its parameter to.
    pub stream_device: Vec<u32>,
    /// The segment whose start issues each stay's prefetch (the prefetch
    /// depth's worth of segments before its first use); -1 for "at the start
    /// of the run".
    pub stream_issue_segment: Vec<i64>,
    /// The first segment each stay serves.
    pub stream_first_segment: Vec<u32>,
    /// The last segment each stay serves (it is evicted after it).
    pub stream_last_segment: Vec<u32>,
    /// Whether each node's value is spilled to the host across a gap in
    /// its uses (only spillable values are).
    pub value_spilled: Vec<bool>,
    /// For spilled values, the segment whose start issues the copy back to
    /// the device (the uses in it and after read the copy); -1 otherwise.
    pub value_reload_segment: Vec<i64>,
    /// How many segments ahead streamed parameters are prefetched; 0 when
    /// each segment reads its own (a [`SYNC_SUFFIX`](crate::SYNC_SUFFIX) candidate).
    pub prefetch_depth: u32,
    /// Bytes of buffers prefetches may fill ahead of use, each issued as
    /// early as they allow (a [`WINDOW_PREFIX`](crate::WINDOW_PREFIX) candidate); 0 when the
    /// depth alone says when.
    pub prefetch_window_bytes: u64,
    /// The home of each parameter of the graph planned: the graph's own
    /// homes, or, when the planner moved parameters to disk (see
    /// [`crate::Planner::run_with_split`]), those of the graph it planned.
    pub param_home: Vec<Tier>,
    /// Whether the split graph given to [`crate::Planner::run_with_split`]
    /// was planned: then every node and parameter index of the plan refers
    /// to it.
    pub split: bool,
    /// Simulated time until the last output is on the host, in seconds.
    pub predicted_time_s: f64,
    /// Simulated peak memory per device, in bytes.
    pub peak_bytes: Vec<u64>,
    /// What each device holds at its peak, in device order.
    pub peaks: Vec<PeakContents>,
    /// The busiest resource's seconds of work: no schedule of this plan's
    /// work is faster.
    pub lower_bound_s: f64,
    /// Fraction of the predicted time each resource is busy, by resource
    /// name (see [`crate::Resource::name`]).
    pub busy_fraction: Vec<(String, f64)>,
    /// The simulated timeline of the plan.
    pub timeline: Vec<Record>,
    /// Every candidate listed, in search order.
    pub candidates: Vec<Candidate>,
    /// Name of the chosen candidate.
    pub chosen: String,
    /// What the search did and why it stopped.
    pub report: Report,
    /// 16 lowercase hex digits of a stable FNV-1a 64 hash of the inputs and
    /// the decisions.
    pub plan_hash: String,
}
