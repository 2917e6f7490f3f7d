//! `Device`: one device of the machine (index 0 of a device list is the host).

use std::fmt::Write;

use pyo3::prelude::*;
use tensortorrent_planner::Device;

/// One device: its compute rate, memory budget, copy rates, and (when
/// modelled) its memory bandwidth and disk read rate.
#[pyclass(frozen, name = "Device", module = "tensortorrent_dynamo._planner")]
pub(crate) struct PyDevice {
    pub(crate) inner: Device,
}

#[pymethods]
impl PyDevice {
    #[new]
    #[pyo3(signature = (
        name,
        is_host,
        flops_per_s,
        budget_bytes,
        h2d_bytes_per_s,
        d2h_bytes_per_s,
        latency_s,
        *,
        mem_bytes_per_s = f64::INFINITY,
        disk_bytes_per_s = f64::INFINITY,
        class_flops_per_s = Vec::new(),
        disk_latency_s = 0.0,
        read_slowdown = 1.0,
        class_latency_s = Vec::new(),
        cold_latency_s = 0.0,
        read_cpu_s = 0.0,
        inline_read_bytes = 0,
        inline_read_s = 0.0,
        segment_call_s = 0.0,
        resident_lookup_s = 0.0,
        stream_op_s = 0.0,
    ))]
    fn new(
        name: String,
        is_host: bool,
        flops_per_s: f64,
        budget_bytes: u64,
        h2d_bytes_per_s: f64,
        d2h_bytes_per_s: f64,
        latency_s: f64,
        mem_bytes_per_s: f64,
        disk_bytes_per_s: f64,
        class_flops_per_s: Vec<f64>,
        disk_latency_s: f64,
        read_slowdown: f64,
        class_latency_s: Vec<f64>,
        cold_latency_s: f64,
        read_cpu_s: f64,
        inline_read_bytes: u64,
        inline_read_s: f64,
        segment_call_s: f64,
        resident_lookup_s: f64,
        stream_op_s: f64,
    ) -> Self {
        Self {
            inner: Device {
                name,
                is_host,
                flops_per_s,
                class_flops_per_s,
                class_latency_s,
                budget_bytes,
                h2d_bytes_per_s,
                d2h_bytes_per_s,
                latency_s,
                cold_latency_s,
                mem_bytes_per_s,
                disk_bytes_per_s,
                disk_latency_s,
                read_slowdown,
                read_cpu_s,
                inline_read_bytes,
                inline_read_s,
                segment_call_s,
                resident_lookup_s,
                stream_op_s,
            },
        }
    }

    /// Unique device name.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether this is the host.
    #[getter]
    fn is_host(&self) -> bool {
        self.inner.is_host
    }

    /// Compute rate in floating-point operations per second.
    #[getter]
    fn flops_per_s(&self) -> f64 {
        self.inner.flops_per_s
    }

    /// Compute rate of each rate class from 1 (class `c` at index `c - 1`);
    /// class 0 and unlisted classes run at `flops_per_s`.
    #[getter]
    fn class_flops_per_s(&self) -> Vec<f64> {
        self.inner.class_flops_per_s.clone()
    }

    /// Fixed cost of a node of each rate class from 1 (class `c` at index
    /// `c - 1`), all its ops together; class 0 and unlisted classes pay
    /// `latency_s` an op.
    #[getter]
    fn class_latency_s(&self) -> Vec<f64> {
        self.inner.class_latency_s.clone()
    }

    /// Memory the plan may use on this device, in bytes.
    #[getter]
    fn budget_bytes(&self) -> u64 {
        self.inner.budget_bytes
    }

    /// Host-to-device copy rate in bytes per second.
    #[getter]
    fn h2d_bytes_per_s(&self) -> f64 {
        self.inner.h2d_bytes_per_s
    }

    /// Device-to-host copy rate in bytes per second.
    #[getter]
    fn d2h_bytes_per_s(&self) -> f64 {
        self.inner.d2h_bytes_per_s
    }

    /// Fixed cost per node, in seconds.
    #[getter]
    fn latency_s(&self) -> f64 {
        self.inner.latency_s
    }

    /// What a segment pays the first time it runs each kind of op, beyond
    /// the ops' fixed costs, in seconds (0: not modelled).
    #[getter]
    fn cold_latency_s(&self) -> f64 {
        self.inner.cold_latency_s
    }

    /// Device-memory bandwidth in bytes per second (infinite: not modelled).
    #[getter]
    fn mem_bytes_per_s(&self) -> f64 {
        self.inner.mem_bytes_per_s
    }

    /// Disk read rate in bytes per second, used on the host (infinite: not
    /// modelled).
    #[getter]
    fn disk_bytes_per_s(&self) -> f64 {
        self.inner.disk_bytes_per_s
    }

    /// Fixed cost in seconds of a disk read issued to an idle disk, used on
    /// the host (0: not modelled).
    #[getter]
    fn disk_latency_s(&self) -> f64 {
        self.inner.disk_latency_s
    }

    /// How many times longer the host's compute takes while disk reads run
    /// (1: not modelled).
    #[getter]
    fn read_slowdown(&self) -> f64 {
        self.inner.read_slowdown
    }

    /// Seconds of the host's compute each disk read takes while in flight,
    /// used on the host (0: not modelled).
    #[getter]
    fn read_cpu_s(&self) -> f64 {
        self.inner.read_cpu_s
    }

    /// A disk read of a parameter of at most this many bytes is made by the
    /// host's calling thread, used on the host (0: every read is handed on).
    #[getter]
    fn inline_read_bytes(&self) -> u64 {
        self.inner.inline_read_bytes
    }

    /// Fixed cost of a read the host's calling thread makes, beyond its
    /// bytes over the disk rate, used on the host.
    #[getter]
    fn inline_read_s(&self) -> f64 {
        self.inner.inline_read_s
    }

    /// The calling thread's cost of calling one segment of a plan of
    /// several, used on the host.
    #[getter]
    fn segment_call_s(&self) -> f64 {
        self.inner.segment_call_s
    }

    /// The calling thread's cost of looking up one resident parameter, used
    /// on the host.
    #[getter]
    fn resident_lookup_s(&self) -> f64 {
        self.inner.resident_lookup_s
    }

    /// The calling thread's cost of one streamed parameter beyond its read
    /// and copy, used on the host.
    #[getter]
    fn stream_op_s(&self) -> f64 {
        self.inner.stream_op_s
    }

    fn __repr__(&self) -> String {
        let d = &self.inner;
        format!(
            "Device(name={:?}, is_host={}, flops_per_s={}, budget_bytes={}, \
             h2d_bytes_per_s={}, d2h_bytes_per_s={}, latency_s={}, \
             mem_bytes_per_s={}, disk_bytes_per_s={}{}{}{}{}{}{}{}{})",
            d.name,
            if d.is_host { "True" } else { "False" },
            float_repr(d.flops_per_s),
            d.budget_bytes,
            float_repr(d.h2d_bytes_per_s),
            float_repr(d.d2h_bytes_per_s),
            float_repr(d.latency_s),
            float_repr(d.mem_bytes_per_s),
            float_repr(d.disk_bytes_per_s),
            list_repr("class_flops_per_s", &d.class_flops_per_s),
            list_repr("class_latency_s", &d.class_latency_s),
            if d.cold_latency_s > 0.0 {
                format!(", cold_latency_s={}", float_repr(d.cold_latency_s))
            } else {
                String::new()
            },
            if d.disk_latency_s > 0.0 {
                format!(", disk_latency_s={}", float_repr(d.disk_latency_s))
            } else {
                String::new()
            },
            if d.read_slowdown > 1.0 {
                format!(", read_slowdown={}", float_repr(d.read_slowdown))
            } else {
                String::new()
            },
            if d.read_cpu_s > 0.0 {
                format!(", read_cpu_s={}", float_repr(d.read_cpu_s))
            } else {
                String::new()
            },
            if d.inline_read_bytes > 0 {
                format!(
                    ", inline_read_bytes={}, inline_read_s={}",
                    d.inline_read_bytes,
                    float_repr(d.inline_read_s)
                )
            } else {
                String::new()
            },
            runtime_repr(d),
        )
    }
}

/// The runtime's work figures that are modelled (above 0), as keywords.
fn runtime_repr(d: &Device) -> String {
    let mut out = String::new();
    for (name, value) in [
        ("segment_call_s", d.segment_call_s),
        ("resident_lookup_s", d.resident_lookup_s),
        ("stream_op_s", d.stream_op_s),
    ] {
        if value > 0.0 {
            let _ = write!(out, ", {name}={}", float_repr(value));
        }
    }
    out
}

/// `, name=[a, b]` for a list keyword that is not empty, else nothing.
fn list_repr(name: &str, values: &[f64]) -> String {
    if values.is_empty() {
        return String::new();
    }
    let items: Vec<String> = values.iter().map(|&x| float_repr(x)).collect();
    format!(", {name}=[{}]", items.join(", "))
}

/// A float as Python writes it back: `inf` is `float('inf')`.
fn float_repr(x: f64) -> String {
    if x.is_infinite() {
        let sign = if x < 0.0 { "-" } else { "" };
        format!("float('{sign}inf')")
    } else {
        format!("{x:?}")
    }
}
