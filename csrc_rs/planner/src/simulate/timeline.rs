//! The resources a simulation queues work on, and the records of that work.

use std::fmt;

use crate::device::Device;

/// A resource that runs one piece of work at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// The compute queue of a device.
    Compute(u32),
    /// The host-to-device copy engine of an accelerator.
    HostToDevice(u32),
    /// The device-to-host copy engine of an accelerator.
    DeviceToHost(u32),
    /// Disk reads into host memory.
    Disk,
}

impl Resource {
    /// The resource's name: the device's name for its compute queue,
    /// `"<host>-><device>"` and `"<device>-><host>"` for copy engines,
    /// `"disk-><host>"` for disk reads.
    #[must_use]
    pub fn name(self, devices: &[Device]) -> String {
        let host = &devices[0].name;
        match self {
            Self::Compute(d) => devices[d as usize].name.clone(),
            Self::HostToDevice(d) => format!("{host}->{}", devices[d as usize].name),
            Self::DeviceToHost(d) => format!("{}->{host}", devices[d as usize].name),
            Self::Disk => format!("disk->{host}"),
        }
    }

    /// Every resource of `devices` in a fixed order: compute queues, then
    /// each accelerator's two copy engines, then the disk when `disk`.
    pub(crate) fn all(num_devices: usize, disk: bool) -> Vec<Self> {
        let mut out: Vec<Self> = (0..num_devices as u32).map(Self::Compute).collect();
        for a in 1..num_devices as u32 {
            out.push(Self::HostToDevice(a));
            out.push(Self::DeviceToHost(a));
        }
        if disk {
            out.push(Self::Disk);
        }
        out
    }
}

/// What a piece of work on a resource was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activity {
    /// A node computing (the record's index is the node).
    Node,
    /// A parameter read from disk or copied to a device (index: parameter).
    Param,
    /// A node's value copied to another device (index: the producing node).
    Value,
    /// A graph output copied back to the host at the end (index: node).
    Output,
    /// A spilled value copied to the host to free its device (index: node).
    Spill,
    /// A spilled value copied back for its next use (index: node).
    Reload,
    /// The host's compute a disk read takes while in flight
    /// (`Device::read_cpu_s`; index: parameter).
    ReadCpu,
}

impl Activity {
    /// The activity's name: `"node"`, `"param"`, `"value"`, `"output"`,
    /// `"spill"`, `"reload"` or `"read-cpu"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Param => "param",
            Self::Value => "value",
            Self::Output => "output",
            Self::Spill => "spill",
            Self::Reload => "reload",
            Self::ReadCpu => "read-cpu",
        }
    }
}

impl fmt::Display for Activity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One piece of work in a simulated timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// Where it ran.
    pub resource: Resource,
    /// What it was.
    pub activity: Activity,
    /// The node or parameter it concerns (see [`Activity`]).
    pub index: u32,
    /// Start, in seconds from the start of the run.
    pub start_s: f64,
    /// End, in seconds from the start of the run.
    pub end_s: f64,
}
