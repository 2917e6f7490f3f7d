//! Resident set by knapsack: which streamed parameters to keep resident,
//! valued by the transfer time their residency saves.
//!
//! Starting from a placement with every parameter streamed, a parameter's
//! value is its share of the prefetch waits it causes (a segment's wait is
//! split over the bytes it prefetches) plus a small fraction of its copy
//! time (so that, with no wait at all, saving link time still counts). The
//! weight is its bytes and each device's capacity is its budget less the
//! all-streamed peak there: making a parameter resident adds its bytes for
//! the whole run and removes a buffer that lived only part of it. Segments
//! merging can still lengthen a value's life, so the choice is simulated
//! and, while a device overshoots, its capacity shrinks by the overshoot.
//! The all-streamed peak counts a buffer for every parameter, the largest
//! too: once a choice fits with those resident, the room left under the
//! budget keeps more, by the same values, while the predicted time does not
//! grow.

use crate::graph::Tier;
use crate::placement::{Placement, HOST};
use crate::plan::search::{Search, Trial};

/// Weight of a parameter's copy time in its value, next to the waits.
const COPY_TIME_WEIGHT: f64 = 1e-3;
/// Rounds of shrinking the capacities of devices that overshoot.
const ROUNDS: usize = 4;
/// Rounds of keeping more resident in the room a fitting choice leaves.
const FILL_ROUNDS: usize = 4;
/// The share of a device's limit the room keeps free (the room is below
/// `limit - limit / FILL_MARGIN`). A plan filled to the byte leaves nothing
/// for a storage the run makes larger than its fake tensor said: a
/// functional `copy` in DeepSeek-V3's decode step ran in 3584 bytes where
/// 3552 were planned (since costed as eager runs it), and its plan, 10 bytes
/// under a 234 KiB budget, ran 14 bytes over.
const FILL_MARGIN: u64 = 1024;
/// Largest item count solved exactly (on a coarsened capacity).
const TABLE_ITEMS: usize = 512;
/// Capacity units of the exact solution.
const TABLE_UNITS: u64 = 1024;

/// A 0/1 knapsack: the items of largest total value whose weights sum to at
/// most `capacity`. Takes the better of a greedy fill by value per weight
/// and, for few items, a table over the capacity in `TABLE_UNITS` units
/// (weights rounded up, so its choice always fits). Items worth nothing
/// are never taken. Deterministic: ties go to the lower index.
pub(crate) fn select(weights: &[u64], values: &[f64], capacity: u64) -> Vec<bool> {
    let greedy = by_density(weights, values, capacity);
    if weights.len() > TABLE_ITEMS || capacity == 0 {
        return greedy;
    }
    let table = by_table(weights, values, capacity);
    let total = |pick: &[bool]| -> f64 {
        pick.iter()
            .zip(values)
            .filter(|(&p, _)| p)
            .map(|(_, &v)| v)
            .sum()
    };
    if total(&table) > total(&greedy) {
        table
    } else {
        greedy
    }
}

fn by_density(weights: &[u64], values: &[f64], capacity: u64) -> Vec<bool> {
    let density = |i: usize| values[i] / weights[i].max(1) as f64;
    let mut order: Vec<usize> = (0..weights.len()).filter(|&i| values[i] > 0.0).collect();
    order.sort_by(|&a, &b| density(b).total_cmp(&density(a)).then(a.cmp(&b)));
    let mut pick = vec![false; weights.len()];
    let mut left = capacity;
    for i in order {
        if weights[i] <= left {
            left -= weights[i];
            pick[i] = true;
        }
    }
    pick
}

fn by_table(weights: &[u64], values: &[f64], capacity: u64) -> Vec<bool> {
    let unit = capacity.div_ceil(TABLE_UNITS);
    let slots = (capacity / unit) as usize;
    let m = weights.len();
    let mut best = vec![0.0f64; slots + 1];
    let mut take = vec![false; m * (slots + 1)];
    for i in 0..m {
        if values[i] <= 0.0 {
            continue;
        }
        let w = weights[i].div_ceil(unit);
        let Ok(w) = usize::try_from(w) else { continue };
        if w > slots {
            continue;
        }
        for c in (w..=slots).rev() {
            let with = best[c - w] + values[i];
            if with > best[c] {
                best[c] = with;
                take[i * (slots + 1) + c] = true;
            }
        }
    }
    let mut pick = vec![false; m];
    let mut c = slots;
    for i in (0..m).rev() {
        if take[i * (slots + 1) + c] {
            pick[i] = true;
            c -= weights[i].div_ceil(unit) as usize;
        }
    }
    pick
}

/// Chooses resident parameters for the placement of `streamed` (a trial
/// with every streamable parameter streamed), device by device. Returns the
/// first choice that fits every budget (or, on a device already over budget
/// with everything streamed, does not raise its peak), or `None` when no
/// parameter is worth keeping, no choice fits within the rounds, or the
/// search runs out of budget.
pub(crate) fn fit(s: &mut Search, streamed: &Trial) -> Option<Trial> {
    let g = s.g;
    let nd = s.devices.len();
    let bytes = g.param_bytes();
    let host = &s.devices[HOST as usize];
    let seg = &streamed.seg;
    let sim = &streamed.sim;

    let mut segment_bytes = vec![0.0f64; seg.segment_device.len()];
    for span in &seg.spans {
        segment_bytes[span.first_segment as usize] += bytes[span.param as usize] as f64;
    }
    let mut value = vec![0.0f64; g.num_params()];
    let mut devices_of = vec![0u32; g.num_params()];
    // per device: whether each parameter is listed there
    let mut listed = vec![vec![false; g.num_params()]; nd];
    let mut items: Vec<Vec<u32>> = vec![Vec::new(); nd];
    for span in &seg.spans {
        let q = span.param as usize;
        let b = bytes[q] as f64;
        let first = span.first_segment as usize;
        let wait = sim.prefetch_wait_s[first];
        if wait > 0.0 && segment_bytes[first] > 0.0 {
            value[q] += wait * b / segment_bytes[first];
        }
        let mut copy = 0.0;
        if g.param_home()[q] == Tier::Disk {
            copy += host.disk_read_time(b);
        }
        if span.device != HOST {
            copy += b / s.devices[span.device as usize].h2d_bytes_per_s;
        }
        if copy.is_finite() {
            value[q] += COPY_TIME_WEIGHT * copy;
        }
        // one item per (parameter, device), however many stays it has there
        if !std::mem::replace(&mut listed[span.device as usize][q], true) {
            devices_of[q] += 1;
            items[span.device as usize].push(span.param);
        }
    }

    let mut capacity: Vec<u64> = s
        .devices
        .iter()
        .zip(&sim.peak_bytes)
        .map(|(d, &peak)| d.budget_bytes.saturating_sub(peak))
        .collect();
    // A device already over budget with everything streamed must not get
    // worse; the others must fit.
    let limit: Vec<u64> = s
        .devices
        .iter()
        .zip(&sim.peak_bytes)
        .map(|(d, &peak)| d.budget_bytes.max(peak))
        .collect();
    let choice = Choice {
        items: &items,
        bytes,
        value: &value,
        devices_of: &devices_of,
    };
    // `streamed`'s placement, depth and window with `param_streamed` resident or not
    let simulate = |s: &mut Search, param_streamed: Vec<bool>| {
        let node_device = streamed.placement.node_device.clone();
        s.simulate_windowed(
            Placement::new(g, node_device, param_streamed),
            streamed.depth,
            streamed.window,
        )
    };
    let mut fitted = None;
    for _ in 0..ROUNDS {
        let param_streamed = choice.keep(&streamed.placement.param_streamed, &capacity);
        if param_streamed == streamed.placement.param_streamed || s.out_of_time() {
            return None;
        }
        let trial = simulate(s, param_streamed);
        if fits(&trial, &limit, &mut capacity) {
            fitted = Some(trial);
            break;
        }
    }
    let mut best = fitted?;
    // The capacity is the budget less the all-streamed peak, which counts a
    // buffer for every parameter; once the largest of them are resident the
    // buffers left need less, and the room that leaves keeps more (narrowed
    // by what a choice overshoots, while it does).
    let fill_limit: Vec<u64> = limit.iter().map(|&l| l - l / FILL_MARGIN).collect();
    let mut room = room_left(&best, &fill_limit);
    for _ in 0..FILL_ROUNDS {
        let param_streamed = choice.keep(&best.placement.param_streamed, &room);
        if param_streamed == best.placement.param_streamed || s.out_of_time() {
            break;
        }
        let trial = simulate(s, param_streamed);
        if !fits(&trial, &fill_limit, &mut room) {
            continue;
        }
        if trial.sim.predicted_time_s > best.sim.predicted_time_s {
            break;
        }
        room = room_left(&trial, &fill_limit);
        best = trial;
    }
    Some(best)
}

/// What a knapsack chooses from: each device's items (the parameters
/// streamed to it), their bytes and values, and how many devices each
/// parameter streams to.
struct Choice<'a> {
    items: &'a [Vec<u32>],
    bytes: &'a [u64],
    value: &'a [f64],
    devices_of: &'a [u32],
}

impl Choice<'_> {
    /// `param_streamed` with more parameters resident: on each device, the
    /// best of its items still streamed that fit in its `capacity`; a
    /// parameter is resident only where every device it streams to chose it.
    fn keep(&self, param_streamed: &[bool], capacity: &[u64]) -> Vec<bool> {
        let mut chosen = vec![0u32; param_streamed.len()];
        for (d, list) in self.items.iter().enumerate() {
            let left: Vec<u32> = list
                .iter()
                .copied()
                .filter(|&q| param_streamed[q as usize])
                .collect();
            if left.is_empty() {
                continue;
            }
            let w: Vec<u64> = left.iter().map(|&q| self.bytes[q as usize]).collect();
            let v: Vec<f64> = left.iter().map(|&q| self.value[q as usize]).collect();
            for (k, take) in select(&w, &v, capacity[d]).into_iter().enumerate() {
                if take {
                    chosen[left[k] as usize] += 1;
                }
            }
        }
        (0..param_streamed.len())
            .map(|q| param_streamed[q] && chosen[q] < self.devices_of[q])
            .collect()
    }
}

/// Whether `trial` peaks within `limit` on every device; where it does not,
/// `capacity` there shrinks by what it overshoots.
fn fits(trial: &Trial, limit: &[u64], capacity: &mut [u64]) -> bool {
    let mut fits = true;
    for (d, &limit) in limit.iter().enumerate() {
        let over = trial.sim.peak_bytes[d].saturating_sub(limit);
        if over > 0 {
            fits = false;
            capacity[d] = capacity[d].saturating_sub(over);
        }
    }
    fits
}

/// Bytes between `trial`'s peak and `limit` on each device.
fn room_left(trial: &Trial, limit: &[u64]) -> Vec<u64> {
    limit
        .iter()
        .zip(&trial.sim.peak_bytes)
        .map(|(&limit, &peak)| limit.saturating_sub(peak))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(pick: &[bool], values: &[f64]) -> f64 {
        pick.iter()
            .zip(values)
            .filter(|(&p, _)| p)
            .map(|(_, &v)| v)
            .sum()
    }

    #[test]
    fn table_beats_greedy_when_density_misleads() {
        // Greedy takes the dense small item and then nothing fits.
        let pick = select(&[1, 10], &[2.0, 10.0], 10);
        assert_eq!(pick, vec![false, true]);
    }

    #[test]
    fn choices_fit_and_skip_worthless_items() {
        let pick = select(&[4, 4, 4], &[1.0, 0.0, 3.0], 8);
        assert_eq!(pick, vec![true, false, true]);
        assert_eq!(select(&[5], &[1.0], 4), vec![false]);
        assert_eq!(select(&[0, 3], &[1.0, 1.0], 0), vec![true, false]);
    }

    /// Against brute force on small random instances: always within
    /// capacity, and the table's coarse units lose little value.
    #[test]
    fn near_optimal_on_random_instances() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..300 {
            let m = 1 + next(10) as usize;
            let weights: Vec<u64> = (0..m).map(|_| 1 + next(5000)).collect();
            let values: Vec<f64> = (0..m).map(|_| next(1000) as f64).collect();
            let capacity = next(15_000);
            let pick = select(&weights, &values, capacity);
            let used: u64 = (0..m).filter(|&i| pick[i]).map(|i| weights[i]).sum();
            assert!(used <= capacity);
            let mut best = 0.0f64;
            for mask in 0u32..1 << m {
                let w: u64 = (0..m)
                    .filter(|&i| mask >> i & 1 == 1)
                    .map(|i| weights[i])
                    .sum();
                if w <= capacity {
                    let v: f64 = (0..m)
                        .filter(|&i| mask >> i & 1 == 1)
                        .map(|i| values[i])
                        .sum();
                    best = best.max(v);
                }
            }
            assert!(
                value(&pick, &values) >= 0.9 * best,
                "{weights:?} {values:?} {capacity}"
            );
        }
    }
}
