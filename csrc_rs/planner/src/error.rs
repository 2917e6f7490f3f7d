//! Errors returned by graph validation and planning, and what a refusal
//! says a device holds at its peak.

/// Everything that can go wrong while building inputs or planning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The cost graph is malformed (lengths, ids, order or values).
    #[error("invalid cost graph: {0}")]
    InvalidGraph(String),
    /// The device list is malformed (host position, names, rates).
    #[error("invalid devices: {0}")]
    InvalidDevices(String),
    /// The objective name is not one of the known objectives.
    #[error("invalid objective: {0}")]
    InvalidObjective(String),
    /// A planner option (a limit, the prefetch depth, the memory slack) is
    /// out of range.
    #[error("invalid option: {0}")]
    InvalidOptions(String),
    /// A placement given to the simulator does not fit the graph and the
    /// devices (lengths, device ids, host-only nodes).
    #[error("invalid placement: {0}")]
    InvalidPlacement(String),
    /// No candidate placement fits the memory budgets.
    #[error("{message}")]
    Infeasible {
        /// Human-readable explanation naming each device and what to change.
        message: String,
        /// For each device whose budget was exceeded in the most lenient
        /// candidate: its name and the smallest budget that makes a plan fit.
        min_budgets: Vec<(String, u64)>,
        /// Each of those devices' peak in that candidate and what makes it,
        /// by the indices of the graph it planned (see `split`).
        peaks: Vec<PeakContents>,
        /// That graph was the split one (`Planner::run_with_split`): its
        /// large weights in row chunks.
        split: bool,
    },
}

impl PlanError {
    /// The message without the variant prefix that `Display` adds.
    #[must_use]
    pub fn message(&self) -> &str {
        match self {
            Self::InvalidGraph(m)
            | Self::InvalidDevices(m)
            | Self::InvalidObjective(m)
            | Self::InvalidOptions(m)
            | Self::InvalidPlacement(m) => m,
            Self::Infeasible { message, .. } => message,
        }
    }
}

/// What a piece of a device's memory holds (besides its resident weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Held {
    /// A streamed parameter's buffer on the device, for one of its stays
    /// (indexed by parameter).
    Weight,
    /// A host buffer a disk read of a parameter lands in before it is
    /// copied on to an accelerator (indexed by parameter).
    Staging,
    /// A node's value made there (indexed by node).
    Value,
    /// A copy of a node's value made elsewhere: copied there to be used or
    /// as an output, a spilled value's host copy or its reload (indexed by
    /// node; its bytes are the value's on that device, as `Value`'s).
    Copy,
}

impl Held {
    /// The name the Python package reads.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Weight => "weight",
            Self::Staging => "staging",
            Self::Value => "value",
            Self::Copy => "copy",
        }
    }
}

/// One device's peak in a simulated run, and what makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakContents {
    /// The device's index.
    pub device: u32,
    /// The peak, in bytes (the simulation's `peak_bytes` for the device).
    pub bytes: u64,
    /// The parameters it holds for the whole run, by index: those resident
    /// on it and, on the host, every one whose home is host memory.
    pub resident: Vec<u32>,
    /// What else is live at the peak, with its bytes, largest first.
    pub live: Vec<(Held, u32, u64)>,
    /// The allocation that brought the device to its peak; `None` when its
    /// resident parameters alone make it.
    pub reached_by: Option<(Held, u32)>,
}
