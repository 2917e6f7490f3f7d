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
mod families;
mod knapsack;
mod local_search;
mod objective;
mod report;
mod residency;
mod search;
mod types;

use std::time::Duration;

pub use families::{SYNC_SUFFIX, WINDOW_PREFIX};
pub use objective::Objective;
pub use report::{Report, StopReason};
pub use types::{Candidate, Family, Plan};

use crate::device::{validate_devices, Device};
use crate::error::PlanError;
use crate::graph::CostGraph;
use crate::hash::Fnv1a64;
use crate::placement::{Placement, HOST};
use crate::simulate::{check_depth, checked_placement, Workspace};
use objective::{accelerator_peak, Goal, Score};
use search::{Evaluated, Search, Trial};

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

    /// Plans `graph` over `devices`: [`Planner::run_with_split`] without a
    /// split graph.
    ///
    /// # Errors
    /// See [`Planner::run_with_split`].
    pub fn run(&self, graph: &CostGraph, devices: &[Device]) -> Result<Plan, PlanError> {
        self.run_with_split(graph, None, devices)
    }

    /// Plans `graph` over `devices`, deciding where parameters live.
    ///
    /// `devices[0]` must be the host; the others are accelerators.
    ///
    /// The plan keeps each parameter's home as the graph gives it, unless no
    /// plan fits because the host budget is short (the host needs more than
    /// its budget) while some parameter whose home is the host may move to
    /// disk (see [`CostGraph::with_disk_allowed`]). Then the planner plans
    /// the disk variant instead: `split` when given (the same work with large
    /// weights cut into row chunks; then [`Plan::split`] is set and the plan's
    /// indices refer to it), else `graph`, with every parameter of it that
    /// may move to disk homed there. [`Plan::param_home`] says which homes
    /// were planned.
    ///
    /// When some home of `graph` is disk already (weights bound to a
    /// checkpoint or released to the offload store), `split` is planned from
    /// the start, with its homes as given (the row chunks of those weights
    /// on disk), and the fallback above moves its other disk-allowed
    /// parameters to disk. The node and time limits apply to each of the
    /// two searches.
    ///
    /// # Errors
    /// As the search of the graph given, or, when the disk variant was
    /// planned, as its search:
    /// * [`PlanError::InvalidDevices`] for a malformed device list;
    /// * [`PlanError::InvalidOptions`] for a prefetch depth of 0 or a
    ///   negative or non-finite memory slack;
    /// * [`PlanError::Infeasible`] when no candidate fits the budgets, with
    ///   the smallest budgets that would make one fit.
    pub fn run_with_split(
        &self,
        graph: &CostGraph,
        split: Option<&CostGraph>,
        devices: &[Device],
    ) -> Result<Plan, PlanError> {
        // weights already on disk are read in row chunks where the split graph cuts them
        let (first, first_split) = match split {
            Some(split) if graph.has_disk_params() => (split, true),
            _ => (graph, false),
        };
        let error = match self.search(first, devices) {
            Ok(mut plan) => {
                plan.split = first_split;
                return Ok(plan);
            }
            Err(error) => error,
        };
        if !(host_short(&error, devices) && first.may_move_to_disk()) {
            return Err(of_split(error, first_split));
        }
        let variant = if first_split {
            first
        } else {
            split.unwrap_or(graph)
        }
        .moved_to_disk();
        let mut plan = self
            .search(&variant, devices)
            .map_err(|e| of_split(e, split.is_some()))?;
        plan.split = split.is_some();
        Ok(plan)
    }

    /// The search of `graph` with its homes as given.
    fn search(&self, graph: &CostGraph, devices: &[Device]) -> Result<Plan, PlanError> {
        validate_devices(devices)?;
        self.check_options()?;
        let mut s = Search::new(
            graph,
            devices,
            self.host_compute,
            self.prefetch_depth,
            self.node_limit(graph.num_nodes()),
            self.time_limit,
        );
        families::single_device(&mut s);
        families::knapsack_family(&mut s);
        families::segments_family(&mut s);
        families::host_stretches(&mut s);
        families::spill_family(&mut s);
        self.local_search(&mut s);
        let report = Report {
            stop_reason: s.stop.unwrap_or(StopReason::Saturated),
            candidates_simulated: s.simulations,
            nodes_simulated: s.nodes_simulated,
        };
        let Some(best) = choose(&s.candidates, self.objective, self.memory_slack) else {
            return Err(infeasible(graph, &s.candidates, devices, self.host_compute));
        };
        Ok(self.finish(graph, devices, &s.candidates, best, report))
    }

    /// The plan made of a known placement, without searching: the same plan
    /// (and hash) as the search that chose it, given the decisions that plan
    /// records.
    ///
    /// `name` is only a label (the chosen candidate's name, hashed as the
    /// search hashes it); what is simulated is the placement (`node_device`,
    /// `param_streamed`, and `value_spilled`: the plan's per-node spill
    /// flags, or empty for none) at the recorded `prefetch_depth` (0 for a
    /// candidate whose segments read their own parameters) with the recorded
    /// `prefetch_window_bytes` (0 for none): a [`Plan`]'s `prefetch_depth`
    /// and `prefetch_window_bytes`. The planner itself is configured as the
    /// search was (its own prefetch depth, at least 1, is hashed as the
    /// search hashes it).
    ///
    /// `graph` is the graph the plan was made for, homes included: for a
    /// plan whose `split` is set, the split graph, and in any case with each
    /// parameter's home set to the plan's `param_home`.
    ///
    /// # Errors
    /// * [`PlanError::InvalidDevices`] or [`PlanError::InvalidPlacement`] for
    ///   a malformed device list or placement;
    /// * [`PlanError::InvalidOptions`] for a configured prefetch depth of 0
    ///   or a negative or non-finite memory slack;
    /// * [`PlanError::Infeasible`] when the placement does not fit the budgets.
    pub fn replay(
        &self,
        graph: &CostGraph,
        devices: &[Device],
        name: &str,
        node_device: &[u32],
        param_streamed: &[bool],
        value_spilled: &[bool],
        prefetch_depth: u32,
        prefetch_window_bytes: u64,
    ) -> Result<Plan, PlanError> {
        validate_devices(devices)?;
        self.check_options()?;
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
        let trial = s.simulate_windowed(placement, prefetch_depth, prefetch_window_bytes);
        let index = s.add(name.to_string(), Family::Replayed, trial, false);
        let replayed = &s.candidates[index];
        if !replayed.feasible() {
            // the placement was given: what it needs, not what a search might find
            let lead = format!("the replayed plan {name} does not fit the memory budgets");
            return Err(over_budget(
                graph,
                &lead,
                replayed,
                devices,
                Vec::new(),
                self.host_compute,
            ));
        }
        let report = Report {
            stop_reason: StopReason::Replayed,
            candidates_simulated: s.simulations,
            nodes_simulated: s.nodes_simulated,
        };
        Ok(self.finish(graph, devices, &s.candidates, index, report))
    }

    /// Checks the configured prefetch depth and memory slack.
    fn check_options(&self) -> Result<(), PlanError> {
        check_depth(self.prefetch_depth)?;
        if !(self.memory_slack.is_finite() && self.memory_slack >= 0.0) {
            return Err(PlanError::InvalidOptions(format!(
                "memory_slack is {}; it must be finite and non-negative",
                self.memory_slack
            )));
        }
        Ok(())
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
        let inputs = self.hash_inputs(g, devices);
        let pl = &c.trial.placement;
        let seg = &c.trial.seg;
        let (sim, peaks) = Workspace::default().run_with_peaks(g, devices, pl, seg, true);

        let p = g.num_params();
        let mut param_device = vec![HOST; p];
        for (q, dev) in param_device.iter_mut().enumerate() {
            *dev = g
                .param_users(q)
                .iter()
                .map(|&u| u as usize)
                .filter(|&u| pl.node_device[u] != HOST)
                .min()
                .map_or(HOST, |u| pl.node_device[u]);
        }
        let stays = &seg.spans;
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
            stream_param: stays.iter().map(|span| span.param).collect(),
            stream_device: stays.iter().map(|span| span.device).collect(),
            stream_issue_segment: stays
                .iter()
                .map(|span| span.issue_segment.map_or(-1, i64::from))
                .collect(),
            stream_first_segment: stays.iter().map(|span| span.first_segment).collect(),
            stream_last_segment: stays.iter().map(|span| span.last_segment).collect(),
            value_spilled,
            value_reload_segment,
            param_home: g.param_home().to_vec(),
            split: false,
            prefetch_depth: c.trial.depth,
            prefetch_window_bytes: c.trial.window,
            predicted_time_s: sim.predicted_time_s,
            peak_bytes: sim.peak_bytes.clone(),
            peaks,
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
                    node_device: e.trial.placement.node_device.clone(),
                    param_streamed: e.trial.placement.param_streamed.clone(),
                    value_spilled: e.trial.placement.value_spilled.clone(),
                    prefetch_depth: e.trial.depth,
                    prefetch_window_bytes: e.trial.window,
                    plan_hash: self.hash_candidate(inputs.clone(), e),
                })
                .collect(),
            chosen: c.name.clone(),
            report,
            plan_hash: self.hash_candidate(inputs, c),
            timeline: sim.timeline,
        }
    }

    /// The hasher after what every candidate of one search shares: the
    /// graph, the devices and the search's options.
    fn hash_inputs(&self, g: &CostGraph, devices: &[Device]) -> Fnv1a64 {
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
        // Class rates matter only to a graph with nodes of a class above 0.
        if g.node_rate_class().iter().any(|&c| c > 0) {
            h.str("node_rate_class");
            h.u32s(g.node_rate_class());
            for d in devices {
                h.f64s(&d.class_flops_per_s);
            }
            // hashed only where given, so that plans made without them keep
            // their hashes
            if devices.iter().any(|d| !d.class_latency_s.is_empty()) {
                h.str("class_latency_s");
                for d in devices {
                    h.f64s(&d.class_latency_s);
                }
            }
        }
        if let Some(ops) = g.explicit_node_ops() {
            h.str("node_ops");
            h.u32s(ops);
        }
        if g.node_alias_ids().iter().any(|&a| a != u32::MAX) {
            h.str("node_alias");
            h.u32s(g.node_alias_ids());
        }
        // hashed only where modelled, so that other plans keep their hashes
        if g.num_kinds() > 0 && devices.iter().any(|d| d.cold_latency_s > 0.0) {
            let (offsets, ids) = g.node_kinds_flat();
            h.str("node_kinds");
            h.u32s(offsets);
            h.u32s(ids);
            for d in devices {
                h.f64(d.cold_latency_s);
            }
        }
        if g.has_disk_params() {
            h.str("param_home");
            for t in g.param_home() {
                h.str(t.as_str());
            }
        }
        // The disk rate means nothing to a graph with no parameter on disk,
        // and callers pass the measured one whatever the homes (the planner
        // may move homes to disk): it is hashed as infinite then, as it was
        // passed before, so that plans without disk homes keep their hashes.
        let disk_params = g.has_disk_params();
        for (i, d) in devices.iter().enumerate() {
            let disk_bytes_per_s = if disk_params {
                d.disk_bytes_per_s
            } else {
                f64::INFINITY
            };
            if d.mem_bytes_per_s.is_finite() || disk_bytes_per_s.is_finite() {
                h.str("rates");
                h.u64(i as u64);
                h.f64(d.mem_bytes_per_s);
                h.f64(disk_bytes_per_s);
            }
            // the disk's figures, hashed only where the graph reads from disk and
            // each is modelled, so that other plans keep their hashes
            if !disk_params {
                continue;
            }
            for (name, value, modelled) in [
                ("disk_latency", d.disk_latency_s, d.disk_latency_s > 0.0),
                ("read_slowdown", d.read_slowdown, d.read_slowdown > 1.0),
                ("read_cpu", d.read_cpu_s, d.read_cpu_s > 0.0),
            ] {
                if modelled {
                    h.str(name);
                    h.u64(i as u64);
                    h.f64(value);
                }
            }
            if d.inline_read_bytes > 0 {
                h.str("inline_read");
                h.u64(i as u64);
                h.u64(d.inline_read_bytes);
                h.f64(d.inline_read_s);
            }
        }
        // the runtime's own work, hashed where modelled (the host's only is used)
        if let Some(host) = devices.first() {
            for (name, value) in [
                ("segment_call", host.segment_call_s),
                ("resident_lookup", host.resident_lookup_s),
                ("stream_op", host.stream_op_s),
            ] {
                if value > 0.0 {
                    h.str(name);
                    h.f64(value);
                }
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
        h
    }

    /// The hash of the plan of candidate `chosen`, after [`Self::hash_inputs`].
    fn hash_candidate(&self, mut h: Fnv1a64, chosen: &Evaluated) -> String {
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

/// Whether `error` says no plan fits because the host needs more than its
/// budget.
fn host_short(error: &PlanError, devices: &[Device]) -> bool {
    let PlanError::Infeasible { min_budgets, .. } = error else {
        return false;
    };
    let host = &devices[HOST as usize];
    min_budgets
        .iter()
        .any(|(name, bytes)| *name == host.name && *bytes > host.budget_bytes)
}

/// `error`, saying whether the graph it names by index was the split one.
fn of_split(mut error: PlanError, of_split: bool) -> PlanError {
    if let PlanError::Infeasible { split, .. } = &mut error {
        *split = of_split;
    }
    error
}

fn infeasible(
    g: &CostGraph,
    cands: &[Evaluated],
    devices: &[Device],
    host_compute: bool,
) -> PlanError {
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
            peaks: Vec::new(),
            split: false,
        };
    };
    over_budget(
        g,
        &format!(
            "no candidate plan fits the memory budgets (closest: {})",
            lenient.name
        ),
        lenient,
        devices,
        fixes,
        host_compute,
    )
}

/// The error of `candidate` (a placement of `g`) not fitting the budgets:
/// `lead`, then each device it needs more of and how to fix it (`fixes` are
/// offered first), with what those devices hold at their peaks.
fn over_budget(
    g: &CostGraph,
    lead: &str,
    candidate: &Evaluated,
    devices: &[Device],
    mut fixes: Vec<String>,
    host_compute: bool,
) -> PlanError {
    let mut min_budgets = Vec::new();
    let mut needs = Vec::new();
    for (&peak, dev) in candidate.trial.sim.peak_bytes.iter().zip(devices) {
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
    let trial = &candidate.trial;
    let (_, peaks) =
        Workspace::default().run_with_peaks(g, devices, &trial.placement, &trial.seg, false);
    let peaks = peaks
        .into_iter()
        .filter(|p| p.bytes > devices[p.device as usize].budget_bytes)
        .collect();
    PlanError::Infeasible {
        message: format!("{lead}: {}. To fix it, {fix}.", needs.join("; ")),
        min_budgets,
        peaks,
        split: false,
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
}
