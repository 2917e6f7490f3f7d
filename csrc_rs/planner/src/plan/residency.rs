//! Greedy residency for a placement on one accelerator.
//!
//! Parameters are visited in order of first use; each becomes resident when
//! the placement stays within the accelerator's budget. Most decisions are
//! settled by two bounds on the accelerator's peak that need only the
//! segmentation (no timing); the full simulation decides the rest.
//!
//! Both bounds rest on the simulation's model (see `crate::simulate`):
//! * streamed buffers live from the start of the segment before their first
//!   using segment (time 0 for the first) to the end of their last, so the
//!   buffers alive during a segment are known from segment ordinals alone;
//! * lower bound: right after a node's output is allocated, the resident
//!   parameters, the buffers of its segment, its output and its distinct
//!   inputs on the accelerator are all alive;
//! * upper bound: resident bytes, plus the most buffer bytes alive in any
//!   segment, plus an activation bound in which values copied in count from
//!   the start and values copied out count until the end.

use crate::device::Device;
use crate::graph::CostGraph;
use crate::plan::segments::{segment, Placement};
use crate::simulate::simulate;

/// Segmentation-only bounds on one accelerator's peak memory.
///
/// Works on the accelerator's nodes only (indexed `0..m` in node order) and
/// keeps the profile of the committed residency, so that a trial that makes
/// one more parameter resident can often be rejected in constant time: only
/// the segments from the one before the parameter's first use to the one
/// after its last use can change.
struct Bounds<'a> {
    g: &'a CostGraph,
    /// Whether the node before each accelerator node runs elsewhere (or
    /// there is none): a segment starts there whatever the parameters.
    gap_before: Vec<bool>,
    /// Activation bytes surely alive right after each accelerator node's
    /// output is allocated.
    act_lo: Vec<u64>,
    /// Activation bytes possibly alive while each accelerator node is the
    /// last one started there.
    act_hi: Vec<u64>,
    /// Committed number of streamed parameters used by each accelerator node.
    stream_count: Vec<u32>,
    /// Parameters used on the accelerator with their first and last user.
    params: Vec<(u32, u32, u32)>,
    /// Accelerator-node indices using each parameter (deduplicated).
    user_offsets: Vec<u32>,
    user_ids: Vec<u32>,
    /// Largest `act_hi`.
    act_bound: u64,
    /// Committed profile: segment ordinal of each accelerator node, and per
    /// segment the buffer bytes alive plus the largest local bytes, with
    /// prefix and suffix maxima of the latter.
    ord: Vec<u32>,
    term_prefix: Vec<u64>,
    term_suffix: Vec<u64>,
    // Trial profile (becomes the committed one on acceptance).
    trial_ord: Vec<u32>,
    trial_term: Vec<u64>,
    seg_lo: Vec<u64>,
    seg_hi: Vec<u64>,
    seg_last_hi: Vec<u64>,
    diff: Vec<i128>,
}

impl<'a> Bounds<'a> {
    /// Sets up the bounds for `node_device` on `acc` with every parameter
    /// used there streamed.
    fn new(g: &'a CostGraph, node_device: &[u32], acc: u32) -> Self {
        let n = g.num_nodes();
        let out = g.node_out_bytes();
        let mut index = vec![u32::MAX; n];
        let mut gap_before = Vec::new();
        for v in 0..n {
            if node_device[v] == acc {
                index[v] = gap_before.len() as u32;
                gap_before.push(v == 0 || node_device[v - 1] != acc);
            }
        }
        let m = gap_before.len();

        // Parameter users on the accelerator.
        let mut params = Vec::new();
        let mut user_offsets = vec![0u32; g.num_params() + 1];
        let mut user_ids = Vec::new();
        let mut stream_count = vec![0u32; m];
        for q in 0..g.num_params() {
            let lo = user_ids.len();
            for &u in g.param_users(q) {
                let i = index[u as usize];
                if i != u32::MAX {
                    user_ids.push(i);
                }
            }
            user_ids[lo..].sort_unstable();
            let mut w = lo;
            for k in lo..user_ids.len() {
                if k == lo || user_ids[k] != user_ids[w - 1] {
                    user_ids[w] = user_ids[k];
                    w += 1;
                }
            }
            user_ids.truncate(w);
            if w > lo {
                params.push((q as u32, user_ids[lo], user_ids[w - 1]));
                for &i in &user_ids[lo..] {
                    stream_count[i as usize] += 1;
                }
            }
            user_offsets[q + 1] = user_ids.len() as u32;
        }

        // Activation bounds over accelerator-node positions. A value made
        // here lives from its node to its last consumer here, and (upper
        // bound) to the end when it is also copied out; a value copied in
        // lives from its first to its last consumer here, and (upper bound)
        // from the start.
        let mut lo_diff = vec![0i128; m + 1];
        let mut hi_diff = vec![0i128; m + 1];
        let mut add = |d: &mut [i128], from: usize, to: usize, bytes: i128| {
            d[from] += bytes;
            d[to + 1] -= bytes;
        };
        for x in 0..n {
            let (mut first_here, mut last_here) = (None, None);
            let mut elsewhere = false;
            for &c in g.consumers(x) {
                match index[c as usize] {
                    u32::MAX => elsewhere = true,
                    i => {
                        first_here.get_or_insert(i as usize);
                        last_here = Some(i as usize);
                    }
                }
            }
            let bytes = i128::from(out[x]);
            if index[x] != u32::MAX {
                let from = index[x] as usize;
                let to = last_here.unwrap_or(from);
                add(&mut lo_diff, from, to, bytes);
                let to_hi = if elsewhere || g.is_output(x) { m - 1 } else { to };
                add(&mut hi_diff, from, to_hi, bytes);
            } else if let (Some(first), Some(last)) = (first_here, last_here) {
                add(&mut lo_diff, first, last, bytes);
                add(&mut hi_diff, 0, last, bytes);
            }
        }
        let clamp = |v: i128| u64::try_from(v).unwrap_or(u64::MAX);
        let prefix = |d: &[i128]| -> Vec<u64> {
            let mut live = 0i128;
            d[..m]
                .iter()
                .map(|x| {
                    live += x;
                    clamp(live)
                })
                .collect()
        };
        let act_lo = prefix(&lo_diff);
        let act_hi = prefix(&hi_diff);
        let act_bound = act_hi.iter().copied().max().unwrap_or(0);

        let mut bounds = Self {
            g,
            gap_before,
            act_lo,
            act_hi,
            stream_count,
            params,
            user_offsets,
            user_ids,
            act_bound,
            ord: Vec::new(),
            term_prefix: Vec::new(),
            term_suffix: Vec::new(),
            trial_ord: vec![0; m],
            trial_term: Vec::new(),
            seg_lo: Vec::new(),
            seg_hi: Vec::new(),
            seg_last_hi: Vec::new(),
            diff: Vec::new(),
        };
        let all_streamed: Vec<bool> = {
            let mut s = vec![false; g.num_params()];
            for &(q, _, _) in &bounds.params {
                s[q as usize] = true;
            }
            s
        };
        bounds.eval(&all_streamed);
        bounds.commit();
        bounds
    }

    fn users(&self, q: usize) -> &[u32] {
        &self.user_ids[self.user_offsets[q] as usize..self.user_offsets[q + 1] as usize]
    }

    /// Cheap lower bound on the peak buffer-plus-local term when `q` (now
    /// streamed) becomes resident: the committed terms of the segments the
    /// change cannot reach.
    fn untouched_term(&self, q: usize) -> u64 {
        let users = self.users(q);
        let (Some(&first), Some(&last)) = (users.first(), users.last()) else {
            return self.term_prefix.last().copied().unwrap_or(0);
        };
        let lo = self.ord[first as usize] as usize;
        let hi = self.ord[last as usize] as usize;
        let before = if lo >= 2 { self.term_prefix[lo - 2] } else { 0 };
        let after = self.term_suffix.get(hi + 2).copied().unwrap_or(0);
        before.max(after)
    }

    /// Makes `q` resident (`resident`) or streamed again in the node counts.
    fn set_resident(&mut self, q: usize, resident: bool) {
        let (lo, hi) = (self.user_offsets[q] as usize, self.user_offsets[q + 1] as usize);
        for k in lo..hi {
            let i = self.user_ids[k] as usize;
            if resident {
                self.stream_count[i] -= 1;
            } else {
                self.stream_count[i] += 1;
            }
        }
    }

    /// Profiles the residency `streamed` (which must agree with the node
    /// counts) into the trial arrays. Returns `(upper, lower)` bounds on the
    /// accelerator's peak buffer plus activation bytes (resident bytes come
    /// on top):
    /// * while a node of segment `k` is the last one started, the buffers
    ///   alive are those of `k` (or of `k + 1` once `k` has ended and `k + 1`
    ///   has not begun), and the activations at most that node's `act_hi`;
    /// * right after a node's output is allocated, the buffers of its segment
    ///   and its `act_lo` are all alive.
    fn eval(&mut self, streamed: &[bool]) -> (u64, u64) {
        self.seg_lo.clear();
        self.seg_hi.clear();
        self.seg_last_hi.clear();
        let mut has_streamed = false;
        for i in 0..self.gap_before.len() {
            let streams = self.stream_count[i] > 0;
            if self.gap_before[i] || (streams && has_streamed) {
                self.seg_lo.push(0);
                self.seg_hi.push(0);
                self.seg_last_hi.push(0);
                has_streamed = false;
            }
            has_streamed |= streams;
            let k = self.seg_lo.len() - 1;
            self.trial_ord[i] = k as u32;
            self.seg_lo[k] = self.seg_lo[k].max(self.act_lo[i]);
            self.seg_hi[k] = self.seg_hi[k].max(self.act_hi[i]);
            self.seg_last_hi[k] = self.act_hi[i];
        }
        let m = self.seg_lo.len();
        self.diff.clear();
        self.diff.resize(m + 1, 0);
        for &(q, first, last) in &self.params {
            if streamed[q as usize] {
                let bytes = i128::from(self.g.param_bytes()[q as usize]);
                let f = self.trial_ord[first as usize] as usize;
                let l = self.trial_ord[last as usize] as usize;
                self.diff[f.saturating_sub(1)] += bytes;
                self.diff[l + 1] -= bytes;
            }
        }
        self.trial_term.clear();
        let clamp = |v: i128| u64::try_from(v).unwrap_or(u64::MAX);
        let mut live = 0i128;
        let mut upper = 0u64;
        let mut lower = 0u64;
        for k in 0..m {
            let here = clamp(live + self.diff[k]);
            let next = clamp(live + self.diff[k] + self.diff[k + 1]);
            live += self.diff[k];
            let term = here.saturating_add(self.seg_lo[k]);
            lower = lower.max(term);
            self.trial_term.push(term);
            upper = upper
                .max(here.saturating_add(self.seg_hi[k]))
                .max(next.saturating_add(self.seg_last_hi[k]));
        }
        (upper, lower)
    }

    /// Makes the last evaluated profile the committed one.
    fn commit(&mut self) {
        std::mem::swap(&mut self.ord, &mut self.trial_ord);
        self.trial_ord.resize(self.ord.len(), 0);
        let mut acc = 0;
        self.term_prefix.clear();
        for &t in &self.trial_term {
            acc = acc.max(t);
            self.term_prefix.push(acc);
        }
        acc = 0;
        self.term_suffix.clear();
        self.term_suffix.resize(self.trial_term.len(), 0);
        for (k, &t) in self.trial_term.iter().enumerate().rev() {
            acc = acc.max(t);
            self.term_suffix[k] = acc;
        }
    }
}

/// Chooses which parameters used on accelerator `acc` are streamed.
///
/// Starts from everything streamed (whose peak on `acc` is `streamed_peak`);
/// if that fits, visits the parameters in order of first use (ties by index)
/// and makes each resident when the placement stays within `acc`'s budget.
pub(crate) fn greedy_residency(
    g: &CostGraph,
    devices: &[Device],
    acc: u32,
    node_device: &[u32],
    streamed_peak: u64,
) -> Vec<bool> {
    let budget = devices[acc as usize].budget_bytes;
    let p = g.num_params();
    let mut first_use = vec![u32::MAX; p];
    for q in 0..p {
        for &u in g.param_users(q) {
            if node_device[u as usize] == acc {
                first_use[q] = first_use[q].min(u);
            }
        }
    }
    let mut streamed: Vec<bool> = first_use.iter().map(|&f| f != u32::MAX).collect();
    if streamed_peak > budget {
        return streamed;
    }
    let bytes = g.param_bytes();
    let all_bytes = (0..p)
        .filter(|&q| streamed[q])
        .fold(0u64, |s, q| s.saturating_add(bytes[q]));
    let mut bounds = Bounds::new(g, node_device, acc);
    // Every trial's upper bound is at most this, so all would be accepted.
    if all_bytes.saturating_add(bounds.act_bound) <= budget {
        return vec![false; p];
    }

    let mut order: Vec<u32> = (0..p as u32).filter(|&q| streamed[q as usize]).collect();
    order.sort_unstable_by_key(|&q| (first_use[q as usize], q));
    let mut resident = 0u64;
    for q in order {
        let qu = q as usize;
        let with_q = resident.saturating_add(bytes[qu]);
        if with_q > budget || with_q.saturating_add(bounds.untouched_term(qu)) > budget {
            continue;
        }
        streamed[qu] = false;
        bounds.set_resident(qu, true);
        let (upper, lower) = bounds.eval(&streamed);
        let accept = if with_q.saturating_add(upper) <= budget {
            true
        } else if with_q.saturating_add(lower) > budget {
            false
        } else {
            let pl = Placement {
                node_device: node_device.to_vec(),
                param_streamed: streamed.clone(),
            };
            let seg = segment(g, &pl);
            simulate(g, devices, &pl, &seg).peak_bytes[acc as usize] <= budget
        };
        if accept {
            resident = with_q;
            bounds.commit();
        } else {
            streamed[qu] = true;
            bounds.set_resident(qu, false);
        }
    }
    streamed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::segments::HOST;

    /// Host input, then `layers` nodes on accelerator 1 each using its own param.
    fn chain(layers: usize, w: u64, act: u64) -> CostGraph {
        let n = layers + 1;
        let mut offsets = vec![0u32];
        let mut ids = Vec::new();
        for v in 0..n {
            if v > 0 {
                ids.push(v as u32 - 1);
            }
            offsets.push(ids.len() as u32);
        }
        CostGraph::new(
            vec![1e6; n],
            vec![act; n],
            (0..n).map(|v| v == 0).collect(),
            offsets,
            ids,
            vec![w; layers],
            (0..=layers as u32).collect(),
            (1..n as u32).collect(),
            vec![n as u32 - 1],
        )
        .unwrap()
    }

    fn device(name: &str, host: bool, budget: u64) -> Device {
        Device {
            name: name.into(),
            is_host: host,
            flops_per_s: 1e9,
            budget_bytes: budget,
            h2d_bytes_per_s: 1e9,
            d2h_bytes_per_s: 1e9,
            latency_s: 1e-6,
        }
    }

    /// The bounds must bracket the simulated peak for any residency choice.
    #[test]
    fn bounds_bracket_the_simulation() {
        let g = chain(12, 1000, 100);
        let devices = [device("cpu", true, u64::MAX), device("acc", false, u64::MAX)];
        let node_device: Vec<u32> = (0..g.num_nodes()).map(|v| if v == 0 { HOST } else { 1 }).collect();
        let mut bounds = Bounds::new(&g, &node_device, 1);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..64 {
            let streamed: Vec<bool> = (0..g.num_params())
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state & 1 == 1
                })
                .collect();
            let resident: u64 = (0..g.num_params()).filter(|&q| !streamed[q]).map(|q| g.param_bytes()[q]).sum();
            let pl = Placement { node_device: node_device.clone(), param_streamed: streamed.clone() };
            let peak = simulate(&g, &devices, &pl, &segment(&g, &pl)).peak_bytes[1];
            for q in 0..g.num_params() {
                if !streamed[q] {
                    bounds.set_resident(q, true);
                }
            }
            let (upper, lower) = bounds.eval(&streamed);
            for q in 0..g.num_params() {
                if !streamed[q] {
                    bounds.set_resident(q, false);
                }
            }

            assert!(resident + lower <= peak, "lower bound {} > peak {peak}", resident + lower);
            assert!(peak <= resident + upper, "peak {peak} above upper bound {}", resident + upper);
        }
    }

    /// The constant-time rejection never exceeds the trial's full bound.
    #[test]
    fn untouched_term_is_below_the_trial_bound() {
        let g = chain(16, 1000, 100);
        let node_device: Vec<u32> = (0..g.num_nodes()).map(|v| if v == 0 { HOST } else { 1 }).collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..64 {
            let mut bounds = Bounds::new(&g, &node_device, 1);
            let mut streamed = vec![true; g.num_params()];
            for q in 0..g.num_params() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if state % 3 == 0 {
                    streamed[q] = false;
                    bounds.set_resident(q, true);
                }
            }
            bounds.eval(&streamed);
            bounds.commit();
            let candidates: Vec<usize> = (0..g.num_params()).filter(|&q| streamed[q]).collect();
            for q in candidates {
                let cheap = bounds.untouched_term(q);
                streamed[q] = false;
                bounds.set_resident(q, true);
                let (_, lower) = bounds.eval(&streamed);
                assert!(cheap <= lower, "param {q}: {cheap} > {lower}");
                streamed[q] = true;
                bounds.set_resident(q, false);
            }
        }
    }
}
