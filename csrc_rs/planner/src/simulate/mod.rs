//! Discrete-event simulation of one placement: time, memory and resources.
//!
//! The model, in short:
//! * one compute queue per device; nodes run in topological order, a node
//!   starting when its device is free, its inputs are on its device and its
//!   segment's prefetches have arrived; it takes
//!   `max(flops / flops_per_s, bytes_accessed / mem_bytes_per_s) + latency`;
//! * one host-to-device and one device-to-host copy engine per accelerator,
//!   and one disk reader into host memory, each first-in first-out in
//!   program order;
//! * a value needed on another device is copied once per (producer, device)
//!   as soon as it is produced (accelerator to accelerator goes through a host
//!   staging copy); graph outputs made on an accelerator are copied back at
//!   the end, once every node has finished;
//! * streamed parameters are prefetched, for each stay on a device (a run of
//!   their using segments there, see `crate::placement::segment`), when the
//!   segment `depth` places before the stay's first using segment starts (at
//!   time 0 when there is none) and evicted after its last; a parameter
//!   whose home is disk is first read into a host staging buffer (freed once
//!   copied on), or straight into host memory for host nodes. Resident
//!   parameters occupy their devices for the whole run; the host holds every
//!   parameter whose home is the host;
//! * a spilled value (see `Placement`) is copied to the host by the
//!   device-to-host engine as soon as it is produced; the device copy is
//!   freed once that copy and its uses before the gap in its uses are done,
//!   and its own segment has ended (the runtime spills it once the segment's
//!   call returns it, so a copy modelled to land mid-segment frees nothing).
//!   The device starts nothing after the last of those uses' segments until
//!   the copy has landed (the runtime waits for it there), so the device
//!   copy is gone before anything that follows allocates.
//!   It is copied back by the host-to-device engine when its reload's issue
//!   segment starts (the host copy freed once that copy is done), serves
//!   the uses from the gap on, and lives there until its last consuming
//!   segment ends;
//! * a value lives on a device from its creation (node start or copy start)
//!   until its last consumer there is done, its copies out completed and,
//!   when another device consumes it, its segment finished (the runtime
//!   copies it once the segment's call returns it). A
//!   consumer in the producer's own segment is done when it finishes; any
//!   other consumer holds the value until its whole segment finishes (a
//!   segment runs as one call that keeps its arguments). Graph outputs on the
//!   host live to the end.
//!
//! Memory events are ordered by time, then by the order in which the
//! simulation produced them (which follows causality for equal times).

mod peak;
mod timeline;

pub use timeline::{Activity, Record, Resource};

use crate::device::{validate_devices, Device};
use crate::error::{Held, PlanError};
use crate::graph::{CostGraph, Tier};
use crate::placement::{segment, streams_to, Placement, Segmentation, HOST};

/// What one simulation measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// Time at which the last graph output is on the host (the makespan of
    /// the nodes when the graph has no outputs), in seconds.
    pub predicted_time_s: f64,
    /// Highest memory use of each device over the run, in bytes (the host's
    /// is the host-memory tier; parameters whose home is disk are not
    /// counted until read).
    pub peak_bytes: Vec<u64>,
    /// Seconds of work queued on each resource, its work over its rate: the
    /// compute queues in device order, then each accelerator's host-to-device
    /// and device-to-host copy engines, then the disk when a parameter's
    /// home is disk.
    pub busy_s: Vec<(Resource, f64)>,
    /// The most busy resource's seconds of work: no schedule of this
    /// placement's work finishes sooner.
    pub lower_bound_s: f64,
    /// Every piece of work, in the order the simulation issued it (empty
    /// unless requested).
    pub timeline: Vec<Record>,
    /// Per segment: how long its first node waited for the segment's
    /// prefetches once everything else was ready.
    pub(crate) prefetch_wait_s: Vec<f64>,
}

impl Simulation {
    /// Fraction of the predicted time each resource is busy (0 when the
    /// predicted time is 0 or infinite).
    #[must_use]
    pub fn busy_fraction(&self) -> Vec<(Resource, f64)> {
        let t = self.predicted_time_s;
        self.busy_s
            .iter()
            .map(|&(r, busy)| {
                let f = if t > 0.0 && t.is_finite() {
                    busy / t
                } else {
                    0.0
                };
                (r, f)
            })
            .collect()
    }
}

/// Simulates one placement of `graph` on `devices`, no value spilled.
///
/// `node_device` gives each node's device index; `param_streamed` whether
/// each parameter is streamed (ignored for parameters no accelerator uses
/// unless their home is disk); `prefetch_depth` (at least 1) how many
/// segments ahead on its device a streamed parameter is prefetched. The
/// timeline is recorded.
///
/// # Errors
/// * [`PlanError::InvalidDevices`] for a malformed device list;
/// * [`PlanError::InvalidPlacement`] for wrong lengths, unknown devices or a
///   host-only node placed elsewhere;
/// * [`PlanError::InvalidOptions`] for a prefetch depth of 0.
pub fn simulate(
    graph: &CostGraph,
    devices: &[Device],
    node_device: &[u32],
    param_streamed: &[bool],
    prefetch_depth: u32,
) -> Result<Simulation, PlanError> {
    simulate_spilled(
        graph,
        devices,
        node_device,
        param_streamed,
        &[],
        prefetch_depth,
    )
}

/// [`simulate`] with the values of the nodes flagged in `value_spilled`
/// spilled to the host between uses (one flag per node, or empty for none;
/// a flag on a value that is not spillable is ignored).
///
/// # Errors
/// As [`simulate`], and [`PlanError::InvalidPlacement`] when
/// `value_spilled` is neither empty nor one flag per node.
pub fn simulate_spilled(
    graph: &CostGraph,
    devices: &[Device],
    node_device: &[u32],
    param_streamed: &[bool],
    value_spilled: &[bool],
    prefetch_depth: u32,
) -> Result<Simulation, PlanError> {
    validate_devices(devices)?;
    check_depth(prefetch_depth)?;
    let placement = checked_placement(graph, devices, node_device, param_streamed, value_spilled)?;
    let seg = segment(graph, &placement, prefetch_depth);
    Ok(run(graph, devices, &placement, &seg, true))
}

/// Checks a prefetch depth (at least 1).
pub(crate) fn check_depth(depth: u32) -> Result<(), PlanError> {
    if depth == 0 {
        return Err(PlanError::InvalidOptions(
            "prefetch_depth is 0; it must be at least 1 (1 is a double buffer)".into(),
        ));
    }
    Ok(())
}

/// Validates a placement given from outside and normalizes its flags.
pub(crate) fn checked_placement(
    g: &CostGraph,
    devices: &[Device],
    node_device: &[u32],
    param_streamed: &[bool],
    value_spilled: &[bool],
) -> Result<Placement, PlanError> {
    let invalid = PlanError::InvalidPlacement;
    if !value_spilled.is_empty() && value_spilled.len() != g.num_nodes() {
        return Err(invalid(format!(
            "value_spilled has {} entries but the graph has {} nodes",
            value_spilled.len(),
            g.num_nodes()
        )));
    }
    if node_device.len() != g.num_nodes() {
        return Err(invalid(format!(
            "node_device has {} entries but the graph has {} nodes",
            node_device.len(),
            g.num_nodes()
        )));
    }
    if param_streamed.len() != g.num_params() {
        return Err(invalid(format!(
            "param_streamed has {} entries but the graph has {} params",
            param_streamed.len(),
            g.num_params()
        )));
    }
    for (v, &d) in node_device.iter().enumerate() {
        if d as usize >= devices.len() {
            return Err(invalid(format!(
                "node_device[{v}] = {d} is out of range for {} devices",
                devices.len()
            )));
        }
        if g.node_host_only()[v] && d != HOST {
            return Err(invalid(format!(
                "node {v} is host-only but node_device[{v}] = {d} ({:?})",
                devices[d as usize].name
            )));
        }
    }
    let placement = Placement::new(g, node_device.to_vec(), param_streamed.to_vec());
    Ok(if value_spilled.is_empty() {
        placement
    } else {
        placement.with_spills(value_spilled.to_vec())
    })
}

#[derive(Debug, Clone, Copy)]
struct Event {
    time_bits: u64,
    seq: u64,
    bytes: u64,
    /// What the bytes hold: the parameter or node `index` names.
    index: u32,
    held: Held,
    alloc: bool,
}

// what an event holds fits in the padding its flag left: a plan's simulations sort
// millions of them
const _: () = assert!(std::mem::size_of::<Event>() == 32);

/// One copy of a value on one device.
#[derive(Debug, Clone, Copy)]
struct Instance {
    device: u32,
    /// The node whose value it is.
    node: u32,
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
    /// The reloaded copy of a spilled value (its other segments read it).
    reload: bool,
    /// The instance whose storage this one's value views (`usize::MAX`:
    /// none): kept alive, one release pending, until this one is freed.
    holds: usize,
}

/// Frees instance `i`, whose releases are all done, at `at` (or once its
/// copies out are done), then drops its hold on the instance it views:
/// a view keeps its base's storage alive.
fn release_chain(instances: &mut [Instance], mem: &mut Memory, mut i: usize, mut at: f64) {
    loop {
        let inst = instances[i];
        mem.release(&inst, at);
        if inst.keep || inst.holds == usize::MAX {
            return;
        }
        at = at.max(inst.floor);
        i = inst.holds;
        instances[i].remaining -= 1;
        if instances[i].remaining != 0 {
            return;
        }
    }
}

struct Memory {
    events: Vec<Vec<Event>>,
    seq: u64,
}

impl Memory {
    fn push(&mut self, device: u32, time: f64, bytes: u64, alloc: bool, held: Held, index: u32) {
        debug_assert!(time >= 0.0, "times are never negative or NaN");
        // Adding 0.0 folds -0.0 into +0.0 so bit order matches numeric order.
        let time_bits = (time + 0.0).to_bits();
        self.events[device as usize].push(Event {
            time_bits,
            seq: self.seq,
            bytes,
            index,
            held,
            alloc,
        });
        self.seq += 1;
    }

    fn release(&mut self, inst: &Instance, at: f64) {
        if !inst.keep {
            let at = at.max(inst.floor);
            self.push(inst.device, at, inst.bytes, false, Held::Value, inst.node);
        }
    }

    /// Peak of each device: `base` plus the highest sum of live events.
    fn peaks(&mut self, base: &[u128]) -> Vec<u64> {
        self.events
            .iter_mut()
            .zip(base)
            .map(|(events, &base)| {
                // The events come mostly in time order, with a few pushed ahead of it (a
                // prefetch's buffer at its issue time, before the wait that came first):
                // the stable sort merges such runs in near-linear time where the unstable
                // one sorted them whole (the planner bench's 10k-node graph: 36 against
                // 46-54 ms a plan). Every key is distinct (`seq`), so the order is the same.
                events.sort_by_key(|e| (e.time_bits, e.seq));
                u64::try_from(peak_of(events, base).0).unwrap_or(u64::MAX)
            })
            .collect()
    }
}

/// The highest sum of live bytes over `base` along `events` (in the order
/// the peak is found in), and the index of the allocation that first reached
/// it (`None` when `base` alone is the peak).
fn peak_of(events: &[Event], base: u128) -> (u128, Option<usize>) {
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
    (peak, at)
}

/// The resources' queues: when each is next free, its busy seconds, and
/// the timeline when one is recorded.
struct Queues {
    num_devices: usize,
    free: Vec<f64>,
    busy: Vec<f64>,
    timeline: Option<Vec<Record>>,
    // the transfer time (bytes over the rate) of the last read queued on the disk
    last_disk_transfer: f64,
}

impl Queues {
    fn new(num_devices: usize, record: bool) -> Self {
        let slots = 3 * num_devices - 1;
        Self {
            num_devices,
            free: vec![0.0; slots],
            busy: vec![0.0; slots],
            timeline: record.then(Vec::new),
            last_disk_transfer: 0.0,
        }
    }

    /// Index of a resource in the order of [`Resource::all`].
    fn slot(&self, r: Resource) -> usize {
        let nd = self.num_devices;
        match r {
            Resource::Compute(d) => d as usize,
            Resource::HostToDevice(a) => nd + 2 * (a as usize - 1),
            Resource::DeviceToHost(a) => nd + 2 * (a as usize - 1) + 1,
            Resource::Disk => 3 * nd - 2,
        }
    }

    fn free_at(&self, r: Resource) -> f64 {
        self.free[self.slot(r)]
    }

    /// Keeps `r` from starting anything before `until` (a wait, not work).
    fn hold(&mut self, r: Resource, until: f64) {
        let k = self.slot(r);
        self.free[k] = self.free[k].max(until);
    }

    /// Adds work on `r` to the timeline, when one is recorded.
    fn note(&mut self, r: Resource, activity: Activity, index: u32, start: f64, end: f64) {
        if let Some(t) = &mut self.timeline {
            t.push(Record {
                resource: r,
                activity,
                index,
                start_s: start,
                end_s: end,
            });
        }
    }

    /// Queues `seconds` of work on `r` no earlier than `issue`; returns
    /// its (start, end).
    fn run(
        &mut self,
        r: Resource,
        issue: f64,
        seconds: f64,
        activity: Activity,
        index: u32,
    ) -> (f64, f64) {
        let k = self.slot(r);
        let start = issue.max(self.free[k]);
        let end = start + seconds;
        self.free[k] = end;
        self.busy[k] += seconds;
        self.note(r, activity, index, start, end);
        (start, end)
    }
}

/// Buffers a simulation reuses from one run to the next.
#[derive(Default)]
pub(crate) struct Workspace {
    base: Vec<u128>,
    stamp: Vec<usize>,
    issue_offsets: Vec<u32>,
    issue_ids: Vec<u32>,
    evict_offsets: Vec<u32>,
    evict_ids: Vec<u32>,
    initial: Vec<u32>,
    events: Vec<Vec<Event>>,
    seg_ready: Vec<f64>,
    instances: Vec<Instance>,
    node_inst: Vec<usize>,
    input_stamp: Vec<u32>,
    pending: Vec<usize>,
    same_segment: Vec<u32>,
    other_segments: Vec<u32>,
    last_segment: Vec<u32>,
    // per kind of op: the segment that ran it last (`u32::MAX`: none yet)
    kind_segment: Vec<u32>,
    consumer_devices: Vec<u32>,
    reload_offsets: Vec<u32>,
    reload_ids: Vec<u32>,
    landed_offsets: Vec<u32>,
    landed_ids: Vec<u32>,
    /// Per node: its spill's index in the segmentation, or `u32::MAX`.
    node_spill: Vec<u32>,
    /// Per spill: the index of its host copy (the reloaded copy follows).
    spill_inst: Vec<usize>,
    /// Per segment: the runtime's own work on the calling thread before it
    /// starts (`runtime_work`).
    runtime_s: Vec<f64>,
    /// Per (parameter, device): the first segment there using it as a
    /// resident (`u32::MAX`: none), indexed `q * devices + d`.
    resident_first: Vec<u32>,
}

/// Groups span ids by a segment key into CSR arrays (ids ascending).
fn group_by_segment(
    num_segments: usize,
    keys: impl Iterator<Item = Option<u32>> + Clone,
    offsets: &mut Vec<u32>,
    ids: &mut Vec<u32>,
) {
    offsets.clear();
    offsets.resize(num_segments + 2, 0);
    for s in keys.clone().flatten() {
        offsets[s as usize + 2] += 1;
    }
    for k in 2..offsets.len() {
        offsets[k] += offsets[k - 1];
    }
    ids.clear();
    ids.resize(offsets[num_segments + 1] as usize, 0);
    for (k, key) in keys.enumerate() {
        if let Some(s) = key {
            let slot = &mut offsets[s as usize + 1];
            ids[*slot as usize] = k as u32;
            *slot += 1;
        }
    }
    offsets.truncate(num_segments + 1);
}

/// The ids grouped under segment `s`.
fn group<'a>(offsets: &[u32], ids: &'a [u32], s: usize) -> &'a [u32] {
    &ids[offsets[s] as usize..offsets[s + 1] as usize]
}

/// Simulates one placement with its segmentation; records the timeline
/// when `record`.
pub(crate) fn run(
    g: &CostGraph,
    devices: &[Device],
    pl: &Placement,
    seg: &Segmentation,
    record: bool,
) -> Simulation {
    Workspace::default().run(g, devices, pl, seg, record)
}

/// What one simulation reads.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    g: &'a CostGraph,
    devices: &'a [Device],
    pl: &'a Placement,
    seg: &'a Segmentation,
}

/// What one simulation accumulates besides the workspace's buffers.
struct Clock {
    mem: Memory,
    queues: Queues,
    /// Per segment: how long its first node waited for prefetches.
    prefetch_wait_s: Vec<f64>,
    /// The latest finish of any node.
    makespan: f64,
    /// When the last graph output is on the host (`-inf` before any is).
    last_output: f64,
}

/// Issues the prefetches of the spans `span_ids` at `at`: each allocates
/// its buffer on its device, is read from disk first when its home is disk
/// (through a host staging buffer for an accelerator), then copied on to an
/// accelerator; its first using segment is ready no earlier than it arrives.
fn issue_prefetches(
    inp: Inputs,
    span_ids: &[u32],
    at: f64,
    mem: &mut Memory,
    queues: &mut Queues,
    seg_ready: &mut [f64],
) {
    let (g, devices, seg) = (inp.g, inp.devices, inp.seg);
    let bytes_of = g.param_bytes();
    let home = g.param_home();
    let host = &devices[HOST as usize];
    // the calling thread issues the prefetches in turn: after one it reads itself
    let mut at = at;
    for &k in span_ids {
        let span = seg.spans[k as usize];
        let (q, d) = (span.param, span.device);
        let bytes = bytes_of[q as usize];
        mem.push(d, at, bytes, true, Held::Weight, q);
        let mut ready = at;
        let start = at.max(queues.free_at(Resource::Compute(HOST)));
        if home[q as usize] == Tier::Disk
            && host.reads_inline(bytes as f64)
            && queues.free_at(Resource::Disk) <= start
        {
            // The calling thread reads it when issuing it (before the segment that
            // issues it), the disk being idle (behind the reads in flight it would wait
            // for them: it goes to the reader's threads then): the host computes
            // nothing meanwhile, and what the thread issues next it issues after.
            let read = host.disk_read_time(bytes as f64);
            let (_, end) = queues.run(Resource::Disk, start, read, Activity::Param, q);
            queues.hold(Resource::Compute(HOST), end);
            at = end;
            ready = end;
            if d != HOST {
                mem.push(HOST, start, bytes, true, Held::Staging, q);
            }
        } else if home[q as usize] == Tier::Disk {
            // A read queued behind another hides its fixed cost behind that one's
            // transfer, as far as the transfer lasts; one issued to an idle disk pays
            // it whole, and so does one queued behind a read of a few KiB (their
            // hand-offs run one after the other: 22 reads of 8-32 KiB kept the disk
            // busy 0.48 ms each on the 2-core development machine).
            let transfer = bytes as f64 / host.disk_bytes_per_s;
            let read = if queues.free_at(Resource::Disk) > at {
                transfer + (host.disk_latency_s - queues.last_disk_transfer).max(0.0)
            } else {
                host.disk_read_time(bytes as f64)
            };
            queues.last_disk_transfer = transfer;
            if host.read_cpu_s > 0.0 {
                // what the read's hand-offs take from the host's compute while it is in
                // flight, charged when it is issued (before the segment that issues it)
                queues.run(
                    Resource::Compute(HOST),
                    at,
                    host.read_cpu_s,
                    Activity::ReadCpu,
                    q,
                );
            }
            let (start, end) = queues.run(Resource::Disk, at, read, Activity::Param, q);
            ready = end;
            if d != HOST {
                // A host staging buffer until the copy on is done.
                mem.push(HOST, start, bytes, true, Held::Staging, q);
            }
        }
        if d != HOST {
            let copy = bytes as f64 / devices[d as usize].h2d_bytes_per_s;
            let (_, end) = queues.run(Resource::HostToDevice(d), ready, copy, Activity::Param, q);
            if home[q as usize] == Tier::Disk {
                mem.push(HOST, end, bytes, false, Held::Staging, q);
            }
            ready = end;
        }
        let slot = &mut seg_ready[span.first_segment as usize];
        *slot = slot.max(ready);
    }
}

impl Workspace {
    /// Simulates one placement with its segmentation; records the timeline
    /// when `record`.
    pub(crate) fn run(
        &mut self,
        g: &CostGraph,
        devices: &[Device],
        pl: &Placement,
        seg: &Segmentation,
        record: bool,
    ) -> Simulation {
        let inp = Inputs {
            g,
            devices,
            pl,
            seg,
        };
        self.constant_memory(inp);
        self.group_spans(inp);
        self.runtime_work(inp);
        let mut clock = self.start(inp, record);
        self.reset_values(inp);
        for x in 0..g.num_nodes() {
            self.step(inp, &mut clock, x);
        }
        self.node_inst.push(self.instances.len());
        self.copy_outputs_back(inp, &mut clock);
        self.finish(inp, clock)
    }

    /// Constant memory, in `base`: every param whose home is the host on the
    /// host, each resident param on each other device that uses it (and on
    /// the host when it comes from disk).
    fn constant_memory(&mut self, inp: Inputs) {
        let (g, pl) = (inp.g, inp.pl);
        let nd = inp.devices.len();
        let bytes_of = g.param_bytes();
        let home = g.param_home();
        let base = &mut self.base;
        let stamp = &mut self.stamp;
        base.clear();
        base.resize(nd, 0);
        stamp.clear();
        stamp.resize(nd, usize::MAX);
        for q in 0..g.num_params() {
            let bytes = u128::from(bytes_of[q]);
            if home[q] == Tier::Host {
                base[HOST as usize] += bytes;
                stamp[HOST as usize] = q;
            }
            if pl.param_streamed[q] {
                continue;
            }
            for &u in g.param_users(q) {
                let d = pl.node_device[u as usize] as usize;
                if stamp[d] != q {
                    stamp[d] = q;
                    base[d] += bytes;
                }
            }
        }
    }

    /// Groups the spans by the segment that issues them and the one ending
    /// them, and the spills by the segment issuing their reload and by the
    /// one after which their device waits for them to land; indexes the
    /// spills by node; lists the spans issued at the start of the run.
    fn group_spans(&mut self, inp: Inputs) {
        let seg = inp.seg;
        let n = inp.g.num_nodes();
        let num_segments = seg.segment_device.len();
        group_by_segment(
            num_segments,
            seg.spans.iter().map(|s| s.issue_segment),
            &mut self.issue_offsets,
            &mut self.issue_ids,
        );
        group_by_segment(
            num_segments,
            seg.spans.iter().map(|s| Some(s.last_segment)),
            &mut self.evict_offsets,
            &mut self.evict_ids,
        );
        group_by_segment(
            num_segments,
            seg.spills.iter().map(|s| Some(s.issue_segment)),
            &mut self.reload_offsets,
            &mut self.reload_ids,
        );
        group_by_segment(
            num_segments,
            seg.spills.iter().map(|s| Some(s.last_near_segment)),
            &mut self.landed_offsets,
            &mut self.landed_ids,
        );
        self.node_spill.clear();
        self.node_spill.resize(n, u32::MAX);
        for (k, spill) in seg.spills.iter().enumerate() {
            self.node_spill[spill.node as usize] = k as u32;
        }
        self.spill_inst.clear();
        self.spill_inst.resize(seg.spills.len(), usize::MAX);
        self.initial.clear();
        self.initial.extend(
            (0..seg.spans.len() as u32).filter(|&k| seg.spans[k as usize].issue_segment.is_none()),
        );
    }

    /// The runtime's own work on the calling thread before each segment
    /// starts (the host's `segment_call_s`, `resident_lookup_s` and
    /// `stream_op_s`): the segment's call, the lookup of each resident
    /// parameter first passed to a segment on its device there (one on an
    /// accelerator, or one whose home is disk), and the prefetch, wait and
    /// evict of each parameter streamed in for it. A plan of one host
    /// segment without any of these (and no state input) is called as that
    /// segment: no work.
    fn runtime_work(&mut self, inp: Inputs) {
        let (g, pl, seg) = (inp.g, inp.pl, inp.seg);
        let host = &inp.devices[HOST as usize];
        let num_segments = seg.segment_device.len();
        self.runtime_s.clear();
        self.runtime_s.resize(num_segments, 0.0);
        if host.segment_call_s == 0.0 && host.resident_lookup_s == 0.0 && host.stream_op_s == 0.0 {
            return;
        }
        for span in &seg.spans {
            self.runtime_s[span.first_segment as usize] += host.stream_op_s;
        }
        let nd = inp.devices.len();
        let home = g.param_home();
        self.resident_first.clear();
        self.resident_first.resize(g.num_params() * nd, u32::MAX);
        let mut lookups = 0usize;
        for (q, &tier) in home.iter().enumerate() {
            for &u in g.param_users(q) {
                let d = pl.node_device[u as usize];
                let streamed = pl.param_streamed[q] && streams_to(g, q, d);
                if streamed || (d == HOST && tier != Tier::Disk) {
                    continue; // streamed in, or the host's own: passed as it is
                }
                let first = &mut self.resident_first[q * nd + d as usize];
                if *first == u32::MAX {
                    lookups += 1;
                }
                *first = (*first).min(seg.node_segment[u as usize]);
            }
        }
        for &s in self.resident_first.iter().filter(|&&s| s != u32::MAX) {
            self.runtime_s[s as usize] += host.resident_lookup_s;
        }
        // (a state input is held by a runtime op of its own, `ops.state`)
        let direct = num_segments == 1
            && seg.segment_device[0] == HOST
            && seg.spans.is_empty()
            && lookups == 0
            && g.state_pairs().is_empty();
        if !direct {
            for work in &mut self.runtime_s {
                *work += host.segment_call_s;
            }
        }
    }

    /// Empty memory events and queues, and the prefetches issued at the
    /// start of the run.
    fn start(&mut self, inp: Inputs, record: bool) -> Clock {
        let nd = inp.devices.len();
        let num_segments = inp.seg.segment_device.len();
        self.events.resize_with(nd, Vec::new);
        for events in &mut self.events {
            events.clear();
        }
        let mut mem = Memory {
            events: std::mem::take(&mut self.events),
            seq: 0,
        };
        let mut queues = Queues::new(nd, record);
        self.seg_ready.clear();
        self.seg_ready.resize(num_segments, 0.0);
        issue_prefetches(
            inp,
            &self.initial,
            0.0,
            &mut mem,
            &mut queues,
            &mut self.seg_ready,
        );
        Clock {
            mem,
            queues,
            prefetch_wait_s: vec![0.0f64; num_segments],
            makespan: 0.0,
            last_output: f64::NEG_INFINITY,
        }
    }

    /// Clears the values' instances and the per-device consumer counts.
    fn reset_values(&mut self, inp: Inputs) {
        let nd = inp.devices.len();
        self.instances.clear();
        self.node_inst.clear();
        self.input_stamp.clear();
        self.pending.clear();
        self.same_segment.clear();
        self.same_segment.resize(nd, 0);
        self.other_segments.clear();
        self.other_segments.resize(nd, 0);
        self.last_segment.clear();
        self.last_segment.resize(nd, u32::MAX);
        self.kind_segment.clear();
        self.kind_segment.resize(inp.g.num_kinds(), u32::MAX);
    }

    /// What node `x` of segment `sid` pays on `device` for the kinds of op
    /// its segment has not run yet (`Device::cold_latency_s` each), which
    /// it then has.
    fn cold_cost(&mut self, g: &CostGraph, device: &Device, x: usize, sid: u32) -> f64 {
        // a device without a cold cost need not track its segments' kinds (segments
        // are each on one device)
        if device.cold_latency_s == 0.0 {
            return 0.0;
        }
        let mut cold = 0;
        for &k in g.node_kinds(x) {
            let last = &mut self.kind_segment[k as usize];
            if *last != sid {
                *last = sid;
                cold += 1;
            }
        }
        f64::from(cold) * device.cold_latency_s
    }

    /// The copy of y's value that a node of segment `sid` on `d` reads:
    /// the reloaded one for a spilled value used after its gap.
    fn find(&self, seg: &Segmentation, y: usize, d: u32, sid: u32) -> usize {
        let (lo, hi) = (self.node_inst[y], self.node_inst[y + 1]);
        let k = self.node_spill[y];
        let reload = k != u32::MAX && sid >= seg.spills[k as usize].first_segment;
        (lo..hi)
            .find(|&i| self.instances[i].device == d && self.instances[i].reload == reload)
            .expect("every consumer device of a value receives a copy")
    }

    /// Simulates node `x`: the reloads of its segment when it is the first
    /// node, its start and run, its inputs' releases, its value's copies,
    /// and the end of its segment when it is the last node.
    fn step(&mut self, inp: Inputs, clock: &mut Clock, x: usize) {
        let (g, devices, pl, seg) = (inp.g, inp.devices, inp.pl, inp.seg);
        // Instances of x start here (and those of x - 1 end here).
        self.node_inst.push(self.instances.len());
        let dev = pl.node_device[x];
        let su = seg.node_segment[x] as usize;
        let first_of_segment = seg.segment_first_node[su] as usize == x;
        if first_of_segment {
            self.issue_reloads(inp, clock, su, dev);
        }
        let start = self.node_start(inp, clock, x, first_of_segment);
        clock
            .mem
            .push(dev, start, own_bytes(g, pl, x), true, Held::Value, x as u32);
        let device = &devices[dev as usize];
        let seconds = device.node_time(
            g.node_flops()[x],
            g.node_bytes_accessed()[x],
            g.node_rate_class()[x],
            g.node_ops(x),
        ) + self.cold_cost(g, device, x, seg.node_segment[x]);
        // slower while the reads queued so far keep the disk busy
        let seconds = if dev == HOST {
            device.while_reading(seconds, start, clock.queues.free_at(Resource::Disk))
        } else {
            seconds
        };
        let (_, finish) = clock.queues.run(
            Resource::Compute(dev),
            start,
            seconds,
            Activity::Node,
            x as u32,
        );
        clock.makespan = clock.makespan.max(finish);
        // a view holds the copy of its base it was taken from (one more
        // release, done when the view is freed)
        let base = g.node_alias(x).map(|a| {
            let i = self.find(seg, a, dev, seg.node_segment[x]);
            self.instances[i].remaining += 1;
            i
        });
        self.release_inputs(inp, clock, x, finish);
        self.count_consumers(inp, x);
        let lo = self.make_instances(inp, clock, x, finish);
        if let Some(i) = base {
            self.instances[lo].holds = i;
        }
        self.settle_value(inp, clock, x, lo, finish);
        if seg.segment_last_node[su] as usize == x {
            self.end_segment(inp, clock, su, finish);
        }
    }

    /// Issues the reloads of segment `su` (on `dev`) when the device is free
    /// to start the segment: each copies a spilled value's host copy back
    /// once it is there, frees the host copy and makes the reloaded copy
    /// ready.
    fn issue_reloads(&mut self, inp: Inputs, clock: &mut Clock, su: usize, dev: u32) {
        let (devices, seg) = (inp.devices, inp.seg);
        let at = clock.queues.free_at(Resource::Compute(dev));
        for &k in group(&self.reload_offsets, &self.reload_ids, su) {
            let spill = seg.spills[k as usize];
            let host = self.spill_inst[k as usize];
            let instances = &mut self.instances;
            let (bytes, on_host) = (instances[host].bytes, instances[host].ready);
            let copy = bytes as f64 / devices[spill.device as usize].h2d_bytes_per_s;
            clock
                .mem
                .push(spill.device, at, bytes, true, Held::Copy, spill.node);
            let (_, end) = clock.queues.run(
                Resource::HostToDevice(spill.device),
                at.max(on_host),
                copy,
                Activity::Reload,
                spill.node,
            );
            instances[host].floor = end;
            let inst = instances[host];
            clock.mem.release(&inst, end);
            instances[host + 1].ready = end;
        }
    }

    /// When node `x` starts: once its device is free, its inputs are on its
    /// device and its segment's prefetches have arrived. The first node of
    /// a segment issues the prefetches that segment's start issues, as the
    /// runtime does: once its device is free, before waiting for the
    /// segment's own inputs and reads (so that a read queues behind the one
    /// in flight; reads it issues for itself, at prefetch depth 0, delay
    /// it), and records how long the segment waited for prefetches.
    fn node_start(&mut self, inp: Inputs, clock: &mut Clock, x: usize, first: bool) -> f64 {
        let (g, pl, seg) = (inp.g, inp.pl, inp.seg);
        let dev = pl.node_device[x];
        let sid = seg.node_segment[x];
        let su = sid as usize;
        let free = clock.queues.free_at(Resource::Compute(dev));
        let mut ready = free;
        for &y in g.inputs(x) {
            let i = self.find(seg, y as usize, dev, sid);
            ready = ready.max(self.instances[i].ready);
        }
        let mut start = ready.max(self.seg_ready[su]);
        if first {
            let ids = group(&self.issue_offsets, &self.issue_ids, su);
            issue_prefetches(
                inp,
                ids,
                free,
                &mut clock.mem,
                &mut clock.queues,
                &mut self.seg_ready,
            );
            // the runtime's own work before the call (not the segment's compute)
            let worked = clock.queues.free_at(Resource::Compute(dev)) + self.runtime_s[su];
            clock.queues.hold(Resource::Compute(dev), worked);
            // reads issued by the segment for itself (prefetch depth 0) delay it, and
            // what the reads issued take from the host's compute
            start = start.max(self.seg_ready[su]).max(worked);
            // Compared first: two infinite times would subtract to NaN.
            let ready = ready.max(free + self.runtime_s[su]);
            clock.prefetch_wait_s[su] = if start > ready { start - ready } else { 0.0 };
        }
        start
    }

    /// Releases node `x`'s inputs (each instance once per node): those made
    /// in its segment now that it finished, the others when its segment
    /// ends.
    fn release_inputs(&mut self, inp: Inputs, clock: &mut Clock, x: usize, finish: f64) {
        let (g, pl, seg) = (inp.g, inp.pl, inp.seg);
        let dev = pl.node_device[x];
        let sid = seg.node_segment[x];
        let tag = x as u32 + 1;
        for &y in g.inputs(x) {
            let i = self.find(seg, y as usize, dev, sid);
            if self.input_stamp[i] == tag {
                continue;
            }
            self.input_stamp[i] = tag;
            let instances = &mut self.instances;
            if instances[i].segment == sid {
                instances[i].remaining -= 1;
                if instances[i].remaining == 0 {
                    release_chain(instances, &mut clock.mem, i, finish);
                }
            } else if instances[i].pending_in != sid + 1 {
                instances[i].pending_in = sid + 1;
                self.pending.push(i);
            }
        }
    }

    /// Where, and for how many releases, x's value is needed: the devices of
    /// its consumers (sorted), and per device the consumers in x's own
    /// segment and the distinct other consuming segments.
    fn count_consumers(&mut self, inp: Inputs, x: usize) {
        let (g, pl, seg) = (inp.g, inp.pl, inp.seg);
        let dev = pl.node_device[x];
        let sid = seg.node_segment[x];
        self.consumer_devices.clear();
        for &c in g.consumers(x) {
            let cd = pl.node_device[c as usize];
            let cs = seg.node_segment[c as usize];
            let cdu = cd as usize;
            if self.same_segment[cdu] == 0 && self.other_segments[cdu] == 0 {
                self.consumer_devices.push(cd);
            }
            if cd == dev && cs == sid {
                self.same_segment[cdu] += 1;
            } else if self.last_segment[cdu] != cs {
                self.last_segment[cdu] = cs;
                self.other_segments[cdu] += 1;
            }
        }
        self.consumer_devices.sort_unstable();
    }

    /// The releases a copy of the value being made on `d` waits for.
    fn releases(&self, d: u32) -> u32 {
        self.same_segment[d as usize] + self.other_segments[d as usize]
    }

    /// The instances of x's value, which `finish`ed: its own; a host copy
    /// for consumers on other devices or to spill it; the reloaded copy of
    /// a spilled value; a copy on each other accelerator consuming it (from
    /// the host copy when there is one). Returns the index of the first.
    fn make_instances(&mut self, inp: Inputs, clock: &mut Clock, x: usize, finish: f64) -> usize {
        let (g, devices, pl, seg) = (inp.g, inp.devices, inp.pl, inp.seg);
        let dev = pl.node_device[x];
        let du = dev as usize;
        let sid = seg.node_segment[x];
        let out = g.node_out_bytes()[x];
        let is_output = g.is_output(x);
        // an output stays where it is made when that is its home (the host, or
        // the device its state lives on); otherwise it is copied there at the end
        let stays = is_output && output_home(g, pl, x) == dev;

        let lo = self.instances.len();
        let spill = self.node_spill[x];
        let remaining = if spill == u32::MAX {
            self.releases(dev) + u32::from(is_output && !stays)
        } else {
            self.same_segment[du] + seg.spills[spill as usize].near_segments
        };
        self.instances.push(Instance {
            device: dev,
            node: x as u32,
            bytes: own_bytes(g, pl, x),
            ready: finish,
            remaining,
            floor: finish,
            // a state input is the caller's tensor: held for the whole call
            keep: stays || g.is_state_input(x),
            segment: sid,
            pending_in: 0,
            reload: false,
            holds: usize::MAX,
        });
        // A copy on the host: for consumers on other devices, or to spill
        // (spillable values have no other consumers).
        let spilled = spill != u32::MAX;
        let read_elsewhere = self.consumer_devices.iter().any(|&cd| cd != dev);
        let mut host_copy = None;
        if dev != HOST && (spilled || read_elsewhere) {
            let copy = out as f64 / devices[du].d2h_bytes_per_s;
            let activity = if spilled {
                Activity::Spill
            } else {
                Activity::Value
            };
            let (cs, ce) = clock.queues.run(
                Resource::DeviceToHost(dev),
                finish,
                copy,
                activity,
                x as u32,
            );
            clock.mem.push(HOST, cs, out, true, Held::Copy, x as u32);
            self.instances[lo].floor = self.instances[lo].floor.max(ce);
            host_copy = Some(self.instances.len());
            // a spilled value's host copy is freed by its reload
            let remaining = if spilled { 1 } else { self.releases(HOST) };
            self.instances.push(Instance {
                device: HOST,
                node: x as u32,
                bytes: out,
                ready: ce,
                remaining,
                floor: ce,
                keep: false,
                segment: u32::MAX,
                pending_in: 0,
                reload: false,
                holds: usize::MAX,
            });
        }
        if let (true, Some(host)) = (spilled, host_copy) {
            self.spill_inst[spill as usize] = host;
            // The reloaded copy, ready once its reload is issued.
            let remaining = self.other_segments[du] - seg.spills[spill as usize].near_segments;
            let floor = self.instances[host].floor;
            self.instances.push(Instance {
                device: dev,
                node: x as u32,
                bytes: out,
                ready: f64::INFINITY,
                remaining,
                floor,
                keep: false,
                segment: u32::MAX,
                pending_in: 0,
                reload: true,
                holds: usize::MAX,
            });
        }
        // The runtime copies a value to another device, or spills it, once its
        // segment returns it, so its own instance is held until that segment
        // ends too (however early a spill's copy is modelled to land).
        if spilled || read_elsewhere {
            self.instances[lo].remaining += 1;
            self.instances[lo].pending_in = sid + 1;
            self.pending.push(lo);
        }
        for k in 0..self.consumer_devices.len() {
            let cd = self.consumer_devices[k];
            if cd == dev || cd == HOST {
                continue;
            }
            let src = host_copy.unwrap_or(lo);
            let copy = out as f64 / devices[cd as usize].h2d_bytes_per_s;
            let (cs, ce) = clock.queues.run(
                Resource::HostToDevice(cd),
                self.instances[src].ready,
                copy,
                Activity::Value,
                x as u32,
            );
            clock.mem.push(cd, cs, out, true, Held::Copy, x as u32);
            self.instances[src].floor = self.instances[src].floor.max(ce);
            let remaining = self.releases(cd);
            self.instances.push(Instance {
                device: cd,
                node: x as u32,
                bytes: out,
                ready: ce,
                remaining,
                floor: ce,
                keep: false,
                segment: u32::MAX,
                pending_in: 0,
                reload: false,
                holds: usize::MAX,
            });
        }
        lo
    }

    /// After x's instances (from `lo`) are made: clears the consumer counts,
    /// notes a graph output made on the host, and frees the instances no
    /// one waits for.
    fn settle_value(&mut self, inp: Inputs, clock: &mut Clock, x: usize, lo: usize, finish: f64) {
        let (g, pl) = (inp.g, inp.pl);
        let dev = pl.node_device[x];
        for &cd in &self.consumer_devices {
            let cdu = cd as usize;
            self.same_segment[cdu] = 0;
            self.other_segments[cdu] = 0;
            self.last_segment[cdu] = u32::MAX;
        }
        self.input_stamp.resize(self.instances.len(), 0);
        if g.is_output(x) && output_home(g, pl, x) == dev {
            clock.last_output = clock.last_output.max(finish);
        }
        for i in lo..self.instances.len() {
            if self.instances[i].remaining == 0 {
                let ready = self.instances[i].ready;
                release_chain(&mut self.instances, &mut clock.mem, i, ready);
            }
        }
    }

    /// The end of segment `su`, at `finish`: releases what it held for its
    /// whole run, evicts the streamed parameters it used last, and keeps its
    /// device from going on until the spills it used last have landed.
    fn end_segment(&mut self, inp: Inputs, clock: &mut Clock, su: usize, finish: f64) {
        let (g, seg) = (inp.g, inp.seg);
        for &k in group(&self.landed_offsets, &self.landed_ids, su) {
            let spill = seg.spills[k as usize];
            let landed = self.instances[self.spill_inst[k as usize]].ready;
            clock.queues.hold(Resource::Compute(spill.device), landed);
        }
        for &i in &self.pending {
            self.instances[i].remaining -= 1;
            if self.instances[i].remaining == 0 {
                release_chain(&mut self.instances, &mut clock.mem, i, finish);
            }
        }
        self.pending.clear();
        let bytes_of = g.param_bytes();
        for &k in group(&self.evict_offsets, &self.evict_ids, su) {
            let span = seg.spans[k as usize];
            let bytes = bytes_of[span.param as usize];
            clock
                .mem
                .push(span.device, finish, bytes, false, Held::Weight, span.param);
        }
    }

    /// Graph outputs not made at their home (the host; for a state's new
    /// value, the device the state lives on) go there at the end, once every
    /// node has finished: to the host, and on from it to an accelerator.
    fn copy_outputs_back(&mut self, inp: Inputs, clock: &mut Clock) {
        let (g, devices, pl) = (inp.g, inp.devices, inp.pl);
        for x in (0..g.num_nodes()).filter(|&x| g.is_output(x)) {
            let (dev, home) = (pl.node_device[x], output_home(g, pl, x));
            if dev == home {
                continue;
            }
            let home_inst = self.node_inst[x];
            let out = g.node_out_bytes()[x];
            let mut ce = clock.makespan;
            if dev != HOST {
                let copy = out as f64 / devices[dev as usize].d2h_bytes_per_s;
                let (cs, end) = clock.queues.run(
                    Resource::DeviceToHost(dev),
                    ce,
                    copy,
                    Activity::Output,
                    x as u32,
                );
                clock.mem.push(HOST, cs, out, true, Held::Copy, x as u32);
                ce = end;
            }
            if home != HOST {
                let copy = out as f64 / devices[home as usize].h2d_bytes_per_s;
                let (cs, end) = clock.queues.run(
                    Resource::HostToDevice(home),
                    ce,
                    copy,
                    Activity::Output,
                    x as u32,
                );
                clock.mem.push(home, cs, out, true, Held::Copy, x as u32);
                ce = end;
            }
            clock.last_output = clock.last_output.max(ce);
            let inst = &mut self.instances[home_inst];
            inst.floor = inst.floor.max(ce);
            inst.remaining -= 1;
            if inst.remaining == 0 {
                release_chain(&mut self.instances, &mut clock.mem, home_inst, ce);
            }
        }
    }

    /// The peaks, the predicted time (the last output on the host, or the
    /// makespan without outputs), the busy seconds and the lower bound;
    /// keeps the event buffers for the next run.
    fn finish(&mut self, inp: Inputs, clock: Clock) -> Simulation {
        let Clock {
            mut mem,
            queues,
            prefetch_wait_s,
            makespan,
            last_output,
        } = clock;
        let peak_bytes = mem.peaks(&self.base);
        self.events = mem.events;
        let predicted_time_s = if last_output.is_finite() {
            last_output
        } else {
            makespan
        };
        let busy_s: Vec<(Resource, f64)> =
            Resource::all(inp.devices.len(), inp.g.has_disk_params())
                .into_iter()
                .map(|r| (r, queues.busy[queues.slot(r)]))
                .collect();
        let lower_bound_s = busy_s.iter().map(|&(_, b)| b).fold(0.0, f64::max);
        Simulation {
            predicted_time_s,
            peak_bytes,
            busy_s,
            lower_bound_s,
            timeline: queues.timeline.unwrap_or_default(),
            prefetch_wait_s,
        }
    }
}

/// The bytes node `x` allocates on its device: its value's, except for a
/// view (it shares its input's storage) and a state's new value written into
/// the state where it is (no new memory).
fn own_bytes(g: &CostGraph, pl: &Placement, x: usize) -> u64 {
    let in_state = g.is_in_place(x)
        && g.state_of_output(x)
            .is_some_and(|i| pl.node_device[i] == pl.node_device[x]);
    if in_state || g.node_alias(x).is_some() {
        0
    } else {
        g.node_out_bytes()[x]
    }
}

/// Where graph output `x` belongs at the end of a call: the device its state
/// input is placed on, for a state's new value; else the host.
fn output_home(g: &CostGraph, pl: &Placement, x: usize) -> u32 {
    g.state_of_output(x).map_or(HOST, |i| pl.node_device[i])
}
