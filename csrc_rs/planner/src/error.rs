//! Errors returned by graph validation and planning.

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
