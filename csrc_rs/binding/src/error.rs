//! Mapping of planner errors onto the classes of `tensortorrent_dynamo.errors`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensortorrent_planner::{PeakContents, PlanError};

const ERRORS_MODULE: &str = "tensortorrent_dynamo.errors";

/// One device's peak as the package reads it, by index (`plan.peaks` names them):
/// `(device, bytes, resident, live, reached_by)`, each piece of `live` and `reached_by`
/// as `(what, index[, bytes])` with `what` one of `"weight"`, `"staging"`, `"value"` (and,
/// for `reached_by` only, `"copy"`: a value's copy from another device).
pub(crate) type PeakTuple = (
    u32,
    u64,
    Vec<u32>,
    Vec<(&'static str, u32, u64)>,
    Option<(&'static str, u32)>,
);

pub(crate) fn peak_tuples(peaks: &[PeakContents]) -> Vec<PeakTuple> {
    peaks
        .iter()
        .map(|p| {
            let live = p
                .live
                .iter()
                .map(|&(held, index, bytes)| (held.as_str(), index, bytes))
                .collect();
            let reached = p.reached_by.map(|(held, index)| (held.as_str(), index));
            (p.device, p.bytes, p.resident.clone(), live, reached)
        })
        .collect()
}

/// Converts a planner error into an instance of its Python class, imported
/// from `tensortorrent_dynamo.errors` at raise time.
pub(crate) fn to_py_err(py: Python<'_>, err: &PlanError) -> PyErr {
    let class = match err {
        PlanError::InvalidGraph(_) => "InvalidCostGraph",
        PlanError::InvalidDevices(_) => "InvalidDevices",
        PlanError::InvalidObjective(_) => "InvalidObjective",
        PlanError::InvalidOptions(_) => "OptionsError",
        PlanError::InvalidPlacement(_) => "InvalidPlacement",
        PlanError::Infeasible { .. } => "PlanInfeasible",
    };
    let raised = py.import(ERRORS_MODULE).and_then(|module| {
        let cls = module.getattr(class)?;
        match err {
            PlanError::Infeasible {
                message,
                min_budgets,
                peaks,
                split,
            } => {
                let budgets = PyDict::new(py);
                for (name, bytes) in min_budgets {
                    budgets.set_item(name, bytes)?;
                }
                let kwargs = PyDict::new(py);
                kwargs.set_item("native_peaks", (*split, peak_tuples(peaks)))?;
                cls.call((message, budgets), Some(&kwargs))
            }
            other => cls.call1((other.message(),)),
        }
    });
    match raised {
        Ok(instance) => PyErr::from_value(instance),
        Err(cause) => {
            let err = PyRuntimeError::new_err(format!(
                "could not raise {ERRORS_MODULE}.{class}: {}",
                err.message()
            ));
            err.set_cause(py, Some(cause));
            err
        }
    }
}
