//! The pool of simulated candidates and the budgets that bound the search.

use std::time::{Duration, Instant};

use crate::device::Device;
use crate::graph::CostGraph;
use crate::placement::{segment_windowed, Placement, Segmentation, HOST};
use crate::plan::report::StopReason;
use crate::plan::types::Family;
use crate::simulate::{Simulation, Workspace};

/// A simulated candidate.
pub(crate) struct Evaluated {
    pub(crate) name: String,
    pub(crate) family: Family,
    pub(crate) trial: Trial,
    /// Bytes over budget, summed over devices (0 when it fits).
    pub(crate) shortfall: u128,
    /// Its placement does not depend on the budgets, so raising a budget to
    /// its peak makes the same placement come back and fit.
    pub(crate) budget_free: bool,
}

impl Evaluated {
    pub(crate) fn feasible(&self) -> bool {
        self.shortfall == 0
    }
}

/// A simulated placement, at a prefetch depth (0: each segment reads its own
/// streamed parameters when it starts) or with a prefetch window (bytes of
/// buffers prefetches may fill ahead of use; 0 for none).
#[derive(Clone)]
pub(crate) struct Trial {
    pub(crate) placement: Placement,
    pub(crate) depth: u32,
    pub(crate) window: u64,
    pub(crate) seg: Segmentation,
    pub(crate) sim: Simulation,
}

/// The search state: inputs, budgets spent, and the candidates so far.
pub(crate) struct Search<'a> {
    pub(crate) g: &'a CostGraph,
    pub(crate) devices: &'a [Device],
    pub(crate) host_compute: bool,
    pub(crate) depth: u32,
    node_limit: u64,
    time_limit: Option<Duration>,
    started: Instant,
    pub(crate) simulations: u64,
    pub(crate) nodes_simulated: u64,
    pub(crate) stop: Option<StopReason>,
    pub(crate) candidates: Vec<Evaluated>,
    workspace: Workspace,
}

impl<'a> Search<'a> {
    pub(crate) fn new(
        g: &'a CostGraph,
        devices: &'a [Device],
        host_compute: bool,
        depth: u32,
        node_limit: u64,
        time_limit: Option<Duration>,
    ) -> Self {
        Self {
            g,
            devices,
            host_compute,
            depth,
            node_limit,
            time_limit,
            started: Instant::now(),
            simulations: 0,
            nodes_simulated: 0,
            stop: None,
            candidates: Vec::new(),
            workspace: Workspace::default(),
        }
    }

    /// Whether the time limit is reached (or the search already stopped);
    /// what stops the constructive families.
    pub(crate) fn out_of_time(&mut self) -> bool {
        if self.stop.is_none() {
            if let Some(limit) = self.time_limit {
                if self.started.elapsed() >= limit {
                    self.stop = Some(StopReason::TimeLimit(limit));
                }
            }
        }
        self.stop.is_some()
    }

    /// Whether the time or the node limit is reached; what stops local
    /// search. The first limit reached is remembered.
    pub(crate) fn out_of_budget(&mut self) -> bool {
        if self.stop.is_none() && self.nodes_simulated >= self.node_limit {
            self.stop = Some(StopReason::NodeLimit(self.node_limit));
        }
        self.out_of_time()
    }

    /// The devices a node that may leave the host can run on.
    pub(crate) fn movable_devices(&self) -> Vec<u32> {
        let first = if self.host_compute { HOST } else { HOST + 1 };
        (first..self.devices.len() as u32).collect()
    }

    /// Bytes over budget, summed over devices.
    pub(crate) fn shortfall(&self, sim: &Simulation) -> u128 {
        sim.peak_bytes
            .iter()
            .zip(self.devices)
            .map(|(&p, d)| u128::from(p.saturating_sub(d.budget_bytes)))
            .sum()
    }

    /// Segments and simulates a placement, counting it against the budgets.
    pub(crate) fn simulate(&mut self, placement: Placement) -> Trial {
        self.simulate_at(placement, self.depth)
    }

    /// [`Search::simulate`] at another prefetch depth.
    pub(crate) fn simulate_at(&mut self, placement: Placement, depth: u32) -> Trial {
        self.simulate_windowed(placement, depth, 0)
    }

    /// [`Search::simulate_at`] with a prefetch window (0 for none).
    pub(crate) fn simulate_windowed(
        &mut self,
        placement: Placement,
        depth: u32,
        window: u64,
    ) -> Trial {
        let seg = segment_windowed(self.g, &placement, depth, window);
        let sim = self
            .workspace
            .run(self.g, self.devices, &placement, &seg, false);
        self.simulations += 1;
        self.nodes_simulated += self.g.num_nodes() as u64;
        Trial {
            placement,
            depth,
            window,
            seg,
            sim,
        }
    }

    /// The listed candidate with this placement and prefetch depth (and no
    /// window), if any.
    pub(crate) fn find(&self, placement: &Placement, depth: u32) -> Option<usize> {
        self.find_windowed(placement, depth, 0)
    }

    fn find_windowed(&self, placement: &Placement, depth: u32, window: u64) -> Option<usize> {
        self.candidates.iter().position(|c| {
            c.trial.placement == *placement && c.trial.depth == depth && c.trial.window == window
        })
    }

    /// Lists a simulated placement under `name`, unless the same placement
    /// is already listed; returns the index of the listed one.
    pub(crate) fn add(
        &mut self,
        name: String,
        family: Family,
        trial: Trial,
        budget_free: bool,
    ) -> usize {
        if let Some(i) = self.find_windowed(&trial.placement, trial.depth, trial.window) {
            self.candidates[i].budget_free |= budget_free;
            return i;
        }
        let shortfall = self.shortfall(&trial.sim);
        self.candidates.push(Evaluated {
            name,
            family,
            trial,
            shortfall,
            budget_free,
        });
        self.candidates.len() - 1
    }
}
