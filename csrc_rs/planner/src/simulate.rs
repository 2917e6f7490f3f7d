//! Time and memory simulation of one candidate placement.
//!
//! The model, in short:
//! * one compute queue per device; nodes run in topological order, a node
//!   starting when its device is free, its inputs are on its device and its
//!   segment's prefetches have arrived; it takes `flops / rate + latency`;
//! * one host-to-device and one device-to-host copy engine per accelerator,
//!   each first-in first-out in program order;
//! * a value needed on another device is copied once per (producer, device)
//!   as soon as it is produced (accelerator to accelerator goes through a host
//!   staging copy); graph outputs made on an accelerator are copied back at
//!   the end, once every node has finished;
//! * streamed parameters are prefetched when the previous segment on their
//!   accelerator starts (at time 0 when there is none) and evicted after their
//!   last using segment; resident parameters occupy their accelerators for the
//!   whole run; the host always holds every parameter;
//! * a value lives on a device from its creation (node start or copy start)
//!   until its last consumer there is done and its copies out completed. A
//!   consumer in the producer's own segment is done when it finishes; any
//!   other consumer holds the value until its whole segment finishes (a
//!   segment runs as one call that keeps its arguments). Graph outputs on the
//!   host live to the end.
//!
//! Memory events are ordered by time, then by the order in which the
//! simulation produced them (which follows causality for equal times).

use crate::device::Device;
use crate::graph::CostGraph;
use crate::plan::{Placement, Segmentation, HOST};

/// What one simulation measured.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Simulation {
    /// Time at which the last graph output is on the host (the makespan of
    /// the nodes when the graph has no outputs).
    pub(crate) predicted_time_s: f64,
    /// Highest memory use of each device over the run.
    pub(crate) peak_bytes: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    time_bits: u64,
    seq: u64,
    bytes: u64,
    alloc: bool,
}

/// One copy of a value on one device.
#[derive(Debug, Clone, Copy)]
struct Instance {
    device: u32,
    bytes: u64,
    ready: f64,
    /// Releases still to come: one per consumer in the producing segment,
    /// one per other consuming segment, one for a final copy to the host.
    remaining: u32,
    /// Completion of the latest copy made from this instance.
    floor: f64,
    /// Never freed (a graph output on the host).
    keep: bool,
    /// Segment of the producer for its own instance; `u32::MAX` for copies.
    segment: u32,
    /// Last consuming segment (plus one) already waiting to release this.
    pending_in: u32,
}

struct Memory {
    events: Vec<Vec<Event>>,
    seq: u64,
}

impl Memory {
    fn push(&mut self, device: u32, time: f64, bytes: u64, alloc: bool) {
        debug_assert!(time >= 0.0, "times are never negative or NaN");
        // Adding 0.0 folds -0.0 into +0.0 so bit order matches numeric order.
        let time_bits = (time + 0.0).to_bits();
        self.events[device as usize].push(Event {
            time_bits,
            seq: self.seq,
            bytes,
            alloc,
        });
        self.seq += 1;
    }

    fn release(&mut self, inst: &Instance, at: f64) {
        if !inst.keep {
            self.push(inst.device, at.max(inst.floor), inst.bytes, false);
        }
    }
}

/// A first-in first-out copy engine; returns (start, end) of a new copy.
fn enqueue(free_at: &mut f64, issue: f64, bytes: u64, rate: f64) -> (f64, f64) {
    let start = issue.max(*free_at);
    let end = start + bytes as f64 / rate;
    *free_at = end;
    (start, end)
}

/// Simulates one placement with its segmentation.
pub(crate) fn simulate(
    g: &CostGraph,
    devices: &[Device],
    pl: &Placement,
    seg: &Segmentation,
) -> Simulation {
    let n = g.num_nodes();
    let nd = devices.len();
    let num_segments = seg.segment_device.len();

    // Constant memory: every param on the host, resident params on each
    // accelerator that uses them.
    let mut base = vec![0u128; nd];
    base[HOST as usize] = g.param_bytes().iter().map(|&b| u128::from(b)).sum();
    let mut stamp = vec![usize::MAX; nd];
    for q in 0..g.num_params() {
        if pl.param_streamed[q] {
            continue;
        }
        for &u in g.param_users(q) {
            let d = pl.node_device[u as usize] as usize;
            if d != HOST as usize && stamp[d] != q {
                stamp[d] = q;
                base[d] += u128::from(g.param_bytes()[q]);
            }
        }
    }

    // Spans grouped by the segment that issues them, ends them, and needs them.
    let mut issue_at: Vec<Vec<usize>> = vec![Vec::new(); num_segments];
    let mut evict_at: Vec<Vec<usize>> = vec![Vec::new(); num_segments];
    let mut initial = Vec::new();
    for (k, span) in seg.spans.iter().enumerate() {
        match span.issue_segment {
            Some(s) => issue_at[s as usize].push(k),
            None => initial.push(k),
        }
        evict_at[span.last_segment as usize].push(k);
    }

    let mut mem = Memory {
        events: (0..nd)
            .map(|_| Vec::with_capacity(2 * n / nd.max(1) + 16))
            .collect(),
        seq: 0,
    };
    let mut dev_free = vec![0.0f64; nd];
    let mut h2d_free = vec![0.0f64; nd];
    let mut d2h_free = vec![0.0f64; nd];
    let mut seg_ready = vec![0.0f64; num_segments];

    let issue = |span_ids: &[usize],
                 at: f64,
                 mem: &mut Memory,
                 h2d_free: &mut [f64],
                 seg_ready: &mut [f64]| {
        for &k in span_ids {
            let span = seg.spans[k];
            let d = span.device as usize;
            let bytes = g.param_bytes()[span.param as usize];
            let (_, end) = enqueue(&mut h2d_free[d], at, bytes, devices[d].h2d_bytes_per_s);
            let ready = &mut seg_ready[span.first_segment as usize];
            *ready = ready.max(end);
            mem.push(span.device, at, bytes, true);
        }
    };
    issue(&initial, 0.0, &mut mem, &mut h2d_free, &mut seg_ready);

    let mut instances: Vec<Instance> = Vec::with_capacity(n + n / 4);
    let mut node_inst = Vec::with_capacity(n + 1); // instance range start per node
    let mut input_stamp: Vec<u32> = Vec::new(); // per instance: last node + 1 that read it
    let mut pending: Vec<Vec<usize>> = vec![Vec::new(); num_segments];
    // Per device, for the value being produced: consumers in its own segment,
    // distinct other consuming segments, and the last such segment seen.
    let mut same_segment = vec![0u32; nd];
    let mut other_segments = vec![0u32; nd];
    let mut last_segment = vec![u32::MAX; nd];
    let mut consumer_devices: Vec<u32> = Vec::with_capacity(nd);
    let mut last_output = f64::NEG_INFINITY;
    let mut makespan = 0.0f64;

    let find = |instances: &[Instance], node_inst: &[usize], y: usize, d: u32| -> usize {
        let (lo, hi) = (node_inst[y], node_inst[y + 1]);
        (lo..hi)
            .find(|&i| instances[i].device == d)
            .expect("every consumer device of a value receives a copy")
    };

    for x in 0..n {
        // Instances of x start here (and those of x - 1 end here).
        node_inst.push(instances.len());
        let dev = pl.node_device[x];
        let du = dev as usize;
        let sid = seg.node_segment[x];
        let su = sid as usize;
        let first_of_segment = seg.segment_first_node[su] as usize == x;

        let mut start = dev_free[du].max(seg_ready[su]);
        for &y in g.inputs(x) {
            let i = find(&instances, &node_inst, y as usize, dev);
            start = start.max(instances[i].ready);
        }
        if first_of_segment && dev != HOST {
            issue(
                &issue_at[su],
                start,
                &mut mem,
                &mut h2d_free,
                &mut seg_ready,
            );
        }
        let out = g.node_out_bytes()[x];
        mem.push(dev, start, out, true);
        let finish = start + devices[du].node_time(g.node_flops()[x]);
        dev_free[du] = finish;
        makespan = makespan.max(finish);

        // Inputs: released now when made in this segment, else when it ends.
        let tag = x as u32 + 1;
        for &y in g.inputs(x) {
            let i = find(&instances, &node_inst, y as usize, dev);
            if input_stamp[i] == tag {
                continue;
            }
            input_stamp[i] = tag;
            if instances[i].segment == sid {
                instances[i].remaining -= 1;
                if instances[i].remaining == 0 {
                    let inst = instances[i];
                    mem.release(&inst, finish);
                }
            } else if instances[i].pending_in != sid + 1 {
                instances[i].pending_in = sid + 1;
                pending[su].push(i);
            }
        }

        // Where, and for how many releases, x's value is needed.
        consumer_devices.clear();
        for &c in g.consumers(x) {
            let cd = pl.node_device[c as usize];
            let cs = seg.node_segment[c as usize];
            let cdu = cd as usize;
            if same_segment[cdu] == 0 && other_segments[cdu] == 0 {
                consumer_devices.push(cd);
            }
            if cd == dev && cs == sid {
                same_segment[cdu] += 1;
            } else if last_segment[cdu] != cs {
                last_segment[cdu] = cs;
                other_segments[cdu] += 1;
            }
        }
        consumer_devices.sort_unstable();
        let releases = |d: u32| same_segment[d as usize] + other_segments[d as usize];
        let is_output = g.is_output(x);

        let lo = instances.len();
        instances.push(Instance {
            device: dev,
            bytes: out,
            ready: finish,
            remaining: releases(dev) + u32::from(is_output && dev != HOST),
            floor: finish,
            keep: is_output && dev == HOST,
            segment: sid,
            pending_in: 0,
        });
        let mut host_copy = None;
        if dev != HOST && consumer_devices.iter().any(|&cd| cd != dev) {
            let (cs, ce) = enqueue(&mut d2h_free[du], finish, out, devices[du].d2h_bytes_per_s);
            mem.push(HOST, cs, out, true);
            instances[lo].floor = instances[lo].floor.max(ce);
            host_copy = Some(instances.len());
            instances.push(Instance {
                device: HOST,
                bytes: out,
                ready: ce,
                remaining: releases(HOST),
                floor: ce,
                keep: false,
                segment: u32::MAX,
                pending_in: 0,
            });
        }
        for &cd in &consumer_devices {
            if cd == dev || cd == HOST {
                continue;
            }
            let src = host_copy.unwrap_or(lo);
            let cdu = cd as usize;
            let (cs, ce) = enqueue(
                &mut h2d_free[cdu],
                instances[src].ready,
                out,
                devices[cdu].h2d_bytes_per_s,
            );
            mem.push(cd, cs, out, true);
            instances[src].floor = instances[src].floor.max(ce);
            instances.push(Instance {
                device: cd,
                bytes: out,
                ready: ce,
                remaining: releases(cd),
                floor: ce,
                keep: false,
                segment: u32::MAX,
                pending_in: 0,
            });
        }
        for &cd in &consumer_devices {
            let cdu = cd as usize;
            same_segment[cdu] = 0;
            other_segments[cdu] = 0;
            last_segment[cdu] = u32::MAX;
        }
        input_stamp.resize(instances.len(), 0);
        if is_output && dev == HOST {
            last_output = last_output.max(finish);
        }
        for inst in &instances[lo..] {
            if inst.remaining == 0 {
                mem.release(inst, inst.ready);
            }
        }

        if seg.segment_last_node[su] as usize == x {
            for &i in &pending[su] {
                instances[i].remaining -= 1;
                if instances[i].remaining == 0 {
                    let inst = instances[i];
                    mem.release(&inst, finish);
                }
            }
            if dev != HOST {
                for &k in &evict_at[su] {
                    let span = seg.spans[k];
                    let bytes = g.param_bytes()[span.param as usize];
                    mem.push(span.device, finish, bytes, false);
                }
            }
        }
    }
    node_inst.push(instances.len());

    // Graph outputs made on accelerators go back to the host at the end.
    for x in (0..n).filter(|&x| g.is_output(x) && pl.node_device[x] != HOST) {
        let du = pl.node_device[x] as usize;
        let home = node_inst[x];
        let out = g.node_out_bytes()[x];
        let (cs, ce) = enqueue(
            &mut d2h_free[du],
            makespan,
            out,
            devices[du].d2h_bytes_per_s,
        );
        mem.push(HOST, cs, out, true);
        last_output = last_output.max(ce);
        let inst = &mut instances[home];
        inst.floor = inst.floor.max(ce);
        inst.remaining -= 1;
        if inst.remaining == 0 {
            let inst = *inst;
            mem.release(&inst, ce);
        }
    }

    let peak_bytes = mem
        .events
        .iter_mut()
        .zip(&base)
        .map(|(events, &base)| {
            events.sort_unstable_by_key(|e| (e.time_bits, e.seq));
            let mut live = base;
            let mut peak = base;
            for e in events.iter() {
                if e.alloc {
                    live += u128::from(e.bytes);
                    peak = peak.max(live);
                } else {
                    live = live.saturating_sub(u128::from(e.bytes));
                }
            }
            u64::try_from(peak).unwrap_or(u64::MAX)
        })
        .collect();

    let predicted_time_s = if last_output.is_finite() {
        last_output
    } else {
        makespan
    };
    Simulation {
        predicted_time_s,
        peak_bytes,
    }
}
