//! `simulate()` and the `Simulation` it returns; timelines as Python tuples.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensortorrent_planner::{Device, Record, Resource, Simulation};

use crate::device::PyDevice;
use crate::error::to_py_err;
use crate::graph::PyCostGraph;

/// One timeline record as Python sees it:
/// `(resource, kind, index, start_s, end_s)`.
pub(crate) type RecordTuple = (String, &'static str, u32, f64, f64);

/// Converts a timeline, naming each resource after `devices`.
pub(crate) fn timeline_tuples(records: &[Record], devices: &[Device]) -> Vec<RecordTuple> {
    let mut names: Vec<(Resource, String)> = Vec::new();
    records
        .iter()
        .map(|r| {
            let name = if let Some((_, name)) = names.iter().find(|(res, _)| *res == r.resource) {
                name.clone()
            } else {
                let name = r.resource.name(devices);
                names.push((r.resource, name.clone()));
                name
            };
            (name, r.activity.as_str(), r.index, r.start_s, r.end_s)
        })
        .collect()
}

/// A dict of `(name, value)` pairs, in their order.
pub(crate) fn ordered_dict<'py>(
    py: Python<'py>,
    pairs: &[(String, f64)],
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in pairs {
        dict.set_item(name, value)?;
    }
    Ok(dict)
}

/// One simulated placement: time, memory, resources and timeline.
#[pyclass(frozen, name = "Simulation", module = "tensortorrent_dynamo._planner")]
pub(crate) struct PySimulation {
    inner: Simulation,
    devices: Vec<Device>,
}

#[pymethods]
impl PySimulation {
    /// Simulated time until the last output is on the host, in seconds.
    #[getter]
    fn predicted_time_s(&self) -> f64 {
        self.inner.predicted_time_s
    }

    /// Simulated peak memory per device, in bytes.
    #[getter]
    fn peak_bytes(&self) -> Vec<u64> {
        self.inner.peak_bytes.clone()
    }

    /// The busiest resource's seconds of work (no schedule is faster).
    #[getter]
    fn lower_bound_s(&self) -> f64 {
        self.inner.lower_bound_s
    }

    /// Fraction of the predicted time each resource is busy, by name.
    #[getter]
    fn busy_fraction<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let pairs: Vec<(String, f64)> = self
            .inner
            .busy_fraction()
            .into_iter()
            .map(|(r, f)| (r.name(&self.devices), f))
            .collect();
        ordered_dict(py, &pairs)
    }

    /// Every piece of work: `(resource, kind, index, start_s, end_s)`.
    #[getter]
    fn timeline(&self) -> Vec<RecordTuple> {
        timeline_tuples(&self.inner.timeline, &self.devices)
    }

    fn __repr__(&self) -> String {
        format!(
            "Simulation(predicted_time_s={:?}, peak_bytes={:?}, lower_bound_s={:?})",
            self.inner.predicted_time_s, self.inner.peak_bytes, self.inner.lower_bound_s
        )
    }
}

/// Simulates one placement of `graph` on `devices`: the device of each
/// node and whether each parameter is streamed, prefetched
/// `prefetch_depth` segments ahead, and optionally which values are spilled
/// to the host between uses. Releases the GIL while simulating.
#[pyfunction]
#[pyo3(signature = (
    graph,
    devices,
    node_device,
    param_streamed,
    *,
    value_spilled = Vec::new(),
    prefetch_depth = 1,
))]
// PyO3 extracts Python sequences into owned vectors; the core borrows them.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn simulate(
    py: Python<'_>,
    graph: &Bound<'_, PyCostGraph>,
    devices: Vec<PyRef<'_, PyDevice>>,
    node_device: Vec<u32>,
    param_streamed: Vec<bool>,
    value_spilled: Vec<bool>,
    prefetch_depth: u32,
) -> PyResult<PySimulation> {
    let devices: Vec<Device> = devices.into_iter().map(|d| d.inner.clone()).collect();
    let graph = &graph.get().inner;
    let inner = py
        .detach(|| {
            tensortorrent_planner::simulate_spilled(
                graph,
                &devices,
                &node_device,
                &param_streamed,
                &value_spilled,
                prefetch_depth,
            )
        })
        .map_err(|e| to_py_err(py, &e))?;
    Ok(PySimulation { inner, devices })
}
