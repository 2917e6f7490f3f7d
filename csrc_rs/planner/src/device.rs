//! Devices: the host and the accelerators a plan may use.

use crate::error::PlanError;

/// One device of the machine.
///
/// Index 0 of every device list is the host; the others are accelerators.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// Unique, non-empty name (for example `"cpu"` or `"virtual:0"`).
    pub name: String,
    /// Whether this is the host (exactly one, at index 0).
    pub is_host: bool,
    /// Sustained compute rate in floating-point operations per second: that
    /// of rate class 0 and of every class `class_flops_per_s` does not list.
    pub flops_per_s: f64,
    /// The compute rate of each further rate class, class `c` (from 1) at
    /// index `c - 1`: a node's class names the rate its FLOPs run at (on the
    /// host, a bfloat16 matmul is not a float32 one). Empty: one rate.
    pub class_flops_per_s: Vec<f64>,
    /// The fixed cost of a node of each further rate class (class `c` at
    /// index `c - 1`) that calls any op, all its ops together, in seconds:
    /// what its ops measured at a size where they move and compute next to
    /// nothing (an attention call costs more than a view). Nodes of class 0
    /// and of the classes it does not list pay `latency_s` an op. Empty: one
    /// fixed cost for every op.
    pub class_latency_s: Vec<f64>,
    /// Memory the plan may use on this device, in bytes.
    pub budget_bytes: u64,
    /// Host-to-device copy rate in bytes per second (ignored for the host).
    pub h2d_bytes_per_s: f64,
    /// Device-to-host copy rate in bytes per second (ignored for the host).
    pub d2h_bytes_per_s: f64,
    /// Fixed cost added to every node run on this device, in seconds.
    pub latency_s: f64,
    /// What a segment pays, beyond its ops' fixed costs, the first time it
    /// runs each kind of op (`CostGraph::node_kinds`), in seconds: between
    /// two segments the runtime's own work, the reads and the other
    /// segments evict the op's code and data from the caches, and between
    /// two calls the framework's and the user's code do. 0 means "not
    /// modelled".
    pub cold_latency_s: f64,
    /// Device-memory bandwidth in bytes per second: a node takes at least
    /// its memory traffic over this rate (memory-bound ops such as
    /// elementwise ops and norms). Infinite means "not modelled".
    pub mem_bytes_per_s: f64,
    /// Read rate of the disk tier in bytes per second (only the host's is
    /// used: parameters whose home is disk are read into host memory).
    /// Infinite means "not modelled".
    pub disk_bytes_per_s: f64,
    /// Fixed cost of a read from the disk tier, in seconds, beyond its bytes
    /// over `disk_bytes_per_s` (the request's latency and the reader's
    /// hand-offs; a read queued behind another hides it behind that one's
    /// transfer, as far as the transfer lasts; only the host's is used). 0
    /// means "not modelled".
    pub disk_latency_s: f64,
    /// How many times longer this device's (the host's) compute takes while
    /// the disk tier reads: the part of a node's run that overlaps reads
    /// already queued runs this much slower (the reads compete with it for
    /// the CPUs and memory). At least 1; 1 means "not modelled".
    pub read_slowdown: f64,
    /// Seconds of the host's compute that each disk read takes from it
    /// while in flight (the reader's threads hand the read on and check it
    /// under the same interpreter lock as the calling thread's ops): charged
    /// on the host's compute queue when the read is issued. Only the host's
    /// is used; 0 means "not modelled".
    pub read_cpu_s: f64,
    /// A disk read of a parameter of at most this many bytes issued while
    /// the disk is idle is made by the host's calling thread, not handed to
    /// the reader's threads (their hand-offs would cost it more than the
    /// read): the host computes nothing while it lasts (`inline_read_s` plus
    /// its bytes over `disk_bytes_per_s`) and it takes no `read_cpu_s`.
    /// Issued behind reads in flight it is handed on (made on the calling
    /// thread, it would wait for them). Only the host's is used; 0 means
    /// every read is handed on.
    pub inline_read_bytes: u64,
    /// Fixed cost of a read the calling thread makes itself (see
    /// `inline_read_bytes`), in seconds, beyond its bytes over
    /// `disk_bytes_per_s`. Only the host's is used.
    pub inline_read_s: f64,
    /// What the calling thread spends calling one segment of a plan of
    /// several (a plan of one segment that only takes the graph's inputs is
    /// called as that segment), in seconds: charged on the segment's device
    /// before its first node, as the runtime's own work (not its compute).
    /// Only the host's is used; 0 means "not modelled".
    pub segment_call_s: f64,
    /// What the calling thread spends looking up one resident parameter a
    /// segment is passed (one on an accelerator, or read from disk once),
    /// in seconds, charged before the first segment on that device using it.
    /// Only the host's is used; 0 means "not modelled".
    pub resident_lookup_s: f64,
    /// What the calling thread spends on one streamed parameter beyond its
    /// read and copy (issuing its prefetch, waiting for it, evicting it), in
    /// seconds, charged before its first using segment. Only the host's is
    /// used; 0 means "not modelled".
    pub stream_op_s: f64,
}

impl Device {
    /// A device with the given rates and budget, whose memory bandwidth and
    /// disk rate are not modelled (infinite).
    #[must_use]
    pub fn new(
        name: impl Into<String>,
        is_host: bool,
        flops_per_s: f64,
        budget_bytes: u64,
        h2d_bytes_per_s: f64,
        d2h_bytes_per_s: f64,
        latency_s: f64,
    ) -> Self {
        Self {
            name: name.into(),
            is_host,
            flops_per_s,
            class_flops_per_s: Vec::new(),
            class_latency_s: Vec::new(),
            budget_bytes,
            h2d_bytes_per_s,
            d2h_bytes_per_s,
            latency_s,
            cold_latency_s: 0.0,
            mem_bytes_per_s: f64::INFINITY,
            disk_bytes_per_s: f64::INFINITY,
            disk_latency_s: 0.0,
            read_slowdown: 1.0,
            read_cpu_s: 0.0,
            inline_read_bytes: 0,
            inline_read_s: 0.0,
            segment_call_s: 0.0,
            resident_lookup_s: 0.0,
            stream_op_s: 0.0,
        }
    }

    /// Whether this device (the host) reads a parameter of `bytes` from the
    /// disk tier on its calling thread (see `inline_read_bytes`).
    #[must_use]
    pub fn reads_inline(&self, bytes: f64) -> bool {
        self.inline_read_bytes > 0 && bytes <= self.inline_read_bytes as f64
    }

    /// The fixed cost of this device's (the host's) read of a parameter of
    /// `bytes` from the disk tier, beyond its bytes over the read rate:
    /// `inline_read_s` for a read the calling thread makes, else
    /// `disk_latency_s`.
    #[must_use]
    pub fn read_fixed_s(&self, bytes: f64) -> f64 {
        if self.reads_inline(bytes) {
            self.inline_read_s
        } else {
            self.disk_latency_s
        }
    }

    /// Seconds this device (the host) needs to read a parameter of `bytes`
    /// from the disk tier: its fixed cost plus the bytes over the read rate.
    #[must_use]
    pub fn disk_read_time(&self, bytes: f64) -> f64 {
        self.read_fixed_s(bytes) + bytes / self.disk_bytes_per_s
    }

    /// The compute rate of rate class `class` (see `class_flops_per_s`).
    #[must_use]
    pub fn class_rate(&self, class: u32) -> f64 {
        (class as usize)
            .checked_sub(1)
            .and_then(|i| self.class_flops_per_s.get(i))
            .copied()
            .unwrap_or(self.flops_per_s)
    }

    /// The fixed cost of a node of rate class `class` that calls `ops` ops:
    /// its class's (see `class_latency_s`), else `latency_s` an op.
    #[must_use]
    pub fn fixed_cost(&self, class: u32, ops: u32) -> f64 {
        if ops == 0 {
            return 0.0;
        }
        (class as usize)
            .checked_sub(1)
            .and_then(|i| self.class_latency_s.get(i))
            .copied()
            .unwrap_or(f64::from(ops) * self.latency_s)
    }

    /// Seconds this device needs to run a node of `flops` operations of
    /// rate class `class` that moves `bytes` through device memory in `ops`
    /// ops: the slower of compute and memory traffic, plus the node's fixed
    /// cost (`fixed_cost`). A node that computes, moves and calls nothing (a
    /// graph input) takes no time.
    #[must_use]
    pub fn node_time(&self, flops: f64, bytes: u64, class: u32, ops: u32) -> f64 {
        let compute = if flops == 0.0 {
            0.0
        } else {
            flops / self.class_rate(class)
        };
        let traffic = bytes as f64 / self.mem_bytes_per_s;
        compute.max(traffic) + self.fixed_cost(class, ops)
    }

    /// Wall seconds of `seconds` of this device's work started at `start`
    /// while reads keep the disk busy until `reads_until`: the overlapping
    /// part runs `read_slowdown` times slower.
    #[must_use]
    pub fn while_reading(&self, seconds: f64, start: f64, reads_until: f64) -> f64 {
        let overlap = reads_until - start;
        if self.read_slowdown <= 1.0 || overlap <= 0.0 || seconds <= 0.0 {
            return seconds;
        }
        let slowed = seconds * self.read_slowdown;
        if slowed <= overlap {
            slowed
        } else {
            overlap + (seconds - overlap / self.read_slowdown)
        }
    }
}

fn invalid(msg: String) -> PlanError {
    PlanError::InvalidDevices(msg)
}

/// Checks a device list: non-empty, exactly one host and it is index 0,
/// unique non-empty names, positive compute and memory rates, positive copy
/// rates on accelerators and a positive disk rate on the host (the others
/// are ignored), finite non-negative latencies. Rates may be infinite.
///
/// # Errors
/// [`PlanError::InvalidDevices`] naming the first offending device and field.
pub fn validate_devices(devices: &[Device]) -> Result<(), PlanError> {
    let Some(first) = devices.first() else {
        return Err(invalid(
            "the device list is empty; it needs the host at index 0".into(),
        ));
    };
    if !first.is_host {
        return Err(invalid(format!(
            "device 0 ({:?}) must be the host (is_host = true)",
            first.name
        )));
    }
    if devices.len() > u32::MAX as usize {
        return Err(invalid(format!("{} devices is too many", devices.len())));
    }
    for (i, d) in devices.iter().enumerate() {
        if i > 0 && d.is_host {
            return Err(invalid(format!(
                "device {i} ({:?}) is a second host; exactly one host is allowed and it is index 0",
                d.name
            )));
        }
        if d.name.is_empty() {
            return Err(invalid(format!("device {i} has an empty name")));
        }
        if let Some(j) = devices[..i].iter().position(|e| e.name == d.name) {
            return Err(invalid(format!(
                "devices {j} and {i} are both named {:?}; names must be unique",
                d.name
            )));
        }
        // Rates may be infinite (a free link, an instant device); latencies
        // may not, or no time would be finite.
        if d.flops_per_s.is_nan() || d.flops_per_s <= 0.0 {
            return Err(invalid(format!(
                "device {i} ({:?}) has flops_per_s = {}; it must be positive",
                d.name, d.flops_per_s
            )));
        }
        if let Some((c, rate)) = d
            .class_flops_per_s
            .iter()
            .enumerate()
            .find(|(_, r)| r.is_nan() || **r <= 0.0)
        {
            return Err(invalid(format!(
                "device {i} ({:?}) has class_flops_per_s[{c}] = {rate}; it must be positive",
                d.name
            )));
        }
        if let Some((c, latency)) = d
            .class_latency_s
            .iter()
            .enumerate()
            .find(|(_, l)| !(l.is_finite() && **l >= 0.0))
        {
            return Err(invalid(format!(
                "device {i} ({:?}) has class_latency_s[{c}] = {latency}; it must be finite and non-negative",
                d.name
            )));
        }
        if !(d.read_slowdown.is_finite() && d.read_slowdown >= 1.0) {
            return Err(invalid(format!(
                "device {i} ({:?}) has read_slowdown = {}; it must be finite and at least 1",
                d.name, d.read_slowdown
            )));
        }
        for (field, value) in [
            ("latency_s", d.latency_s),
            ("cold_latency_s", d.cold_latency_s),
            ("disk_latency_s", d.disk_latency_s),
            ("read_cpu_s", d.read_cpu_s),
            ("inline_read_s", d.inline_read_s),
            ("segment_call_s", d.segment_call_s),
            ("resident_lookup_s", d.resident_lookup_s),
            ("stream_op_s", d.stream_op_s),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(format!(
                    "device {i} ({:?}) has {field} = {value}; it must be finite and non-negative",
                    d.name
                )));
            }
        }
        let rates: &[(&str, f64)] = if d.is_host {
            // The host's own copy rates are never used.
            &[
                ("mem_bytes_per_s", d.mem_bytes_per_s),
                ("disk_bytes_per_s", d.disk_bytes_per_s),
            ]
        } else {
            &[
                ("mem_bytes_per_s", d.mem_bytes_per_s),
                ("h2d_bytes_per_s", d.h2d_bytes_per_s),
                ("d2h_bytes_per_s", d.d2h_bytes_per_s),
            ]
        };
        for &(field, rate) in rates {
            if rate.is_nan() || rate <= 0.0 {
                return Err(invalid(format!(
                    "device {i} ({:?}) has {field} = {rate}; it must be positive",
                    d.name
                )));
            }
        }
    }
    Ok(())
}
