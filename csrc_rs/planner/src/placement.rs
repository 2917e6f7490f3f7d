//! Placements and their segments: what the search proposes and the
//! simulator runs (the search and the simulator both build on this module).

use crate::graph::{CostGraph, Tier};

/// The host's index in every device list.
pub(crate) const HOST: u32 = 0;

/// Where each node runs and which parameters are streamed.
///
/// A parameter that is not streamed is resident on every device whose nodes
/// use it for the whole run (loaded before the run; the host holds every
/// parameter whose home is the host anyway). A streamed parameter is copied
/// to each device using it before its first using segment there and dropped
/// after its last. Only parameters used on an accelerator, or whose home is
/// disk, can be streamed: [`Placement::new`] clears the other flags.
///
/// A spilled value (`value_spilled[node]`) is copied to the host once its
/// producing segment made it and copied back ahead of its next consuming
/// segment, so that the accelerator does not hold it in between; the flag
/// means something only where [`segment`] finds the value spillable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) node_device: Vec<u32>,
    pub(crate) param_streamed: Vec<bool>,
    pub(crate) value_spilled: Vec<bool>,
}

impl Placement {
    /// A placement whose streaming flags are cleared where streaming means
    /// nothing.
    pub(crate) fn new(
        g: &CostGraph,
        mut node_device: Vec<u32>,
        mut param_streamed: Vec<bool>,
    ) -> Self {
        // A state updated in place lives where its update runs (unless it must stay on
        // the host): the update writes into it there.
        for &(input, output, in_place) in g.state_pairs() {
            if in_place && !g.node_host_only()[input as usize] {
                node_device[input as usize] = node_device[output as usize];
            }
        }
        for (q, s) in param_streamed.iter_mut().enumerate() {
            *s = *s && streamable(g, &node_device, q);
        }
        let value_spilled = vec![false; node_device.len()];
        Self {
            node_device,
            param_streamed,
            value_spilled,
        }
    }

    /// The placement with these values spilled (see [`Placement`]).
    pub(crate) fn with_spills(mut self, value_spilled: Vec<bool>) -> Self {
        debug_assert_eq!(value_spilled.len(), self.node_device.len());
        self.value_spilled = value_spilled;
        self
    }

    /// Whether any value is marked spilled.
    pub(crate) fn spills(&self) -> bool {
        self.value_spilled.iter().any(|&s| s)
    }

    /// The placement with every streamable parameter streamed.
    pub(crate) fn all_streamed(g: &CostGraph, node_device: Vec<u32>) -> Self {
        let p = g.num_params();
        Self::new(g, node_device, vec![true; p])
    }
}

/// Whether `q` can be streamed under `node_device`: an accelerator uses it,
/// or its home is disk and some node uses it.
pub(crate) fn streamable(g: &CostGraph, node_device: &[u32], q: usize) -> bool {
    let users = g.param_users(q);
    match g.param_home()[q] {
        Tier::Disk => !users.is_empty(),
        Tier::Host => users.iter().any(|&u| node_device[u as usize] != HOST),
    }
}

/// Whether a streamed `q` is copied to `device` when a node there uses it:
/// always on accelerators, on the host only from disk.
pub(crate) fn streams_to(g: &CostGraph, q: usize, device: u32) -> bool {
    device != HOST || g.param_home()[q] == Tier::Disk
}

/// One stay of a streamed parameter on one device: prefetched for the first
/// of a run of its using segments there, evicted after the last of them. A
/// parameter used again further on (a tied embedding, a layer applied in a
/// loop) comes back in a stay of its own when its next using segment there
/// lies more than the prefetch depth (at least one) further on among the
/// device's segments: its prefetch is then issued after this eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamSpan {
    pub(crate) param: u32,
    pub(crate) device: u32,
    pub(crate) first_segment: u32,
    pub(crate) last_segment: u32,
    /// The segment whose start issues the prefetch: the segment `depth`
    /// places before `first_segment` among those on the same device, or
    /// `None` for "at time 0".
    pub(crate) issue_segment: Option<u32>,
}

/// The trip of one spilled value: copied to the host once made, copied
/// back when `issue_segment` starts (the segment `depth` places before
/// `first_segment` on the device, after every earlier use), read from there
/// by the uses from `first_segment` on. The value as made serves its own
/// segment and the `near_segments` other segments that use it before
/// `first_segment`, the last of them `last_near_segment` (its own segment
/// when there are none): the device goes on past that segment only once the
/// copy to the host has landed, so that the value is gone from it by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpillSpan {
    pub(crate) node: u32,
    pub(crate) device: u32,
    pub(crate) first_segment: u32,
    pub(crate) issue_segment: u32,
    pub(crate) near_segments: u32,
    pub(crate) last_near_segment: u32,
}

/// Segments of a placement, plus the streaming spans they imply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segmentation {
    pub(crate) node_segment: Vec<u32>,
    pub(crate) segment_device: Vec<u32>,
    /// First and last node of each segment (segments are contiguous).
    pub(crate) segment_first_node: Vec<u32>,
    pub(crate) segment_last_node: Vec<u32>,
    /// Spans ordered by `(first_segment, param)`.
    pub(crate) spans: Vec<StreamSpan>,
    /// Spilled values that are spillable, in node order.
    pub(crate) spills: Vec<SpillSpan>,
}

/// Whether `node` (placed on `device`) uses a parameter streamed to `device`.
pub(crate) fn uses_streamed(g: &CostGraph, streamed: &[bool], node: usize, device: u32) -> bool {
    g.node_params(node)
        .iter()
        .any(|&q| streamed[q as usize] && streams_to(g, q as usize, device))
}

/// Cuts the nodes into segments: maximal runs of consecutive nodes on one
/// device, additionally cut so that a node using a streamed parameter
/// starts a new segment when the current segment already holds a node using
/// a streamed parameter. A streamed parameter stays on a device for each run
/// of its using segments there (see [`StreamSpan`]); each stay's prefetch is
/// issued when the segment `depth` places before its first using segment
/// there starts (with 1, the buffers form a double buffer; the planner's internal
/// depth 0 issues it when that segment itself starts, which then waits for it:
/// one buffer, no overlap).
pub(crate) fn segment(g: &CostGraph, pl: &Placement, depth: u32) -> Segmentation {
    segment_windowed(g, pl, depth, 0)
}

/// [`segment`], with the prefetches of each device issued as early as a
/// window of `window` bytes of buffers allows when `window` is not 0 (see
/// [`windowed_issue`]).
pub(crate) fn segment_windowed(
    g: &CostGraph,
    pl: &Placement,
    depth: u32,
    window: u64,
) -> Segmentation {
    let n = g.num_nodes();
    let mut node_segment = Vec::with_capacity(n);
    let mut segment_device: Vec<u32> = Vec::new();
    let mut segment_first_node: Vec<u32> = Vec::new();
    let mut segment_last_node: Vec<u32> = Vec::new();
    let mut has_streamed = false;
    for v in 0..n {
        let d = pl.node_device[v];
        let streams = uses_streamed(g, &pl.param_streamed, v, d);
        let new_segment = match segment_device.last() {
            None => true,
            Some(&cur) => cur != d || (streams && has_streamed),
        };
        if new_segment {
            segment_device.push(d);
            segment_first_node.push(v as u32);
            segment_last_node.push(v as u32);
            has_streamed = false;
        }
        let s = segment_device.len() - 1;
        segment_last_node[s] = v as u32;
        has_streamed |= streams;
        node_segment.push(s as u32);
    }

    // The segment `depth` places earlier on the same device.
    let num_devices = segment_device
        .iter()
        .map(|&d| d as usize + 1)
        .max()
        .unwrap_or(1);
    let mut on_device: Vec<Vec<u32>> = vec![Vec::new(); num_devices];
    let mut issue_of = Vec::with_capacity(segment_device.len());
    for (s, &d) in segment_device.iter().enumerate() {
        let list = &mut on_device[d as usize];
        issue_of.push(if depth == 0 {
            Some(s as u32)
        } else {
            list.len().checked_sub(depth as usize).map(|k| list[k])
        });
        list.push(s as u32);
    }

    // Streaming spans: per (streamed param, device it streams to), one per
    // run of its using segments there; a run ends where the next using
    // segment is more than `depth` places further on (at least one segment
    // without it between), so that its next prefetch is issued after this
    // eviction: the device does not hold the parameter across the gap.
    let mut position = vec![0u32; segment_device.len()];
    for list in &on_device {
        for (k, &s) in list.iter().enumerate() {
            position[s as usize] = k as u32;
        }
    }
    let gap = depth.max(1);
    let mut spans = Vec::new();
    let mut uses: Vec<(u32, u32)> = Vec::new(); // (device, segment)
    for q in 0..g.num_params() {
        if !pl.param_streamed[q] {
            continue;
        }
        uses.clear();
        for &u in g.param_users(q) {
            let dev = pl.node_device[u as usize];
            if streams_to(g, q, dev) {
                uses.push((dev, node_segment[u as usize]));
            }
        }
        // users come in node order, so on one device their segments are sorted
        if !uses.is_sorted() {
            uses.sort_unstable();
        }
        uses.dedup();
        let mut k = 0;
        while k < uses.len() {
            let (device, first_segment) = uses[k];
            let mut last_segment = first_segment;
            k += 1;
            while k < uses.len()
                && uses[k].0 == device
                && position[uses[k].1 as usize] - position[last_segment as usize] <= gap
            {
                last_segment = uses[k].1;
                k += 1;
            }
            spans.push(StreamSpan {
                param: q as u32,
                device,
                first_segment,
                last_segment,
                issue_segment: issue_of[first_segment as usize],
            });
        }
    }
    spans.sort_unstable_by_key(|s| (s.first_segment, s.param));
    if window > 0 {
        windowed_issue(g, &mut spans, &on_device, &position, window);
    }

    let spills = (0..n)
        .filter(|&x| pl.value_spilled[x])
        .filter_map(|x| spill_span(g, pl, &node_segment, &issue_of, x))
        .collect();

    Segmentation {
        node_segment,
        segment_device,
        segment_first_node,
        segment_last_node,
        spans,
        spills,
    }
}

/// Issues each device's prefetches as early as a window of `window` bytes
/// of buffers allows: in order of first use, each span is issued at the
/// earliest segment on its device, no earlier than the previous span's
/// (reads stay first-in first-out) and after its parameter's previous stay
/// there was evicted, from which its buffer fits in the
/// window for every segment until its eviction. A span that fits nowhere
/// keeps its issue one segment ahead (a window never issues later than a
/// double buffer). Spans used by their device's first segment go at the
/// start of the run, as they do at any depth. `position` is each segment's
/// index among its device's (`on_device`).
fn windowed_issue(
    g: &CostGraph,
    spans: &mut [StreamSpan],
    on_device: &[Vec<u32>],
    position: &[u32],
    window: u64,
) {
    let bytes = g.param_bytes();
    // Per device: the buffer bytes held at each of its segments, and the
    // position the last span was issued at.
    let mut held: Vec<Vec<u64>> = on_device.iter().map(|l| vec![0; l.len()]).collect();
    let mut floor = vec![0usize; on_device.len()];
    // Per device and param: the position after the one its previous stay was
    // evicted at (0: none); a later stay is issued there or later.
    let mut after_evicted: Vec<Vec<usize>> = vec![vec![0; g.num_params()]; on_device.len()];
    for span in spans.iter_mut() {
        let d = span.device as usize;
        let (first, last) = (
            position[span.first_segment as usize] as usize,
            position[span.last_segment as usize] as usize,
        );
        let b = bytes[span.param as usize];
        let held = &mut held[d];
        let after = std::mem::replace(&mut after_evicted[d][span.param as usize], last + 1);
        if first == 0 {
            span.issue_segment = None;
            for h in &mut held[..=last] {
                *h += b;
            }
            continue;
        }
        let latest = first - 1;
        let start = floor[d].min(latest).max(after);
        // The earliest issue position whose buffer fits from there on.
        let mut from = latest;
        let mut k = latest + 1;
        while k > start {
            k -= 1;
            if held[k] + b > window {
                break;
            }
            from = k;
        }
        let fits_after = held[from..=last].iter().all(|&h| h + b <= window);
        let at = if fits_after { from } else { latest };
        for h in &mut held[at..=last] {
            *h += b;
        }
        floor[d] = at;
        span.issue_segment = Some(on_device[d][at]);
    }
}

/// The most bytes of prefetch buffers `device` holds at once under `seg`
/// (a buffer is held from its issuing segment to its last using one).
pub(crate) fn buffer_peak(g: &CostGraph, seg: &Segmentation, device: u32) -> u64 {
    let bytes = g.param_bytes();
    let mut held = vec![0u64; seg.segment_device.len()];
    let first_on_device = seg.segment_device.iter().position(|&d| d == device);
    for span in seg.spans.iter().filter(|sp| sp.device == device) {
        let from = span
            .issue_segment
            .map_or(first_on_device.unwrap_or(0), |s| s as usize);
        for (s, h) in held
            .iter_mut()
            .enumerate()
            .take(span.last_segment as usize + 1)
            .skip(from)
        {
            if seg.segment_device[s] == device {
                *h += bytes[span.param as usize];
            }
        }
    }
    held.into_iter().max().unwrap_or(0)
}

/// The spill of `x`'s value, when it is spillable: made on an accelerator,
/// not a graph output, used only on that device, with a gap in its uses: a
/// consuming segment whose reload would be issued after the value's previous
/// use (otherwise the device would hold it throughout anyway). The uses up
/// to the gap read the value as made; the first gap's later uses read the
/// reloaded copy.
fn spill_span(
    g: &CostGraph,
    pl: &Placement,
    node_segment: &[u32],
    issue_of: &[Option<u32>],
    x: usize,
) -> Option<SpillSpan> {
    let device = pl.node_device[x];
    if device == HOST || g.is_output(x) {
        return None;
    }
    let made = node_segment[x];
    let mut uses = Vec::new();
    for &c in g.consumers(x) {
        if pl.node_device[c as usize] != device {
            return None;
        }
        uses.push(node_segment[c as usize]);
    }
    uses.sort_unstable();
    uses.dedup();
    let mut before = made;
    for (near, &first) in uses.iter().enumerate().filter(|&(_, &s)| s != made) {
        if let Some(issue_segment) = issue_of[first as usize].filter(|&i| i > before) {
            return Some(SpillSpan {
                node: x as u32,
                device,
                first_segment: first,
                issue_segment,
                near_segments: u32::try_from(near).expect("segments fit u32")
                    - u32::from(uses[0] == made),
                last_near_segment: before,
            });
        }
        before = first;
    }
    None
}
