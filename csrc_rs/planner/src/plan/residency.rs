//! Greedy residency for a placement on one accelerator.
//!
//! Parameters are visited in order of first use; each becomes resident when
//! the placement stays within the accelerator's budget. The simulation is the
//! judge, but most trials are settled by bounds on the accelerator's peak that
//! need only the segmentation (no timing), and runs of acceptances are taken
//! in growing batches.
//!
//! The bounds rest on the simulation's model (see `crate::simulate`):
//! * a streamed parameter's buffer lives, for each run of its using segments
//!   at most one apart, from the start of the segment before the run's first
//!   (time 0 for the first) to the end of its last, so the
//!   buffers alive during a segment follow from segment ordinals alone (a
//!   prefetch depth of 1, a double buffer: with deeper prefetch, merging two
//!   segments moves other buffers' starts earlier and the bounds fail, so
//!   the planner runs this greedy only at depth 1);
//! * a value lives at least from its creation to its last consumer's finish,
//!   and at most to its last consumer's finish when that consumer is in the
//!   producer's segment, else to the end of the last consumer's segment (or
//!   to the end of the run when it is copied out).
//!
//! A trial makes a batch of parameters resident at once. Its upper bound
//! holds for every prefix of the batch: a prefix's segments refine the
//! batch's, its buffers alive in a segment are those of the batch's enclosing
//! segment (uses at most one of the prefix's segments apart are at most one
//! of the batch's apart, so each of its stays lies within one of the
//! batch's) plus the batch members still streamed (whose bytes the bound
//! already counts as resident), and its value lifetimes end no later than the
//! batch's when "same segment" is judged on the committed segmentation, the
//! finest of all. So a batch within budget means that the one-by-one greedy
//! accepts each member.

use crate::graph::CostGraph;
use crate::placement::Placement;
use crate::plan::search::Search;

/// One value that may live on the accelerator.
#[derive(Debug, Clone, Copy)]
struct Value {
    bytes: u64,
    /// Position of its producer among the accelerator's nodes; `u32::MAX`
    /// when it is copied in.
    producer: u32,
    /// Position of its last consumer there; `u32::MAX` when none.
    last_consumer: u32,
    /// Also needed elsewhere, or a graph output: lives to the end.
    copied_out: bool,
}

/// Segmentation-only bounds on one accelerator's peak memory.
///
/// Works on the accelerator's nodes only (positions `0..m` in node order) and
/// keeps the profile of the committed residency, so that a trial can often be
/// rejected in constant time: only the segments from the one before the
/// parameter's first use to the one after its last use can change.
struct Bounds<'a> {
    g: &'a CostGraph,
    /// Whether the node before each accelerator node runs elsewhere (or
    /// there is none): a segment starts there whatever the parameters.
    gap_before: Vec<bool>,
    /// Activation bytes surely alive right after each accelerator node's
    /// output is allocated (from positions alone).
    act_lo: Vec<u64>,
    /// Distinct inputs of each accelerator node: value, bytes, position of
    /// its last consumer here, position of its producer here (`u32::MAX`
    /// when copied in).
    in_offsets: Vec<u32>,
    inputs: Vec<(u32, u64, u32, u32)>,
    /// Values that may live on the accelerator.
    values: Vec<Value>,
    /// Committed number of streamed parameters used by each accelerator node.
    stream_count: Vec<u32>,
    /// Parameters used on the accelerator with their first and last user.
    params: Vec<(u32, u32, u32)>,
    /// Accelerator-node positions using each parameter (deduplicated).
    user_offsets: Vec<u32>,
    user_ids: Vec<u32>,
    /// Committed profile: segment ordinal of each accelerator node, and per
    /// segment the lower term (buffers plus surely alive activations), with
    /// prefix and suffix maxima.
    ord: Vec<u32>,
    term_prefix: Vec<u64>,
    term_suffix: Vec<u64>,
    // Trial profile (becomes the committed one on acceptance) and scratch.
    trial_ord: Vec<u32>,
    trial_term: Vec<u64>,
    seg_lo: Vec<u64>,
    seg_first: Vec<u32>,
    seg_last: Vec<u32>,
    buffers: Vec<i128>,
    acts: Vec<i128>,
    value_stamp: Vec<u64>,
    epoch: u64,
    held: Vec<(u64, u32)>,
}

impl<'a> Bounds<'a> {
    /// Sets up the bounds for `node_device` on `acc` with every parameter
    /// used there streamed (the committed residency).
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
            user_ids.extend(
                g.param_users(q)
                    .iter()
                    .map(|&u| index[u as usize])
                    .filter(|&i| i != u32::MAX),
            );
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

        // Values, and the activations surely alive at each position: a value
        // made here from its node to its last consumer here, a value copied
        // in from its first to its last consumer here. A view made here owns
        // no bytes and keeps the copy here of what it views alive as long as
        // itself (its consumers here, and to the end when copied out): walked
        // backwards, so that a view's lifetime is known before its base's.
        let mut last_consumer = vec![u32::MAX; n];
        let mut first_consumer = vec![u32::MAX; n];
        let mut copied_out = vec![false; n];
        let mut bytes_here = vec![0u64; n];
        for x in (0..n).rev() {
            let mut elsewhere = false;
            for &c in g.consumers(x) {
                match index[c as usize] {
                    u32::MAX => elsewhere = true,
                    pos => {
                        first_consumer[x] = first_consumer[x].min(pos);
                        last_consumer[x] = later(last_consumer[x], pos);
                    }
                }
            }
            let producer = index[x];
            copied_out[x] |= producer != u32::MAX && (elsewhere || g.is_output(x));
            bytes_here[x] = out[x];
            if let (Some(y), true) = (g.node_alias(x), producer != u32::MAX) {
                bytes_here[x] = 0;
                let held_to = later(last_consumer[x], producer);
                last_consumer[y] = later(last_consumer[y], held_to);
                copied_out[y] |= copied_out[x];
            }
        }
        let mut values = Vec::new();
        let mut lo_diff = vec![0i128; m + 1];
        for x in 0..n {
            let producer = index[x];
            let sure = match (producer, last_consumer[x]) {
                (u32::MAX, u32::MAX) => continue,
                (u32::MAX, last) => (first_consumer[x], last),
                (_, u32::MAX) => (producer, producer),
                (_, last) => (producer, last),
            };
            let bytes = bytes_here[x];
            lo_diff[sure.0 as usize] += i128::from(bytes);
            lo_diff[sure.1 as usize + 1] -= i128::from(bytes);
            values.push(Value {
                bytes,
                producer,
                last_consumer: last_consumer[x],
                copied_out: copied_out[x],
            });
        }
        let mut live = 0i128;
        let act_lo = lo_diff[..m]
            .iter()
            .map(|d| {
                live += d;
                clamp(live)
            })
            .collect();

        let mut in_offsets = vec![0u32];
        let mut inputs = Vec::new();
        let mut seen = vec![u32::MAX; n];
        for v in (0..n).filter(|&v| index[v] != u32::MAX) {
            for &y in g.inputs(v) {
                let yu = y as usize;
                if seen[yu] != v as u32 {
                    seen[yu] = v as u32;
                    inputs.push((y, bytes_here[yu], last_consumer[yu], index[yu]));
                }
            }
            in_offsets.push(inputs.len() as u32);
        }

        let mut bounds = Self {
            g,
            gap_before,
            act_lo,
            in_offsets,
            inputs,
            values,
            stream_count,
            params,
            user_offsets,
            user_ids,
            ord: Vec::new(),
            term_prefix: Vec::new(),
            term_suffix: Vec::new(),
            trial_ord: vec![0; m],
            trial_term: Vec::new(),
            seg_lo: Vec::new(),
            seg_first: Vec::new(),
            seg_last: Vec::new(),
            buffers: Vec::new(),
            acts: Vec::new(),
            value_stamp: vec![0; n],
            epoch: 0,
            held: Vec::new(),
        };
        let mut all_streamed = vec![false; g.num_params()];
        for &(q, _, _) in &bounds.params {
            all_streamed[q as usize] = true;
        }
        bounds.eval(&all_streamed);
        bounds.commit();
        bounds
    }

    fn users(&self, q: usize) -> &[u32] {
        &self.user_ids[self.user_offsets[q] as usize..self.user_offsets[q + 1] as usize]
    }

    /// Cheap lower bound on the lower term when `q` (now streamed) becomes
    /// resident: the committed terms of the segments the change cannot reach.
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
        let (lo, hi) = (
            self.user_offsets[q] as usize,
            self.user_offsets[q + 1] as usize,
        );
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
    /// * upper: while a segment runs, or the wait before it, at most its
    ///   buffers and the values whose possible lifetime meets its nodes are
    ///   alive; it holds for every residency between the committed one and
    ///   this one (see the module documentation);
    /// * lower: right after a node's output is allocated, the buffers of its
    ///   segment and its `act_lo` are all alive; right after the last node of
    ///   a segment allocates, so are all the values made before the segment
    ///   and read in it (the segment's call holds its arguments until it
    ///   ends).
    fn eval(&mut self, streamed: &[bool]) -> (u64, u64) {
        self.seg_lo.clear();
        self.seg_first.clear();
        self.seg_last.clear();
        self.epoch += 1;
        let mut has_streamed = false;
        for i in 0..self.gap_before.len() {
            let streams = self.stream_count[i] > 0;
            if self.gap_before[i] || (streams && has_streamed) {
                self.close_segment();
                self.seg_lo.push(0);
                self.seg_first.push(i as u32);
                self.seg_last.push(i as u32);
                has_streamed = false;
            }
            has_streamed |= streams;
            let k = self.seg_lo.len() - 1;
            self.trial_ord[i] = k as u32;
            self.seg_lo[k] = self.seg_lo[k].max(self.act_lo[i]);
            self.seg_last[k] = i as u32;
            let key = (self.epoch << 32) | (k as u64 + 1);
            let first = self.seg_first[k];
            let (lo, hi) = (self.in_offsets[i] as usize, self.in_offsets[i + 1] as usize);
            for &(y, bytes, last, producer) in &self.inputs[lo..hi] {
                let made_before = producer == u32::MAX || producer < first;
                if made_before && self.value_stamp[y as usize] != key {
                    self.value_stamp[y as usize] = key;
                    self.held.push((bytes, last));
                }
            }
        }
        self.close_segment();

        // Buffers alive per segment.
        let segments = self.seg_lo.len();
        self.buffers.clear();
        self.buffers.resize(segments + 1, 0);
        // One stay per run of using segments at most one apart (see
        // `crate::placement::segment`, at depth 1).
        for &(q, _, _) in &self.params {
            if !streamed[q as usize] {
                continue;
            }
            let bytes = i128::from(self.g.param_bytes()[q as usize]);
            let (lo, hi) = (
                self.user_offsets[q as usize] as usize,
                self.user_offsets[q as usize + 1] as usize,
            );
            let mut stay: Option<(usize, usize)> = None;
            for k in lo..hi {
                let o = self.trial_ord[self.user_ids[k] as usize] as usize;
                stay = match stay {
                    Some((f, l)) if o <= l + 1 => Some((f, o)),
                    Some((f, l)) => {
                        self.buffers[f.saturating_sub(1)] += bytes;
                        self.buffers[l + 1] -= bytes;
                        Some((o, o))
                    }
                    None => Some((o, o)),
                };
            }
            if let Some((f, l)) = stay {
                self.buffers[f.saturating_sub(1)] += bytes;
                self.buffers[l + 1] -= bytes;
            }
        }

        // Possible value lifetimes per position.
        let m = self.gap_before.len();
        let committed = if self.ord.len() == m {
            &self.ord
        } else {
            &self.trial_ord
        };
        self.acts.clear();
        self.acts.resize(m + 1, 0);
        for v in &self.values {
            let start = if v.producer == u32::MAX {
                0
            } else {
                v.producer as usize
            };
            let end = if v.copied_out {
                m - 1
            } else if v.last_consumer == u32::MAX {
                start
            } else if v.producer != u32::MAX
                && committed[v.last_consumer as usize] == committed[v.producer as usize]
            {
                v.last_consumer as usize
            } else {
                self.seg_last[self.trial_ord[v.last_consumer as usize] as usize] as usize
            };
            self.acts[start] += i128::from(v.bytes);
            self.acts[end + 1] -= i128::from(v.bytes);
        }

        self.trial_term.clear();
        let mut buffers = 0i128;
        let mut acts = 0i128;
        let mut upper = 0u64;
        let mut lower = 0u64;
        for k in 0..segments {
            buffers += self.buffers[k];
            let alive = clamp(buffers);
            let term = alive.saturating_add(self.seg_lo[k]);
            lower = lower.max(term);
            self.trial_term.push(term);
            let mut most_acts = 0i128;
            for p in self.seg_first[k]..=self.seg_last[k] {
                acts += self.acts[p as usize];
                most_acts = most_acts.max(acts);
            }
            upper = upper.max(alive.saturating_add(clamp(most_acts)));
        }
        (upper, lower)
    }

    /// Adds to the last segment's lower term the values its call holds that
    /// its last node's `act_lo` misses.
    fn close_segment(&mut self) {
        if let Some(k) = self.seg_lo.len().checked_sub(1) {
            let last = self.seg_last[k];
            let extra = self
                .held
                .iter()
                .filter(|&&(_, l)| l < last)
                .fold(0u64, |sum, &(bytes, _)| sum.saturating_add(bytes));
            let at_last = self.act_lo[last as usize].saturating_add(extra);
            self.seg_lo[k] = self.seg_lo[k].max(at_last);
        }
        self.held.clear();
    }

    /// Makes the last evaluated profile the committed one.
    fn commit(&mut self) {
        std::mem::swap(&mut self.ord, &mut self.trial_ord);
        self.trial_ord.resize(self.ord.len(), 0);
        let mut most = 0;
        self.term_prefix.clear();
        for &t in &self.trial_term {
            most = most.max(t);
            self.term_prefix.push(most);
        }
        most = 0;
        self.term_suffix.clear();
        self.term_suffix.resize(self.trial_term.len(), 0);
        for (k, &t) in self.trial_term.iter().enumerate().rev() {
            most = most.max(t);
            self.term_suffix[k] = most;
        }
    }
}

/// The later of two positions, `u32::MAX` in `pos` meaning none.
fn later(pos: u32, other: u32) -> u32 {
    if pos == u32::MAX {
        other
    } else {
        pos.max(other)
    }
}

fn clamp(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}

/// Chooses which parameters used on accelerator `acc` are streamed, for a
/// prefetch depth of 1.
///
/// Starts from everything streamed (whose peak on `acc` is `streamed_peak`);
/// if that fits, visits the parameters in order of first use (ties by index)
/// and makes each resident when the placement stays within `acc`'s budget.
pub(crate) fn greedy_residency(
    search: &mut Search,
    acc: u32,
    node_device: &[u32],
    streamed_peak: u64,
) -> Vec<bool> {
    let g = search.g;
    let budget = search.devices[acc as usize].budget_bytes;
    let p = g.num_params();
    let first_use: Vec<u32> = (0..p)
        .map(|q| {
            g.param_users(q)
                .iter()
                .copied()
                .filter(|&u| node_device[u as usize] == acc)
                .min()
                .unwrap_or(u32::MAX)
        })
        .collect();
    let mut streamed: Vec<bool> = first_use.iter().map(|&f| f != u32::MAX).collect();
    if streamed_peak > budget {
        return streamed;
    }
    let bytes = g.param_bytes();
    debug_assert_eq!(search.depth, 1, "the bounds hold for a double buffer");
    let mut bounds = Bounds::new(g, node_device, acc);
    let mut order: Vec<u32> = (0..p as u32).filter(|&q| streamed[q as usize]).collect();
    order.sort_unstable_by_key(|&q| (first_use[q as usize], q));

    let mut resident = 0u64;
    // Start with every parameter in one batch (it fits when the budget is
    // roomy), halve on failure, double after each acceptance.
    let mut batch = order.len();
    let mut i = 0;
    while i < order.len() {
        let k = batch.min(order.len() - i);
        if k > 1 {
            let members = &order[i..i + k];
            let mut with = resident;
            for &q in members {
                with = with.saturating_add(bytes[q as usize]);
                streamed[q as usize] = false;
                bounds.set_resident(q as usize, true);
            }
            let (upper, _) = bounds.eval(&streamed);
            if with.saturating_add(upper) <= budget {
                resident = with;
                bounds.commit();
                i += k;
                batch = k * 2;
            } else {
                for &q in members {
                    streamed[q as usize] = true;
                    bounds.set_resident(q as usize, false);
                }
                batch = k / 2;
            }
            continue;
        }

        let qu = order[i] as usize;
        i += 1;
        batch = 1;
        let with_q = resident.saturating_add(bytes[qu]);
        if with_q > budget || with_q.saturating_add(bounds.untouched_term(qu)) > budget {
            continue;
        }
        streamed[qu] = false;
        bounds.set_resident(qu, true);
        let (upper, lower) = bounds.eval(&streamed);
        let accept = if with_q.saturating_add(upper) <= budget {
            batch = 2;
            true
        } else if with_q.saturating_add(lower) > budget {
            false
        } else {
            let pl = Placement::new(g, node_device.to_vec(), streamed.clone());
            search.simulate(pl).sim.peak_bytes[acc as usize] <= budget
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
    use crate::device::Device;
    use crate::placement::{segment, HOST};
    use crate::simulate::run;

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// A random DAG: a host input, nodes reading one to three earlier nodes
    /// (some host-only), parameters used by one to three nodes, the last
    /// node and a few others as outputs.
    fn random_graph(rng: &mut Rng) -> CostGraph {
        let n = 2 + rng.below(24) as usize;
        let mut host_only = vec![true];
        let mut offsets = vec![0u32, 0];
        let mut ids = Vec::new();
        for v in 1..n {
            host_only.push(rng.below(8) == 0);
            ids.push(v as u32 - 1);
            for _ in 0..rng.below(3) {
                ids.push(rng.below(v as u64) as u32);
            }
            offsets.push(ids.len() as u32);
        }
        let p = rng.below(12) as usize;
        let mut param_offsets = vec![0u32];
        let mut users = Vec::new();
        for _ in 0..p {
            for _ in 0..=rng.below(3) {
                users.push(1 + rng.below(n as u64 - 1) as u32);
            }
            param_offsets.push(users.len() as u32);
        }
        let mut outputs = vec![n as u32 - 1];
        if rng.below(3) == 0 {
            outputs.push(rng.below(n as u64) as u32);
        }
        // some nodes are views of their first input (node v - 1)
        let alias = (0..n)
            .map(|v| {
                if v > 0 && rng.below(4) == 0 {
                    v as u32 - 1
                } else {
                    u32::MAX
                }
            })
            .collect();
        CostGraph::new(
            (0..n)
                .map(|v| {
                    if v == 0 {
                        0.0
                    } else {
                        (rng.below(100) * 1_000_000) as f64
                    }
                })
                .collect(),
            (0..n).map(|_| rng.below(5000)).collect(),
            host_only,
            offsets,
            ids,
            (0..p).map(|_| 1 + rng.below(20_000)).collect(),
            param_offsets,
            users,
            outputs,
        )
        .unwrap()
        .with_node_alias(alias)
        .unwrap()
    }

    fn devices(rng: &mut Rng, budget: u64) -> Vec<Device> {
        let rate = |rng: &mut Rng| 1e5 * (1 + rng.below(1000)) as f64;
        let host = Device::new("cpu", true, 1e9, u64::MAX, 0.0, 0.0, 1e-6);
        let acc = Device::new(
            "acc",
            false,
            rate(rng) * 1e4,
            budget,
            rate(rng),
            rate(rng),
            1e-6 * rng.below(3) as f64,
        );
        vec![host, acc]
    }

    fn on_acc(g: &CostGraph) -> Vec<u32> {
        g.node_host_only()
            .iter()
            .map(|&h| if h { HOST } else { 1 })
            .collect()
    }

    fn peak(g: &CostGraph, devices: &[Device], node_device: &[u32], streamed: &[bool]) -> u64 {
        let pl = Placement::new(g, node_device.to_vec(), streamed.to_vec());
        run(g, devices, &pl, &segment(g, &pl, 1), false).peak_bytes[1]
    }

    /// The lower bound is below the simulated peak of the evaluated
    /// residency; the upper bound is above the peak of every residency
    /// between the committed one and the evaluated one.
    #[test]
    fn bounds_bracket_the_simulation() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            let g = random_graph(&mut rng);
            let devices = devices(&mut rng, u64::MAX);
            let node_device = on_acc(&g);
            let mut bounds = Bounds::new(&g, &node_device, 1);
            let used: Vec<bool> = (0..g.num_params())
                .map(|q| {
                    g.param_users(q)
                        .iter()
                        .any(|&u| node_device[u as usize] == 1)
                })
                .collect();
            // Commit a random residency, then evaluate a random superset.
            let mut committed = used.clone();
            for q in 0..g.num_params() {
                if used[q] && rng.below(3) == 0 {
                    committed[q] = false;
                    bounds.set_resident(q, true);
                }
            }
            bounds.eval(&committed);
            bounds.commit();
            let mut batch = committed.clone();
            for (q, streams) in batch.iter_mut().enumerate() {
                if *streams && rng.below(2) == 0 {
                    *streams = false;
                    bounds.set_resident(q, true);
                }
            }
            let resident = |s: &[bool]| -> u64 {
                (0..g.num_params())
                    .filter(|&q| used[q] && !s[q])
                    .map(|q| g.param_bytes()[q])
                    .sum()
            };
            let (upper, lower) = bounds.eval(&batch);
            let peak_batch = peak(&g, &devices, &node_device, &batch);
            let low = resident(&batch) + lower;
            assert!(low <= peak_batch, "lower bound {low} > peak {peak_batch}");
            let high = resident(&batch) + upper;
            for _ in 0..4 {
                let between: Vec<bool> = (0..g.num_params())
                    .map(|q| {
                        if committed[q] && !batch[q] {
                            rng.below(2) == 0
                        } else {
                            batch[q]
                        }
                    })
                    .collect();
                let peak = peak(&g, &devices, &node_device, &between);
                assert!(peak <= high, "peak {peak} > upper bound {high}");
            }
            assert!(peak_batch <= high, "peak {peak_batch} > upper bound {high}");
        }
    }

    /// A value read across a segment boundary is held to the end of the
    /// reading segment; making the reader's parameter resident merges the
    /// segments and frees it earlier. The batch bound must still cover the
    /// unmerged residency it was evaluated from.
    #[test]
    fn batch_bound_covers_values_held_across_segments() {
        // input -> n1 (W1, 100 kB out) -> n2 (W2, 10 B out) -> n3 (100 kB out).
        let g = CostGraph::new(
            vec![0.0, 1e6, 1e6, 1e6],
            vec![10, 100_000, 10, 100_000],
            vec![true, false, false, false],
            vec![0, 0, 1, 2, 3],
            vec![0, 1, 2],
            vec![1000, 1000],
            vec![0, 1, 2],
            vec![1, 2],
            vec![3],
        )
        .unwrap();
        let mut rng = Rng(7);
        let devices = devices(&mut rng, u64::MAX);
        let node_device = on_acc(&g);
        let all_streamed = [true, true];
        let unmerged = peak(&g, &devices, &node_device, &all_streamed);
        let mut bounds = Bounds::new(&g, &node_device, 1);
        bounds.set_resident(1, true);
        let (upper, _) = bounds.eval(&[true, false]);
        assert!(
            unmerged >= 200_000,
            "n1's output is held while n3 runs: {unmerged}"
        );
        assert!(unmerged <= 1000 + upper, "{unmerged} > {}", 1000 + upper);
    }

    /// The constant-time rejection never exceeds the trial's full bound.
    #[test]
    fn untouched_term_is_below_the_trial_bound() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..300 {
            let g = random_graph(&mut rng);
            let node_device = on_acc(&g);
            let mut bounds = Bounds::new(&g, &node_device, 1);
            let mut streamed: Vec<bool> = (0..g.num_params())
                .map(|q| {
                    g.param_users(q)
                        .iter()
                        .any(|&u| node_device[u as usize] == 1)
                })
                .collect();
            for (q, s) in streamed.iter_mut().enumerate() {
                if *s && rng.below(3) == 0 {
                    *s = false;
                    bounds.set_resident(q, true);
                }
            }
            bounds.eval(&streamed);
            bounds.commit();
            let still: Vec<usize> = (0..g.num_params()).filter(|&q| streamed[q]).collect();
            for q in still {
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

    /// The pruned greedy decides exactly like simulating every trial.
    #[test]
    fn greedy_matches_the_plain_greedy() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut partial = 0;
        for _ in 0..400 {
            let g = random_graph(&mut rng);
            let node_device = on_acc(&g);
            let used: Vec<bool> = (0..g.num_params())
                .map(|q| {
                    g.param_users(q)
                        .iter()
                        .any(|&u| node_device[u as usize] == 1)
                })
                .collect();
            let probe = devices(&mut rng, u64::MAX);
            let low = peak(&g, &probe, &node_device, &used);
            let high = peak(&g, &probe, &node_device, &vec![false; g.num_params()]);
            let budget = low + rng.below(high.saturating_sub(low) + 2);
            let mut devices = probe;
            devices[1].budget_bytes = budget;

            let mut search = Search::new(&g, &devices, false, 1, u64::MAX, None);
            let fast = greedy_residency(&mut search, 1, &node_device, low);
            let mut plain = used.clone();
            let mut order: Vec<usize> = (0..g.num_params()).filter(|&q| used[q]).collect();
            let first = |q: usize| {
                g.param_users(q)
                    .iter()
                    .filter(|&&u| node_device[u as usize] == 1)
                    .min()
                    .copied()
            };
            order.sort_by_key(|&q| (first(q), q));
            for q in order {
                plain[q] = false;
                if peak(&g, &devices, &node_device, &plain) > budget {
                    plain[q] = true;
                }
            }
            assert_eq!(fast, plain, "budget {budget} between {low} and {high}");
            if plain.iter().any(|&s| s) && plain.iter().zip(&used).any(|(&s, &u)| u && !s) {
                partial += 1;
            }
        }
        assert!(
            partial > 50,
            "only {partial} graphs mixed resident and streamed params"
        );
    }
}
