//! Candidate search and the final choice.
//!
//! Candidate families, every candidate scored by the same simulator:
//! * `single-device`: for each accelerator `a`, `all-on-<a>` (every node that
//!   may leave the host on `a`, parameters made resident greedily in order
//!   of first use while the budget allows; prefetch depth 1 only) and
//!   `all-on-<a>/streamed` (every parameter streamed); with host compute, `all-on-<host>` (and
//!   `all-on-<host>/streamed` when parameters live on disk). Always run.
//! * `knapsack`: `all-on-<a>/knapsack`, the resident set chosen by a
//!   knapsack on the transfer time each parameter's residency saves; with
//!   host compute and parameters on disk, `all-on-<host>/knapsack` too (the
//!   parameters the host keeps in memory, the others read each run). Each
//!   also, at the default prefetch depth, with prefetch windows
//!   (`.../knapsack/window-<N>KiB`): prefetches issued as early as that
//!   many bytes of buffers allow, the rest of the budget left to the
//!   knapsack (or, when it keeps nothing, `.../streamed/window-<N>KiB`).
//! * `segments`: contiguous segments over the topological order by dynamic
//!   programming over every usable device, each accelerator taking the
//!   parameters that fit what its budget leaves (see `dp`); residency then
//!   by knapsack.
//! * `host-stretches`: for each accelerator `a`, with the resident set of
//!   the best `all-on-<a>` candidate kept, the DP over the host and `a`
//!   decides which stretches compute on the host because streaming their
//!   weights costs more than computing them there.
//! * `spill`: each candidate over an accelerator's budget again with every
//!   spillable value spilled to the host between its uses (see
//!   `Placement`); listed as `<name>/spill` when that lowers its overshoot.
//! * `local-search`: hill climbing from the candidates so far (see
//!   `local_search`); listed when it finds a better placement.
//!
//! The search is deterministic and bounded by a node limit and an optional
//! time limit; the [`Report`] says which stopped it. The constructive
//! families take a bounded number of simulations per device and always run
//! unless time runs out (`single-device` runs even then); the node limit
//! (nodes simulated over all candidates, those of the families included)
//! bounds local search. The objective picks among the feasible candidates.

mod dp;
mod knapsack;
mod local_search;
mod report;
mod residency;
mod search;

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use report::{Report, StopReason};

use crate::device::{validate_devices, Device};
use crate::error::PlanError;
use crate::graph::CostGraph;
use crate::hash::Fnv1a64;
use crate::placement::{buffer_peak, Placement, HOST};
use crate::simulate::{check_depth, checked_placement, run, Record, Simulation};
use search::{Evaluated, Search, Trial};

/// What the plan optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Objective {
    /// Least predicted time for one run (one forward).
    Latency,
    /// Least accelerator memory (the largest peak over accelerators) among
    /// plans within the memory slack (10 % by default) of the fastest.
    Memory,
    /// Most runs per second. The planner has no batch or stream-of-requests
    /// information and simulates one run at a time, with runs not
    /// overlapping, so this is the same choice as [`Objective::Latency`].
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
    /// `param_device`; -1 otherwise.
    pub param_prefetch_segment: Vec<i64>,
    /// For streamed parameters, the last segment using it on
    /// `param_device` (it is evicted after it); -1 otherwise.
    pub param_evict_segment: Vec<i64>,
    /// For streamed parameters, the segment whose start issues the
    /// prefetch to `param_device` (the prefetch depth's worth of segments
    /// before the first use there); -1 for "at the start of the run" and
    /// for parameters not streamed.
    pub param_issue_segment: Vec<i64>,
    /// Whether each node's value is spilled to the host across a gap in
    /// its uses (only spillable values are).
    pub value_spilled: Vec<bool>,
    /// For spilled values, the segment whose start issues the copy back to
    /// the device (the uses in it and after read the copy); -1 otherwise.
    pub value_reload_segment: Vec<i64>,
    /// How many segments ahead streamed parameters are prefetched; 0 when
    /// each segment reads its own (a [`SYNC_SUFFIX`] candidate).
    pub prefetch_depth: u32,
    /// Bytes of buffers prefetches may fill ahead of use, each issued as
    /// early as they allow (a [`WINDOW_PREFIX`] candidate); 0 when the
    /// depth alone says when.
    pub prefetch_window_bytes: u64,
    /// Simulated time until the last output is on the host, in seconds.
    pub predicted_time_s: f64,
    /// Simulated peak memory per device, in bytes.
    pub peak_bytes: Vec<u64>,
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

/// A configured search: the objective, the limits and the options.
///
/// ```
/// use std::time::Duration;
/// use tensortorrent_planner::{Objective, Planner};
///
/// let planner = Planner::new(Objective::Latency)
///     .with_host_compute(false)
///     .with_node_limit(1_000_000)
///     .with_time_limit(Duration::from_millis(50));
/// assert_eq!(planner.objective(), Objective::Latency);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Planner {
    objective: Objective,
    host_compute: bool,
    node_limit: Option<u64>,
    time_limit: Option<Duration>,
    prefetch_depth: u32,
    memory_slack: f64,
}

impl Planner {
    /// Default memory slack of [`Objective::Memory`]: 10 % over the fastest.
    pub const DEFAULT_MEMORY_SLACK: f64 = 0.10;
    /// Default node limit, in whole-graph simulations.
    pub const DEFAULT_SIMULATIONS: u64 = 32;
    /// Floor of the default node limit, so that small graphs search well.
    pub const MIN_NODE_LIMIT: u64 = 1 << 18;

    /// A planner for `objective` with host compute allowed, the default
    /// node limit, no time limit, a prefetch depth of 1 and the default
    /// memory slack.
    #[must_use]
    pub fn new(objective: Objective) -> Self {
        Self {
            objective,
            host_compute: true,
            node_limit: None,
            time_limit: None,
            prefetch_depth: 1,
            memory_slack: Self::DEFAULT_MEMORY_SLACK,
        }
    }

    /// The objective.
    #[must_use]
    pub fn objective(&self) -> Objective {
        self.objective
    }

    /// Whether nodes that may leave the host may still run there.
    #[must_use]
    pub fn with_host_compute(mut self, host_compute: bool) -> Self {
        self.host_compute = host_compute;
        self
    }

    /// Stops local search once this many nodes were simulated, over all
    /// candidates (the constructive families always run in full). The
    /// default is `DEFAULT_SIMULATIONS` simulations of the whole graph, and
    /// at least `MIN_NODE_LIMIT`.
    #[must_use]
    pub fn with_node_limit(mut self, nodes: u64) -> Self {
        self.node_limit = Some(nodes);
        self
    }

    /// Stops the search after this much time (the `single-device` family
    /// always runs in full). A search stopped by time is not reproducible.
    #[must_use]
    pub fn with_time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = Some(limit);
        self
    }

    /// How many segments ahead on its device a streamed parameter is
    /// prefetched (at least 1; 1 is a double buffer). The runtime issues
    /// prefetches one segment ahead.
    #[must_use]
    pub fn with_prefetch_depth(mut self, depth: u32) -> Self {
        self.prefetch_depth = depth;
        self
    }

    /// The fraction over the fastest time within which
    /// [`Objective::Memory`] looks for the least accelerator memory.
    #[must_use]
    pub fn with_memory_slack(mut self, slack: f64) -> Self {
        self.memory_slack = slack;
        self
    }

    /// The node limit for a graph of `num_nodes` nodes.
    #[must_use]
    pub fn node_limit(&self, num_nodes: usize) -> u64 {
        self.node_limit.unwrap_or_else(|| {
            (Self::DEFAULT_SIMULATIONS * num_nodes as u64).max(Self::MIN_NODE_LIMIT)
        })
    }

    /// Plans `graph` over `devices`.
    ///
    /// `devices[0]` must be the host; the others are accelerators.
    ///
    /// # Errors
    /// * [`PlanError::InvalidDevices`] for a malformed device list;
    /// * [`PlanError::InvalidOptions`] for a prefetch depth of 0 or a
    ///   negative or non-finite memory slack;
    /// * [`PlanError::Infeasible`] when no candidate fits the budgets, with
    ///   the smallest budgets that would make one fit.
    pub fn run(&self, graph: &CostGraph, devices: &[Device]) -> Result<Plan, PlanError> {
        validate_devices(devices)?;
        check_depth(self.prefetch_depth)?;
        if !(self.memory_slack.is_finite() && self.memory_slack >= 0.0) {
            return Err(PlanError::InvalidOptions(format!(
                "memory_slack is {}; it must be finite and non-negative",
                self.memory_slack
            )));
        }
        let mut s = Search::new(
            graph,
            devices,
            self.host_compute,
            self.prefetch_depth,
            self.node_limit(graph.num_nodes()),
            self.time_limit,
        );
        single_device(&mut s);
        knapsack_family(&mut s);
        segments_family(&mut s);
        host_stretches(&mut s);
        spill_family(&mut s);
        self.local_search(&mut s);
        let report = Report {
            stop_reason: s.stop.unwrap_or(StopReason::Saturated),
            candidates_simulated: s.simulations,
            nodes_simulated: s.nodes_simulated,
        };
        let Some(best) = choose(&s.candidates, self.objective, self.memory_slack) else {
            return Err(infeasible(&s.candidates, devices, self.host_compute));
        };
        Ok(self.finish(graph, devices, &s.candidates, best, report))
    }

    /// The plan made of a known placement, without searching: the same plan
    /// (and hash) as the search that chose `name` with this placement.
    ///
    /// # Errors
    /// * [`PlanError::InvalidDevices`] or [`PlanError::InvalidPlacement`] for
    ///   a malformed device list or placement;
    /// * [`PlanError::Infeasible`] when the placement does not fit the budgets.
    ///
    /// `value_spilled` is the plan's per-node spill flags, or empty for none.
    pub fn replay(
        &self,
        graph: &CostGraph,
        devices: &[Device],
        name: &str,
        node_device: &[u32],
        param_streamed: &[bool],
        value_spilled: &[bool],
    ) -> Result<Plan, PlanError> {
        validate_devices(devices)?;
        check_depth(self.prefetch_depth)?;
        let placement =
            checked_placement(graph, devices, node_device, param_streamed, value_spilled)?;
        let mut s = Search::new(
            graph,
            devices,
            self.host_compute,
            self.prefetch_depth,
            0,
            None,
        );
        let depth = if name.split('/').any(|part| part.ends_with(SYNC_SUFFIX)) {
            0
        } else {
            self.prefetch_depth
        };
        let trial = s.simulate_windowed(placement, depth, window_of(name));
        let index = s.add(name.to_string(), Family::Replayed, trial, false);
        if !s.candidates[index].feasible() {
            return Err(infeasible(&s.candidates, devices, self.host_compute));
        }
        let report = Report {
            stop_reason: StopReason::Replayed,
            candidates_simulated: s.simulations,
            nodes_simulated: s.nodes_simulated,
        };
        Ok(self.finish(graph, devices, &s.candidates, index, report))
    }

    /// The score local search minimises for this objective.
    fn goal(&self, cands: &[Evaluated]) -> Goal {
        let fastest = cands
            .iter()
            .filter(|c| c.feasible())
            .map(|c| c.trial.sim.predicted_time_s)
            .fold(f64::INFINITY, f64::min);
        Goal {
            objective: self.objective,
            time_cap: (1.0 + self.memory_slack) * fastest,
        }
    }

    /// Local search from every candidate so far, best first; lists the best
    /// improvement.
    fn local_search(&self, s: &mut Search) {
        let goal = self.goal(&s.candidates);
        let score = |s: &Search, t: &Trial| goal.score(s.shortfall(&t.sim), &t.sim);
        let scores: Vec<Score> = s
            .candidates
            .iter()
            .map(|c| goal.score(c.shortfall, &c.trial.sim))
            .collect();
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[a].compare(&scores[b]).then(a.cmp(&b)));
        let starts: Vec<(Placement, Score)> = order
            .into_iter()
            .map(|i| (s.candidates[i].trial.placement.clone(), scores[i]))
            .collect();
        let best = local_search::search(s, &starts, &score);
        if let Some(t) = best {
            s.add("local-search".into(), Family::LocalSearch, t, false);
        }
    }

    fn finish(
        &self,
        g: &CostGraph,
        devices: &[Device],
        cands: &[Evaluated],
        best: usize,
        report: Report,
    ) -> Plan {
        let c = &cands[best];
        let pl = &c.trial.placement;
        let seg = &c.trial.seg;
        let sim = run(g, devices, pl, seg, true);

        let p = g.num_params();
        let mut param_device = vec![HOST; p];
        let mut param_prefetch_segment = vec![-1i64; p];
        let mut param_evict_segment = vec![-1i64; p];
        let mut param_issue_segment = vec![-1i64; p];
        for (q, dev) in param_device.iter_mut().enumerate() {
            *dev = g
                .param_users(q)
                .iter()
                .map(|&u| u as usize)
                .filter(|&u| pl.node_device[u] != HOST)
                .min()
                .map_or(HOST, |u| pl.node_device[u]);
        }
        for span in &seg.spans {
            let q = span.param as usize;
            if span.device == param_device[q] {
                param_prefetch_segment[q] = i64::from(span.first_segment);
                param_evict_segment[q] = i64::from(span.last_segment);
                param_issue_segment[q] = span.issue_segment.map_or(-1, i64::from);
            }
        }
        let mut value_spilled = vec![false; g.num_nodes()];
        let mut value_reload_segment = vec![-1i64; g.num_nodes()];
        for spill in &seg.spills {
            value_spilled[spill.node as usize] = true;
            value_reload_segment[spill.node as usize] = i64::from(spill.issue_segment);
        }
        let busy_fraction = sim
            .busy_fraction()
            .into_iter()
            .map(|(r, f)| (r.name(devices), f))
            .collect();

        Plan {
            node_device: pl.node_device.clone(),
            node_segment: seg.node_segment.clone(),
            segment_device: seg.segment_device.clone(),
            param_streamed: pl.param_streamed.clone(),
            param_device,
            param_prefetch_segment,
            param_evict_segment,
            param_issue_segment,
            value_spilled,
            value_reload_segment,
            prefetch_depth: c.trial.depth,
            prefetch_window_bytes: c.trial.window,
            predicted_time_s: sim.predicted_time_s,
            peak_bytes: sim.peak_bytes.clone(),
            lower_bound_s: sim.lower_bound_s,
            busy_fraction,
            candidates: cands
                .iter()
                .map(|e| Candidate {
                    name: e.name.clone(),
                    family: e.family,
                    predicted_time_s: e.trial.sim.predicted_time_s,
                    feasible: e.feasible(),
                    peak_bytes: e.trial.sim.peak_bytes.clone(),
                })
                .collect(),
            chosen: c.name.clone(),
            report,
            plan_hash: self.hash(g, devices, c),
            timeline: sim.timeline,
        }
    }

    fn hash(&self, g: &CostGraph, devices: &[Device], chosen: &Evaluated) -> String {
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
        h.str(self.objective.as_str());
        h.bool(self.host_compute);
        // Inputs added later are hashed only when they differ from their
        // defaults, so that plans made without them keep their hashes.
        if g.node_bytes_accessed().iter().any(|&b| b > 0) {
            h.str("node_bytes_accessed");
            h.u64s(g.node_bytes_accessed());
        }
        if g.has_disk_params() {
            h.str("param_home");
            for t in g.param_home() {
                h.str(t.as_str());
            }
        }
        for (i, d) in devices.iter().enumerate() {
            if d.mem_bytes_per_s.is_finite() || d.disk_bytes_per_s.is_finite() {
                h.str("rates");
                h.u64(i as u64);
                h.f64(d.mem_bytes_per_s);
                h.f64(d.disk_bytes_per_s);
            }
        }
        if let Some(limit) = self.node_limit {
            h.str("node_limit");
            h.u64(limit);
        }
        if let Some(limit) = self.time_limit {
            h.str("time_limit");
            h.f64(limit.as_secs_f64());
        }
        if self.prefetch_depth != 1 {
            h.str("prefetch_depth");
            h.u64(u64::from(self.prefetch_depth));
        }
        if self.memory_slack.to_bits() != Self::DEFAULT_MEMORY_SLACK.to_bits() {
            h.str("memory_slack");
            h.f64(self.memory_slack);
        }
        if chosen.trial.depth != self.prefetch_depth {
            h.str("depth");
            h.u64(u64::from(chosen.trial.depth));
        }
        if chosen.trial.window > 0 {
            h.str("window");
            h.u64(chosen.trial.window);
        }
        h.str(&chosen.name);
        h.u32s(&chosen.trial.placement.node_device);
        h.bools(&chosen.trial.placement.param_streamed);
        if chosen.trial.placement.spills() {
            h.str("value_spilled");
            h.bools(&chosen.trial.placement.value_spilled);
        }
        h.hex()
    }
}

/// Plans a cost graph over a device list with the default limits: the
/// same as `Planner::new(objective).with_host_compute(host_compute).run(..)`.
///
/// `devices[0]` must be the host; the others are accelerators. With
/// `host_compute` false, nodes that may leave the host never run there.
///
/// # Errors
/// See [`Planner::run`].
pub fn plan(
    graph: &CostGraph,
    devices: &[Device],
    objective: Objective,
    host_compute: bool,
) -> Result<Plan, PlanError> {
    Planner::new(objective)
        .with_host_compute(host_compute)
        .run(graph, devices)
}

/// Every node that may leave the host on device `d`.
fn all_on(g: &CostGraph, d: u32) -> Vec<u32> {
    g.node_host_only()
        .iter()
        .map(|&h| if h { HOST } else { d })
        .collect()
}

/// The `single-device` family; runs whatever the limits.
fn single_device(s: &mut Search) {
    let g = s.g;
    for a in 1..s.devices.len() as u32 {
        let name = &s.devices[a as usize].name;
        let (greedy_name, streamed_name) =
            (format!("all-on-{name}"), format!("all-on-{name}/streamed"));
        let node_device = all_on(g, a);
        let streamed = s.simulate(Placement::all_streamed(g, node_device.clone()));
        if s.depth == 1 {
            let peak = streamed.sim.peak_bytes[a as usize];
            let flags = residency::greedy_residency(s, a, &node_device, peak);
            let greedy = Placement::new(g, node_device, flags);
            if greedy != streamed.placement {
                let trial = s.simulate(greedy);
                s.add(greedy_name, Family::SingleDevice, trial, false);
            }
        }
        s.add(streamed_name, Family::SingleDevice, streamed, true);
    }
    if s.host_compute {
        let name = format!("all-on-{}", s.devices[HOST as usize].name);
        let on_host = vec![HOST; g.num_nodes()];
        let trial = s.simulate(Placement::new(
            g,
            on_host.clone(),
            vec![false; g.num_params()],
        ));
        s.add(name.clone(), Family::SingleDevice, trial, true);
        if g.has_disk_params() {
            let trial = s.simulate(Placement::all_streamed(g, on_host));
            s.add(
                format!("{name}/streamed"),
                Family::SingleDevice,
                trial,
                true,
            );
        }
    }
}

/// The listed all-streamed trial of `node_device` at prefetch `depth`, or a
/// new simulation.
fn streamed_trial(s: &mut Search, node_device: Vec<u32>, depth: u32) -> Trial {
    let pl = Placement::all_streamed(s.g, node_device);
    match s.find(&pl, depth) {
        Some(i) => s.candidates[i].trial.clone(),
        None => s.simulate_at(pl, depth),
    }
}

/// The `knapsack` family: on each accelerator, and on the host when
/// parameters live on disk (which of them the host keeps in memory), there
/// also with synchronous reads (see [`SYNC_SUFFIX`]).
fn knapsack_family(s: &mut Search) {
    let host = s.host_compute && s.g.has_disk_params();
    let depth = s.depth;
    let runs = (1..s.devices.len() as u32)
        .map(|a| (a, depth))
        .chain(host.then_some((HOST, depth)))
        .chain(host.then_some((HOST, 0)));
    for (a, depth) in runs {
        if s.out_of_time() {
            return;
        }
        let streamed = streamed_trial(s, all_on(s.g, a), depth);
        let name = format!("all-on-{}/knapsack", s.devices[a as usize].name);
        if let Some(trial) = knapsack::fit(s, &streamed) {
            let sync = if depth == 0 { SYNC_SUFFIX } else { "" };
            s.add(format!("{name}{sync}"), Family::Knapsack, trial, false);
        }
        // Windows replace the default double buffer, not a depth asked for.
        if depth != 1 {
            continue;
        }
        for window in windows(s, a, &streamed) {
            if s.out_of_time() {
                return;
            }
            let pl = streamed.placement.clone();
            let wide = s.simulate_windowed(pl, depth, window);
            let suffix = format!("{WINDOW_PREFIX}{}KiB", window / 1024);
            match knapsack::fit(s, &wide) {
                // With nothing left streaming the window means nothing.
                Some(trial) if trial.seg.spans.iter().any(|sp| sp.device == a) => {
                    s.add(format!("{name}{suffix}"), Family::Knapsack, trial, false);
                }
                Some(_) => {}
                None => {
                    let name = format!("all-on-{}/streamed{suffix}", s.devices[a as usize].name);
                    s.add(name, Family::SingleDevice, wide, true);
                }
            }
        }
    }
}

/// Marks a candidate whose prefetches fill a window of buffers:
/// `<name>/window-<N>KiB`, the window being N KiB. [`Planner::replay`]
/// replays such a name with its window.
pub const WINDOW_PREFIX: &str = "/window-";

/// The prefetch window a candidate's name gives (0 for none).
fn window_of(name: &str) -> u64 {
    name.rsplit_once(WINDOW_PREFIX)
        .and_then(|(_, w)| w.strip_suffix("KiB"))
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Prefetch windows worth trying on device `a` for the all-streamed trial
/// `streamed` (at depth 1): its double buffer's peak `p` widened by an
/// eighth, a quarter, a half and the whole of its largest buffer; only those
/// narrower than the budget, in whole KiB, ascending.
fn windows(s: &Search, a: u32, streamed: &Trial) -> Vec<u64> {
    let bytes = s.g.param_bytes();
    let on_a = streamed.seg.spans.iter().filter(|sp| sp.device == a);
    let largest = on_a.map(|sp| bytes[sp.param as usize]).max().unwrap_or(0);
    let peak = buffer_peak(s.g, &streamed.seg, a);
    let budget = s.devices[a as usize].budget_bytes;
    let mut out: Vec<u64> = [8, 4, 2, 1]
        .into_iter()
        .map(|k| (peak + largest / k) / 1024 * 1024)
        .filter(|&w| largest > 0 && w > peak && w < budget)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Suffix of a candidate whose segments read their own streamed parameters
/// when they start (prefetch depth 0): one read buffer instead of two, so
/// more of a tight host budget is left for parameters kept in memory, at the
/// price of reads no longer overlapping compute. [`Planner::replay`] replays
/// such a name at depth 0.
pub const SYNC_SUFFIX: &str = "-sync";

/// Lists a DP placement with its residency by knapsack (or everything
/// streamed when no resident set fits).
fn add_fitted(s: &mut Search, name: String, family: Family, node_device: Vec<u32>) {
    if s.out_of_time() {
        return;
    }
    let depth = s.depth;
    let streamed = streamed_trial(s, node_device, depth);
    let trial = knapsack::fit(s, &streamed).unwrap_or(streamed);
    s.add(name, family, trial, false);
}

/// The `segments` family.
fn segments_family(s: &mut Search) {
    let movable = s.movable_devices();
    if movable.len() < 2 || s.out_of_time() {
        return;
    }
    let g = s.g;
    let devices = s.devices;
    // What the budget leaves for resident parameters: the budget less the
    // peak with everything on the device streamed.
    let capacity: Vec<u64> = (0..devices.len() as u32)
        .map(|d| {
            let headroom = if d == HOST {
                0
            } else {
                s.find(&Placement::all_streamed(g, all_on(g, d)), s.depth)
                    .map_or(0, |i| s.candidates[i].trial.sim.peak_bytes[d as usize])
            };
            devices[d as usize].budget_bytes.saturating_sub(headroom)
        })
        .collect();
    let costs = dp::Costs::new(g, devices, &vec![false; g.num_params()]);
    let node_device = dp::place(&costs, &movable, &capacity);
    add_fitted(s, "segments".into(), Family::Segments, node_device);
}

/// The `host-stretches` family.
fn host_stretches(s: &mut Search) {
    if !s.host_compute {
        return;
    }
    let g = s.g;
    let devices = s.devices;
    for a in 1..devices.len() as u32 {
        if s.out_of_time() {
            return;
        }
        // The fastest feasible candidate with everything on `a`.
        let on_a = all_on(g, a);
        let kept = s
            .candidates
            .iter()
            .filter(|c| c.feasible() && c.trial.placement.node_device == on_a)
            .min_by(|x, y| {
                x.trial
                    .sim
                    .predicted_time_s
                    .total_cmp(&y.trial.sim.predicted_time_s)
            });
        let free: Vec<bool> = (0..g.num_params())
            .map(|q| {
                kept.is_some_and(|c| {
                    !c.trial.placement.param_streamed[q]
                        && g.param_users(q).iter().any(|&u| on_a[u as usize] == a)
                })
            })
            .collect();
        let costs = dp::Costs::new(g, devices, &free);
        let node_device = dp::place(&costs, &[HOST, a], &vec![0; devices.len()]);
        let streamed: Vec<bool> = free.iter().map(|&f| !f).collect();
        let trial = s.simulate(Placement::new(g, node_device, streamed));
        let name = format!("host-stretches/{}", devices[a as usize].name);
        s.add(name, Family::HostStretches, trial, false);
    }
}

/// The `spill` family: every candidate over an accelerator's budget again
/// with every spillable value spilled, listed when that lowers its overshoot.
fn spill_family(s: &mut Search) {
    let over_accelerator = |sim: &Simulation, devices: &[Device]| {
        sim.peak_bytes
            .iter()
            .zip(devices)
            .skip(1)
            .any(|(&peak, d)| peak > d.budget_bytes)
    };
    let n = s.g.num_nodes();
    let over: Vec<usize> = (0..s.candidates.len())
        .filter(|&i| over_accelerator(&s.candidates[i].trial.sim, s.devices))
        .collect();
    for i in over {
        if s.out_of_time() {
            return;
        }
        let c = &s.candidates[i];
        let (name, shortfall, budget_free) =
            (format!("{}/spill", c.name), c.shortfall, c.budget_free);
        let (placement, depth) = (c.trial.placement.clone(), c.trial.depth);
        let mut trial = s.simulate_at(placement.with_spills(vec![true; n]), depth);
        if trial.seg.spills.is_empty() || s.shortfall(&trial.sim) >= shortfall {
            continue;
        }
        // Only the flags that take effect, so equal plans compare equal.
        let mut spilled = vec![false; n];
        for spill in &trial.seg.spills {
            spilled[spill.node as usize] = true;
        }
        trial.placement.value_spilled = spilled;
        s.add(name, Family::Spill, trial, budget_free);
    }
}

/// How local search compares simulated placements: fitting first, then
/// the objective. Times within a relative 1e-9 count as equal, so that
/// rounding never passes for an improvement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Score {
    shortfall: u128,
    /// Seconds over the memory objective's time cap (0 otherwise).
    excess_s: f64,
    /// The memory objective's accelerator peak (0 otherwise).
    memory: u64,
    time_s: f64,
}

fn cmp_time(a: f64, b: f64) -> Ordering {
    if (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) {
        Ordering::Equal
    } else {
        a.total_cmp(&b)
    }
}

impl Score {
    fn compare(&self, other: &Self) -> Ordering {
        self.shortfall
            .cmp(&other.shortfall)
            .then(cmp_time(self.excess_s, other.excess_s))
            .then(self.memory.cmp(&other.memory))
            .then(cmp_time(self.time_s, other.time_s))
    }

    pub(crate) fn better_than(&self, other: &Self) -> bool {
        self.compare(other) == Ordering::Less
    }
}

struct Goal {
    objective: Objective,
    /// The memory objective's time cap.
    time_cap: f64,
}

impl Goal {
    fn score(&self, shortfall: u128, sim: &Simulation) -> Score {
        let time_s = sim.predicted_time_s;
        match self.objective {
            Objective::Latency | Objective::Throughput => Score {
                shortfall,
                excess_s: 0.0,
                memory: 0,
                time_s,
            },
            Objective::Memory => Score {
                shortfall,
                excess_s: if time_s > self.time_cap {
                    time_s - self.time_cap
                } else {
                    0.0
                },
                memory: accelerator_peak(sim),
                time_s,
            },
        }
    }
}

fn accelerator_peak(sim: &Simulation) -> u64 {
    sim.peak_bytes.iter().skip(1).copied().max().unwrap_or(0)
}

/// Index of the candidate the objective prefers, if any is feasible.
fn choose(cands: &[Evaluated], objective: Objective, slack: f64) -> Option<usize> {
    let feasible = || cands.iter().enumerate().filter(|(_, c)| c.feasible());
    let time = |c: &Evaluated| c.trial.sim.predicted_time_s;
    let fastest = feasible()
        .min_by(|(_, a), (_, b)| time(a).total_cmp(&time(b)))
        .map(|(i, _)| i)?;
    match objective {
        Objective::Latency | Objective::Throughput => Some(fastest),
        Objective::Memory => {
            let limit = (1.0 + slack) * time(&cands[fastest]);
            feasible()
                .filter(|(_, c)| time(c) <= limit)
                .min_by(|(i, a), (j, b)| {
                    accelerator_peak(&a.trial.sim)
                        .cmp(&accelerator_peak(&b.trial.sim))
                        .then(time(a).total_cmp(&time(b)))
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
    // Only a candidate whose placement ignores the budgets is sure to come
    // back, and fit, once the budgets are raised to its peaks.
    let lenient = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| c.budget_free)
        .min_by_key(|&(i, c)| (c.shortfall, i))
        .map(|(_, c)| c);
    let Some(lenient) = lenient else {
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
    };
    let mut min_budgets = Vec::new();
    let mut needs = Vec::new();
    for (&peak, dev) in lenient.trial.sim.peak_bytes.iter().zip(devices) {
        if peak <= dev.budget_bytes {
            continue;
        }
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

    #[test]
    fn rounding_is_not_an_improvement() {
        let at = |time_s: f64| Score {
            shortfall: 0,
            excess_s: 0.0,
            memory: 0,
            time_s,
        };
        assert!(!at(1.0 - 1e-12).better_than(&at(1.0)));
        assert!(at(0.999).better_than(&at(1.0)));
        assert!(!at(f64::INFINITY).better_than(&at(f64::INFINITY)));
        let over = Score {
            shortfall: 1,
            ..at(0.0)
        };
        assert!(at(5.0).better_than(&over));
    }
}
