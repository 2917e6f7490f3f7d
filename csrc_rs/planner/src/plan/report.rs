//! Why a search stopped, and how much it did.

use std::fmt;
use std::time::Duration;

/// Why the search stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Every candidate family ran and the local search converged.
    Saturated,
    /// The node limit (nodes simulated, over all candidates) was reached.
    NodeLimit(u64),
    /// The time limit was reached.
    TimeLimit(Duration),
    /// No search: a given placement was simulated (see [`crate::Planner::replay`]).
    Replayed,
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Saturated => f.write_str("searched all families"),
            Self::NodeLimit(limit) => write!(f, "node limit {limit} reached"),
            Self::TimeLimit(limit) => {
                write!(f, "time limit {} ms reached", limit.as_secs_f64() * 1e3)
            }
            Self::Replayed => f.write_str("replayed a known placement, no search"),
        }
    }
}

/// What a search did: why it stopped and how many simulations it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Why the search stopped.
    pub stop_reason: StopReason,
    /// Placements simulated, in every family (local-search moves included).
    pub candidates_simulated: u64,
    /// Nodes simulated over all those simulations.
    pub nodes_simulated: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, n) = (self.candidates_simulated, self.nodes_simulated);
        match self.stop_reason {
            StopReason::Saturated => write!(
                f,
                "searched all families: {c} candidates simulated ({n} nodes)"
            ),
            reason => write!(f, "{reason} after {c} candidates ({n} nodes)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_read_as_sentences() {
        let report = |stop_reason| Report {
            stop_reason,
            candidates_simulated: 7,
            nodes_simulated: 700,
        };
        assert_eq!(
            report(StopReason::Saturated).to_string(),
            "searched all families: 7 candidates simulated (700 nodes)"
        );
        assert_eq!(
            report(StopReason::NodeLimit(500)).to_string(),
            "node limit 500 reached after 7 candidates (700 nodes)"
        );
        assert_eq!(
            report(StopReason::TimeLimit(Duration::from_millis(50))).to_string(),
            "time limit 50 ms reached after 7 candidates (700 nodes)"
        );
    }
}
