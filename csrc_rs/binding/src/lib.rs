//! Python binding of the tensortorrent planner: `tensortorrent_dynamo._planner`.
//!
//! Every module here only converts types and errors; the planning lives in
//! the `tensortorrent-planner` crate.

use pyo3::prelude::*;

mod device;
mod error;
mod exhaustive;
mod graph;
mod plan;
mod simulate;

/// Native planner of tensortorrent: where each node runs, which parameters
/// stay resident and which are streamed, and the predicted time and memory;
/// the simulator and the exhaustive reference search behind it.
#[pymodule]
fn _planner(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<graph::PyCostGraph>()?;
    m.add_class::<device::PyDevice>()?;
    m.add_class::<plan::PyCandidate>()?;
    m.add_class::<plan::PyPlan>()?;
    m.add_class::<simulate::PySimulation>()?;
    m.add_class::<exhaustive::PyOptimum>()?;
    m.add_function(wrap_pyfunction!(plan::plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::replay, m)?)?;
    m.add_function(wrap_pyfunction!(simulate::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(exhaustive::exhaustive, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    Ok(())
}

/// The planner's version.
#[pyfunction]
fn version() -> &'static str {
    tensortorrent_planner::VERSION
}
