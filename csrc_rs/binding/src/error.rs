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
            } => {
                let budgets = PyDict::new(py);
                for (name, bytes) in min_budgets {
                    budgets.set_item(name, bytes)?;
                }
                cls.call1((message, budgets))
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
