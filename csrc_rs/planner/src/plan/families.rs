//! The candidate families (see the [`plan`](mod@crate::plan) module docs): each
//! proposes placements, simulates them and lists them in the [`Search`].

use crate::device::Device;
use crate::graph::CostGraph;
use crate::placement::{buffer_peak, segment, Placement, HOST};
use crate::plan::search::{Search, Trial};
use crate::plan::types::Family;
use crate::plan::{dp, knapsack, residency};
use crate::simulate::Simulation;

/// Every node that may leave the host on device `d`.
fn all_on(g: &CostGraph, d: u32) -> Vec<u32> {
    g.node_host_only()
        .iter()
        .map(|&h| if h { HOST } else { d })
        .collect()
}

/// The `single-device` family; runs whatever the limits.
pub(crate) fn single_device(s: &mut Search) {
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
pub(crate) fn knapsack_family(s: &mut Search) {
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
                    if !same_as_listed_double_buffer(s, &trial) {
                        s.add(format!("{name}{suffix}"), Family::Knapsack, trial, false);
                    }
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

/// Whether the windowed `trial` issues every prefetch where a double buffer
/// would (its window holds no more than one: too narrow for what is left
/// streaming) and that plan is listed already: the same plan, listed once.
fn same_as_listed_double_buffer(s: &Search, trial: &Trial) -> bool {
    let plain = segment(s.g, &trial.placement, trial.depth);
    plain.spans == trial.seg.spans && s.find(&trial.placement, trial.depth).is_some()
}

/// Marks a candidate whose prefetches fill a window of buffers:
/// `<name>/window-<N>KiB`, the window being N KiB (the plan's
/// `prefetch_window_bytes`).
pub const WINDOW_PREFIX: &str = "/window-";

/// Prefetch windows worth trying on device `a` for the all-streamed trial
/// `streamed` (at depth 1): its double buffer's peak `p` widened by an
/// eighth, a quarter, a half and the whole of its largest buffer; and two,
/// three and four of the largest buffer of at most an eighth of the budget
/// (`p` counts a buffer for every parameter, the largest ones too, which a
/// tight budget keeps resident: the window the rest streams through can be
/// far narrower); only those narrower than the budget, in whole KiB,
/// ascending.
fn windows(s: &Search, a: u32, streamed: &Trial) -> Vec<u64> {
    let bytes = s.g.param_bytes();
    let budget = s.devices[a as usize].budget_bytes;
    let sizes: Vec<u64> = streamed
        .seg
        .spans
        .iter()
        .filter(|sp| sp.device == a)
        .map(|sp| bytes[sp.param as usize])
        .collect();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let small = sizes.iter().copied().filter(|&b| b <= budget / 8).max();
    let peak = buffer_peak(s.g, &streamed.seg, a);
    let widened = [8, 4, 2, 1]
        .into_iter()
        .map(|k| peak + largest / k)
        .filter(|&w| largest > 0 && w > peak);
    let narrow = small
        .into_iter()
        .flat_map(|b| [2, 3, 4].map(|k| k * b))
        .filter(|&w| w < peak);
    let mut out: Vec<u64> = widened
        .chain(narrow)
        .map(|w| w / 1024 * 1024)
        .filter(|&w| w > 0 && w < budget)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Suffix of a candidate whose segments read their own streamed parameters
/// when they start (prefetch depth 0): one read buffer instead of two, so
/// more of a tight host budget is left for parameters kept in memory, at the
/// price of reads no longer overlapping compute (the plan's `prefetch_depth` is 0).
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
pub(crate) fn segments_family(s: &mut Search) {
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
pub(crate) fn host_stretches(s: &mut Search) {
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
pub(crate) fn spill_family(s: &mut Search) {
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
