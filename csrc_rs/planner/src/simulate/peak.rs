//! What a device holds at its peak: what a refusal names so that the user
//! knows what to change.

use super::{peak_of, Event, Simulation, Workspace};
use crate::device::Device;
use crate::error::{Held, PeakContents};
use crate::graph::{CostGraph, Tier};
use crate::placement::{Placement, Segmentation, HOST};

impl Workspace {
    /// Simulates the placement (recording the timeline when `record`) and
    /// reports each device's peak and what makes it.
    // Kept out of its callers: inlined, it made the search's own simulations
    // slower (10k-node plans 57 ms against 53.5, side by side, though the
    // profile showed no time in it); apart, 54.3 against 53.2.
    #[inline(never)]
    pub(crate) fn run_with_peaks(
        &mut self,
        g: &CostGraph,
        devices: &[Device],
        pl: &Placement,
        seg: &Segmentation,
        record: bool,
    ) -> (Simulation, Vec<PeakContents>) {
        let sim = self.run(g, devices, pl, seg, record);
        let sizes = (g.num_nodes(), g.num_params());
        // `run` leaves each device's events sorted in the order its peak was found in
        let contents: Vec<PeakContents> = self
            .events
            .iter()
            .zip(&self.base)
            .enumerate()
            .map(|(d, (events, &base))| {
                let device = d as u32;
                contents(device, events, base, resident(g, pl, device), sizes)
            })
            .collect();
        debug_assert!(contents
            .iter()
            .zip(&sim.peak_bytes)
            .all(|(c, &peak)| c.bytes == peak));
        (sim, contents)
    }
}

/// The parameters `device` holds for the whole run (as the simulation's
/// constant memory counts them).
fn resident(g: &CostGraph, pl: &Placement, device: u32) -> Vec<u32> {
    let home = g.param_home();
    (0..g.num_params())
        .filter(|&q| {
            (device == HOST && home[q] == Tier::Host)
                || (!pl.param_streamed[q]
                    && g.param_users(q)
                        .iter()
                        .any(|&u| pl.node_device[u as usize] == device))
        })
        .map(|q| q as u32)
        .collect()
}

/// The peak of `events` (sorted as the peak was found) over `base`, and
/// what is live then, for a graph of `nodes` nodes and `params` parameters.
fn contents(
    device: u32,
    events: &[Event],
    base: u128,
    resident: Vec<u32>,
    (nodes, params): (usize, usize),
) -> PeakContents {
    let (peak, at) = peak_of(events, base);
    // the bytes each value, streamed weight and staging buffer holds then
    // (indexed by slot: nodes, then weights, then staging buffers)
    let slot = |held: Held, index: u32| match held {
        Held::Value | Held::Copy => index as usize,
        Held::Weight => nodes + index as usize,
        Held::Staging => nodes + params + index as usize,
    };
    let mut held = vec![0i128; nodes + 2 * params];
    for e in &events[..at.map_or(0, |i| i + 1)] {
        let bytes = i128::from(e.bytes);
        held[slot(e.held, e.index)] += if e.alloc { bytes } else { -bytes };
    }
    let what = |k: usize| match k {
        k if k < nodes => (Held::Value, k as u32),
        k if k < nodes + params => (Held::Weight, (k - nodes) as u32),
        k => (Held::Staging, (k - nodes - params) as u32),
    };
    let mut live: Vec<(Held, u32, u64)> = held
        .iter()
        .enumerate()
        .filter(|&(_, &bytes)| bytes > 0)
        .map(|(k, &bytes)| {
            let (w, index) = what(k);
            (w, index, u64::try_from(bytes).unwrap_or(u64::MAX))
        })
        .collect();
    live.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
    PeakContents {
        device,
        bytes: u64::try_from(peak).unwrap_or(u64::MAX),
        resident,
        live,
        reached_by: at.map(|i| (events[i].held, events[i].index)),
    }
}
