//! What the plan optimises, and how local search compares placements.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::error::PlanError;
use crate::simulate::Simulation;

/// What the plan optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Objective {
    /// Least predicted time for one run (one forward).
    Latency,
    /// Least accelerator memory (the largest peak over accelerators) among
    /// plans within the memory slack (10 % by default) of the fastest.
    Memory,
    /// Most runs per second. The planner has no batch or stream-of-requests
    /// information and simulates one run at a time, with runs not
    /// overlapping, so this is the same choice as [`Objective::Latency`].
    Throughput,
}

impl Objective {
    /// Every objective, in the order their names are listed.
    pub const ALL: [Self; 3] = [Self::Latency, Self::Memory, Self::Throughput];

    /// The objective's name as parsed by [`str::parse`].
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Latency => "latency",
            Self::Memory => "memory",
            Self::Throughput => "throughput",
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Objective {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        Self::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| {
                let valid: Vec<&str> = Self::ALL.iter().map(|o| o.as_str()).collect();
                PlanError::InvalidObjective(format!(
                    "unknown objective {s:?}; valid objectives are: {}",
                    valid.join(", ")
                ))
            })
    }
}

/// How local search compares simulated placements: fitting first, then
/// the objective. Times within a relative 1e-9 count as equal, so that
/// rounding never passes for an improvement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Score {
    shortfall: u128,
    /// Seconds over the memory objective's time cap (0 otherwise).
    excess_s: f64,
    /// The memory objective's accelerator peak (0 otherwise).
    memory: u64,
    time_s: f64,
}

fn cmp_time(a: f64, b: f64) -> Ordering {
    if (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) {
        Ordering::Equal
    } else {
        a.total_cmp(&b)
    }
}

impl Score {
    pub(crate) fn compare(&self, other: &Self) -> Ordering {
        self.shortfall
            .cmp(&other.shortfall)
            .then(cmp_time(self.excess_s, other.excess_s))
            .then(self.memory.cmp(&other.memory))
            .then(cmp_time(self.time_s, other.time_s))
    }

    pub(crate) fn better_than(&self, other: &Self) -> bool {
        self.compare(other) == Ordering::Less
    }
}

/// What local search aims at: the objective, and for the memory objective
/// the time it may not exceed.
pub(crate) struct Goal {
    pub(crate) objective: Objective,
    /// The memory objective's time cap.
    pub(crate) time_cap: f64,
}

impl Goal {
    /// The score of a simulation `shortfall` bytes over budget.
    pub(crate) fn score(&self, shortfall: u128, sim: &Simulation) -> Score {
        let time_s = sim.predicted_time_s;
        match self.objective {
            Objective::Latency | Objective::Throughput => Score {
                shortfall,
                excess_s: 0.0,
                memory: 0,
                time_s,
            },
            Objective::Memory => Score {
                shortfall,
                excess_s: if time_s > self.time_cap {
                    time_s - self.time_cap
                } else {
                    0.0
                },
                memory: accelerator_peak(sim),
                time_s,
            },
        }
    }
}

/// The largest peak over the accelerators.
pub(crate) fn accelerator_peak(sim: &Simulation) -> u64 {
    sim.peak_bytes.iter().skip(1).copied().max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_parse_and_print() {
        for o in Objective::ALL {
            assert_eq!(o.as_str().parse::<Objective>(), Ok(o));
            assert_eq!(o.to_string(), o.as_str());
        }
        let err = "fastest".parse::<Objective>().unwrap_err();
        assert_eq!(
            err,
            PlanError::InvalidObjective(
                "unknown objective \"fastest\"; valid objectives are: latency, memory, throughput"
                    .into()
            )
        );
    }

    #[test]
    fn rounding_is_not_an_improvement() {
        let at = |time_s: f64| Score {
            shortfall: 0,
            excess_s: 0.0,
            memory: 0,
            time_s,
        };
        assert!(!at(1.0 - 1e-12).better_than(&at(1.0)));
        assert!(at(0.999).better_than(&at(1.0)));
        assert!(!at(f64::INFINITY).better_than(&at(f64::INFINITY)));
        let over = Score {
            shortfall: 1,
            ..at(0.0)
        };
        assert!(at(5.0).better_than(&over));
    }
}
