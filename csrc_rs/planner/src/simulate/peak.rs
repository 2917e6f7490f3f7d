//! What a device holds at its peak: what a refusal names so that the user
//! knows what to change.

use std::collections::HashMap;

use super::{Event, Simulation, Workspace};
use crate::device::Device;
use crate::error::{Held, PeakContents};
use crate::graph::{CostGraph, Tier};
use crate::placement::{Placement, Segmentation, HOST};

impl Workspace {
    /// Simulates the placement (recording the timeline when `record`) and
    /// reports each device's peak and what makes it.
    pub(crate) fn run_with_peaks(
        &mut self,
        g: &CostGraph,
        devices: &[Device],
        pl: &Placement,
        seg: &Segmentation,
        record: bool,
    ) -> (Simulation, Vec<PeakContents>) {
        let sim = self.run(g, devices, pl, seg, record);
        // `run` leaves each device's events sorted in the order its peak was found in
        let contents: Vec<PeakContents> = self
            .events
            .iter()
            .zip(&self.base)
            .enumerate()
            .map(|(d, (events, &base))| {
                let device = d as u32;
                contents(device, events, base, resident(g, pl, device))
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
/// what is live then.
fn contents(device: u32, events: &[Event], base: u128, resident: Vec<u32>) -> PeakContents {
    let (mut live, mut peak, mut at) = (base, base, None);
    for (i, e) in events.iter().enumerate() {
        if e.alloc {
            live += u128::from(e.bytes);
            if live > peak {
                peak = live;
                at = Some(i);
            }
        } else {
            live = live.saturating_sub(u128::from(e.bytes));
        }
    }
    let mut held: HashMap<(Held, u32), i128> = HashMap::new();
    for e in &events[..at.map_or(0, |i| i + 1)] {
        let bytes = i128::from(e.bytes);
        *held.entry((e.held, e.index)).or_default() += if e.alloc { bytes } else { -bytes };
    }
    let mut live: Vec<(Held, u32, u64)> = held
        .into_iter()
        .filter(|&(_, bytes)| bytes > 0)
        .map(|((what, index), bytes)| (what, index, u64::try_from(bytes).unwrap_or(u64::MAX)))
        .collect();
    live.sort_unstable_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
    PeakContents {
        device,
        bytes: u64::try_from(peak).unwrap_or(u64::MAX),
        resident,
        live,
        reached_by: at.map(|i| (events[i].held, events[i].index)),
    }
}
