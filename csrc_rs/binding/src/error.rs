//! Mapping of planner errors onto the classes of `tensortorrent_dynamo.errors`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensortorrent_planner::PlanError;

const ERRORS_MODULE: &str = "tensortorrent_dynamo.errors";

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
                // by index: the package names them (`plan.refusal`)
                let peaks: Vec<_> = peaks
                    .iter()
                    .map(|p| {
                        let live: Vec<_> = p
                            .live
                            .iter()
                            .map(|&(held, index, bytes)| (held.as_str(), index, bytes))
                            .collect();
                        let reached = p.reached_by.map(|(held, index)| (held.as_str(), index));
                        (p.device, p.bytes, p.resident.clone(), live, reached)
                    })
                    .collect();
                let kwargs = PyDict::new(py);
                kwargs.set_item("native_peaks", (*split, peaks))?;
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
